"""A regional server (``fedper serve --root URL --region K``; docs/SCALING.md, "Hierarchical
aggregation"): its rounds are its root's. Round r here is the root's round r and trains the
version the root's does. When the round mode says the round closes, the region forwards the sum
of its accepted updates to the root instead of publishing; the round ends when the root's does,
with the version the root published (installed here under the same number, byte for byte) or
abandoned with the root's reason, and the root's next round opens here.

Every step is decided on the clock's tick from what the root says (``GET /v1/regions/K``), so
a region that was down, or whose root was, catches up: a region behind the root ends its round
as the root ended it and opens the root's current one. A forward is sealed first. Its sum is
made from the sealed round's updates and kept in the round's folder, recorded in the same
transaction, after which the round takes nothing more, even after a restart. Until the root has
the sum, every retry sends the same bytes (the root answers a repeat as it answered the first).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from dataclasses import replace

from fedper.common import hierarchical, weights
from fedper.common.protocol import ErrorCode, RegionView
from fedper.common.strategy.round_strategy import RoundProgress
from fedper.common.strategy.secure_aggregation import SecureAggregation
from fedper.server.closing import Closing, round_metrics
from fedper.server.disk_room import out_of_space
from fedper.server.root_link import RootLink, RootRefusedError, RootUnreachableError
from fedper.server.round_context import FencedError, RoundContext
from fedper.server.secure_round import DONE
from fedper.server.storage import Round, RoundState, RunState

log = logging.getLogger("fedper.server")


class ExportMismatchError(RuntimeError):
    """The root serves another export: this region's updates would not fit its versions."""


