#!/usr/bin/env bash
# Builds android_demo/core with the host JDK and runs its JUnit tests (what `make android-test` runs).
# Usage: host-test.sh PYTHON   (a Python with fedper installed: the tests start `fedper serve`)
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${1:?usage: host-test.sh PYTHON}
JUNIT=${JUNIT_JAR:-/usr/share/java/junit4.jar}
HAMCREST=${HAMCREST_JAR:-/usr/share/java/hamcrest-core.jar}
# org.json: built into Android; on the host Debian's libandroid-json-java (the same sources).
# Whatever compiles core/ (or app/ against it) needs this jar on its classpath.
ANDROID_JSON=${ANDROID_JSON_JAR:-/usr/share/java/com.android.json.jar}
for tool in javac java; do
  command -v "$tool" >/dev/null || { echo "host-test.sh: $tool not found; install a JDK (apt-get install default-jdk-headless)" >&2; exit 1; }
done
for jar in "$JUNIT" "$HAMCREST" "$ANDROID_JSON"; do
  [ -f "$jar" ] || { echo "host-test.sh: $jar not found; run ensure-jdk.sh (apt-get install junit4 libandroid-json-java)" >&2; exit 1; }
done
BUILD=build
rm -rf "$BUILD"
mkdir -p "$BUILD"
javac --release 11 -Xlint:all -Werror -cp "$ANDROID_JSON" -d "$BUILD/classes" $(find src/main/java -name '*.java')
# The app (Android) against the API stubs, with core's classes: a compile check, nothing runs.
../app-compile.sh "$PWD/$BUILD/classes:$ANDROID_JSON" "$PWD/$BUILD/app"
javac --release 11 -cp "$BUILD/classes:$ANDROID_JSON:$JUNIT:$HAMCREST" -d "$BUILD/test-classes" $(find src/test/java -name '*.java')
"$PYTHON" host_fixtures.py make "$BUILD/fixtures"
"$PYTHON" host_fixtures.py onnx-inputs "$BUILD/fixtures/onnx"
# SecAggVectorsTest reads the protocol's known-answer vectors where the repository keeps them.
VECTORS=$(cd ../.. && pwd)/docs/secagg_vectors.json
[ -f "$VECTORS" ] || { echo "host-test.sh: $VECTORS not found" >&2; exit 1; }
# The app's trainer with ExecuTorch's real training runtime (../host_runtime: its Kotlin API and
# JNI built for this JVM from ../shared/upstream), on a real export made meanwhile; skipped, with
# the reason, where those sources or a JDK 17 are absent.
RUNTIME_DIR=$(cd ../host_runtime && pwd)
set +e
RUNTIME=$(../host_runtime/build.sh "$PYTHON")
RUNTIME_STATUS=$?
set -e
if [ "$RUNTIME_STATUS" -ne 0 ] && [ "$RUNTIME_STATUS" -ne 3 ]; then
  exit "$RUNTIME_STATUS"
fi
if [ "$RUNTIME_STATUS" -eq 0 ]; then
  "$PYTHON" "$RUNTIME_DIR/runtime_fixtures.py" program "$BUILD/fixtures/runtime" > "$BUILD/runtime-export.log" 2>&1 &
  EXPORTING=$!
fi
TESTS=$(cd src/test/java && find . -name '*Test.java' | sed 's|^\./||; s|\.java$||; s|/|.|g' | sort)
java -cp "$BUILD/classes:$BUILD/test-classes:$ANDROID_JSON:$JUNIT:$HAMCREST" \
  -Dfedper.python="$PYTHON" -Dfedper.fixtures="$PWD/$BUILD/fixtures" -Dfedper.script="$PWD/host_fixtures.py" \
  -Dfedper.vectors="$VECTORS" \
  org.junit.runner.JUnitCore $TESTS
if [ "$RUNTIME_STATUS" -eq 3 ]; then
  echo "host-test.sh: SKIPPED the real-runtime tests of the app's trainer (the reason is above)" >&2
  exit 0
fi
KOTLIN_CP=$(echo "$RUNTIME" | tail -n 2 | head -n 1)
NATIVE=$(echo "$RUNTIME" | tail -n 1)
# The app's Android-free trainer against the real Kotlin classes (the app build checks it against
# the stubs), then its tests, which reach core's test helpers.
javac --release 17 -Xlint:all -Werror -cp "$BUILD/classes:$ANDROID_JSON:$KOTLIN_CP" -d "$BUILD/runtime-classes" \
  ../app/src/main/java/org/fedper/demo/ExecuTorchTrainer.java ../app/src/main/java/org/fedper/demo/Scorer.java
RUNTIME_CP="$BUILD/classes:$BUILD/test-classes:$BUILD/runtime-classes:$KOTLIN_CP:$ANDROID_JSON:$JUNIT:$HAMCREST"
javac --release 17 -Xlint:all -Werror -cp "$RUNTIME_CP" -d "$BUILD/runtime-test-classes" \
  $(find "$RUNTIME_DIR/src/test/java" -name '*.java')
wait "$EXPORTING" || { cat "$BUILD/runtime-export.log" >&2; echo "host-test.sh: the real export failed" >&2; exit 1; }
RUNTIME_TESTS=$(cd "$RUNTIME_DIR/src/test/java" && find . -name '*Test.java' | sed 's|^\./||; s|\.java$||; s|/|.|g' | sort)
java -XX:-UsePerfData -cp "$BUILD/runtime-test-classes:$RUNTIME_CP" \
  -Dfedper.python="$PYTHON" -Dfedper.fixtures="$PWD/$BUILD/fixtures" -Dfedper.script="$PWD/host_fixtures.py" \
  -Dfedper.runtime.lib="$NATIVE" -Dfedper.runtime.fixtures="$PWD/$BUILD/fixtures/runtime" \
  -Dfedper.runtime.script="$RUNTIME_DIR/runtime_fixtures.py" \
  org.junit.runner.JUnitCore $RUNTIME_TESTS 2> >(grep -v 'cpuinfo_utils.cpp' >&2)
