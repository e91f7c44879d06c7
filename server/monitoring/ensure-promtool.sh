#!/usr/bin/env bash
# Installs promtool (Debian's prometheus package) if missing: `make test` checks the alert rules
# with it (server/monitoring/alerts.yml). The package's service is not started here.
set -euo pipefail
command -v promtool >/dev/null && exit 0
if [ "$(id -u)" -eq 0 ]; then SUDO=""; elif command -v sudo >/dev/null; then SUDO="sudo"; else
  echo "ensure-promtool.sh: promtool not found; run: apt-get install prometheus" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y -qq --no-install-recommends prometheus \
  || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends prometheus; }
