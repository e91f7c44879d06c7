"""Closing a round: when (the round mode's decision), aggregating it, checking the aggregate and
publishing it as the next model version, or abandoning the round with its reason.

The round's stored files are read one at a time, in a canonical order (by the sha256 of each
file): the float64 sum of FedAvg depends on the order of its terms (by a rounding, which can reach
the float32 result), so the new base depends only on the set of accepted updates, not on the
order they arrived in nor on the (random) device ids.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Iterator
from dataclasses import replace

import numpy as np

from fedper.common import weights
from fedper.common.metrics import summarize
from fedper.common.robust_aggregate import NonFiniteAggregateError
from fedper.common.secagg.fixed_point import SumOutOfBoundsError
from fedper.common.secagg.server_session import RoundFailedError
from fedper.common.strategy.round_strategy import Contribution, RoundInputs, RoundProgress, RoundResult, SecureSum
from fedper.server import publish_check
from fedper.server.disk_room import out_of_space
from fedper.server.regional_intake import combined
from fedper.server.round_context import FencedError, RoundContext
from fedper.server.secure_round import DONE
from fedper.server.storage import RoundState, RunState, StoredUpdate, Transaction

log = logging.getLogger("fedper.server")


class Closing:
    def __init__(self, ctx: RoundContext) -> None:
        self.ctx = ctx

    # --- when ---------------------------------------------------------------------------

    def received(self, number: int, count: int) -> None:
        """After an update is recorded (under the lock): close a round the mode says is full (a
        regional server's rounds end on the clock's tick: server.regional_rounds)."""
        if self.ctx.config.root:
            return
        decision = self.ctx.strategy.decide(RoundProgress(count, due=False))
        if decision.action == "close":
            self.try_close(number, decision.reason)

    def tick(self) -> None:
        """Apply the clock: close or abandon the open round as the round mode decides."""
        ctx = self.ctx
        snap, now = ctx.snapshot, ctx.clock()
        if snap.finished or not snap.is_open:
            return
        if ctx.secure is None:  # decided on the snapshot first: most ticks take no lock
            due = snap.deadline is not None and now >= snap.deadline
            if ctx.strategy.decide(RoundProgress(snap.received, due)).action == "wait":
                return
        with ctx.lock:
            current = ctx.db.rounds.latest()
            if current is None or current.state != RoundState.OPEN or ctx.finished():
                return
            if ctx.db.closers.lease_live(current.round, now):  # another process is closing it
                return
            due = current.deadline is not None and now >= current.deadline
            counted = ctx.count_received(current.round)
            progress = RoundProgress(counted, due)
            if ctx.secure is not None:
                try:
                    stage = ctx.secure.stage(current.round, now)
                except Exception as exc:  # a stored session that no longer replays must not wedge the run
                    if out_of_space(exc):
                        raise
                    log.exception(json.dumps({"event": "secure_session_failed", "round": current.round}))
                    self.abandon_failed(current.round, f"the secure session cannot be replayed: {exc}")
                    return
                progress = RoundProgress(0, due, unmasked=stage == DONE, session=stage is not None)
            decision = ctx.strategy.decide(progress)
            if decision.action == "close":
                self.try_close(current.round, decision.reason)
            elif decision.action == "abandon":
                self.abandon(current.round, current.model_version, reason=decision.reason, counted=counted)

    # --- closing ------------------------------------------------------------------------

    def try_close(self, number: int, reason: str) -> None:
        """Seal the round, then close it. A full disk drains the server (the round closes when there
        is room); any other failure (a secure round's masks that cannot be removed, an overflow, a
        bug) abandons the round with its reason recorded and opens the next one: no round can wedge
        the server, and a restart does not meet the same failure again. The update that filled the
        round is stored either way, so its device gets its 202. A round another process is closing
        is left to it; a process that lost its lease meanwhile publishes nothing."""
        token = self.ctx.seal(number)
        if token is None:
            return
        noised: list[RoundResult] = []  # a DP round noised before it failed still counts
        with self.ctx.lease(number, token):
            try:
                self._close(number, reason, noised, token)
            except FencedError as exc:
                log.warning(json.dumps({"event": "round_close_fenced", "round": number, "reason": str(exc)}))
            except Exception as exc:
                if out_of_space(exc):
                    self.ctx.unseal(number, token)
                    self.ctx.drain(f"round {number} could not be closed: {exc}")
                    return
                log.exception(json.dumps({"event": "round_close_failed", "round": number}))
                why = f"closing failed: {type(exc).__name__}: {exc}"
                self.abandon_failed(number, why, noised[0] if noised else None, token)

    def abandon_failed(
        self, number: int, why: str, noised: RoundResult | None = None, token: int | None = None
    ) -> None:
        """Abandon a round that cannot be closed (if it is still open), counted as not published."""
        current = self.ctx.db.rounds.get(number)
        if current is None or current.state != RoundState.OPEN:
            return
        self._refuse(number, current.model_version, why[:500], noised, token)

    def _close(self, number: int, reason: str, noised: list[RoundResult], token: int) -> None:
        """Aggregate, check the aggregate (:mod:`server.publish_check`), write version v+1
        durably, then record it and open the next round; an aggregate that fails a check is not
        published: the round is abandoned and the next one trains the same version.

        If a stored update had to be dropped, the round stays open with its recomputed count,
        as after a restart: whether it closes is decided again (a later upload, the deadline).
        """
        ctx, start = self.ctx, time.perf_counter()
        current = ctx.db.rounds.get(number)
        assert current is not None and current.state == RoundState.OPEN
        version = current.model_version
        updates = ctx.db.rounds.updates(number)
        round_base = ctx.models.base(version)
        mode = ctx.round_mode()
        try:
            if ctx.config.regions:
                result: RoundResult | str = combined(ctx, number, np.random.default_rng(secrets.randbits(128)))
            else:
                result = mode.aggregate(self.inputs(number, token, version, round_base))
        except (RoundFailedError, SumOutOfBoundsError) as exc:
            log.warning(json.dumps({"event": "secure_round_failed", "round": number, "reason": str(exc)}))
            self._refuse(number, version, f"secure round failed: {exc}", token=token)
            return
        except NonFiniteAggregateError as exc:
            self._refuse(number, version, str(exc), token=token)
            return
        if isinstance(result, str):
            self.abandon(number, version, reason=result, token=token)
            return
        if result.dp is not None:
            noised.append(result)
        if result.updates < len(updates):
            ctx.unseal(number, token)
            ctx.refresh()
            log.warning(json.dumps({"event": "round_close_deferred", "round": number,
                                    "dropped": len(updates) - result.updates}))  # fmt: skip
            return
        steps = self._recent_steps()
        refused = publish_check.problem(ctx.config.publish, result.base, round_base, steps)
        if refused is None and ctx.config.publish.publish_command:
            with ctx.store.temp_file(".candidate") as (candidate, f):
                f.write(weights.encode(result.base))
                f.flush()
                refused = publish_check.command_problem(ctx.config.publish, candidate)
        if refused is not None:
            self._refuse(number, version, refused, result if result.dp is not None else None, token)
            return
        self._publish(number, reason, result, round_base, updates, steps, start, token)

    def _publish(
        self,
        number: int,
        reason: str,
        result: RoundResult,
        round_base: dict[str, np.ndarray],
        updates: list[StoredUpdate],
        steps: list[float],
        start: float,
        token: int,
    ) -> None:
        """Write the next version, record it and open the next round (or finish the run). The
        file is written in ``tmp/`` and moved into place inside the transaction, after the fencing
        check: a closer that lost the round never replaces a published file."""
        ctx = self.ctx
        steps = [*steps, publish_check.step_norm(result.base, round_base)][-publish_check.HISTORY :]
        report = result.robust.to_dict() if result.robust is not None else None
        now = ctx.clock()
        with ctx.models.staged(result.base) as staged:
            try:
                with ctx.db.transaction() as tx:
                    ctx.fence(number, token)
                    version = ctx.db.versions.latest() + 1
                    finished = ctx.db.rounds.count_closed() + 1 >= ctx.config.rounds
                    target = ctx.models.place(staged, version)
                    ctx.db.versions.insert(tx, version, staged.sha256, target.name, now, number)
                    ending = replace(ctx.ending(number), aggregation=report)
                    ctx.db.rounds.end(tx, number, RoundState.CLOSED, now, version, round_metrics(updates),
                                      ending=ending)  # fmt: skip
                    ctx.db.set_recent_steps(tx, steps)
                    finished = self._next_round(tx, number, version, now, result, finished)
            finally:
                ctx.refresh()
        ctx.store.remove_round(number)
        ctx.aggregation_seconds += time.perf_counter() - start
        done: dict[str, object]
        if result.dp is not None:
            done = {**self._privacy_log(result), "secure": result.secure}
        elif result.robust is not None:
            ctx.aggregation_counts.add(result.robust)
            done = result.robust.to_dict()
        else:
            done = {"secure": result.secure, "updates": result.updates}
        log.info(json.dumps({
            "event": "round_closed", "round": number, "reason": reason, "updates": result.updates,
            "model_version": version, "seconds": round(time.perf_counter() - start, 3), "finished": finished,
            "aggregation" if result.dp is None else "privacy": done,
        }))  # fmt: skip
        self._prune()

    def inputs(self, number: int, token: int | None, version: int, round_base: dict[str, np.ndarray]) -> RoundInputs:
        """What the round mode aggregates round ``number`` from (its stored updates, read again on
        each pass; DP's noise; a secure round's unmasked sum)."""
        ctx = self.ctx
        private = ctx.strategy.private is not None
        return RoundInputs(
            ctx.layout, round_base,
            updates=lambda: (Contribution(t, u.num_samples, u.unclipped) for u, t in self.stored(number, token)),
            noise=np.random.default_rng(secrets.randbits(128)) if private else None,
            last_step=lambda: ctx.models.last_step(version),
            secure=self._secure_sum(number) if ctx.secure is not None else None,
            spill=ctx.store.tmp_dir, group=1,  # one loaded update in memory at a time (for the mean)
        )  # fmt: skip

    def stored(self, number: int, token: int | None = None) -> Iterator[tuple[StoredUpdate, dict[str, np.ndarray]]]:
        """Round ``number``'s stored updates, read with the loader one at a time, in ascending
        order of the sha256 of their files (then device id, for identical files). A file that
        cannot be read or that the loader refuses is quarantined and its row removed, so the
        round's count is recomputed and that device may upload again: by the closer holding
        ``token``, or (None, at start) only while nobody is closing the round (else FencedError;
        a closer that lost the round never touches its records or files)."""
        keyed = []
        for update in self.ctx.db.rounds.updates(number):
            try:
                if update.file is None:
                    raise FileNotFoundError("no file recorded")
                keyed.append((self.ctx.store.digest(update.file), update.device_id, update))
            except OSError as exc:
                self._drop(update, exc, token)
        for _, _, update in sorted(keyed, key=lambda k: k[:2]):
            assert update.file is not None
            try:
                tensors = self.ctx.store.load(update.file)
            except (weights.WeightsError, OSError) as exc:
                self._drop(update, exc, token)
                continue
            yield update, tensors

    def _drop(self, update: StoredUpdate, exc: Exception, token: int | None) -> None:
        ctx = self.ctx
        with ctx.db.transaction() as tx:
            if token is not None:
                ctx.fence(update.round, token)
            else:
                ctx.unsealed(update.round)
            ctx.db.rounds.delete_update(tx, update.round, update.device_id)
            if update.file is not None:
                ctx.store.quarantine(update.file, str(exc))
        log.warning(json.dumps({"event": "update_dropped", "round": update.round, "device": update.device_id,
                                "reason": str(exc)[:300]}))  # fmt: skip

    def _secure_sum(self, number: int) -> SecureSum | None:
        """The unmasked sum (None: no session); RoundFailedError when the masks cannot be removed.
        Who the round left out of its sum, and whose shares of a secret were wrong, is logged."""
        secure = self.ctx.secure
        assert secure is not None
        try:
            return secure.summed(number, self.ctx.layout)
        finally:
            found = secure.session(number)
            if found is not None and (found[1].left_out() or found[1].wrong_shares):
                log.warning(json.dumps({"event": "secure_round_devices", "round": number,
                                        "left_out": sorted(found[1].left_out()),
                                        "wrong_shares": found[1].wrong_shares}))  # fmt: skip

    def _recent_steps(self) -> list[float]:
        """The distances of the last published versions from their rounds' bases."""
        return self.ctx.db.recent_steps()

    def _prune(self) -> None:
        """Keep the newest ``--keep-versions`` model versions (and version 0, the export's, and the
        open round's): the rows go in one transaction, then the files (a crash between leaves
        files that the next start removes)."""
        ctx, keep = self.ctx, self.ctx.config.keep_versions
        if not keep:
            return
        with ctx.lock:
            latest = ctx.db.versions.latest()
            training = ctx.snapshot.model_version
            doomed = [v for v in ctx.db.versions.files() if v != 0 and v != training and v <= latest - keep]
            if not doomed:
                return
            with ctx.db.transaction() as tx:
                for v in doomed:
                    ctx.db.versions.delete(tx, v)
        ctx.models.forget(doomed)
        log.info(json.dumps({"event": "versions_pruned", "versions": doomed}))

    def _privacy_log(self, result: RoundResult) -> dict[str, object]:
        assert self.ctx.privacy is not None and result.dp is not None
        spent = self.ctx.privacy.spent()
        return {**result.dp.to_dict(), "epsilon": spent.epsilon, "noised_rounds": spent.rounds}

    # --- not publishing -----------------------------------------------------------------

    def _refuse(
        self, number: int, version: int, why: str, noised: RoundResult | None = None, token: int | None = None
    ) -> None:
        """A round whose aggregate may not be published: abandoned, counted, logged as a warning.
        A noised round counts against the privacy budget all the same (its refusal is visible)."""
        if not self.abandon(number, version, noised, why, token):
            return
        self.ctx.rounds_refused += 1
        log.warning(json.dumps({"event": "round_not_published", "round": number, "model_version": version,
                                "reason": why}))  # fmt: skip

    def abandon(
        self,
        number: int,
        version: int,
        noised: RoundResult | None = None,
        reason: str | None = None,
        token: int | None = None,
        counted: int | None = None,
    ) -> bool:
        """End the round unaggregated (with ``reason`` recorded: GET /v1/rounds/{r} says it) and
        open the next on the same version, or finish the run, when a refused noised round used up
        the privacy budget. A secure round's secrets (sealed shares, answers) go with its row's
        messages, its masked inputs with its folder. Checked in the transaction: the closer that
        holds ``token``, or (None) no process's lease on the round runs and, when the clock
        decided on ``counted`` updates, the round still holds that many (another process may
        have recorded one since: the clock decides again); False if not ended here."""
        ctx = self.ctx
        now = ctx.clock()
        try:
            with ctx.db.transaction() as tx:
                if token is not None:
                    ctx.fence(number, token)
                else:
                    ctx.may_end(number, now)
                if counted is not None and ctx.count_received(number) != counted:
                    raise FencedError(f"round {number} has received an update since the clock decided")
                ctx.db.rounds.end(tx, number, RoundState.ABANDONED, now, reason=reason, ending=ctx.ending(number))
                self._next_round(tx, number, version, now, noised)
        except FencedError as exc:
            log.warning(json.dumps({"event": "round_end_fenced", "round": number, "reason": str(exc)}))
            return False
        finally:
            ctx.refresh()
        ctx.store.remove_round(number)
        log.info(json.dumps({"event": "round_abandoned", "round": number, "model_version": version, "reason": reason}))
        return True

    def _next_round(
        self, tx: Transaction, number: int, version: int, now: float, noised: RoundResult | None, finished: bool = False
    ) -> bool:
        """In the transaction that ends round ``number``: count a noised round against the budget,
        then finish the run (``finished``, or the budget spent) or open the next round on
        ``version``. Whether the run finished."""
        ctx = self.ctx
        if ctx.privacy is not None and noised is not None and noised.dp is not None:
            finished = not ctx.privacy.record(tx, noised) or finished
        if finished:
            ctx.db.set_run_state(tx, RunState.FINISHED)
        else:
            ctx.db.rounds.open(tx, number + 1, version, now, ctx.deadline(now))
        return finished


def round_metrics(updates: list[StoredUpdate]) -> dict[str, dict[str, float]]:
    """Per metric name: mean, sample-weighted mean and std across the round's devices."""
    names = sorted({name for u in updates for name in u.metrics})
    out = {}
    for name in names:
        pairs = [(u.metrics[name], u.num_samples) for u in updates if name in u.metrics]
        s = summarize([v for v, _ in pairs], [n for _, n in pairs])
        out[name] = {"mean": s.mean, "weighted_mean": s.weighted_mean, "std": s.std, "count": s.count}
    return out
