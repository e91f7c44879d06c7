"""What a device reports while it runs: typed events (the fleet's live view and ``fedper
device``'s log lines are built from them), and the summary of one round."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class RoundReport:
    round: int
    model_version: int
    num_samples: int
    accuracy: float | None  # None: an empty test split
    accuracy_after: float | None
    train_loss: float | None
    uploaded: bool
    received: int | None


@dataclass(frozen=True)
class Evaluated:
    """Scored its test split with the received base and its own head, before training."""

    round: int
    accuracy: float | None  # None: an empty test split
    kind: ClassVar[str] = "evaluated"


@dataclass(frozen=True)
class Dropped:
    """Quit the round after evaluating (the ``dropout`` knob)."""

    round: int
    kind: ClassVar[str] = "dropped"


@dataclass(frozen=True)
class Training:
    round: int
    kind: ClassVar[str] = "training"


@dataclass(frozen=True)
class Refused:
    """Trained, but the server did not take the update (e.g. ``not_in_cohort``: the slot had
    expired; ``round_not_open``: the round closed first) or the upload failed; the device asks
    for a task again."""

    round: int
    reason: str
    kind: ClassVar[str] = "refused"


@dataclass(frozen=True)
class Uploaded:
    report: RoundReport
    kind: ClassVar[str] = "uploaded"


@dataclass(frozen=True)
class FinalEvaluated:
    """After the run finished: scored its test split with the final base and its own final head.

    ``round`` is the server's last round + 1, the final point's number in results.json.
    """

    round: int
    model_version: int
    num_samples: int
    accuracy: float
    kind: ClassVar[str] = "final_evaluated"


@dataclass(frozen=True)
class Finished:
    """The server answered 410: the run is over."""

    kind: ClassVar[str] = "finished"


DeviceEvent = Evaluated | Dropped | Training | Refused | Uploaded | FinalEvaluated | Finished
Event = Callable[[DeviceEvent], None]


@dataclass(frozen=True)
class DeviceFailed:
    """A device's run ended with an error (reported by the fleet; the other devices go on)."""

    error: str
    kind: ClassVar[str] = "error"


@dataclass(frozen=True)
class WorkerDone:
    """A fleet worker process has no device left running."""

    worker: int
    kind: ClassVar[str] = "worker_done"


def describe(event: DeviceEvent) -> str:
    """One line for a log: the event's kind and its fields."""
    fields = dataclasses.asdict(event.report if isinstance(event, Uploaded) else event)
    return f"{event.kind} {fields}"
