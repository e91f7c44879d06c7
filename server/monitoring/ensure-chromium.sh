#!/usr/bin/env bash
# Installs Debian's chromium if missing: the dashboard's test drives it headless (Playwright,
# tests/integration/test_dashboard_browser.py) and docs/scripts/dashboard_screenshots.py uses it.
set -euo pipefail
command -v chromium >/dev/null && exit 0
if [ "$(id -u)" -eq 0 ]; then SUDO=""; elif command -v sudo >/dev/null; then SUDO="sudo"; else
  echo "ensure-chromium.sh: chromium not found; run: apt-get install chromium" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y -qq --no-install-recommends chromium \
  || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends chromium; }
