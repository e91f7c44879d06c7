"""One device: what a phone does each round, with the exported program (or eager PyTorch).

Round: task -> manifest/programs (once, cached by sha256; the manifest pinned once its
trainer loaded) -> base (cached by ETag, per manifest) -> load base + own head -> evaluate
(``metric.accuracy``) -> train -> stage the head -> upload the base only -> commit the head
once the server accepted the base (202 or ``duplicate_update``). A 401 enrolls again, once a
run. The head never leaves this object except into the device's own storage.
When the run is finished (410), a device that trained evaluates once more with the newest
model version's base and its final head: the run's final point (:mod:`fedper.results`).
What a board runs, no more: an emulated fleet's faults (dropout, stragglers, a flaky network)
are wrappers around it (:mod:`device_runtime.emulation`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from fedper.client_round import Client, ClientRound, Trained, score_held, train_held
from fedper.common import weights
from fedper.common.dp.clipping import clip_delta
from fedper.common.errors import FedperError
from fedper.common.manifest import MANIFEST_FILE, Manifest, read_manifest, sha256_file
from fedper.common.protocol import ErrorCode, Metadata, Route, Task, TaskConfig
from fedper.common.train_config import TrainConfig
from fedper.device_runtime.client import NoTask, NotInCohortError, ProtocolClient, RefusedError, RunFinishedError
from fedper.device_runtime.device_storage import DeviceStorage
from fedper.device_runtime.events import (
    Evaluated,
    Event,
    FinalEvaluated,
    Finished,
    Refused,
    RoundReport,
    Training,
    Uploaded,
)
from fedper.device_runtime.local_data import LocalData
from fedper.device_runtime.retry import TransientError
from fedper.device_runtime.runtime_config import Engine, Evaluator
from fedper.device_runtime.secure_round import SecureRound, SecureRoundRefusedError
from fedper.trainer import Trainer

log = logging.getLogger("fedper.device")
# (manifest sha256, the directory holding its artifacts, the manifest) -> the trainer to use.
# A fleet host may hand every device it runs the same trainer (one loaded program per host).
TrainerFactory = Callable[[str, Path, Manifest], Trainer]


class ManifestConflictError(FedperError):
    """A new export would make this device upload tensors it has kept personal so far."""


@dataclass(frozen=True)
class ScoredRound:
    """A round once evaluated: what it trains from, and how well that scored."""

    task: Task
    manifest: Manifest
    trainer: Trainer
    client: Client
    base: dict[str, np.ndarray]
    head: dict[str, np.ndarray]
    accuracy: float | None
    secure: SecureRound | None  # a secure round's session, its keys shared


@dataclass(frozen=True)
class TrainedRound:
    """A round once trained, its head staged: what is left is to send it."""

    scored: ScoredRound
    trained: Trained


@dataclass(frozen=True)
class DeviceOptions:
    engine: Engine = "executorch"
    # Which exported inference model scores the local test split (ExecuTorch engine only).
    evaluator: Evaluator = "onnx"
    seed: int = 0
    client_id: int = 0
    max_idle_wait: float = 5.0  # cap on Retry-After waits


class RoundPlan(Protocol):
    """How a device goes through a round's phases: a board evaluates, trains and sends
    (:func:`plain_round`); an emulated fleet composes faults between them (``emulation.py``)."""

    def __call__(self, device: Device, task: Task) -> RoundReport: ...


def plain_round(device: Device, task: Task) -> RoundReport:
    """Evaluate, train, send: what a board runs."""
    return device.send(device.train(device.evaluate(task)))


class Device:
    def __init__(
        self,
        client: ProtocolClient,
        storage: DeviceStorage,
        data: Callable[[Manifest], LocalData],
        options: DeviceOptions,
        enrollment_key: str,
        on_event: Event | None = None,
        compute_lock: Any = None,
        sleep: Callable[[float], None] = time.sleep,
        trainer_for: TrainerFactory | None = None,
        plan: RoundPlan = plain_round,
    ):
        self.client, self.storage, self.options = client, storage, options
        self._data_for = data
        self._enrollment_key = enrollment_key
        self.emit: Event = on_event or (lambda _event: None)
        self._lock = compute_lock
        self.sleep = sleep
        self._plan = plan
        self._trainer_for: TrainerFactory = trainer_for if trainer_for is not None else self._own_trainer
        self._trainers: dict[str, tuple[Manifest, Trainer, Client]] = {}
        self._skip_round: int | None = None
        self.device_id: str | None = None

    def _own_trainer(self, _sha: str, directory: Path, manifest: Manifest) -> Trainer:
        """A trainer for this device alone (a device that runs by itself, not in a fleet host)."""
        return make_trainer(self.options.engine, directory, manifest, self.options.evaluator)

    # --- identity -----------------------------------------------------------------------

    def ensure_enrolled(self) -> str:
        saved = self.storage.credentials()
        if saved is None:
            return self._enroll()
        device_id, token = saved
        self.client.token = token
        self.device_id = device_id
        return device_id

    def _enroll(self) -> str:
        device_id, token = self.client.enroll(self._enrollment_key)
        self.storage.save_credentials(device_id, token)
        self.device_id = device_id
        return device_id

    # --- the loop -----------------------------------------------------------------------

    def run(self, max_rounds: int | None = None) -> list[RoundReport]:
        """Take part in rounds until the run is finished (410) or ``max_rounds`` were done."""
        self.ensure_enrolled()
        reports: list[RoundReport] = []
        reenrolled = False
        while max_rounds is None or len(reports) < max_rounds:
            try:
                task = self.client.task()
            except RunFinishedError:
                self._finish()
                break
            except TransientError as exc:
                log.warning("device %s: %s; waiting", self.device_id, exc)
                self.sleep(self.options.max_idle_wait)
                continue
            except RefusedError as exc:
                if exc.status != 401 or reenrolled:
                    raise
                reenrolled = self._reenroll(exc)
                continue
            if isinstance(task, NoTask) or task.round == self._skip_round:
                wait = task.retry_after if isinstance(task, NoTask) else self.options.max_idle_wait
                self.sleep(min(wait, self.options.max_idle_wait))
                continue
            try:
                report = self.run_round(task)
            except RunFinishedError:  # the operator stopped the run while this device trained
                self._finish()
                break
            except TransientError as exc:
                log.warning("device %s: round %d failed: %s", self.device_id, task.round, exc)
                continue
            except SecureRoundRefusedError as exc:  # the round cannot be taken part in safely
                log.warning("device %s: out of secure round %d: %s", self.device_id, task.round, exc)
                self._skip_round = task.round
                continue
            except NotInCohortError as exc:  # our slot expired: not a failure
                log.info("device %s: not in round %d's cohort; asking again", self.device_id, task.round)
                self.sleep(min(exc.retry_after, self.options.max_idle_wait))
                continue
            except RefusedError as exc:
                if exc.code in (ErrorCode.ROUND_NOT_OPEN, ErrorCode.STALE_BASE_VERSION, ErrorCode.SECAGG_STAGE_CLOSED):
                    self._skip_round = task.round  # too late for this round; wait for the next
                    continue
                if exc.status == 401 and not reenrolled:
                    reenrolled = self._reenroll(exc)
                    continue
                raise
            reports.append(report)
        return reports

    def _reenroll(self, refused: RefusedError) -> bool:
        """A 401 mid-run (token revoked, or the server lost its devices): enroll again, once."""
        log.warning("device %s: %s; enrolling again", self.device_id, refused)
        self._enroll()
        return True

    def _finish(self) -> None:
        self.evaluate_final()
        self.emit(Finished())

    def evaluate_final(self) -> float | None:
        """Score the test split with the newest model version's base (``GET /v1/status``) and
        the head this device kept, as the simulation's final point; emits FinalEvaluated. None,
        and nothing emitted, for a device that never trained (it has no head) or has no test
        examples (accuracy is undefined)."""
        sha = self.storage.pinned_manifest()
        head = self.storage.load_head(sha) if sha is not None else None
        if sha is None or head is None:
            return None
        status = self.client.status()
        manifest, trainer, client = self._prepare(sha, Route.ARTIFACT.format(name=MANIFEST_FILE))
        base = self._base(sha, status.model_version, Route.MODEL_BASE.format(version=status.model_version), manifest)
        with self._compute():
            accuracy = score_held(trainer, (base, head), client)
        if accuracy is None:
            return None
        self.emit(FinalEvaluated(status.round + 1, status.model_version, client.num_samples, accuracy))
        return accuracy

    def run_round(self, task: Task) -> RoundReport:
        """One round of ``task``, as the device's round plan goes through its phases."""
        return self._plan(self, task)

    # --- a round's phases ----------------------------------------------------------------

    def evaluate(self, task: Task) -> ScoredRound:
        """What the round trains from (a secure round's keys shared first), scored on the test split."""
        secure = None
        if task.secagg is not None:  # keys and shares first (short stages), then the rest
            assert self.device_id is not None
            secure = SecureRound(self.client, self.device_id, task.round, task.secagg, self.sleep,
                                 self.options.max_idle_wait)  # fmt: skip
            secure.share()
        manifest, trainer, client = self._prepare(task.manifest_sha256, task.manifest_url)
        sha = task.manifest_sha256
        base = self._base(sha, task.model_version, task.base_url, manifest)
        head = self.storage.load_head(sha)
        if head is None:  # first round: the exported initial head
            head = self._initial_head(sha, manifest)
        with self._compute():
            accuracy = score_held(trainer, (base, head), client)
        self.emit(Evaluated(task.round, accuracy))
        return ScoredRound(task, manifest, trainer, client, base, head, accuracy, secure)

    def train(self, scored: ScoredRound) -> TrainedRound:
        """Train from what was scored, in the batch order ``fedper simulate`` uses for client
        ``client_id`` in this round; the trained head is staged, not yet committed."""
        task, manifest = scored.task, scored.manifest
        config = _train_config(manifest, task.config)
        this_round = ClientRound(self.options.client_id, task.round, self.options.seed, True, config,
                                 tuple(manifest.base_names), tuple(manifest.head_names))  # fmt: skip
        self.emit(Training(task.round))
        with self._compute():
            trained = train_held(scored.trainer, (scored.base, scored.head), this_round, scored.client)
        # Committed once the server accepts the base.
        self.storage.stage_head(task.manifest_sha256, trained.personal)
        return TrainedRound(scored, trained)

    def send(self, trained_round: TrainedRound) -> RoundReport:
        """Upload the base (masked, in a secure round); commit the head once the server has it."""
        scored, trained = trained_round.scored, trained_round.trained
        task, manifest, client, base = scored.task, scored.manifest, scored.client, scored.base
        sha, accuracy, secure = task.manifest_sha256, scored.accuracy, scored.secure
        loss, accuracy_after, update = trained.loss, trained.accuracy_after, trained.update
        metrics = {"accuracy": accuracy, "accuracy_after": accuracy_after, "train_loss": loss}
        metadata = {Metadata.NUM_SAMPLES: str(client.num_samples), Metadata.BASE_VERSION: str(task.model_version),
                    **metric_metadata(metrics)}  # fmt: skip
        if secure is not None:  # the masked update, then the unmasking: nothing in the clear
            update_arrays = weights.to_numpy(update)
            delta, unclipped = secure.delta(update_arrays, base, manifest.base_names)
            words = secure.words(delta, unclipped, client.num_samples, task.dp is not None)
            try:
                secure.send_masked(words)
            except RefusedError as exc:
                self.emit(Refused(task.round, exc.code))
                raise
            secure.unmask()
            self.storage.commit_head(sha)  # only now is this device's input in the sum
            report = RoundReport(task.round, task.model_version, client.num_samples, accuracy, accuracy_after,
                                 None if np.isnan(loss) else loss, True, None)  # fmt: skip
            self.emit(Uploaded(report))
            return report
        sent: weights.Tensors = update
        if task.dp is not None:  # DP-FedAvg: the server checks the clip, so clip exactly as it measures
            clipped = clip_delta(weights.to_numpy(update), base, manifest.base_names, task.dp.clip_norm)
            sent, metadata[Metadata.UNCLIPPED] = clipped.tensors, "1" if clipped.unclipped else "0"
        body = weights.encode(sent, metadata)
        try:
            received = self.client.upload(task.round, body)
        except NotInCohortError:
            self.emit(Refused(task.round, ErrorCode.NOT_IN_COHORT))
            raise
        except RefusedError as exc:
            self.emit(Refused(task.round, exc.code))
            raise
        except TransientError:
            self.emit(Refused(task.round, "upload failed"))
            raise
        self.storage.commit_head(sha)  # 202, or duplicate_update: the server has this round's base
        report = RoundReport(task.round, task.model_version, client.num_samples, accuracy, accuracy_after,
                             None if np.isnan(loss) else loss, True, received)  # fmt: skip
        self.emit(Uploaded(report))
        return report

    def give_up(self, scored: ScoredRound) -> RoundReport:
        """Leave the round after evaluating it (nothing sent); ask again only for the next one."""
        task = scored.task
        self._skip_round = task.round
        return RoundReport(task.round, task.model_version, scored.client.num_samples, scored.accuracy,
                           None, None, False, None)  # fmt: skip

    # --- what a round needs ----------------------------------------------------------------

    def _compute(self) -> Any:
        return self._lock if self._lock is not None else contextlib.nullcontext()

    def _prepare(self, sha: str, manifest_url: str) -> tuple[Manifest, Trainer, Client]:
        if sha in self._trainers:
            return self._trainers[sha]
        pinned = self.storage.pinned_manifest()
        directory = self.storage.artifact_dir(sha)
        if not (directory / MANIFEST_FILE).exists():
            (directory / MANIFEST_FILE).write_bytes(self.client.download_verified(manifest_url, sha))
        manifest = read_manifest(directory, verify_files=False)
        if pinned is not None and pinned != sha:
            old = read_manifest(self.storage.artifact_dir(pinned), verify_files=False)
            leaked = sorted(set(old.head_names) & set(manifest.base_names))
            if leaked:
                raise ManifestConflictError(
                    f"the new manifest would upload tensors this device keeps personal, e.g. {leaked[0]!r}"
                )
        for name in set(manifest.artifacts.values()):
            path = directory / name
            if not path.exists() or sha256_file(path) != manifest.sha256[name]:
                path.write_bytes(self.client.download_verified(Route.ARTIFACT.format(name=name), manifest.sha256[name]))
        with self._compute():  # the ExecuTorch runtime is not safe to load from two threads at once
            trainer = self._trainer_for(sha, directory, manifest)
        self.storage.pin_manifest(sha)  # only once a trainer of it loaded
        data = self._data_for(manifest)
        prepared = (manifest, trainer, Client(*data.tensors(manifest)))
        self._trainers[sha] = prepared
        return prepared

    def _base(self, sha: str, version: int, url: str, manifest: Manifest) -> dict[str, np.ndarray]:
        path = self.storage.base_path(sha, version)
        body, new_etag = self.client.download(url, self.storage.base_etag(sha, version))
        if body is not None:
            self.storage.save_base(sha, version, body, new_etag)
        return weights.load_checked([path], manifest.layout("base"))

    def _initial_head(self, sha: str, manifest: Manifest) -> dict[str, np.ndarray]:
        path = self.storage.artifact_dir(sha) / manifest.artifacts["initial_head"]
        return weights.load_checked([path], manifest.layout("head"))


