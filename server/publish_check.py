"""Checks a round's aggregate must pass before it is published as a model version.

Robust aggregation bounds what one device can do; these checks catch what gets through
anyway (many colluding devices, an operator's `--aggregate mean --clip-factor 0`): a base with
a negative BatchNorm variance, a step from the round's base far larger than the run's recent
steps, or a base the operator's own check refuses (e.g. an evaluation on a probe set the
server holds; the server itself loads no ML framework, so the check is a command). A round
whose aggregate fails is recorded as abandoned and the next round trains the same version.
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedper.common.config_cli import option
from fedper.common.errors import ConfigError
from fedper.common.robust_aggregate import group_norms, lower_median, negative_variance

Tensors = dict[str, np.ndarray]
HISTORY = 10  # published steps the step check compares with
MIN_HISTORY = 3  # before this many, any finite step passes


@dataclass(frozen=True)
class PublishConfig:
    publish_max_step_factor: float = option(
        10.0,
        f"an aggregate whose distance from the round's base exceeds this x the median of the last {HISTORY} "
        f"published steps (once {MIN_HISTORY} exist) is not published (0: no check)",
    )
    publish_command: str = option(
        "", "command run with the candidate base's safetensors file as its last argument before publishing; "
        "a nonzero exit keeps it unpublished (empty: none)",
        metavar="CMD",
    )  # fmt: skip
    publish_timeout: float = option(300.0, "seconds the publish check command may take (then it counts as failed)")

    def __post_init__(self) -> None:
        if not self.publish_max_step_factor >= 0:
            raise ConfigError(
                f"--publish-max-step-factor must be >= 0 (0: no check), got {self.publish_max_step_factor}"
            )
        if self.publish_command and not shlex.split(self.publish_command):
            raise ConfigError("--publish-command is blank")
        if not self.publish_timeout > 0:
            raise ConfigError(f"--publish-timeout must be > 0, got {self.publish_timeout}")


def step_norm(candidate: Tensors, base: Tensors) -> float:
    """The distance of ``candidate`` from ``base`` over the weights (BatchNorm statistics apart)."""
    return group_norms(candidate, base)["parameters"]


def problem(config: PublishConfig, candidate: Tensors, base: Tensors, recent_steps: list[float]) -> str | None:
    """Why ``candidate`` must not be published (the in-process checks), or None."""
    for name, values in sorted(candidate.items()):
        smallest = negative_variance(name, values)
        if smallest is not None:
            return f"tensor {name!r} has a negative BatchNorm variance ({smallest:g})"
    recent = recent_steps[-HISTORY:]
    factor = config.publish_max_step_factor
    if factor and len(recent) >= MIN_HISTORY:
        step, typical = step_norm(candidate, base), lower_median(recent)
        if step > factor * typical:
            return (f"the step from the round's base is {step:.4g}, more than {factor:g} x the median "
                    f"{typical:.4g} of the last {len(recent)} published steps")  # fmt: skip
    return None


def command_problem(config: PublishConfig, candidate_file: Path) -> str | None:
    """Why the operator's command refuses the candidate file, or None (also None without a command)."""
    if not config.publish_command:
        return None
    argv = [*shlex.split(config.publish_command), str(candidate_file)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=config.publish_timeout, check=False)
    except subprocess.TimeoutExpired:
        return f"the publish check {argv[0]!r} took longer than {config.publish_timeout:g} s"
    except OSError as exc:
        return f"the publish check {argv[0]!r} could not run: {exc}"
    if done.returncode != 0:
        said = (done.stdout + done.stderr).strip()[-300:]
        return f"the publish check {argv[0]!r} exited {done.returncode}: {said}"
    return None
