"""Finished runs for the tests of what reads them, written by the run's own recorder (so they are
what a run writes, schema and all, not a hand-made subset)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedper.results import ClientRecord, RunRecorder

FIRST_ROUND_GAP = 0.02  # round 1 is this much below the final point: the last-5 mean is final - 0.01


def write_run(
    path: Path,
    per_client: dict[str, list[float]],
    config: dict[str, Any] | None = None,
    baselines: dict[str, list[float]] | None = None,
    **parts: Any,
) -> Path:
    """A run of one round and its final point per algorithm, each client's final accuracy as
    given (and ``FIRST_ROUND_GAP`` below it at round 1); ``parts``: the recorder's other
    attributes (``aggregation``, ``privacy``, ``new_users``)."""
    sim = {"kp": 2, "base": "model", "head": "ordinal", "init": "pretrained"}
    recorder = RunRecorder(config if config is not None else {"simulation": sim})
    for algorithm, values in per_client.items():
        for client, accuracy in enumerate(values):
            recorder.add(ClientRecord(algorithm, 1, client, 100, accuracy - FIRST_ROUND_GAP, accuracy, 1.0))
            recorder.add(ClientRecord(algorithm, 2, client, 100, accuracy, final=True))
    recorder.baselines = baselines or {}
    for name, value in parts.items():
        setattr(recorder, name, value)
    recorder.write(path, plots=False)
    return path