class RegionalRounds:
    def __init__(self, ctx: RoundContext, closing: Closing, link: RootLink) -> None:
        self.ctx, self.closing, self.link = ctx, closing, link
        self._export_checked = False
        self._problem: str | None = None  # the last one logged, logged again only when it changes

    def tick(self) -> None:
        """Follow the root: end a round the root has ended, forward a round the mode closes. What
        the root cannot answer now is asked again on a later tick."""
        try:
            self._follow()
        except (RootUnreachableError, RootRefusedError, ExportMismatchError, weights.WeightsError) as exc:
            self._report(f"the root: {exc}")

    def _follow(self) -> None:
        view = self.link.view()
        self._check_export()
        local = self.ctx.db.rounds.latest()
        if local is None or local.state != RoundState.OPEN or self.ctx.finished():
            return
        if view.finished or (view.round is not None and view.round > local.round):
            self._end_as_root(local, view)
        elif view.round == local.round and view.model_version == local.model_version:
            if self._same_privacy(local, view):
                self._forward_when_due(local)
        elif view.round is not None:
            self._report(f"the root's round {view.round} trains version {view.model_version}; this region's round "
                         f"{local.round} trains {local.model_version}: waiting for the root to move on")  # fmt: skip

    # --- forwarding -----------------------------------------------------------------------

    def _forward_when_due(self, local: Round) -> None:
        ctx, number = self.ctx, local.round
        made = ctx.db.regions.forwarded(number)
        if made is not None:  # the sum is made: the round takes nothing more, and ends with the root's
            if not made[1]:
                try:
                    kept = (ctx.store.updates_dir / ctx.store.forwarded_sum(number)).read_bytes()
                except OSError as exc:
                    self._report(f"round {number}'s sum cannot be read again ({exc}): the root ends it without it")
                    return
                self._send(number, kept)  # the same bytes: the root answers as it did
            return
        now = ctx.clock()
        if ctx.db.closers.lease_live(number, now):
            return  # another process sharing the database is forwarding it
        due = local.deadline is not None and now >= local.deadline
        progress = RoundProgress(ctx.count_received(number), due)
        if ctx.secure is not None:
            stage = ctx.secure.stage(number, now)
            progress = RoundProgress(0, due, unmasked=stage == DONE, session=stage is not None)
        decision = ctx.strategy.decide(progress)
        if decision.action == "close":
            self._seal_and_forward(local)
        elif decision.action == "abandon":
            self._report(f"round {number}: {decision.reason}; no sum goes to the root unless more updates come")

    def _seal_and_forward(self, local: Round) -> None:
        ctx, number = self.ctx, local.round
        with ctx.lock:
            token = ctx.seal(number)
        if token is None:
            return
        with ctx.lease(number, token):
            try:
                body = self._sum(local, token)
            except FencedError:
                return
            except Exception as exc:
                if not out_of_space(exc):
                    log.exception(json.dumps({"event": "region_sum_failed", "round": number}))
                ctx.unseal(number, token)
                self._report(f"round {number}'s sum could not be made: {type(exc).__name__}: {exc}")
                return
            if body is None:
                ctx.unseal(number, token)  # an update was dropped: the round decides again
                return
            if isinstance(body, str):
                self._report(f"round {number} sends no sum: {body}")  # stays sealed: the root ends it
                return
            kept = ctx.store.updates_dir / ctx.store.forwarded_sum(number)
            with ctx.store.temp_file(".sum") as (temp, f):
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
                try:
                    with ctx.db.transaction() as tx:
                        ctx.fence(number, token)
                        kept.parent.mkdir(exist_ok=True)
                        os.replace(temp, kept)
                        ctx.db.regions.put_forward(tx, number, hashlib.sha256(body).hexdigest(), ctx.clock())
                except FencedError:
                    return
        ctx.end_lease(number, token)  # sealed for good, and the root's end may end it at once
        self._send(number, body)

    def _sum(self, local: Round, token: int) -> bytes | str | None:
        """The round's sum as the root takes it; why there is none (a string); None when an
        unreadable update was dropped (the round stays open with one update fewer)."""
        ctx, number = self.ctx, local.round
        layout, region = ctx.layout, self.link.region
        if ctx.secure is not None:
            mode = ctx.strategy
            assert isinstance(mode, SecureAggregation)
            base = ctx.models.base(local.model_version)
            checked = mode.checked_sum(self.closing.inputs(number, token, local.model_version, base))
            if isinstance(checked, str):
                return checked
            cap = checked.fixed.weight_cap
            summed = {name: base[name] * checked.weight + checked.sums[name] * cap for name, _ in layout}
            found = hierarchical.RegionalSum(region, summed, checked.weight, checked.survivors, local.model_version)
            return hierarchical.encode(found)
        updates = ctx.db.rounds.updates(number)
        private = ctx.privacy is not None  # DP-FedAvg: every delta weighs 1, and the root counts the bits
        stored = list(self.closing.stored(number, token))
        if len(stored) < len(updates):
            return None
        if not stored:
            return "no update was accepted"
        pairs = [(tensors, 1 if private else u.num_samples) for u, tensors in stored]
        found = hierarchical.regional_sum(layout, region, pairs, local.model_version)
        if private:
            found = replace(found, unclipped=sum(1 for u, _ in stored if u.unclipped))
        return hierarchical.encode(found)

    def _send(self, number: int, body: bytes) -> None:
        try:
            self.link.forward(number, body)
        except RootUnreachableError as exc:
            self._report(f"round {number}'s sum did not reach the root (it is sent again): {exc}")
            return
        except RootRefusedError as exc:
            if exc.code in (ErrorCode.ROUND_NOT_OPEN, ErrorCode.RUN_FINISHED):
                self._report(f"round {number}'s sum came too late: the root's round ended")
            else:
                log.error(json.dumps({"event": "region_sum_refused", "round": number, "error": str(exc)}))
                self._report(f"round {number}'s sum was refused: {exc}")
            return
        ctx = self.ctx
        with ctx.db.transaction() as tx:
            ctx.db.regions.acknowledged(tx, number)
        log.info(json.dumps({"event": "region_sum_forwarded", "round": number, "bytes": len(body)}))

    # --- following the root ---------------------------------------------------------------

    def _end_as_root(self, local: Round, view: RegionView) -> None:
        """End round ``local`` as the root ended it, install the versions the root published, and
        open the root's open round (or finish, with the root)."""
        ctx, number = self.ctx, local.round
        now = ctx.clock()
        if ctx.db.closers.lease_live(number, now):
            return  # a forward in progress: the next tick
        outcome = self.link.round(number) if number >= 1 else None
        result: int | None = None
        reason: str | None = f"the root has no round {number} (it is at round {view.round})"
        if outcome is not None and outcome.state == "open":
            return  # the root's view moved on meanwhile: the next tick
        if outcome is not None and outcome.state == "closed":
            result = outcome.result_version
            made = ctx.db.regions.forwarded(number)
            reason = None if made and made[1] else f"the root closed round {number} without this region's sum"
        elif outcome is not None:
            reason = f"the root {outcome.state} round {number}" + (f": {outcome.reason}" if outcome.reason else "")
        wanted = {v for v in (result, None if view.finished else view.model_version) if v is not None}
        fetched = {v: self.link.version(v)[0] for v in sorted(wanted) if ctx.db.versions.get(v) is None}
        with contextlib.ExitStack() as stack:
            staged = {v: stack.enter_context(ctx.models.staged_bytes(data, f"the root's version {v}"))
                      for v, data in fetched.items()}  # fmt: skip
            with ctx.lock:
                try:
                    with ctx.db.transaction() as tx:
                        ctx.may_end(number, now)
                        for v, one in staged.items():
                            target = ctx.models.place(one, v)
                            ctx.db.versions.insert(tx, v, one.sha256, target.name, now, number if v == result else None)
                        state = RoundState.CLOSED if reason is None else RoundState.ABANDONED
                        metrics = round_metrics(ctx.db.rounds.updates(number))
                        ctx.db.rounds.end(tx, number, state, now, result if state == RoundState.CLOSED else None,
                                          metrics, reason, ending=ctx.ending(number))  # fmt: skip
                        if view.finished or view.round is None:
                            ctx.db.set_run_state(tx, RunState.FINISHED)
                        else:
                            ctx.db.rounds.open(tx, view.round, view.model_version, now, ctx.deadline(now))
                            if ctx.privacy is not None and view.dp_clip is not None:  # the root's next clip
                                ctx.db.set_dp_state(tx, replace(ctx.db.dp_state(), clip=view.dp_clip))
                except FencedError:
                    return
                finally:
                    ctx.refresh()
        ctx.store.remove_round(number)
        self._problem = None
        log.info(json.dumps({"event": "round_closed" if reason is None else "round_abandoned", "round": number,
                             "model_version": local.model_version, "result_version": result, "reason": reason,
                             "next_round": None if view.finished else view.round}))  # fmt: skip

    def _same_privacy(self, local: Round, view: RegionView) -> bool:
        """Whether this region runs the root's DP-FedAvg round: the root's clip (taken over while
        the round has no update yet) and sampling probability; else the problem is reported."""
        ctx = self.ctx
        if (ctx.privacy is None) != (view.dp_clip is None):
            self._report("the root and this region disagree on --dp: no sum can go to the root")
            return False
        if ctx.privacy is None or view.dp_clip is None:
            return True
        if view.dp_sampling_probability != ctx.config.privacy.dp_sampling_probability:
            self._report(f"the root draws devices with probability {view.dp_sampling_probability}, this region "
                         f"with {ctx.config.privacy.dp_sampling_probability}: set the root's")  # fmt: skip
            return False
        if ctx.privacy.clip() == view.dp_clip:
            return True
        with ctx.lock, ctx.db.transaction() as tx:
            if ctx.count_received(local.round) == 0:
                ctx.db.set_dp_state(tx, replace(ctx.db.dp_state(), clip=view.dp_clip))
                return True
        self._report(f"round {local.round}'s updates were clipped to {ctx.privacy.clip()}, the root's clip is "
                     f"{view.dp_clip}: its sum cannot go to the root")  # fmt: skip
        return False

    def _check_export(self) -> None:
        """Once: the root's version 0 is this region's (the same export)."""
        if self._export_checked:
            return
        mine = self.ctx.models.file(0)
        _, theirs = self.link.version(0)
        if mine is None or mine[1] != theirs:
            raise ExportMismatchError(f"the root's version 0 has sha256 {theirs[:12]}..., this region's "
                                      f"{mine[1][:12] if mine else 'none'}...: serve the root's export")  # fmt: skip
        self._export_checked = True

    def _report(self, problem: str) -> None:
        """Log a problem once, until it changes (the tick runs every second)."""
        if problem != self._problem:
            log.warning(json.dumps({"event": "region_waiting", "problem": problem[:500]}))
            self._problem = problem
