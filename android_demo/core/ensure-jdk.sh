#!/usr/bin/env bash
# Installs what the Android core's host tests need if missing (Debian packages): a JDK, JUnit 4,
# and org.json (libandroid-json-java: the org.json that Android has built in, same API and code);
# for the real-runtime tests (../host_runtime/build.sh) g++, npm (Kotlin's compiler) and jsr305.
# Only what is missing is installed (a machine's own Node.js, say, is left alone).
set -euo pipefail
PACKAGES=""
command -v javac >/dev/null || PACKAGES="$PACKAGES default-jdk-headless"
[ -f "${JUNIT_JAR:-/usr/share/java/junit4.jar}" ] && [ -f "${HAMCREST_JAR:-/usr/share/java/hamcrest-core.jar}" ] \
  || PACKAGES="$PACKAGES junit4"
[ -f "${ANDROID_JSON_JAR:-/usr/share/java/com.android.json.jar}" ] || PACKAGES="$PACKAGES libandroid-json-java"
command -v g++ >/dev/null || PACKAGES="$PACKAGES g++"
command -v npm >/dev/null || PACKAGES="$PACKAGES npm"
[ -f "${JSR305_JAR:-/usr/share/java/jsr305.jar}" ] || PACKAGES="$PACKAGES libjsr305-java"
[ -n "$PACKAGES" ] || exit 0
if [ "$(id -u)" -eq 0 ]; then SUDO=""; elif command -v sudo >/dev/null; then SUDO="sudo"; else
  echo "ensure-jdk.sh: missing$PACKAGES; run: apt-get install$PACKAGES" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# shellcheck disable=SC2086
$SUDO apt-get install -y --no-install-recommends $PACKAGES \
  || { $SUDO apt-get update && $SUDO apt-get install -y --no-install-recommends $PACKAGES; }
