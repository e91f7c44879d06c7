"""The schema of a run's ``results.json``: what ``fedper simulate``, ``fedper fleet`` and
``fedper demo`` write and what every report reads (the demo's page, ``fedper report``, the
simulation's tables and plots, ``make results``).

The writers validate against it before writing (a run never leaves a file its readers cannot
read), and the readers get typed values, so a report is written against what a run can hold
rather than against one run's example. Files are written with only the keys the run set, so
the JSON is what it was before the schema existed; files from before a field existed load with
its default.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, JsonValue, ValidationError

from fedper.common.errors import FedperError

RESULTS_FILE = "results.json"

Count = Annotated[int, Field(ge=0)]
Round = Annotated[int, Field(ge=1)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Accuracy = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Spread = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]  # a std or standard error of accuracies
# A client's or a user's number, or a number of photos, as a JSON object key.
Key = Annotated[str, Field(pattern=r"^(0|[1-9][0-9]{0,5})$")]
Name = Annotated[str, Field(min_length=1, max_length=40)]


def _nan_is_none(value: Any) -> Any:
    return None if isinstance(value, float) and math.isnan(value) else value


# An accuracy that may be undefined: null, or NaN in files written before the schema.
MaybeAccuracy = Annotated[Accuracy | None, BeforeValidator(_nan_is_none)]


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MetricSummary(_Part):
    """A metric across the clients of one evaluation point (fedper.common.metrics.Summary)."""

    mean: Finite
    weighted_mean: Finite
    std: NonNegative
    count: Annotated[int, Field(ge=1)]


class RoundSummary(_Part):
    """One evaluation point: round r's start, or (``final``) after the last round."""

    round: Round
    clients: Annotated[int, Field(ge=1)]
    final: bool = False
    after_round: Count | None = None
    accuracy: MetricSummary | None = None
    accuracy_after: MetricSummary | None = None
    train_loss: MetricSummary | None = None


class AlgorithmSummary(_Part):
    """An algorithm's headline (fedper.results.RunRecorder.final); ``last5_*`` absent when no
    client had a finite accuracy, and in files written before they existed."""

    final_round: Round
    final_after_round: Count | None = None
    final_point: str
    final_mean_accuracy: Accuracy
    final_weighted_mean_accuracy: Accuracy
    final_std: NonNegative
    final_per_client: dict[Key, Accuracy]
    last5_mean_accuracy: Accuracy | None = None
    last5_std: NonNegative | None = None
    last5_rounds: list[Round] = []
    last5_per_client: dict[Key, Accuracy] = {}


class BaselineSummary(_Part):
    """A baseline on the run's own split (fedper.baselines); a client without a test split has
    no accuracy (null)."""

    mean_accuracy: Accuracy
    std: NonNegative
    per_client: dict[Key, MaybeAccuracy]


class CurvePoint(_Part):
    """New users at one number of photos N: how many users had N, and their accuracy (``se`` is
    null below two users; nothing but ``users`` when none had N)."""

    users: Count
    mean: Accuracy | None = None
    std: Spread | None = None
    se: Spread | None = None
    per_user: dict[Key, Accuracy] = {}


class NewUsers(_Part):
    """Held-out users' fine-tuning curves (recipes/new_users.py)."""

    users: list[Count]
    pool_sizes: list[Count]
    test_sizes: list[Count]
    sizes: list[Count]
    steps: Annotated[int, Field(ge=1)]
    curves: dict[Name, dict[Key, CurvePoint]]


class PrivacySummary(_Part):
    """What DP-FedAvg spent: the simulation's accountant, or a server's ``/v1/status``."""

    epsilon: NonNegative | None  # null: no noise (infinite)
    delta: Annotated[float, Field(gt=0, lt=1)]
    rounds: Count
    noise_multiplier: NonNegative
    sampling_probability: Annotated[float, Field(gt=0, le=1)]
    target_epsilon: NonNegative | None = None
    clip_norm: NonNegative | None = None  # a server's: the open round's clip
    accountant: str | None = None
    stopped_before_round: Round | None = None


class Environment(_Part):
    """What computed the floats (fedper.environment.numeric_environment)."""

    torch: str
    executorch: str | None = None
    numpy: str | None = None
    python: str
    cpu: str
    machine: str
    cores: Count | None = None
    cpu_capability: str
    torch_threads: Annotated[int, Field(ge=1)]
    kernel_variables: dict[str, str] = {}


class SecureSetup(_Part):
    """A secure demo's SecAgg+ parameters with the whole fleet in a round."""

    neighbours: Annotated[int, Field(ge=1)]
    threshold: Annotated[int, Field(ge=1)]
    clip: NonNegative | None  # null: the round's DP clip
    weight_cap: Annotated[int, Field(ge=1)]


