"""Counters for ``GET /metrics``, exposed in Prometheus' text format by its client library."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from fedper.common.protocol import PrivacySpent
from fedper.common.robust_aggregate import AggregationReport
from fedper.server.request_metrics import request_histogram
from fedper.server.run_history import REPORTED_METRICS, VersionReport
from fedper.server.storage import EndedRound, RoundState

# Seconds from a round's opening until its cohort was full: a draw after a check-in window, or
# the last slot handed out first come first served.
FILL_BUCKETS = (0.5, 1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
# Round durations: from a demo's seconds to a day-long round of a production deployment.
ROUND_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 3 * 3600.0, 12 * 3600.0, 86400.0)

METRICS_PATH = "/metrics"  # an operator endpoint, outside the device protocol


class _Families(Collector):
    """A fixed set of metric families (one scrape's values)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


@dataclass
class AggregationCounts:
    """What robust aggregation did since this process started (the round log has each round's)."""

    clipped: int = 0  # updates scaled down (the norm bound) or clipped around the last step (centered-clip)
    capped: int = 0  # updates whose num_samples weight was capped
    coordinates_clipped: int = 0  # coordinate values held to the round's median +- c MAD

    def add(self, report: AggregationReport) -> None:
        self.clipped += report.clipped
        self.capped += report.capped
        self.coordinates_clipped += report.coordinates_clipped


@dataclass(frozen=True)
class RequestTotals:
    refused: dict[str, int]  # updates refused, by error code
    answers: dict[str, int]  # requests, by answer class (2xx ... 5xx)
    accepted: int
    bytes_in: int
    bytes_out: int


class MetricsRegistry:
    """What the server counts itself (uploads, bytes); the round numbers and in-flight uploads are
    read from the round state at each scrape."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._registry = CollectorRegistry(auto_describe=False)
        self.requests = request_histogram(self._registry)
        self.accepted = 0
        self.rejected: Counter[str] = Counter()
        self.bytes_in = 0
        self.bytes_out = 0
        self.started_at = time.time()

    def reject(self, code: str) -> None:
        with self._lock:
            self.rejected[code] += 1

    def accept(self, nbytes: int) -> None:
        with self._lock:
            self.accepted += 1
            self.bytes_in += nbytes

    def received(self, nbytes: int) -> None:
        """Bytes of an accepted message that is not an update (a secure round's keys, shares, answers)."""
        with self._lock:
            self.bytes_in += nbytes

    def sent(self, nbytes: int) -> None:
        with self._lock:
            self.bytes_out += nbytes

    def totals(self) -> RequestTotals:
        """What this process counted since it started, for the dashboard."""
        answers: Counter[str] = Counter()
        for family in self.requests.collect():
            for sample in family.samples:
                if sample.name.endswith("_count"):
                    answers[sample.labels["answer"]] += int(sample.value)
        with self._lock:
            return RequestTotals(dict(self.rejected), dict(sorted(answers.items())), self.accepted, self.bytes_in,
                                 self.bytes_out)  # fmt: skip

    def render(
        self, rounds_closed: int, current_round: int, aggregation_seconds: float, in_flight: int,
        aggregation: AggregationCounts | None = None, not_published: int = 0, draining: bool = False,
        privacy: PrivacySpent | None = None, ended: list[EndedRound] | None = None,
        disk: tuple[int | None, int] = (None, 0), round_timeout: float = 0.0,
        versions: list[VersionReport] | None = None,
    ) -> bytes:  # fmt: skip
        """One scrape. ``disk``: the bytes free (None: not measurable) and the reserve a round
        needs (--min-free-mib); ``round_timeout``: --round-timeout (0: none), for the alert rules;
        ``versions``: what devices reported per model version."""
        counts = aggregation if aggregation is not None else AggregationCounts()
        with self._lock:
            rejected = CounterMetricFamily("fedper_updates_rejected", "updates refused, by error code", labels=["code"])
            for code, n in sorted(self.rejected.items()):
                rejected.add_metric([code], n)
            families = [
                CounterMetricFamily("fedper_rounds_closed", "rounds closed", value=rounds_closed),
                GaugeMetricFamily("fedper_current_round", "the open round (0: none yet)", value=current_round),
                CounterMetricFamily("fedper_updates_accepted", "updates accepted", value=self.accepted),
                rejected,
                CounterMetricFamily(
                    "fedper_bytes_received",
                    "bytes of accepted updates and secure-aggregation messages",
                    value=self.bytes_in,
                ),
                CounterMetricFamily(
                    "fedper_bytes_sent",
                    "bytes of bases, artifacts and secure-aggregation relays sent",
                    value=self.bytes_out,
                ),
                CounterMetricFamily(
                    "fedper_aggregation_seconds", "seconds spent folding and closing", value=aggregation_seconds
                ),
                GaugeMetricFamily("fedper_uploads_in_flight", "upload bodies being received now", value=in_flight),
                CounterMetricFamily(
                    "fedper_updates_clipped",
                    "updates scaled to the round's norm bound or clipped around the last step (robust aggregation)",
                    value=counts.clipped,
                ),
                CounterMetricFamily(
                    "fedper_updates_weight_capped", "updates whose num_samples weight was capped", value=counts.capped
                ),
                CounterMetricFamily(
                    "fedper_coordinates_clipped",
                    "coordinate values held to the round's median plus or minus --coordinate-clip MADs",
                    value=counts.coordinates_clipped,
                ),
                CounterMetricFamily(
                    "fedper_rounds_not_published",
                    "rounds whose aggregate failed a publish check (abandoned instead)",
                    value=not_published,
                ),
                GaugeMetricFamily(
                    "fedper_draining", "1 while the disk is too full to take uploads", value=int(draining)
                ),
                GaugeMetricFamily("fedper_disk_reserve_bytes", "bytes a round needs free (--min-free-mib)",
                                  value=disk[1]),
                GaugeMetricFamily("fedper_round_timeout_seconds", "--round-timeout (0: rounds have no deadline)",
                                  value=round_timeout),
            ]  # fmt: skip
            if disk[0] is not None:
                families.append(GaugeMetricFamily("fedper_disk_free_bytes", "bytes free on the data directory's disk",
                                                  value=disk[0]))  # fmt: skip
            if privacy is not None:  # DP-FedAvg (docs/PRIVACY.md); no epsilon without noise
                families += [
                    GaugeMetricFamily("fedper_dp_clip_norm", "the open round's DP clip norm", value=privacy.clip_norm),
                    CounterMetricFamily("fedper_dp_rounds", "rounds noised so far", value=privacy.rounds),
                    GaugeMetricFamily("fedper_dp_delta", "the delta epsilon is reported at", value=privacy.delta),
                ]
                if privacy.epsilon is not None:
                    epsilon = GaugeMetricFamily("fedper_dp_epsilon", "epsilon spent so far", value=privacy.epsilon)
                    families.append(epsilon)
                if privacy.target_epsilon is not None:
                    families.append(GaugeMetricFamily("fedper_dp_target_epsilon", "the epsilon the run stops at",
                                                      value=privacy.target_epsilon))  # fmt: skip
        families += round_families(ended or [])
        families += version_families(versions or [])
        families += list(self._registry.collect())
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families(families))
        return generate_latest(registry)


def round_families(ended: list[EndedRound]) -> list[Metric]:
    """What the ended rounds say (read from the database at each scrape, so every process of a
    server and a restart agree): how many ended each way, how long they were open, and the last
    one's cohort: checked in, drawn (held a slot when it ended), reported, dropped (drawn, not
    reported)."""
    by_state = CounterMetricFamily("fedper_rounds_ended", "rounds ended, by how", labels=["state"])
    for state in (RoundState.CLOSED, RoundState.ABANDONED):
        by_state.add_metric([state.value], sum(r.state == state for r in ended))
    duration = _histogram("fedper_round_duration_seconds", "how long ended rounds were open",
                          [r.seconds for r in ended], ROUND_BUCKETS)  # fmt: skip
    fill = _histogram("fedper_cohort_fill_seconds", "from a round's opening until its cohort was full (rounds "
                      "whose cohort filled)", [r.fill_seconds for r in ended if r.fill_seconds is not None],
                      FILL_BUCKETS)  # fmt: skip
    families: list[Metric] = [by_state, duration, fill]
    if ended:
        last = ended[-1]
        families.append(GaugeMetricFamily("fedper_last_round", "the last ended round's number", value=last.round))
        families.append(GaugeMetricFamily("fedper_last_round_end_timestamp_seconds", "when it ended (Unix time)",
                                          value=last.ended_at))  # fmt: skip
        families.append(GaugeMetricFamily("fedper_last_round_reported", "its updates accepted", value=last.reported))
        if last.checked_in is not None and last.drawn is not None:
            families += [
                GaugeMetricFamily("fedper_last_round_checked_in", "devices that checked in", value=last.checked_in),
                GaugeMetricFamily("fedper_last_round_drawn", "devices holding a slot at its end", value=last.drawn),
                GaugeMetricFamily("fedper_last_round_dropped", "devices drawn that did not report",
                                  value=max(0, last.drawn - last.reported)),
            ]  # fmt: skip
        if last.aggregation is not None:  # robust aggregation's report of a closed round
            did = GaugeMetricFamily("fedper_last_round_aggregation", "what robust aggregation did to its updates",
                                    labels=["what"])  # fmt: skip
            for what in ("clipped", "capped", "coordinates_clipped"):
                did.add_metric([what], float(last.aggregation.get(what, 0)))
            families.append(did)
        refused = GaugeMetricFamily("fedper_last_round_refused", "its uploads refused, by error code", labels=["code"])
        for code, n in sorted(last.refused.items()):
            refused.add_metric([code], n)
        families.append(refused)
        if last.secure_stages:
            stages = GaugeMetricFamily("fedper_last_round_secure_messages",
                                       "a secure round's messages accepted, by stage", labels=["stage"])  # fmt: skip
            for stage, n in sorted(last.secure_stages.items()):
                stages.add_metric([stage], n)
            families.append(stages)
    return families


def _histogram(name: str, documentation: str, values: list[float], bounds: tuple[float, ...]) -> Metric:
    buckets = [(repr(bound), sum(v <= bound for v in values)) for bound in bounds]
    buckets.append(("+Inf", len(values)))
    return HistogramMetricFamily(name, documentation, buckets=buckets, sum_value=sum(values))


def version_families(reports: list[VersionReport]) -> list[Metric]:
    """What devices reported for the newest model version with reports: mean and quantiles per
    metric (fedper's own metric names only, so the labels are bounded); history is Prometheus'."""
    if not reports:
        return []
    newest = max(r.version for r in reports)
    summary = GaugeMetricFamily("fedper_reported", "devices' reported metric on the newest model version with "
                                "reports, by metric and statistic", labels=["metric", "stat"])  # fmt: skip
    count = GaugeMetricFamily("fedper_reported_count", "reports of the metric on that version", labels=["metric"])
    for r in reports:
        if r.version != newest or r.metric not in REPORTED_METRICS:
            continue
        for stat, value in (("mean", r.mean), ("p10", r.p10), ("p50", r.p50), ("p90", r.p90)):
            summary.add_metric([r.metric, stat], value)
        count.add_metric([r.metric], r.count)
    version = GaugeMetricFamily("fedper_reported_model_version", "the model version they trained from", value=newest)
    return [version, summary, count]
