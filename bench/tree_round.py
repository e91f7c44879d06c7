"""A tree of ``fedper serve`` processes against one server (docs/SCALING.md, "Hierarchical
aggregation"), measured in one run: the same ``--uploads`` MobileNet-V1 width-0.25 updates per
round, into one server, or spread evenly over R regional servers under a root.

Per round: the uploads' wall time (``--concurrency`` at a time, each device at its own server),
the time from the last 202 until the aggregating server publishes (the flat server's close; in a
tree the regions' forwards on their next tick, the root's close, which comes with the last sum),
and the bytes the aggregating server received (its ``fedper_bytes_received`` counter: updates for
the flat server, regions' float64 sums for a root). Every server is a process on this machine;
the load comes from this process on the same cores.

Usage: python -m bench.tree_round [--regions 2 4] [--uploads 48] [--rounds 3] [--name tree_round]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import write_results
from bench.replica_scale import ADMIN, ENROLL, _timed
from fedper.common.protocol import Header, Route
from fedper.server.process import ServerProcess, metric_sample

PLAIN = {"clip_factor": 0, "weight_cap": 0, "coordinate_clip": 0, "min_clients": 1, "rounds": 100,
         "round_timeout": 0, "enroll_total_per_minute": 0, "max_requests_per_address": 0}  # fmt: skip


def _bytes_in(server: ServerProcess) -> float:
    return metric_sample(httpx.get(server.url + "/metrics", timeout=30).text, "fedper_bytes_received_total")


def _version(server: ServerProcess) -> int:
    return int(httpx.get(server.url + Route.STATUS, timeout=30).json()["model_version"])


def measure(regions: int, args: argparse.Namespace, work: Path, body: Any) -> dict[str, Any]:
    """``regions`` 0: one server; else a root and that many regional servers."""
    artifacts, run = work / "artifacts", work / f"run-{regions}-{time.monotonic_ns()}"
    env = {"FEDPER_ADMIN_TOKEN": ADMIN, "FEDPER_ENROLLMENT_KEY": ENROLL}
    per = args.uploads // max(regions, 1)
    with contextlib.ExitStack() as stack:
        if regions == 0:
            top = stack.enter_context(ServerProcess(artifacts, run / "flat", {**PLAIN, "target_clients": args.uploads},
                                                    env=env, log=run / "flat.log"))  # fmt: skip
            edges = [top]
        else:
            top = stack.enter_context(ServerProcess(artifacts, run / "root", {**PLAIN, "regions": regions},
                                                    env=env, log=run / "root.log"))  # fmt: skip
            edges = [stack.enter_context(ServerProcess(
                artifacts, run / f"region-{k}", {**PLAIN, "target_clients": per, "root": top.url, "region": k,
                                                 "region_token_file": str(run / "root" / "region_tokens" / f"region-{k}")},
                env=env, log=run / f"region-{k}.log")) for k in range(regions)]  # fmt: skip
        rounds = []
        for number in range(1, args.rounds + 1):
            devices = []
            for edge in edges:
                made = httpx.post(edge.url + Route.ADMIN_DEVICES, json={"count": per if regions else args.uploads},
                                  headers={"Authorization": f"Bearer {ADMIN}"}, timeout=120)  # fmt: skip
                made.raise_for_status()
                devices += [(edge.url, {"Authorization": f"Bearer {d['token']}"}) for d in made.json()["devices"]]
            for url, headers in devices:  # each takes its slot of the round
                httpx.get(url + Route.TASK, headers=headers, timeout=60).raise_for_status()
            before = _bytes_in(top)

            def upload(url: str, headers: dict[str, str], n: int = number) -> Any:
                def call(client: httpx.Client) -> None:
                    r = client.post(url + Route.UPDATES.format(round_number=n), content=body(n - 1),
                                    headers={**headers, Header.CONTENT_TYPE: Header.OCTET_STREAM})  # fmt: skip
                    if r.status_code != 202:
                        raise RuntimeError(f"upload: {r.status_code} {r.text[:200]}")

                return call

            seconds, _ = _timed([upload(u, h) for u, h in devices], args.concurrency)
            last = time.perf_counter()
            deadline = time.monotonic() + 120
            while _version(top) < number:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"round {number} was not published")
                time.sleep(0.02)
            published = time.perf_counter() - last
            rounds.append({"round": number, "upload_s": seconds, "publish_after_s": published,
                           "aggregator_bytes_in": _bytes_in(top) - before})  # fmt: skip
            print({"regions": regions, **rounds[-1]}, flush=True)
            while regions and any(_version(e) < number for e in edges):  # the regions follow before the next round
                time.sleep(0.02)
    return {"regions": regions, "rounds": rounds}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.tree_round", description=__doc__)
    p.add_argument("--regions", type=int, nargs="+", default=[2, 4])
    p.add_argument("--uploads", type=int, default=48)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--name", default="tree_round")
    args = p.parse_args()
    from fedper.common import weights
    from fedper.common.manifest import read_manifest
    from fedper.export.pipeline import write_server_only_export
    from tests.support.server_support import base_like

    runs = []
    with tempfile.TemporaryDirectory(prefix="tree_round-") as tmp:
        work = Path(tmp)
        write_server_only_export(work / "artifacts", alpha=0.25)
        tensors = base_like(read_manifest(work / "artifacts"), seed=0)  # random, with variances >= 0

        def body(version: int) -> bytes:
            return weights.encode(tensors, {"num_samples": "10", "base_version": str(version)})

        for regions in [0, *args.regions]:
            runs.append(measure(regions, args, work, body))
    summary = {
        str(r["regions"]): {
            "upload_s_median": statistics.median(x["upload_s"] for x in r["rounds"]),
            "publish_after_s_median": statistics.median(x["publish_after_s"] for x in r["rounds"]),
            "aggregator_bytes_in_median": statistics.median(x["aggregator_bytes_in"] for x in r["rounds"]),
        }
        for r in runs
    }
    update_bytes = len(body(0))
    path = write_results(
        args.name, {"args": vars(args), "update_bytes": update_bytes, "runs": runs, "summary": summary}
    )
    print(summary)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
