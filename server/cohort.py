"""Cohort selection and pace steering (PROTOCOL.md, "Cohorts" and "Check-in window and
participation").

A round has ``ServerConfig.slots`` slots (ceil(cohort size x over-selection)). ``GET /v1/task``
gives them to the first devices that ask; a slot is held until its device's update is accepted
(then for good) or until its report timeout passes (then the next device that asks gets it).
Without this, every device that asks trains, and all but the first ``target_clients`` uploads
are thrown away. Devices without a slot are told when to ask again, spread over the expected
rest of the round, so that thousands of them do not come back at the same moment.

Under ``--dp`` (docs/PRIVACY.md), the draw is the privacy accountant's Poisson sampling: each
device that checked in gets a slot on its own coin of probability ``--dp-sampling-probability``,
with no cap and no order, and a device that did not check in gets none: one device's presence
never changes another's chance, which the amplification theorem needs.

First come is what a few fast sybils exploit: polling every half second, they take every slot.
With ``--checkin-window S``, the devices that ask during the first S seconds of a round only
check in (204, asked back over a stretch after the window ends: a tenth of the rest of the
round, at most a minute, so that they do not all come back at once); then the slots are drawn at random among
them (Bonawitz et al., "Towards Federated Learning at Scale", 2019), devices that reported in
the previous round last, so no device holds slots back to back while others wait. Asking
faster buys nothing. ``--max-participation K --participation-rounds W``: a device with K
accepted updates in the last W rounds gets no slot.

The slots live in SQLite (:mod:`server.storage`), so they survive a restart; every assignment
is one transaction, so two devices can never take the last slot at once.
"""

from __future__ import annotations

import json
import logging
import math
import random
import threading
import time
from collections.abc import Callable

from fedper.server.config import ServerConfig
from fedper.server.storage import Database, RoundState, RunState, Slot, Transaction

log = logging.getLogger("fedper.server")

MAX_RETRY_AFTER = 3600  # seconds; no device is told to wait longer than this
MAX_CHECKIN_SPREAD = 60  # seconds over which checked-in devices are told to come back for their slots


# Called in the draw's transaction with the round, the devices drawn, the time and the deadline.
OnDraw = Callable[[Transaction, int, list[str], float, float | None], object]