def metric_metadata(metrics: Mapping[str, float | None]) -> dict[str, str]:
    """``metric.<name>`` entries of an upload: undefined (None) and non-finite values are left
    out, since the server refuses NaN and Inf (``bad_metadata``) and the round's work would be lost."""
    return {
        f"{Metadata.METRIC_PREFIX}{name}": repr(float(value))
        for name, value in metrics.items()
        if value is not None and math.isfinite(value)
    }


def make_trainer(engine: Engine, directory: Any, manifest: Manifest, evaluator: Evaluator = "onnx") -> Trainer:
    """The exported program in the ExecuTorch runtime, or the same model and step in eager PyTorch."""
    if engine == "executorch":
        from fedper.device_runtime.training_program import TrainingProgram

        return TrainingProgram(directory, manifest, evaluator=evaluator)
    from fedper.eager_trainer import EagerTrainer
    from fedper.models import ModelConfig, build_model

    model = build_model(ModelConfig(**manifest.model.model_dump()))
    trainable = manifest.head_names if manifest.training.trainable == "head" else None
    trainer = EagerTrainer(model, trainable=trainable)
    files = [
        directory / manifest.artifacts["initial_base"],
        directory / manifest.artifacts["initial_head"],
    ]
    trainer.set_tensors(weights.load_checked(files, manifest.layout("base") + manifest.layout("head")))
    return trainer


def _train_config(manifest: Manifest, task: TaskConfig) -> TrainConfig:
    """The manifest's training defaults, overridden key by key by the task's config; the batch
    is capped at the largest the program accepts."""
    config = task.over(manifest.training)
    return replace(config, batch_size=min(config.batch_size, manifest.training_program.max_batch))
