"""In-process simulation of FedPer, FedAvg and local training (eager PyTorch, one process).

Every client trains from the received base plus its own personal tensors; the
base is aggregated as the server aggregates it (:func:`fedper.common.robust_aggregate.robust_aggregate`:
the toolkit's one FedAvg behind the same clipping and weight cap, or a robust mean).
Accuracy is measured on each client's own test split with the model it holds at
the start of the round, before local training, as Flower's reproduction does, and
once more after the last round's aggregation: the final point, the headline
(:mod:`fedper.results`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import torch

from fedper._recipes.new_users import new_user_curves
from fedper.baselines import per_client_accuracy
from fedper.checkpoints import Checkpoint, init_base, read_checkpoint
from fedper.client_round import Client, ClientOutcome, ClientRound, client_round
from fedper.common import weights
from fedper.common.config_cli import nested, option
from fedper.common.dp.clipping import clip_delta
from fedper.common.dp.config import DPConfig
from fedper.common.errors import ConfigError
from fedper.common.robust_aggregate import AggregationConfig
from fedper.common.strategy.modes import Strategy, round_strategy
from fedper.common.strategy.round_strategy import Contribution, Quorum, RoundInputs, RoundProgress
from fedper.common.train_config import TrainConfig
from fedper.data import DataConfig, FederatedData, labelled_tensors, load_federated
from fedper.eager_trainer import EagerTrainer
from fedper.environment import numeric_environment
from fedper.models import ModelConfig, StagedModel, build_model, exchanged_state, split
from fedper.models.split import batchnorm_stat_names
from fedper.pretrained import INIT_HELP, checkpoint_path
from fedper.ray_cluster import RayConfig, ray_session
from fedper.results import ClientRecord, RunRecorder, config_json
from fedper.trainer import to_torch

ALGORITHMS = ("fedper", "fedavg", "local")


@dataclass(frozen=True)
class SimulationConfig:
    """One simulated experiment; everything follows from these fields (and the data config)."""

    algorithms: tuple[str, ...] = option(("fedper", "fedavg", "local"), "comma-separated: fedper, fedavg (kp=0), local")
    kp: int = option(2, "personal layers counted from the top (1 = classifier)")
    rounds: int = option(30, "federated rounds")
    training: TrainConfig = nested(lambda: TrainConfig(local_epochs=2))
    fraction: float = option(
        1.0, "share of clients that train each round (with --dp: each client's probability, on its own coin)"
    )
    bn: Literal["shared", "local"] = option(
        "shared", "base BatchNorm statistics: averaged (shared) or kept per client (local)"
    )
    # The data sets the classes and the input size, --kp the linear base's layers.
    model: ModelConfig = nested(ModelConfig, skip=("num_classes", "input_size", "linear_base_kp"))
    threads: int = option(0, "torch threads (0 = all cores)")
    backend: Literal["serial", "ray"] = option(
        "serial", "where the clients of a round train: one after the other in this process, or as Ray tasks (a "
        "local Ray or --ray-address; equal to serial with --threads 1)",
    )  # fmt: skip
    ray: RayConfig = nested(RayConfig)
    aggregation: AggregationConfig = nested(AggregationConfig, "as fedper serve does (without --dp)")
    privacy: DPConfig = nested(DPConfig)
    fine_tune_steps: int = option(50, "SGD steps each held-out user (--holdout-clients) trains for, at every N")
    init: Path | None = option(None, f"every algorithm's initial base: {INIT_HELP}", metavar="PATH")
    out: Path = option(Path("runs/simulation"), "output directory")
    list_layers: bool = option(
        False, "print the model's layer groups (the index, the kp that makes each personal, its module paths and "
        "parameters) and exit without simulating",
    )  # fmt: skip

    def __post_init__(self) -> None:
        unknown = [a for a in self.algorithms if a not in ALGORITHMS]
        if unknown or not self.algorithms:
            raise ConfigError(f"unknown algorithm(s) {unknown}; choose from {', '.join(ALGORITHMS)}")
        if self.rounds < 1:
            raise ConfigError(f"--rounds must be >= 1, got {self.rounds}")
        if not 0 < self.fraction <= 1:
            raise ConfigError(f"fraction must be in (0, 1], got {self.fraction}")
        if self.fine_tune_steps < 1:
            raise ConfigError(f"--fine-tune-steps must be >= 1, got {self.fine_tune_steps}")
        self.privacy.require_mean(self.aggregation.aggregate)
        if self.model.base == "linear" and checkpoint_path(self.init) is not None:
            raise ConfigError(
                "--base linear replaces every layer a checkpoint could start with one linear layer: "
                f"--init {self.init} has nothing to load; give --init scratch"
            )


ProgressFn = Callable[[str, int, int], None]


StartFn = Callable[[ModelConfig, list[int]], None]
Arrays = dict[str, np.ndarray]
# What a client sends instead of its honest update (recipes/poisoning.py): (client, update,
# num_samples, the round's base) -> (tensors, num_samples) sent, or None for nothing.
TamperFn = Callable[[int, Arrays, int, Arrays], tuple[Arrays, int] | None]


def model_config(sim: SimulationConfig, num_classes: int, input_size: int) -> ModelConfig:
    """The simulation's model for its data's classes and image size."""
    linear_base_kp = sim.kp if sim.model.base == "linear" else 0
    return replace(sim.model, num_classes=num_classes, input_size=input_size, linear_base_kp=linear_base_kp)


def clients_per_round(sim: SimulationConfig, num_clients: int) -> int:
    """How many clients train in each round (``fraction`` of them, at least one)."""
    return max(1, round(sim.fraction * num_clients))


def shared_names(sim: SimulationConfig, algorithm: str, model: StagedModel) -> tuple[str, ...]:
    """The tensors an algorithm aggregates; every other exchanged tensor stays on its client."""
    if algorithm == "local":
        return ()
    s = split(model, sim.kp if algorithm == "fedper" else 0)
    if sim.bn == "local":
        local_stats = set(batchnorm_stat_names(s.base))
        return tuple(n for n in s.base if n not in local_stats)
    return s.base


def run(
    sim: SimulationConfig,
    data: DataConfig,
    progress: ProgressFn | None = None,
    on_start: StartFn | None = None,
    tamper: TamperFn | None = None,
) -> RunRecorder:
    """Run every algorithm on the same clients and initial weights; write the run's files.
    ``on_start`` gets the model config and each client's number of training samples once the
    data is loaded, before any training (the command estimates the run's time with them).
    ``tamper`` replaces what clients send (an attack, for research). What the server would
    refuse (a non-finite value, a negative BatchNorm variance) is left out of the round, as the
    server leaves it out; a round with nothing left keeps its base, as an abandoned round does."""
    if sim.threads:
        torch.set_num_threads(sim.threads)
    with ray_session(sim.ray) if sim.backend == "ray" else nullcontext() as ray:
        return _run(sim, data, progress, on_start, ray, tamper)


def _run(sim: SimulationConfig, data: DataConfig, progress: ProgressFn | None, on_start: StartFn | None,
         ray: Any, tamper: TamperFn | None) -> RunRecorder:  # fmt: skip
    fed = load_federated(data)
    ds = fed.dataset
    mcfg = model_config(sim, ds.num_classes, ds.image_size)
    clients = []
    for i in range(len(fed.clients)):
        tr, te = fed.client_train(i), fed.client_test(i)
        clients.append(Client(*labelled_tensors(tr, ds), *labelled_tensors(te, ds)))
    config: dict[str, Any] = {
        "simulation": config_json(sim),
        "data": config_json(data),
        "model": mcfg.to_dict(),
        "partition": fed.partition,
        "clients_train_samples": [c.num_samples for c in clients],
    }
    init = checkpoint_path(sim.init)
    checkpoint = read_checkpoint(init, mcfg.name) if init is not None else None
    if checkpoint is not None:  # checked before any training, at the kp that needs the most of it
        needs = 0 if "fedavg" in sim.algorithms else sim.kp
        config["init"] = init_base(build_model(mcfg, seed=data.seed), checkpoint, needs).to_dict()
    if on_start is not None:
        on_start(mcfg, config["clients_train_samples"])
    recorder = RunRecorder(config, numeric_environment())
    recorder.baselines = per_client_accuracy(fed, data.seed)
    sim.out.mkdir(parents=True, exist_ok=True)
    for algorithm in sim.algorithms:
        _run_algorithm(sim, mcfg, algorithm, clients, recorder, progress, data.seed, checkpoint, ray, tamper)
        recorder.write(sim.out)  # keep what finished if a later algorithm crashes
    if fed.holdout:
        _new_users(sim, mcfg, fed, recorder, progress, data.seed)
    return recorder


def _new_users(
    sim: SimulationConfig,
    mcfg: ModelConfig,
    fed: FederatedData,
    recorder: RunRecorder,
    progress: ProgressFn | None,
    seed: int,
) -> None:
    """The held-out users' accuracy against their number of rated photos (recipes/new_users.py)."""
    recorder.new_users = new_user_curves(
        fed, mcfg, sim.kp, sim.algorithms, sim.out, sim.training, sim.fine_tune_steps, seed, progress
    )
    recorder.write(sim.out)


def _run_algorithm(
    sim: SimulationConfig,
    mcfg: ModelConfig,
    algorithm: str,
    clients: list[Client],
    recorder: RunRecorder,
    progress: ProgressFn | None,
    seed: int,
    checkpoint: Checkpoint | None,
    ray: Any = None,
    tamper: TamperFn | None = None,
) -> None:
    model = build_model(mcfg, seed=seed)
    if checkpoint is not None:  # FedAvg's classifier is in its base, and stays fresh too
        init_base(model, checkpoint, 0 if algorithm == "fedavg" else sim.kp)
    initial = exchanged_state(model)
    shared = shared_names(sim, algorithm, model)
    personal_names = tuple(n for n in initial if n not in set(shared))
    layout = [(n, tuple(initial[n].shape)) for n in shared]
    global_shared = {n: initial[n] for n in shared}
    personal = [{n: initial[n].clone() for n in personal_names} for _ in clients]
    rounds: ClientRounds
    if ray is None:
        rounds = _SerialRounds(EagerTrainer(model), clients)
    else:
        from fedper._recipes.ray_simulation import RayRounds

        rounds = RayRounds(ray, mcfg, seed, clients)
    rng = np.random.default_rng([seed, 20])
    n_train = clients_per_round(sim, len(clients))
    privacy = replace(sim.privacy, dp=sim.privacy.dp and bool(shared))
    q = n_train / len(clients)
    strategy = round_strategy(sim.aggregation, privacy, Quorum(1, n_train), expected_cohort=n_train,
                              sampling_probability=q, population=partial(len, clients))  # fmt: skip
    private = strategy.private
    stopped_before: int | None = None
    last = 0
    last_step: Arrays | None = None  # the last published step: where centered clipping starts
    for rnd in range(1, sim.rounds + 1):
        if not strategy.allows_next():
            stopped_before = rnd
            break
        last = rnd
        if private is not None:  # each client on its own coin: what the accountant assumes
            selected = set(np.flatnonzero(rng.random(len(clients)) < private.sampling_probability).tolist())
        else:
            selected = set(rng.choice(len(clients), size=n_train, replace=False).tolist())
        tasks = [ClientRound(cid, rnd, seed, cid in selected, sim.training, shared, personal_names)
                 for cid in range(len(clients))]  # fmt: skip
        updates: list[Contribution] = []
        received = weights.to_numpy(global_shared)
        for task, client, outcome in zip(tasks, clients, rounds.run(tasks, global_shared, personal), strict=True):
            if outcome.personal is not None:
                personal[task.client_id] = outcome.personal
            if shared and outcome.update is not None:  # in client order, as ever
                sent: Contribution | None = _sent(strategy, weights.to_numpy(outcome.update), client.num_samples,
                                                  received, shared)  # fmt: skip
                if tamper is not None and sent is not None:
                    tampered = tamper(task.client_id, dict(sent.tensors), sent.num_samples, received)
                    sent = None if tampered is None else sent._replace(tensors=tampered[0], num_samples=tampered[1])
                if sent is not None and strategy.refusal(sent.tensors, received, layout) is None:  # as the server does
                    updates.append(sent)
            if outcome.accuracy is not None:  # a client without test examples has no accuracy, as a device
                recorder.add(ClientRecord(algorithm, rnd, task.client_id, client.num_samples, outcome.accuracy,
                                          outcome.accuracy_after, outcome.loss))  # fmt: skip
        # Every round ends at its deadline here; one that publishes nothing leaves the base as it was.
        if shared and strategy.decide(RoundProgress(len(updates), due=True)).action == "close":
            noise = np.random.default_rng([seed, 31, rnd]) if private is not None else None
            result = strategy.aggregate(RoundInputs(layout, received, partial(iter, updates), noise,
                                                    _given(last_step)))  # fmt: skip
            assert not isinstance(result, str), result
            strategy.record(result)
            global_shared = to_torch(result.base)
            if result.dp is not None and private is not None:
                recorder.aggregation[algorithm].append({"round": rnd, **result.dp.to_dict(),
                                                        "epsilon": private.epsilon()})  # fmt: skip
            elif result.robust is not None:
                last_step = {n: result.base[n].astype(np.float64) - received[n] for n in result.base}
                recorder.aggregation[algorithm].append({"round": rnd, **result.robust.to_dict()})
        if progress is not None:
            progress(algorithm, rnd, sim.rounds)
    if private is not None:
        recorder.privacy[algorithm] = {**private.budget().to_dict(last), "stopped_before_round": stopped_before}
    # The final point: final base + own final head, evaluated only.
    final = [ClientRound(cid, last + 1, seed, False, sim.training, shared, personal_names)
             for cid in range(len(clients))]  # fmt: skip
    for task, client, outcome in zip(final, clients, rounds.run(final, global_shared, personal), strict=True):
        if outcome.accuracy is not None:
            recorder.add(ClientRecord(algorithm, task.round, task.client_id, client.num_samples, outcome.accuracy,
                                      final=True))  # fmt: skip
    _write_state(sim.out / algorithm, global_shared, personal)


def _given(step: Arrays | None) -> Callable[[], Arrays | None]:
    """The last published step as the round mode asks for it (the server reads its own from disk)."""
    return lambda: step


def _sent(
    strategy: Strategy, trained: Arrays, num_samples: int, received: Arrays, shared: tuple[str, ...]
) -> Contribution:
    """What a device sends: under DP its delta clipped to the round's clip, with its bit."""
    clip = strategy.device_clip()
    if clip is None:
        return Contribution(trained, num_samples, True)
    clipped = clip_delta(trained, received, shared, clip)
    return Contribution(clipped.tensors, num_samples, clipped.unclipped)


class ClientRounds(Protocol):
    """Runs the clients' rounds (``tasks``, one per client, in client order) from the same base."""

    def run(self, tasks: list[ClientRound], shared: dict[str, torch.Tensor],
            personal: list[dict[str, torch.Tensor]]) -> list[ClientOutcome]: ...  # fmt: skip


class _SerialRounds:
    """One client after the other on one trainer, in this process."""

    def __init__(self, trainer: EagerTrainer, clients: list[Client]) -> None:
        self._trainer, self._clients = trainer, clients

    def run(self, tasks: list[ClientRound], shared: dict[str, torch.Tensor],
            personal: list[dict[str, torch.Tensor]]) -> list[ClientOutcome]:  # fmt: skip
        return [client_round(self._trainer, t, self._clients[t.client_id], shared, personal[t.client_id])
                for t in tasks]  # fmt: skip


def _write_state(out: Path, shared: dict[str, torch.Tensor], personal: list[dict[str, torch.Tensor]]) -> None:
    """final_base.safetensors (the aggregated tensors) and heads/client_NNN.safetensors."""
    if shared:
        weights.save(out / "final_base.safetensors", shared)
    for cid, tensors in enumerate(personal):
        if tensors:
            weights.save(out / "heads" / f"client_{cid:03d}.safetensors", tensors)
