"""Per-client, per-round metrics of a federated run and the files they are reported in.

Shared by ``fedper simulate`` and ``fedper fleet`` so both report the same way:
``results.json`` (config, per-round summaries, final summary), ``metrics.csv``
(one row per client per evaluation point) and PNG plots.

Evaluation points: round r's point is each client's accuracy at the start of round r (the
received base + its own head, before local training), and one more, the *final* point, is
recorded after the last round's aggregation under round number N + 1 (N = the last round):
the final base + each client's final head. It is the one record with ``final=True``, and the
headline (:meth:`RunRecorder.final`).
"""

from __future__ import annotations

import csv
import io
import math
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedper.common.atomic_write import atomic_write_text
from fedper.common.config_cli import option_values
from fedper.common.metrics import summarize
from fedper.run_results import RESULTS_FILE, DemoSummary, RunResults, parse_results

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

CSV_FIELDS = (
    "algorithm",
    "round",
    "client",
    "num_samples",
    "accuracy",
    "accuracy_after",
    "train_loss",
    "final",
)
LAST_POINTS = 5  # last5_mean_accuracy averages over this many evaluation points


@dataclass(frozen=True)
class ClientRecord:
    """One client's numbers at one evaluation point.

    In round r: ``accuracy`` at the start of the round, before local training; ``accuracy_after``
    and ``train_loss`` if it trained. ``final``: the evaluation after the last round N's
    aggregation (final base + the client's final head), recorded as round N + 1 with neither.
    """

    algorithm: str
    round: int
    client: int
    num_samples: int
    accuracy: float
    accuracy_after: float | None = None
    train_loss: float | None = None
    final: bool = False


def point_label(round_number: int, final: bool) -> str:
    """How a report names an evaluation point: "after round N" for the final one."""
    return f"after round {round_number - 1}" if final else f"start of round {round_number}"


