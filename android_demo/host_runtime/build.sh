#!/usr/bin/env bash
# Builds ExecuTorch's own Android training API (org.pytorch.executorch: TrainingModule, SGD,
# Tensor, EValue; Kotlin, with its JNI C++) for the host JVM, linked against the native libraries
# of the executorch package installed in PYTHON's environment (the wheel the exporter uses), so
# that `make android-test` drives the app's trainer with the real runtime. No Android SDK, Gradle
# or Maven: the third-party sources come from UPSTREAM (ExecuTorch's JNI and Kotlin files, fbjni
# 0.7.0, SoLoader's nativeloader 0.10.5; byte for byte upstream, see its PROVENANCE.md) and are
# used in place (a copy under build/ gets patches/); Kotlin's compiler comes from npm.
#
# Usage: build.sh PYTHON
# Prints the classpath and the native library directory on its last two lines. Exit status 3:
# skipped (no UPSTREAM directory, or no JDK 17+): the reason is printed, the caller says so.
# Cached: a second run with the same inputs does nothing (build/stamp).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PYTHON=${1:?usage: build.sh PYTHON}
UPSTREAM=${EXECUTORCH_ANDROID_HOST:-$(cd "$HERE/../../.." && pwd)/shared/upstream/executorch-android-host}
B=${HOST_RUNTIME_BUILD:-$HERE/build}
JOBS=${JOBS:-2}
ET_VERSION=1.5.1
KOTLIN_VERSION=2.4.20
JSR305=${JSR305_JAR:-/usr/share/java/jsr305.jar}

skip() {
  echo "host_runtime/build.sh: SKIPPED, the real-runtime tests cannot run: $*" >&2
  exit 3
}
[ -f "$UPSTREAM/PROVENANCE.md" ] \
  || skip "no ExecuTorch Android sources at $UPSTREAM (set EXECUTORCH_ANDROID_HOST to where they are)"
command -v javac >/dev/null || skip "no JDK (javac); run android_demo/core/ensure-jdk.sh"
JAVAC_MAJOR=$(javac -version 2>&1 | sed -n 's/^javac \([0-9]*\).*/\1/p')
[ "${JAVAC_MAJOR:-0}" -ge 17 ] || skip "javac is version ${JAVAC_MAJOR:-unknown}; ExecuTorch's Kotlin classes need 17 or later"
JAVA_HOME=${JAVA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v javac)")")")}
for tool in g++ npm; do
  command -v "$tool" >/dev/null || { echo "host_runtime/build.sh: $tool not found (ensure-jdk.sh installs it)" >&2; exit 1; }
done
[ -f "$JSR305" ] || { echo "host_runtime/build.sh: $JSR305 not found (apt-get install libjsr305-java)" >&2; exit 1; }

W=$("$PYTHON" -c 'import executorch; print(list(executorch.__path__)[0])')
VERSION=$("$PYTHON" -c 'from executorch.version import __version__; print(__version__)')
case $VERSION in
  "$ET_VERSION"*) ;;
  *) echo "host_runtime/build.sh: executorch $VERSION is installed; these sources are for $ET_VERSION" >&2; exit 1 ;;
esac
[ -f "$W/lib/libexecutorch.so" ] && [ -d "$W/include" ] \
  || { echo "host_runtime/build.sh: $W has no lib/libexecutorch.so or include/" >&2; exit 1; }

CLASSPATH_OUT="$B/classes/java:$B/classes/kotlin:$B/tools/node_modules/kotlin-compiler/lib/kotlin-stdlib.jar"
finish() {
  echo "$CLASSPATH_OUT"
  echo "$B/lib"
}

