"""The settings of one round of local training: their one definition, defaults and checks.

The server's task, the manifest's defaults, the export, the simulation and the demo all
compose this class; a recipe that trains longer says so by overriding a field, not by
declaring the setting again.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedper.common.config_cli import option
from fedper.common.errors import ConfigError


@dataclass(frozen=True)
class TrainConfig:
    """What a client does in one round: ``local_epochs`` passes of SGD with momentum (reset every
    round) over its data in batches of ``batch_size``."""

    local_epochs: int = option(1, "local epochs per round")
    batch_size: int = option(32, "local batch size")
    learning_rate: float = option(0.01, "SGD learning rate", flags=("--lr",))
    momentum: float = option(0.9, "SGD momentum (reset every round)")

    def __post_init__(self) -> None:
        if self.local_epochs < 1:
            raise ConfigError(f"--local-epochs must be >= 1, got {self.local_epochs}")
        if self.batch_size < 2:
            raise ConfigError(
                f"--batch-size must be >= 2 (BatchNorm cannot train on one example), got {self.batch_size}"
            )
        if not self.learning_rate > 0 or self.learning_rate == float("inf"):
            raise ConfigError(f"--learning-rate must be a positive number, got {self.learning_rate}")
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"--momentum must be in [0, 1), got {self.momentum}")
