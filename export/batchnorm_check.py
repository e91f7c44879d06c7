"""Which BatchNorm layers a training program can carry (both training graphs refuse the others)."""

from __future__ import annotations

from torch import nn

from fedper.common.errors import ConfigError


def check_batchnorm(path: str, bn: nn.modules.batchnorm._BatchNorm) -> None:
    """Refuse a BatchNorm the training program cannot carry, naming it and what to change: its
    running statistics are the program's inputs and outputs (an exponential average, per channel
    of an image), and its scale and shift are trained parameters."""
    where = f"the BatchNorm at {path or 'the model'} ({type(bn).__name__})"
    if type(bn) is not nn.BatchNorm2d:
        raise ConfigError(
            f"{where}: the training program supports nn.BatchNorm2d only (on [batch, channels, height, width] "
            "images); use nn.BatchNorm2d or another normalization (GroupNorm, LayerNorm)"
        )
    if bn.momentum is None:
        raise ConfigError(f"{where} has momentum=None (a cumulative average over every batch ever seen), which a "
                          "program that keeps its statistics between rounds cannot compute; build it with a momentum "
                          "(e.g. nn.BatchNorm2d(channels, momentum=0.1))")  # fmt: skip
    if not bn.affine:
        raise ConfigError(f"{where} has affine=False: the training program trains BatchNorm's scale and shift; build "
                          "it with affine=True (the default)")  # fmt: skip
    if not bn.track_running_stats:
        raise ConfigError(f"{where} has track_running_stats=False: the training program carries running statistics "
                          "for the inference models; build it with track_running_stats=True (the default)")  # fmt: skip