class DemoSetup(_Part):
    """What the demo ran, as its page says it."""

    devices: Annotated[int, Field(ge=1)]
    rounds: Annotated[int, Field(ge=1)]  # asked for; each fleet's rounds say how many it ran
    local_epochs: Annotated[int, Field(ge=1)]
    batch_size: Annotated[int, Field(ge=1)]
    learning_rate: NonNegative
    momentum: NonNegative
    kp: Count
    head: Name
    images_per_user: tuple[Count, Count]
    engine: Name
    workers: Annotated[int, Field(ge=1)]
    seed: int
    dp: bool = False
    secure: SecureSetup | None = None


class BaseCard(_Part):
    """What the packaged pretrained base's model card says about it, as the page shows it."""

    commit: str
    epochs: Annotated[int, Field(ge=1)]
    images: Count
    image_size: Annotated[int, Field(ge=1)]
    seed: int
    raters: str
    looks: dict[Name, Finite]  # held-out R² of each photographic property
    category_accuracy: Accuracy


class ScratchBase(_Part):
    """The base's version 0 was random weights."""

    kind: Literal["scratch"]


class CheckpointBase(_Part):
    """The base's version 0 came from a checkpoint the user gave."""

    kind: Literal["checkpoint"]
    path: str
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class PretrainedBase(_Part):
    """The base's version 0 was the pretrained base the toolkit ships, with its model card."""

    kind: Literal["pretrained"]
    path: str
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    card: BaseCard


BaseSource = Annotated[ScratchBase | CheckpointBase | PretrainedBase, Field(discriminator="kind")]


class Traffic(_Part):
    """A fleet's bytes on the wire, as its server counted them, and per device per round run."""

    up: Count
    down: Count
    rounds: Count  # rounds the fleet ran (evaluation points but the final one)
    up_per_device_round: NonNegative | None = None  # null: no round ran
    down_per_device_round: NonNegative | None = None


class Comparison(_Part):
    """FedPer minus FedAvg per device, on the devices both evaluated at their final point."""

    devices: Count
    difference: Finite | None = None  # null: no device in common
    standard_error: NonNegative | None = None  # null below two devices
    devices_won: Count
    devices_lost: Count
    fedper_last_rounds: Accuracy | None = None
    fedavg_last_rounds: Accuracy | None = None
    last_rounds: Count


class Export(_Part):
    sizes: dict[str, Count]
    seconds: NonNegative


class DemoSummary(_Part):
    """``fedper demo``'s own part of results.json: what its page shows beside the run's numbers."""

    setup: DemoSetup
    base: BaseSource
    step_ms: NonNegative
    timings: dict[Name, NonNegative]
    traffic: dict[Name, Traffic]
    export: Export
    comparison: Comparison | None = None  # null: a fleet recorded no round
    majority_baseline: Accuracy | None = None
    fedper_minus_majority: Finite | None = None


class RunResults(_Part):
    """A whole ``results.json``."""

    config: dict[str, JsonValue]
    environment: Environment | None = None
    algorithms: dict[Name, AlgorithmSummary]
    baselines: dict[Name, BaselineSummary] = {}
    rounds: dict[Name, list[RoundSummary]] = {}
    new_users: NewUsers | None = None
    aggregation: dict[Name, list[dict[str, JsonValue]]] = {}
    privacy: dict[Name, PrivacySummary] = {}
    demo: DemoSummary | None = None

    def to_json(self) -> str:
        """The file's text: the keys the run set, in the order they were set."""
        return json.dumps(self.model_dump(mode="json", exclude_unset=True), indent=2) + "\n"


def report_number(report: dict[str, JsonValue], key: str) -> float:
    """A number of one round's aggregation report (robust or DP: their keys differ)."""
    value = report.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FedperError(f"an aggregation report has no number {key!r}: {report}")
    return float(value)


def parse_results(data: Any, source: str) -> RunResults:
    """``data`` (a results.json's content, or what a run is about to write) as RunResults; a
    FedperError naming ``source`` and each field that does not fit otherwise."""
    try:
        return RunResults.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'the top level'}: {e['msg']}" for e in exc.errors()[:5])
        more = f" (and {exc.error_count() - 5} more)" if exc.error_count() > 5 else ""
        raise FedperError(f"{source} is not a run's results: {problems}{more}") from None


def load_results(run_dir: Path) -> RunResults:
    """``run_dir/results.json``, checked against the schema, with a clear error for a missing,
    unreadable or malformed file."""
    path = Path(run_dir) / RESULTS_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise FedperError(f"{path} does not exist: is {run_dir} a finished run?") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FedperError(f"{path} cannot be read as JSON: {exc}") from None
    return parse_results(data, str(path))
