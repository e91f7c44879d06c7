#!/usr/bin/env bash
# Installs what the Android core's host tests need (a JDK and JUnit 4, Debian packages) if missing.
set -euo pipefail
if command -v javac >/dev/null && [ -f "${JUNIT_JAR:-/usr/share/java/junit4.jar}" ] \
    && [ -f "${HAMCREST_JAR:-/usr/share/java/hamcrest-core.jar}" ]; then
  exit 0
fi
if [ "$(id -u)" -eq 0 ]; then SUDO=""; elif command -v sudo >/dev/null; then SUDO="sudo"; else
  echo "ensure-jdk.sh: need javac and JUnit 4; run: apt-get install default-jdk-headless junit4" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y --no-install-recommends default-jdk-headless junit4 \
  || { $SUDO apt-get update && $SUDO apt-get install -y --no-install-recommends default-jdk-headless junit4; }
