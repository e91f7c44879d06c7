#!/usr/bin/env bash
# Reproduces every number in docs/RESULTS.md. Two runs at a time, one torch thread each.
# Usage: docs/reproduce_results.sh [OUT_DIR]   (about 45 minutes on 2 cores)
set -euo pipefail
OUT=${1:-runs/results}
FEDPER=${FEDPER:-.venv/bin/fedper}
mkdir -p "$OUT"
common=(--rounds 30 --seed 0 --threads 1)
digits=(--dataset digits --clients 10 --local-epochs 2 "${common[@]}")
synth=(--dataset aesthetic-synth --clients 10 --local-epochs 5 "${common[@]}")
run() { local name=$1; shift; "$FEDPER" simulate "$@" --out "$OUT/$name" > "$OUT/$name.log" 2>&1; }

run digits-k4 "${digits[@]}" --classes-per-client 4 --algorithms fedper,fedavg,local --kp 2 &
run synth "${synth[@]}" --algorithms fedper,fedavg,local --kp 2 &
wait
run digits-k10 "${digits[@]}" --classes-per-client 10 --algorithms fedper,fedavg,local --kp 2 &
run synth-kp1 "${synth[@]}" --algorithms fedper --kp 1 &
wait
for kp in 1 3 4; do run "digits-k4-kp$kp" "${digits[@]}" --classes-per-client 4 --algorithms fedper --kp "$kp"; done &
for kp in 3 4; do run "synth-kp$kp" "${synth[@]}" --algorithms fedper --kp "$kp"; done &
wait
run digits-k4-linear "${digits[@]}" --classes-per-client 4 --algorithms fedper --kp 2 --base linear &
run synth-linear "${synth[@]}" --algorithms fedper --kp 2 --base linear &
wait
run digits-k4-linear-kp1 "${digits[@]}" --classes-per-client 4 --algorithms fedper --kp 1 --base linear &
run synth-linear-kp1 "${synth[@]}" --algorithms fedper --kp 1 --base linear &
wait
"$FEDPER" report "$OUT"/digits-k4 "$OUT"/digits-k10 "$OUT"/digits-k4-kp[0-9] "$OUT"/digits-k4-linear "$OUT"/digits-k4-linear-kp1 \
    "$OUT"/synth "$OUT"/synth-kp[0-9] "$OUT"/synth-linear "$OUT"/synth-linear-kp1 | tee "$OUT/table.md"
