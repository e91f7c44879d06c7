"""Defaults a dataset brings to ``fedper simulate``: the setting its paper and Flower's baseline use.

A preset only names options whose value differs from the options' own defaults, and applies to
the options the user did not give (:func:`fedper.common.config_cli.with_defaults`): each value is
declared once, here or at its option, and an explicit flag always wins.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fedper._recipes.simulation import SimulationConfig
from fedper.common.config_cli import from_arguments, given, with_defaults
from fedper.data import DataConfig
from fedper.models.heads import HeadKind
from fedper.pretrained import PRETRAINED

# Flower's FedPer baseline at adap/flower fdef7afb1dca3030553be302366cfd285ed6632c.
FLOWER_FEDPER = "adap/flower baselines/fedper/fedper"


@dataclass(frozen=True)
class Preset:
    """Option values (field name -> value) for a dataset, and where they come from."""

    source: str = ""
    values: Mapping[str, int | float | str | Path] = field(default_factory=dict)


# The flagship setting: the demo's fleets and `fedper simulate --dataset aesthetic-synth` train
# this long, so the simulation's tables and the demo's report measure the same thing.
SYNTH_ROUNDS = 20
SYNTH_LOCAL_EPOCHS = 3
# From the packaged pretrained base, with the ordinal head, kp=1: on a validation split of the
# training photos the heads are within a standard error, and the ordinal one has fewer
# parameters per user (docs/RESULTS.md, "Choosing the head").
SYNTH_INIT = Path(PRETRAINED)
SYNTH_HEAD: HeadKind = "ordinal"
SYNTH_KP = 1

PRESETS: dict[str, Preset] = {
    "aesthetic-synth": Preset(
        source="the demo's setting",
        values={
            "rounds": SYNTH_ROUNDS,
            "local_epochs": SYNTH_LOCAL_EPOCHS,
            "init": SYNTH_INIT,
            "head": SYNTH_HEAD,
            "kp": SYNTH_KP,
        },
    ),
    "flickr-aes": Preset(
        source=f"Flower's FedPer baseline, {FLOWER_FEDPER}/conf/flickr.yaml",
        values={
            "image_size": 224,  # client.py: transforms.Resize((224, 224)) for flickr
            "num_clients": 30,  # num_clients: 30, clients_per_round: 30
            "batch_size": 4,  # batch_size: 4
            "local_epochs": 4,  # num_epochs: 4
            "rounds": 35,  # num_rounds: 35 (also run_figures.sh)
            "alpha": 1.0,  # implemented_models/mobile_model.py: MobileNet-V1 at full width, 32..1024 channels
        },
    ),
}


def preset(dataset: str) -> Preset:
    """The dataset's preset; an empty one when it has none."""
    return PRESETS.get(dataset, Preset())


def help_text() -> str:
    """One sentence per preset for ``--help``, made from the table."""
    parts = []
    for name, p in PRESETS.items():
        flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in p.values.items())
        parts.append(f"--dataset {name} has its own defaults ({p.source}): {flags}; options you give win.")
    return " ".join(parts)


@dataclass(frozen=True)
class Setting:
    """What ``fedper simulate`` runs, and which of its values came from the dataset's preset."""

    simulation: SimulationConfig
    data: DataConfig
    preset: Preset
    from_preset: tuple[str, ...]


def setting(args: argparse.Namespace) -> Setting:
    """The simulation and data configs from parsed options, the dataset's preset filling in the
    options the user did not give."""
    p = preset(args.dataset)
    values = dict(p.values)
    if args.model != "mobilenet_v1":  # the packaged base is MobileNet-V1's: another model starts from scratch
        values.pop("init", None)
    args = with_defaults(args, values)
    applied = tuple(name for name in values if name not in given(args))
    return Setting(from_arguments(SimulationConfig, args), from_arguments(DataConfig, args), p, applied)
