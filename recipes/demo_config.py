"""``fedper demo``'s settings, apart from the demo so its report can read them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path

from fedper._recipes.presets import SYNTH_HEAD, SYNTH_INIT, SYNTH_KP, SYNTH_LOCAL_EPOCHS, SYNTH_ROUNDS
from fedper.common.config_cli import nested, option
from fedper.common.dp.config import DPConfig
from fedper.common.errors import ConfigError
from fedper.common.secagg.config import SecAggConfig
from fedper.common.train_config import TrainConfig
from fedper.device_runtime.runtime_config import RuntimeConfig
from fedper.models import ModelConfig
from fedper.pretrained import INIT_HELP, PRETRAINED, SCRATCH
from fedper.server.config import ServerConfig

CHECKIN_SECONDS = 2.0  # a DP or secure round's check-in window in the demo (devices ask about every second)


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
    # MobileNet-V1 width 0.25 at 32 pixels for aesthetic-synth's five ratings; the model (by name or
    # reference, with its arguments and head modules) and the head are options.
    model: ModelConfig = nested(
        lambda: ModelConfig(num_classes=5, alpha=0.25, input_size=32, head=SYNTH_HEAD),
        skip=("num_classes", "alpha", "input_size", "base", "linear_base_kp"),
    )
    kp: int = option(SYNTH_KP, "FedPer's personal layers from the top (FedAvg's fleet has none)")
    # Ten devices make a small cohort: the count's default noise (0.05 x 10) would be below z/2.
    privacy: DPConfig = nested(lambda: DPConfig(dp_count_stddev=1.0), "for both fleets' servers")
    # The demo's devices share one machine with their server: a stage waits 10 s, not a phone's 30.
    secure: SecAggConfig = nested(lambda: SecAggConfig(secagg_stage_timeout=10.0), "for both fleets' servers")
    dp_round_seconds: float = option(
        20.0, "with --dp: each round's length (a DP round closes at its deadline, whoever reported; the first "
        "2 seconds are its check-in window)",
    )  # fmt: skip

    def __post_init__(self) -> None:
        if str(self.init) == PRETRAINED and self.model.name != "mobilenet_v1":
            raise ConfigError(
                f"--init {PRETRAINED} is the packaged MobileNet-V1 base: it cannot start --model {self.model.name}; "
                f"give --init {SCRATCH} or a checkpoint PATH in the model's layout"
            )
        if self.devices < 1 or self.rounds < 1:
            raise ConfigError(f"--devices and --rounds must be >= 1, got {self.devices} and {self.rounds}")
        if self.new_users < 0 or self.fine_tune_steps < 1:
            raise ConfigError(
                f"--new-users must be >= 0 and --fine-tune-steps >= 1, got {self.new_users} and {self.fine_tune_steps}"
            )
        if self.privacy.dp:
            if not self.dp_round_seconds > CHECKIN_SECONDS:
                raise ConfigError(f"--dp-round-seconds must be above {CHECKIN_SECONDS}, got {self.dp_round_seconds}")
            stages = 3 * self.secure.secagg_stage_timeout
            if self.secure.secagg and not self.dp_round_seconds > CHECKIN_SECONDS + stages:
                raise ConfigError(
                    f"--dp with --secagg needs --dp-round-seconds above the check-in window ({CHECKIN_SECONDS:g} s) "
                    f"plus 3 x --secagg-stage-timeout and the training's time, got {self.dp_round_seconds}"
                )
        if self.secure.secagg and self.devices < 3:
            raise ConfigError(
                f"--secagg needs --devices >= 3: a sum of two updates tells each device the other's, got {self.devices}"
            )
        if self.privacy.dp or self.secure.secagg:
            self.server_options()  # the servers' own checks, before anything runs

    def server_options(self) -> dict[str, object]:
        """The options both fleets' ``fedper serve`` run with."""
        options: dict[str, object] = {
            "rounds": self.rounds,
            "target_clients": self.devices,
            "min_clients": max(1, self.devices // 2),
            "round_timeout": 600,
            "retry_after": 1,
            **asdict(self.training),
        }
        if self.privacy.dp:
            expected = max(1, round(self.devices * self.privacy.dp_sampling_probability))
            options.update(
                round_timeout=self.dp_round_seconds, checkin_window=CHECKIN_SECONDS, cohort_size=expected,
                start_devices=self.devices,  # the fleet takes a while to start: no round passes without it
                target_clients=expected, min_clients=1,
                **{k: v for k, v in asdict(self.privacy).items() if v is not None},
            )  # fmt: skip
        if self.secure.secagg:  # a cohort fixed at the end of a check-in window (docs/SECAGG.md)
            options.update(checkin_window=CHECKIN_SECONDS, start_devices=self.devices, **asdict(self.secure))
        own = {f.name for f in fields(ServerConfig)}
        flat = {k: v for k, v in options.items() if k in own}
        ServerConfig(**flat, training=self.training, privacy=self.privacy, secure=self.secure)  # type: ignore[arg-type]  # serve's checks
        return options
