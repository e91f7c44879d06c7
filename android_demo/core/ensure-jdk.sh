#!/usr/bin/env bash
# Installs what the Android core's host tests need if missing (Debian packages): a JDK, JUnit 4,
# and org.json (libandroid-json-java: the org.json that Android has built in, same API and code).
set -euo pipefail
JSON=${ANDROID_JSON_JAR:-/usr/share/java/com.android.json.jar}
if command -v javac >/dev/null && [ -f "${JUNIT_JAR:-/usr/share/java/junit4.jar}" ] \
    && [ -f "${HAMCREST_JAR:-/usr/share/java/hamcrest-core.jar}" ] && [ -f "$JSON" ]; then
  exit 0
fi
PACKAGES="default-jdk-headless junit4 libandroid-json-java"
if [ "$(id -u)" -eq 0 ]; then SUDO=""; elif command -v sudo >/dev/null; then SUDO="sudo"; else
  echo "ensure-jdk.sh: need javac, JUnit 4 and org.json; run: apt-get install $PACKAGES" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# shellcheck disable=SC2086
$SUDO apt-get install -y --no-install-recommends $PACKAGES \
  || { $SUDO apt-get update && $SUDO apt-get install -y --no-install-recommends $PACKAGES; }
