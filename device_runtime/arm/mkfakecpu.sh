#!/bin/sh
# Writes /proc/cpuinfo and /sys/devices/system/cpu of an emulated NCPU-core Cortex-A76 into ROOT:
# qemu-user 7.2 shows the host's x86 ones, and torch's and XNNPACK's CPU detection crash on them
# (docs/DEVICES.md, "An ARM device on this machine"). qemu's -L prefix resolves /proc/cpuinfo and
# /sys paths to these files. Usage: mkfakecpu.sh ROOT [NCPU]
set -eu
R=$1
N=${2:-2}
MIDR=0x414fd0b1 # qemu's cortex-a76 (QEMU_CPU=cortex-a76)
rm -rf "$R/sys/devices/system/cpu"
mkdir -p "$R/proc" "$R/sys/devices/system/cpu"
: >"$R/proc/cpuinfo"
i=0
while [ "$i" -lt "$N" ]; do
  cat >>"$R/proc/cpuinfo" <<EOC
processor	: $i
BogoMIPS	: 50.00
Features	: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer	: 0x41
CPU architecture: 8
CPU variant	: 0x4
CPU part	: 0xd0b
CPU revision	: 1

EOC
  c="$R/sys/devices/system/cpu/cpu$i"
  mkdir -p "$c/regs/identification" "$c/topology"
  printf '0x%016x\n' $MIDR >"$c/regs/identification/midr_el1"
  echo "$i" >"$c/topology/core_id"
  echo 0 >"$c/topology/physical_package_id"
  echo "0-$((N - 1))" >"$c/topology/core_siblings_list"
  echo "$i" >"$c/topology/thread_siblings_list"
  i=$((i + 1))
done
for f in possible present online; do echo "0-$((N - 1))" >"$R/sys/devices/system/cpu/$f"; done
