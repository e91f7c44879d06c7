#!/usr/bin/env bash
# ensure-debian-package.sh COMMAND PACKAGE: installs Debian's PACKAGE if COMMAND is missing.
# `make monitoring-check` needs promtool (package prometheus) for the alert rules, `make test-slow`
# chromium for the dashboard's browser test, `make test` PostgreSQL's server for the storage
# tests on Postgres (they start their own scratch cluster), nginx (package nginx-light) for the
# replicas behind a proxy. No service is started here.
set -euo pipefail
command="$1" package="$2"
command -v "$command" >/dev/null && exit 0
if [ "$(id -u)" -eq 0 ]; then SUDO=""; elif command -v sudo >/dev/null; then SUDO="sudo"; else
  echo "ensure-debian-package.sh: $command not found; run: apt-get install $package" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y -qq --no-install-recommends "$package" \
  || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends "$package"; }
