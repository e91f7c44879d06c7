"""``fedper probe-check``: a candidate base judged on a probe set the operator holds.

Made for ``fedper serve --publish-command "fedper probe-check --artifacts DIR --min-accuracy X
[data options]"``: the server appends the candidate base's file and publishes it only if this
exits 0 (docs/SERVER.md, "Publish checks and rollback"). The server loads no ML framework; this
command does, in its own process.

FedPer's head is personal, so a base is judged by what a head can read from it: for each client
of the probe set (any dataset ``fedper simulate`` reads, generated or from ``--data-root``), a
logistic regression on the candidate base's frozen features of the client's training photos,
scored on its test photos (the linear probe of ``recipes.pretrain_probe``). The mean over
clients must reach ``--min-accuracy``. One JSON line says what was measured; exit 0 passes, 1
refuses, 2 is a bad input (a file the manifest's loader refuses, an unknown dataset).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from fedper._recipes.pretrain_probe import frozen_features, user_probe
from fedper.common import weights
from fedper.common.config_cli import Positional, add_command, from_arguments, option
from fedper.common.errors import ConfigError
from fedper.common.manifest import read_manifest
from fedper.data import DataConfig, load_federated
from fedper.models import ModelConfig, build_model


@dataclass(frozen=True)
class ProbeCheckConfig:
    artifacts: Path = option(Path("artifacts"), "the export whose manifest describes the model", metavar="DIR")
    min_accuracy: float = option(0.0, "the probe's mean client accuracy a candidate must reach (0..1)")

    def __post_init__(self) -> None:
        if not 0 <= self.min_accuracy <= 1:
            raise ConfigError(f"--min-accuracy must be in [0, 1], got {self.min_accuracy}")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    add_command(
        sub, "probe-check", probe_check, [ProbeCheckConfig, DataConfig], skip=("holdout_clients", "validate"),
        positionals=[Positional("candidate", Path, "BASE", "the candidate base (safetensors)")],
        help="judge a candidate base on a probe set (for fedper serve --publish-command)",
        description="Fit a linear probe per client of the probe set on the candidate base's frozen features; "
        "exit 0 if their mean test accuracy reaches --min-accuracy, 1 if not.",
    )  # fmt: skip


def probe_accuracy(artifacts: Path, candidate: Path, data: DataConfig) -> list[float]:
    """Each probe client's linear-probe test accuracy on ``candidate``'s frozen features."""
    manifest = read_manifest(artifacts, verify_files=False)
    model = build_model(ModelConfig(**manifest.model.model_dump()))
    files = [candidate, artifacts / manifest.artifacts["initial_head"]]
    tensors = weights.load_checked(files, manifest.layout("base") + manifest.layout("head"))
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()}, strict=False)
    assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing), (missing, unexpected)
    fed = load_federated(replace(data, image_size=manifest.model.input_size))
    scores = []
    for c in range(len(fed.clients)):
        train, test = fed.client_train(c), fed.client_test(c)
        features = frozen_features(model, train, fed.dataset), frozen_features(model, test, fed.dataset)
        scores.append(user_probe(features[0], train.labels, features[1], test.labels, data.seed * 1000 + c))
    return scores


def probe_check(args: argparse.Namespace) -> int:
    config, data = from_arguments(ProbeCheckConfig, args), from_arguments(DataConfig, args)
    scores = probe_accuracy(config.artifacts, args.candidate, data)
    accuracy = float(np.mean(scores))
    passed = accuracy >= config.min_accuracy
    print(json.dumps({"candidate": str(args.candidate), "probe_accuracy": round(accuracy, 4),
                      "clients": len(scores), "min_accuracy": config.min_accuracy, "passed": passed}))  # fmt: skip
    sys.stdout.flush()
    return 0 if passed else 1
