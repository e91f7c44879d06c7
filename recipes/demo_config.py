"""``fedper demo``'s settings, apart from the demo so its report can read them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fedper._recipes.presets import SYNTH_HEAD, SYNTH_INIT, SYNTH_KP, SYNTH_LOCAL_EPOCHS, SYNTH_ROUNDS
from fedper.common.config_cli import nested, option
from fedper.common.errors import ConfigError
from fedper.common.train_config import TrainConfig
from fedper.device_runtime.runtime_config import RuntimeConfig
from fedper.models.heads import HeadKind
from fedper.pretrained import INIT_HELP


@dataclass(frozen=True)
class DemoConfig:
    out: Path = option(Path("demo-out"), "where the report and results go")
    devices: int = option(10, "emulated devices (aesthetic-synth users)")
    rounds: int = option(SYNTH_ROUNDS, "federated rounds per algorithm")
    training: TrainConfig = nested(lambda: TrainConfig(local_epochs=SYNTH_LOCAL_EPOCHS), "as the server's tasks ask")
    images_per_user: tuple[int, int] = option((100, 200), "images each user rated, N or MIN-MAX")
    new_users: int = option(
        3, "held-out users who never join a fleet; the report shows their accuracy against their number of "
        "rated photos, from FedPer's and FedAvg's final models (0 = none)",
    )  # fmt: skip
    fine_tune_steps: int = option(50, "SGD steps each new user trains for, at every number of photos")
    workers: int = option(0, "worker processes for the fleet (0 = one per core)")
    # The demo starts its own servers and fleets: of the device settings only --engine is an option.
    runtime: RuntimeConfig = nested(lambda: RuntimeConfig(threads=1))
    seed: int = option(0, "seed for data, initial weights and training order")
    init: Path = option(SYNTH_INIT, f"the base's version 0: {INIT_HELP}", metavar="PATH")
    head: HeadKind = option(SYNTH_HEAD, "the personal classifier: softmax or ordinal (for ratings)")
    kp: int = option(SYNTH_KP, "FedPer's personal layers from the top (FedAvg's fleet has none)")

    def __post_init__(self) -> None:
        if self.devices < 1 or self.rounds < 1:
            raise ConfigError(f"--devices and --rounds must be >= 1, got {self.devices} and {self.rounds}")
        if self.new_users < 0 or self.fine_tune_steps < 1:
            raise ConfigError(
                f"--new-users must be >= 0 and --fine-tune-steps >= 1, got {self.new_users} and {self.fine_tune_steps}"
            )