# Everything the build reads, hashed: same inputs, same build.
KEY=$( {
  cat "$HERE/build.sh" "$HERE"/patches/*.patch "$UPSTREAM/PROVENANCE.md"
  find "$HERE/shim" -type f -print0 | sort -z | xargs -0 cat
  echo "$W $VERSION $KOTLIN_VERSION"
  sha256sum "$W/lib/libexecutorch.so"
  javac -version 2>&1
  g++ --version | head -1
} | sha256sum | cut -d' ' -f1)
if [ -f "$B/stamp" ] && [ "$(cat "$B/stamp")" = "$KEY" ]; then
  echo "host_runtime/build.sh: cached ($B)" >&2
  finish
  exit 0
fi

START=$(date +%s)
rm -rf "$B/src" "$B/obj" "$B/lib" "$B/classes" "$B/stamp"
mkdir -p "$B/src" "$B/obj" "$B/lib" "$B/classes" "$B/tmp"
export TMPDIR=$B/tmp
export npm_config_cache=$B/tmp/npm npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false
# The kotlinc script runs `java` and caches under $HOME: keep both inside build/.
export JAVA_OPTS="-XX:-UsePerfData -Djava.io.tmpdir=$B/tmp -Duser.home=$B/tmp"

KOTLINC_HOME=$B/tools/node_modules/kotlin-compiler
if [ ! -x "$KOTLINC_HOME/bin/kotlinc" ] || [ "$(cat "$KOTLINC_HOME/build.txt" 2>/dev/null)" != "$KOTLIN_VERSION" ]; then
  echo "host_runtime/build.sh: kotlin-compiler $KOTLIN_VERSION from npm" >&2
  npm install --silent --prefix "$B/tools" "kotlin-compiler@$KOTLIN_VERSION" >&2
fi

cp -r "$UPSTREAM/." "$B/src/"
for p in "$HERE"/patches/*.patch; do
  patch -s -p1 -d "$B/src" <"$p"
done

# compile OUTDIR FLAGS SOURCES...: one object per source, JOBS at a time.
compile() {
  local out=$1 flags=$2
  shift 2
  mkdir -p "$out"
  printf '%s\0' "$@" | xargs -0 -n 1 -P "$JOBS" sh -c 'exec g++ $1 -c "$2" -o "$0/$(basename "$2" .cpp).o"' "$out" "$flags"
}
JNI_INC="-I$JAVA_HOME/include -I$JAVA_HOME/include/linux"
F=$B/src/fbjni/cxx
E=$B/src/executorch
# fbjni with the flags of its own CMakeLists.txt (v0.7.0), position-independent.
compile "$B/obj/fbjni" "-std=c++14 -pthread -fno-omit-frame-pointer -fexceptions -frtti -ffunction-sections \
  -O3 -DNDEBUG -DBUILDING_FBJNI -fPIC -pipe -Wno-attributes -I$F $JNI_INC" \
  "$F"/fbjni/*.cpp "$F"/fbjni/detail/*.cpp "$F"/lyra/*.cpp
g++ -shared -pthread -Wl,-soname,libfbjni.so -o "$B/lib/libfbjni.so" "$B"/obj/fbjni/*.o
# ExecuTorch's JNI layer against the wheel's headers, with the defines its libraries were built
# with (lib/cmake/executorch/executorch-config.cmake; ET_EVENT_TRACER_ENABLED changes class
# layouts). No ET_USE_THREADPOOL: it needs cpuinfo.h, which the wheel does not ship.
compile "$B/obj/executorch_jni" "-std=c++17 -O2 -DNDEBUG -fPIC -pipe -Wno-deprecated-declarations \
  -DC10_USING_CUSTOM_GENERATED_MACROS -DET_EVENT_TRACER_ENABLED -DEXECUTORCH_BUILD_EXTENSION_TRAINING=1 \
  -I$B/src -I$W/include -I$W/include/executorch/runtime/core/portable_type/c10 -I$F $JNI_INC" \
  "$E"/extension/android/jni/{jni_layer,jni_layer_training,jni_layer_runtime,jni_helper}.cpp \
  "$E"/extension/training/module/training_module.cpp \
  "$E"/extension/training/optimizer/sgd.cpp \
  "$E"/extension/runner_util/{inputs,inputs_portable}.cpp
# The kernels, the XNNPACK delegate and the thread pool register themselves from static
# initializers: linked although nothing names a symbol of theirs. Named libexecutorch_jni.so:
# the wheel's runtime is already libexecutorch.so (HostRuntime maps the name).
g++ -shared -o "$B/lib/libexecutorch_jni.so" "$B"/obj/executorch_jni/*.o -L"$B/lib" -lfbjni \
  -L"$W/lib" -Wl,--no-as-needed -lexecutorch_kernels_optimized -lexecutorch_backend_xnnpack \
  -lexecutorch_threadpool -Wl,--as-needed -lexecutorch \
  -Wl,--no-undefined -Wl,-rpath,'$ORIGIN' -Wl,-rpath,"$W/lib"

javac -J-XX:-UsePerfData -nowarn --release 17 -cp "$JSR305" -d "$B/classes/java" \
  $(find "$B/src/fbjni/java" "$B/src/soloader/java" "$HERE/shim" -name '*.java')
JAVA_TOOL_OPTIONS=-XX:-UsePerfData "$KOTLINC_HOME/bin/kotlinc" -nowarn -jvm-target 17 -no-reflect \
  -cp "$B/classes/java" -d "$B/classes/kotlin" \
  $(find "$B/src/executorch/extension/android/executorch_android/src/main/java" -name '*.kt') \
  2> >(grep -v '^Picked up JAVA_TOOL_OPTIONS' >&2)
echo "$KEY" >"$B/stamp"
echo "host_runtime/build.sh: built in $(($(date +%s) - START)) s ($B)" >&2
finish