class RunRecorder:
    """Collects ClientRecords and writes the run's report files."""

    def __init__(self, config: dict[str, Any], environment: dict[str, Any] | None = None):
        self.config = config
        # what computed the floats (fedper.environment): the same seed gives the same numbers
        # only on the same kernel set
        self.environment = environment
        # name -> each client's accuracy on its own test split (fedper.baselines), client order
        self.baselines: dict[str, list[float]] = {}
        # new users' accuracy against their number of photos (recipes/new_users.py), if measured
        self.new_users: dict[str, Any] = {}
        # algorithm -> per round, what robust aggregation did (fedper.common.robust_aggregate.AggregationReport)
        self.aggregation: dict[str, list[dict[str, Any]]] = defaultdict(list)
        # algorithm -> what DP-FedAvg spent (fedper.common.dp.accountant.PrivacyBudget.to_dict), under --dp
        self.privacy: dict[str, dict[str, Any]] = {}
        # what `fedper demo` adds for its page (recipes/demo.py)
        self.demo: DemoSummary | None = None
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
            recs = sorted(by_round[rnd], key=lambda r: r.client)  # not arrival order: sums must not vary
            row: dict[str, Any] = {"round": rnd, "clients": len(recs)}
            if any(r.final for r in recs):
                row["final"] = True
                row["after_round"] = rnd - 1
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
        """The headline: each client's accuracy at the final evaluation point, after the last
        round's aggregation (final base + its own final head), summarized across clients.

        ``final_round`` is that point's round number in metrics.csv and ``rounds`` (the last
        round N + 1), ``final_after_round`` is N, ``final_point`` says it in words. A run
        without a final point (e.g. a fleet whose devices all failed before it) falls back to
        the last round's start-of-round accuracy, and ``final_point`` says so.
        Plus :meth:`last_points` (``last5_*``).
        """
        recs = self._records[algorithm]
        if not recs:
            return {}
        finals = [r for r in recs if r.final]
        last = max(r.round for r in finals or recs)
        chosen = sorted((r for r in finals or recs if r.round == last), key=lambda r: r.client)
        s = summarize([r.accuracy for r in chosen], [r.num_samples for r in chosen])
        return {
            "final_round": last,
            "final_after_round": last - 1 if finals else None,
            "final_point": point_label(last, bool(finals)),
            "final_mean_accuracy": s.mean,
            "final_weighted_mean_accuracy": s.weighted_mean,
            "final_std": s.std,
            "final_per_client": {str(r.client): r.accuracy for r in chosen},
            **self.last_points(algorithm),
        }

    def last_points(self, algorithm: str) -> dict[str, Any]:
        """A headline less sensitive to one round's noise: ``last5_mean_accuracy`` is the mean
        over clients of each client's mean accuracy over the run's last 5 (``LAST_POINTS``)
        evaluation points (the 5 largest round numbers with any record, the final point included;
        a client missing at some of them is averaged over those it has), ``last5_std`` the
        population std of those per-client means, ``last5_rounds`` the round numbers used."""
        recs = self._records[algorithm]
        points = sorted({r.round for r in recs})[-LAST_POINTS:]
        per_client: dict[int, list[float]] = defaultdict(list)
        for r in recs:
            if r.round in points and math.isfinite(r.accuracy):
                per_client[r.client].append(r.accuracy)
        if not per_client:
            return {}
        means = {c: sum(v) / len(v) for c, v in sorted(per_client.items())}
        s = summarize(list(means.values()))
        return {
            "last5_mean_accuracy": s.mean,
            "last5_std": s.std,
            "last5_rounds": points,
            "last5_per_client": {str(c): m for c, m in means.items()},
        }

    def baseline_summary(self) -> dict[str, dict[str, Any]]:
        """Each baseline's mean, std and per-client accuracies on the run's own split."""
        out = {}
        for name, accuracies in self.baselines.items():
            finite = [a for a in accuracies if math.isfinite(a)]
            if not finite:  # no client has a test split
                continue
            s = summarize(finite)
            per_client = {str(c): a if math.isfinite(a) else None for c, a in enumerate(accuracies)}
            out[name] = {"mean_accuracy": s.mean, "std": s.std, "per_client": per_client}
        return out

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "config": self.config,
            **({"environment": self.environment} if self.environment is not None else {}),
            "algorithms": {a: self.final(a) for a in self.algorithms},
            "baselines": self.baseline_summary(),
            "rounds": {a: self.rounds(a) for a in self.algorithms},
        }
        if self.new_users:
            out["new_users"] = self.new_users
        if self.aggregation:
            out["aggregation"] = dict(self.aggregation)
        if self.privacy:
            out["privacy"] = self.privacy
        if self.demo is not None:
            out["demo"] = self.demo.model_dump(mode="json", exclude_unset=True)
        return out

    def results(self) -> RunResults:
        """The summary as results.json's schema has it; a FedperError if the run produced
        something its readers could not read (before anything is written)."""
        return parse_results(self.summary(), "the run's results")

    def write(self, out: Path, plots: bool = True) -> RunResults:
        """results.json, metrics.csv, then the plots (each file whole or not at all): what the
        run measured is on disk before anything draws or renders it."""
        results = self.results()
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / RESULTS_FILE, results.to_json())
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
        writer.writeheader()
        for algorithm in self.algorithms:
            for r in sorted(self._records[algorithm], key=lambda r: (r.round, r.client)):
                writer.writerow({k: "" if v is None else v for k, v in asdict(r).items()})
        atomic_write_text(out / "metrics.csv", buf.getvalue())
        if plots:
            from fedper.plots import plot_run

            plot_run(results, out)
        return results


def config_json(config: DataclassInstance) -> dict[str, Any]:
    """A config dataclass as it goes into results.json: flat, as on the command line (a nested
    config's options beside the holder's, by option name), paths as strings, tuples as lists
    (within tuples too: ``--model-arg``'s pairs)."""
    return {k: _json_value(v) for k, v in option_values(config).items()}


def _json_value(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple | list):
        return [_json_value(v) for v in value]
    return value
