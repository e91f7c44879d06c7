"""The run's ended rounds and what devices reported per model version, for ``/metrics`` and the
dashboard. An ended round never changes, so each is read from the database once: a scrape or a
dashboard poll reads only the rounds that ended since the last one, whatever the run's length."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from fedper.server.storage import Database, EndedRound

# The device metrics summarized per version: the ones fedper's devices report (a label set an
# attacker cannot grow by naming metrics).
REPORTED_METRICS = ("accuracy", "accuracy_after", "train_loss")
KEPT_VERSIONS = 50  # the newest model versions whose reports are kept


@dataclass(frozen=True)
class VersionReport:
    """One metric as the devices that trained from one model version reported it."""

    version: int
    metric: str
    count: int
    mean: float
    p10: float
    p50: float
    p90: float


class RunHistory:
    def __init__(self, db: Database) -> None:
        self._db = db
        self._lock = threading.Lock()
        self._ended: list[EndedRound] = []
        self._values: dict[int, dict[str, list[float]]] = {}  # version -> metric -> values
        self._reports: list[VersionReport] = []  # summaries of _values, made again only when it changes

    def ended(self) -> list[EndedRound]:
        """Every ended round, oldest first."""
        with self._lock:
            self._catch_up()
            return list(self._ended)

    def versions(self) -> list[VersionReport]:
        """What the devices of ended rounds reported, per model version (the newest
        ``KEPT_VERSIONS``) and metric, oldest version first."""
        with self._lock:
            self._catch_up()
            return list(self._reports)

    def _catch_up(self) -> None:
        last = self._ended[-1].round if self._ended else 0
        new = self._db.rounds.ended_after(last)
        if not new:
            return
        newest = max(r.model_version for r in new)  # older versions' reports would be dropped at once
        changed: set[int] = set()
        for version, metrics in self._db.rounds.reported_metrics(new[0].round, new[-1].round,
                                                                 newest - KEPT_VERSIONS + 1):  # fmt: skip
            kept = self._values.setdefault(version, {})
            for metric in REPORTED_METRICS:
                if metric in metrics:
                    kept.setdefault(metric, []).append(metrics[metric])
                    changed.add(version)
        for version in sorted(self._values)[:-KEPT_VERSIONS]:
            del self._values[version]
        unchanged = [r for r in self._reports if r.version in self._values and r.version not in changed]
        fresh = [_summary(v, metric, values) for v in changed if v in self._values
                 for metric, values in sorted(self._values[v].items())]  # fmt: skip
        self._reports = sorted(unchanged + fresh, key=lambda r: (r.version, r.metric))
        self._ended += new


def _summary(version: int, metric: str, values: list[float]) -> VersionReport:
    p10, p50, p90 = (float(q) for q in np.quantile(values, [0.1, 0.5, 0.9]))
    return VersionReport(version, metric, len(values), float(np.mean(values)), p10, p50, p90)
