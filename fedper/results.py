"""Per-client, per-round metrics of a federated run and the files they are reported in.

Shared by ``fedper simulate`` and ``fedper fleet`` so both report the same way:
``results.json`` (config, per-round summaries, final summary), ``metrics.csv``
(one row per client per round) and PNG plots.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fedper.atomic_write import atomic_write_text
from fedper.metrics import summarize

CSV_FIELDS = (
    "algorithm",
    "round",
    "client",
    "num_samples",
    "accuracy",
    "accuracy_after",
    "train_loss",
)


@dataclass(frozen=True)
class ClientRecord:
    """One client's numbers in one round; ``accuracy`` is measured before local training."""

    algorithm: str
    round: int
    client: int
    num_samples: int
    accuracy: float
    accuracy_after: float | None = None
    train_loss: float | None = None


class RunRecorder:
    """Collects ClientRecords and writes the run's report files."""

    def __init__(self, config: dict[str, Any]):
        self.config = config
        # name -> each client's accuracy on its own test split (fedper.baselines), client order
        self.baselines: dict[str, list[float]] = {}
        # new users' accuracy against their number of photos (recipes/new_users.py), if measured
        self.new_users: dict[str, Any] = {}
        self._records: dict[str, list[ClientRecord]] = defaultdict(list)

    def add(self, record: ClientRecord) -> None:
        self._records[record.algorithm].append(record)

    @property
    def algorithms(self) -> list[str]:
        return list(self._records)

    def records(self, algorithm: str) -> list[ClientRecord]:
        return list(self._records[algorithm])

    def rounds(self, algorithm: str) -> list[dict[str, Any]]:
        """Per round: summaries across clients of each metric."""
        by_round: dict[int, list[ClientRecord]] = defaultdict(list)
        for r in self._records[algorithm]:
            by_round[r.round].append(r)
        out = []
        for rnd in sorted(by_round):
            recs = by_round[rnd]
            row: dict[str, Any] = {"round": rnd, "clients": len(recs)}
            for metric in ("accuracy", "accuracy_after", "train_loss"):
                pairs = [
                    (getattr(r, metric), r.num_samples)
                    for r in recs
                    if getattr(r, metric) is not None and not math.isnan(getattr(r, metric))
                ]
                if pairs:
                    values, weights = zip(*pairs, strict=True)
                    row[metric] = summarize(values, weights).to_dict()
            out.append(row)
        return out

    def final(self, algorithm: str) -> dict[str, Any]:
        """The headline: each client's accuracy in the last round, before local training."""
        recs = self._records[algorithm]
        if not recs:
            return {}
        last = max(r.round for r in recs)
        final = sorted((r for r in recs if r.round == last), key=lambda r: r.client)
        s = summarize([r.accuracy for r in final], [r.num_samples for r in final])
        return {
            "final_round": last,
            "final_mean_accuracy": s.mean,
            "final_weighted_mean_accuracy": s.weighted_mean,
            "final_std": s.std,
            "final_per_client": {str(r.client): r.accuracy for r in final},
        }

    def baseline_summary(self) -> dict[str, dict[str, Any]]:
        """Each baseline's mean, std and per-client accuracies on the run's own split."""
        out = {}
        for name, accuracies in self.baselines.items():
            finite = [a for a in accuracies if math.isfinite(a)]
            if not finite:  # no client has a test split
                continue
            s = summarize(finite)
            out[name] = {"mean_accuracy": s.mean, "std": s.std,
                         "per_client": {str(c): a for c, a in enumerate(accuracies)}}  # fmt: skip
        return out

    def summary(self) -> dict[str, Any]:
        out = {
            "config": self.config,
            "algorithms": {a: self.final(a) for a in self.algorithms},
            "baselines": self.baseline_summary(),
            "rounds": {a: self.rounds(a) for a in self.algorithms},
        }
        if self.new_users:
            out["new_users"] = self.new_users
        return out

    def write(self, out: Path, plots: bool = True) -> None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "results.json", json.dumps(self.summary(), indent=2) + "\n")
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
        writer.writeheader()
        for algorithm in self.algorithms:
            for r in self._records[algorithm]:
                writer.writerow({k: "" if v is None else v for k, v in asdict(r).items()})
        atomic_write_text(out / "metrics.csv", buf.getvalue())
        if plots:
            from fedper.plots import plot_run

            plot_run(self, out)


def config_json(config: Any) -> dict[str, Any]:
    """A config dataclass as it goes into results.json: flat, as on the command line (a nested
    config's fields beside the holder's), paths as strings, tuples as lists."""
    flat: dict[str, Any] = {}

    def add(values: dict[str, Any]) -> None:
        for k, v in values.items():
            if isinstance(v, dict):
                add(v)
            else:
                flat[k] = str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v

    add(asdict(config))
    return flat