class Cohort:
    def __init__(self, config: ServerConfig, db: Database, rng: random.Random | None = None):
        self.config, self.db = config, db
        self._rng = rng or random.SystemRandom()  # an attacker must not predict the draw
        self._draw_lock = threading.Lock()
        self.on_draw: OnDraw | None = None  # a secure round begins at its draw

    def window_end(self, opened_at: float) -> float:
        return opened_at + self.config.checkin_window

    def over_limit(self, number: int, device_id: str) -> bool:
        """Whether the device has used up its participations in the rounds before ``number``."""
        limit, rounds = self.config.max_participation, self.config.participation_rounds
        return bool(limit) and self.db.cohort.participations(device_id, number - rounds) >= limit

    def draw(self, number: int, now: float) -> None:
        """Once a round's check-in window is over, give its free slots to devices drawn at random
        among those that checked in (those that reported in the previous round only after all
        others; under DP each on its own coin). The check-ins are read and the draw made with no
        database lock held; one short transaction then writes the drawn slots and marks the round
        drawn (drawing 100,000 check-ins takes some 0.8 s, too long to hold the write lock:
        bench/checkin_scale.py)."""
        with self._draw_lock:
            if self.db.drawn_round() == number:
                return
            start = time.perf_counter()
            current = self.db.rounds.get(number)
            if current is None or current.state != RoundState.OPEN:
                return
            checked_in = self.db.cohort.checkins(number)
            if self.config.max_participation:
                counts = self.db.cohort.participation_counts(number - self.config.participation_rounds)
                checked_in = [d for d in checked_in if counts.get(d, 0) < self.config.max_participation]
            if self.config.privacy.dp:  # each on its own coin, no cap: what the accountant assumes
                q = self.config.privacy.dp_sampling_probability
                drawn = [d for d in sorted(checked_in) if self._rng.random() < q]
            else:
                previous = self.db.cohort.reporters(number - 1)
                self._rng.shuffle(checked_in)
                checked_in.sort(key=lambda d: d in previous)  # stable: random within each group
                free = self.config.slots - self.db.cohort.count_held(number, now)
                drawn = checked_in[: max(0, free)]
            slots = [Slot(number, d, now, self.expiry(now, current.deadline)) for d in drawn]
            computed = time.perf_counter()
            with self.db.transaction() as tx:
                if self.db.drawn_round() == number:  # another process drew it meanwhile
                    return
                self.db.cohort.put_slots(tx, slots)
                if self.on_draw is not None and checked_in:
                    self.on_draw(tx, number, drawn, now, current.deadline)
                self.db.set_drawn_round(tx, number)
            log.info(json.dumps({"event": "cohort_drawn", "round": number, "checked_in": len(checked_in),
                                 "drawn": len(drawn), "seconds": round(time.perf_counter() - start, 3),
                                 "seconds_locked": round(time.perf_counter() - computed, 3)}))  # fmt: skip

    def expiry(self, now: float, deadline: float | None) -> float | None:
        """When a slot assigned at ``now`` expires: after the report timeout, at the latest at the
        round's deadline; None (never) without either."""
        ends = [t for t in (deadline,) if t is not None]
        if self.config.report_timeout:
            ends.append(now + self.config.report_timeout)
        return min(ends) if ends else None

    def _held(self, slot: Slot | None, now: float) -> bool:
        return slot is not None and (slot.expires_at is None or slot.expires_at > now)

    def holds(self, number: int, device_id: str, now: float) -> bool:
        """Whether ``device_id`` holds an unexpired slot of round ``number``."""
        return self._held(self.db.cohort.slot(number, device_id), now)

    def has_room(self, number: int, now: float) -> bool:
        return self.db.cohort.count_held(number, now) < self.config.slots

    def may_report(self, number: int, device_id: str, now: float) -> bool:
        """An upload is admitted only from a device that holds an unexpired slot: a device that
        never asked, or whose slot expired, asks for a task again (and may get a slot back)."""
        return self.holds(number, device_id, now)

    def assign(self, number: int, device_id: str, now: float) -> Slot | None:
        """The device's slot in open round ``number``: the one it holds, else a free one, else
        None (every slot is held, the round already has ``target_clients`` updates, or it is no
        longer open). One transaction: the check and the claim cannot be split by another device."""
        opened = self.db.rounds.get(number)
        waiting = number == 1 and self.db.run_state() == RunState.WAITING  # for --start-devices
        window_over = opened is not None and not waiting and now >= self.window_end(opened.opened_at)
        if self.config.checkin_window and window_over:
            self.draw(number, now)  # before the transaction: the draw holds no write lock while it is made
        with self.db.transaction() as tx:
            current = self.db.rounds.get(number)
            if current is None or current.state != RoundState.OPEN:
                return None
            held = self.db.cohort.slot(number, device_id)
            if held is not None and self._held(held, now):
                return held  # the same task again; asking again does not extend the slot
            if self.over_limit(number, device_id):
                return None
            waiting = number == 1 and self.db.run_state() == RunState.WAITING  # for --start-devices
            if now < self.window_end(current.opened_at) or waiting:
                self.db.cohort.put_checkin(tx, number, device_id, now)
                return None
            if self.config.privacy.dp or self.config.secure.secagg:  # the draw fixed the cohort
                return None
            if self.db.rounds.count_updates(number) >= self.config.target_clients or not self.has_room(number, now):
                return None
            slot = Slot(number, device_id, now, self.expiry(now, current.deadline))
            self.db.cohort.put_slot(tx, slot)
            return slot

    def checkin_spread(self, opened_at: float, deadline: float | None) -> int:
        """The most seconds a checked-in device's Retry-After adds to the window's end: a tenth of
        the rest of the round, at most ``MAX_CHECKIN_SPREAD``. In a secure round at most a quarter
        of the key stage, which begins at the draw: a drawn device told to come back later would
        find the stage over and sit the round out."""
        after = (deadline - self.window_end(opened_at)) / 10 if deadline is not None else self.config.retry_after
        spread = max(1, min(MAX_CHECKIN_SPREAD, math.ceil(after)))
        if self.config.secure.secagg:
            spread = min(spread, math.floor(self.config.secure.secagg_stage_timeout / 4))
        return spread

    def retry_after(self, number: int, opened_at: float, deadline: float | None, now: float) -> int:
        """Seconds a device without a slot (or already reported) waits before asking again.

        Uniformly random in [lo, hi]: lo is the time until the round is expected to end (its
        opening plus the length of the last closed round), or until its deadline, or until the
        first held slot may expire, whichever comes first, and at least ``--retry-after``; hi is
        lo plus one expected round length (at least ``--retry-after``); both at most
        ``MAX_RETRY_AFTER``. Before any round has closed, the expected length is ``--retry-after``.
        """
        idle = self.config.retry_after
        if now < self.window_end(opened_at):  # checked in: come back once the slots are drawn,
            wait = math.ceil(self.window_end(opened_at) - now)  # spread over a tenth of the rest of the round
            return self._rng.randint(wait, wait + self.checkin_spread(opened_at, deadline))
        expected = self.db.rounds.last_closed_seconds() or float(idle)
        ends = [opened_at + expected, deadline, self.db.cohort.earliest_expiry(number, now)]
        end = min(t for t in ends if t is not None)
        lo = min(MAX_RETRY_AFTER, max(idle, math.ceil(end - now)))
        hi = min(MAX_RETRY_AFTER, lo + max(idle, math.ceil(expected)))
        return self._rng.randint(lo, hi)
