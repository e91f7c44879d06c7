#!/usr/bin/env bash
# `make arm-check`: the device on the phone's instruction set. An aarch64 Debian root under
# qemu-user (made once, cached) runs the project's device code with the aarch64 wheels of its
# device extra: first the Python device's first training step on the demo's exported program,
# compared with the same step on this x86-64 machine (bounds from the spread x86 itself shows
# when the input moves by one ulp, measured in the same run), then `fedper device` for two rounds
# against a `fedper serve` on the host, whose uploads must be accepted and aggregated.
#
# Usage: arm_check.sh PYTHON    (the host's Python with fedper installed, e.g. .venv/bin/python)
# Cache: FEDPER_ARM_CACHE (default ~/.cache/fedper/arm64): root/ (Debian bookworm arm64, about
# 330 MB), site/ (the aarch64 wheels, about 5.5 GB: PyPI's aarch64 torch is its CUDA build and
# pulls NVIDIA's libraries). First run: root (debootstrap, needs root for chroot and binfmt_misc)
# and wheels, about 8 minutes and 3.5 GB of downloads; later runs: the check only.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PYTHON=${1:?usage: arm_check.sh PYTHON}
C=${FEDPER_ARM_CACHE:-$HOME/.cache/fedper/arm64}
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
UV_VERSION=0.13.9
export QEMU_CPU=${QEMU_CPU:-cortex-a76} # pinned: qemu's default "max" has SVE, and XNNPACK picks other kernels
mkdir -p "$C"
START=$(date +%s)
say() { echo "arm-check: $*" >&2; }

need_root() {
  [ "$(id -u)" -eq 0 ] || { say "building the arm64 root needs root (debootstrap, chroot, binfmt_misc): $1"; exit 1; }
}

# --- the arm64 root -------------------------------------------------------------------------
if [ ! -f "$C/root/.complete" ]; then
  need_root "run once as root, or point FEDPER_ARM_CACHE at a root built elsewhere"
  command -v qemu-aarch64-static >/dev/null && command -v debootstrap >/dev/null \
    || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-user-static debootstrap binfmt-support
  rm -rf "$C/root" "$C/root.partial"
  say "debootstrap $SUITE arm64 (first stage)"
  debootstrap --arch=arm64 --foreign --variant=minbase --include=python3,ca-certificates "$SUITE" "$C/root.partial" "$MIRROR" >&2
  # The second stage runs arm64 programs in a chroot: the kernel hands them to qemu (binfmt_misc).
  [ -f /proc/sys/fs/binfmt_misc/register ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  update-binfmts --enable qemu-aarch64 2>/dev/null || true
  cp "$(command -v qemu-aarch64-static)" "$C/root.partial/usr/bin/"
  say "debootstrap second stage (under qemu, about 3 minutes)"
  chroot "$C/root.partial" /debootstrap/debootstrap --second-stage >&2
  touch "$C/root.partial/.complete"
  mv "$C/root.partial" "$C/root"
fi
"$HERE/mkfakecpu.sh" "$C/root" 2

# --- the device extra's aarch64 wheels ----------------------------------------------------------
# uv resolves for the target platform (pip evaluates markers for the machine it runs on, and would
# pull x86-only packages); the lock is kept beside the wheels.
if [ ! -f "$C/site/.complete" ]; then
  if [ ! -x "$C/uv/bin/uv" ]; then
    "$PYTHON" -m venv "$C/uv"
    "$C/uv/bin/pip" install -q "uv==$UV_VERSION"
  fi
  rm -rf "$C/site"
  say "resolving fedper[device] for aarch64"
  "$C/uv/bin/uv" pip compile --quiet "$REPO/pyproject.toml" --extra device --python-version 3.11 \
    --python-platform aarch64-manylinux_2_28 -o "$C/lock.txt"
  say "installing $(grep -c '==' "$C/lock.txt") aarch64 packages"
  "$C/uv/bin/uv" pip install --quiet --target "$C/site" --python-version 3.11 --python-platform aarch64-manylinux_2_28 \
    --no-deps -r "$C/lock.txt"
  touch "$C/site/.complete"
fi

# Runs the root's Python 3.11 on the project's sources (no chroot, mount or root: qemu's -L prefix).
arm_python() {
  env PYTHONPATH="$C/import:$C/site" PYTHONDONTWRITEBYTECODE=1 \
    qemu-aarch64-static -L "$C/root" "$C/root/usr/bin/python3.11" "$@"
}
# `import fedper` from the checkout: the package is a folder of links (pyproject.toml), so a
# directory holding only a link named fedper to it is enough.
mkdir -p "$C/import"
ln -sfn "$REPO/fedper" "$C/import/fedper"

RUN=$C/run
rm -rf "$RUN"
mkdir -p "$RUN"
say "exporting the demo's model on the host"
"$PYTHON" -m fedper.cli export --model mobilenet_v1 --alpha 0.25 --input-size 32 --num-classes 10 --kp 2 --seed 0 \
  --out "$RUN/artifacts" >/dev/null

# --- the first training step, x86-64 against aarch64 -----------------------------------------
T0=$(date +%s)
"$PYTHON" "$HERE/first_step.py" step "$RUN/artifacts" "$RUN/x86.npz"
"$PYTHON" "$HERE/first_step.py" step "$RUN/artifacts" "$RUN/x86-ulp.npz" --perturb
T1=$(date +%s)
arm_python "$HERE/first_step.py" step "$RUN/artifacts" "$RUN/arm.npz" 2> >(grep -v 'cpuinfo_utils\|ExperimentalWarning\|TrainingModule(module)\|_pytree' >&2)
T2=$(date +%s)
"$PYTHON" "$HERE/first_step.py" compare "$RUN/x86.npz" "$RUN/x86-ulp.npz" "$RUN/arm.npz"

# --- two rounds of `fedper device` on aarch64 against `fedper serve` on the host ---------------
PORT=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export FEDPER_ENROLLMENT_KEY=arm-check-enrollment-key FEDPER_ADMIN_TOKEN=arm-check-admin-token-0123456789
"$PYTHON" -m fedper.cli serve --artifacts "$RUN/artifacts" --data-dir "$RUN/server" --port "$PORT" --rounds 2 \
  --target-clients 1 --min-clients 1 --round-timeout 0 --retry-after 1 >"$RUN/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  "$PYTHON" -c "import httpx, sys; sys.exit(httpx.get('http://127.0.0.1:$PORT/v1/health').status_code != 200)" 2>/dev/null && break
  sleep 0.3
done
T3=$(date +%s)
arm_python -m fedper.cli device --server "http://127.0.0.1:$PORT" --dataset digits --clients 4 --client-id 0 \
  --storage "$RUN/device" --threads 2 2> >(grep -v 'cpuinfo_utils\|ExperimentalWarning\|TrainingModule(module)\|_pytree' >&2)
T4=$(date +%s)
"$PYTHON" "$HERE/first_step.py" rounds "http://127.0.0.1:$PORT" "$RUN/server.log" 2
say "times: x86 steps $((T1 - T0)) s, aarch64 step under qemu $((T2 - T1)) s, two aarch64 rounds $((T4 - T3)) s," \
  "whole check $(($(date +%s) - START)) s (QEMU_CPU=$QEMU_CPU)"
