"""What a secure round costs (docs/SCALING.md, "Secure aggregation"): bytes per device and CPU
per round, server and device, for cohorts of 10, 100 and 1,000, against plain FedAvg of the same
updates measured in the same run.

A measured model, not a fleet: the protocol's own device and server sessions
(``fedper.common.secagg``) run one round in this process on the demo's base (MobileNet-V1
width 0.25 at 32 px, ordinal head, kp=1), with the defaults ``fedper serve --secagg`` uses
(k = 2 ceil(log2 n), t = floor(k/2) + 1) and 5% of the devices dropping after sharing their keys
(at least one), so the server rebuilds their pairwise masks. Bytes are the bodies the protocol
sends (JSON as the server's models encode it, the masked words as raw bytes; HTTP headers and
the base's download, the same in both modes, left out). Server CPU is the time in the server's
session (routing, the running sum, putting secrets together, removing masks) plus decoding;
plain FedAvg's is ``fedper.common.aggregate.FedAvg`` over the same number of float32 updates
(what ``fedper serve`` folds), and its bytes the float32 safetensors upload.

Usage: python -m bench.secagg_cost [--cohorts 10,100,1000]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from bench.common import write_results
from fedper.common import weights
from fedper.common.aggregate import FedAvg
from fedper.common.protocol import (
    SecAggKeys,
    SecAggNeighbours,
    SecAggSealed,
    SecAggUnmaskAnswer,
    SecAggUnmaskRequest,
    octets_text,
)
from fedper.common.secagg.device_session import DeviceSession
from fedper.common.secagg.fixed_point import FixedPoint
from fedper.common.secagg.graph import default_neighbours, default_threshold
from fedper.common.secagg.server_session import ServerSession

DROP = 0.05
CONTEXT = b"0123456789abcdef0123456789abcdef"


def _layout() -> list[tuple[str, tuple[int, ...]]]:
    from fedper.models import ModelConfig, build_model, exchanged_state, split

    model = build_model(ModelConfig(name="mobilenet_v1", num_classes=5, alpha=0.25, input_size=32, head="ordinal"))
    state = exchanged_state(model)
    return [(n, tuple(state[n].shape)) for n in split(model, 1).base]


def secure_round(n: int, words: int) -> dict[str, float]:
    """One secure round of n devices: bytes each device sends and receives, device and server CPU."""
    k, names = default_neighbours(n), [f"d-{i:016x}" for i in range(n)]
    t = default_threshold(k)
    server_time = 0.0
    device_time = np.zeros(n)
    sent = np.zeros(n)
    received = np.zeros(n)

    def timed(i: int | None, call, *args):  # type: ignore[no-untyped-def]
        nonlocal server_time
        start = time.process_time()
        out = call(*args)
        spent = time.process_time() - start
        if i is None:
            server_time += spent
        else:
            device_time[i] += spent
        return out

    server = timed(None, ServerSession, names, k, t, words + 1, CONTEXT)
    devices = [timed(i, DeviceSession, d, CONTEXT) for i, d in enumerate(names)]
    for i, (d, s) in enumerate(zip(names, devices, strict=True)):
        a = timed(i, s.advertise)
        sent[i] += len(SecAggKeys(channel_key=octets_text(a.channel), mask_key=octets_text(a.mask)).model_dump_json())
        timed(None, server.advertise, d, a)
    for i, (d, s) in enumerate(zip(names, devices, strict=True)):
        neighbours = timed(None, server.neighbours, d)
        body = SecAggNeighbours(threshold=t, neighbours={m: SecAggKeys(channel_key=octets_text(a.channel),
                                                                      mask_key=octets_text(a.mask))
                                                         for m, a in neighbours.items()})  # fmt: skip
        received[i] += len(body.model_dump_json())
        sealed = timed(i, s.share_keys, neighbours, t)
        sent[i] += len(SecAggSealed(shares={m: octets_text(c) for m, c in sealed.items()}).model_dump_json())
        timed(None, server.share, d, sealed)
    for i, (d, s) in enumerate(zip(names, devices, strict=True)):
        mine = timed(None, server.shares_for, d)
        received[i] += len(SecAggSealed(shares={m: octets_text(c) for m, c in mine.items()}).model_dump_json())
        timed(i, s.receive_shares, mine)
    fixed = FixedPoint(1.0, n, 1000)
    rng = np.random.default_rng(0)
    dropped = set(range(max(1, round(DROP * n))))
    delta = rng.standard_normal(words)
    delta /= np.linalg.norm(delta)
    for i, (d, s) in enumerate(zip(names, devices, strict=True)):
        if i in dropped:
            continue
        masked = timed(i, lambda s=s: s.masked_input(fixed.encode(delta, 100)))
        sent[i] += 4 * (words + 1)
        timed(None, server.submit, d, masked)
    inside = timed(None, server.included)
    for i, (d, s) in enumerate(zip(names, devices, strict=True)):
        if d not in inside:
            continue
        who = timed(None, server.unmask_request, d)
        received[i] += len(SecAggUnmaskRequest(dropped=who[0], survivors=who[1]).model_dump_json())
        answer = timed(i, s.unmask, *who)
        sent[i] += len(SecAggUnmaskAnswer(shares={m: octets_text(v) for m, v in answer.items()}).model_dump_json())
        timed(None, server.answer, d, answer)
    total = timed(None, server.total)
    mean, _ = timed(None, fixed.decode, total)
    assert np.max(np.abs(mean - delta)) <= fixed.error_bound(n - len(dropped), 100 * (n - len(dropped)))
    live = [i for i in range(n) if i not in dropped]
    return {"k": k, "t": t, "dropped": len(dropped), "server_cpu_s": server_time,
            "device_cpu_s": float(np.mean(device_time[live])), "device_sent_bytes": float(np.mean(sent[live])),
            "device_received_bytes": float(np.mean(received[live]))}  # fmt: skip


def plain_round(n: int, layout: list[tuple[str, tuple[int, ...]]]) -> dict[str, float]:
    """FedAvg of n float32 updates as the server folds them (group=1), and the upload's size."""
    rng = np.random.default_rng(0)
    pool = [{name: rng.standard_normal(shape, dtype=np.float32) for name, shape in layout} for _ in range(4)]
    upload = len(weights.encode(pool[0], {"num_samples": "100", "base_version": "0"}))
    start = time.process_time()
    agg = FedAvg(layout, group=1)
    for i in range(n):
        agg.add(pool[i % 4], 100)
    agg.result()
    return {"server_cpu_s": time.process_time() - start, "device_sent_bytes": float(upload)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--cohorts", default="10,100,1000")
    args = p.parse_args()
    layout = _layout()
    words = sum(math.prod(s) for _, s in layout)
    rows = []
    print(f"base of {words} floats; 5% of devices (at least one) drop after sharing keys")
    print("| cohort n | k | t | dropped | bytes sent per device (SecAgg / plain) | received besides the base "
          "| device CPU (SecAgg extra) | server CPU (SecAgg / plain FedAvg) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for n in (int(c) for c in args.cohorts.split(",")):
        secure, plain = secure_round(n, words), plain_round(n, layout)
        rows.append({"cohort": n, "secure": secure, "plain": plain})
        print(f"| {n} | {secure['k']} | {secure['t']} | {secure['dropped']} | {secure['device_sent_bytes'] / 1e3:.1f} kB / "
              f"{plain['device_sent_bytes'] / 1e3:.1f} kB ({secure['device_sent_bytes'] / plain['device_sent_bytes']:.3f}x) "
              f"| {secure['device_received_bytes'] / 1e3:.1f} kB | {secure['device_cpu_s'] * 1e3:.0f} ms "
              f"| {secure['server_cpu_s'] * 1e3:.0f} ms / {plain['server_cpu_s'] * 1e3:.0f} ms "
              f"({secure['server_cpu_s'] / plain['server_cpu_s']:.1f}x) |", flush=True)  # fmt: skip
    write_results("secagg_cost", {"words": words, "drop": DROP, "rows": rows})


if __name__ == "__main__":
    main()
