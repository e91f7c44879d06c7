"""Cohort selection and pace steering (PROTOCOL.md, revision 1.2, "Cohorts"; revision 1.4,
"Check-in window").

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
check in (204, asked back when the window ends); then the slots are drawn at random among
them (Bonawitz et al., "Towards Federated Learning at Scale", 2019), devices that reported in
the previous round last, so no device holds slots back to back while others wait. Asking
faster buys nothing. ``--max-participation K --participation-rounds W``: a device with K
accepted updates in the last W rounds gets no slot.

The slots live in SQLite (:mod:`server.storage`), so they survive a restart; every assignment
is one transaction, so two devices can never take the last slot at once.
"""

from __future__ import annotations

import math
import random
import sqlite3
from collections.abc import Callable

from fedper.server.config import ServerConfig
from fedper.server.storage import Database, RoundState, Slot

MAX_RETRY_AFTER = 3600  # seconds; no device is told to wait longer than this
WAITING_KEY = "waiting_for_devices"  # meta: "1" while round 1 waits for --start-devices enrollments


# Called in the draw's transaction with the round, the devices drawn, the time and the deadline.
OnDraw = Callable[[sqlite3.Connection, int, list[str], float, float | None], object]


class Cohort:
    def __init__(self, config: ServerConfig, db: Database, rng: random.Random | None = None):
        self.config, self.db = config, db
        self._rng = rng or random.SystemRandom()  # an attacker must not predict the draw
        self.on_draw: OnDraw | None = None  # a secure round begins at its draw

    def window_end(self, opened_at: float) -> float:
        return opened_at + self.config.checkin_window

    def over_limit(self, number: int, device_id: str) -> bool:
        """Whether the device has used up its participations in the rounds before ``number``."""
        limit, rounds = self.config.max_participation, self.config.participation_rounds
        return bool(limit) and self.db.participations(device_id, number - rounds) >= limit

    def _draw(self, conn: sqlite3.Connection, number: int, deadline: float | None, now: float) -> None:
        """Give the free slots to devices drawn at random among those that checked in; those that
        reported in the previous round only after all others."""
        checked_in = [d for d in self.db.take_checkins(conn, number) if not self.over_limit(number, d)]
        if self.config.privacy.dp:  # each on its own coin, no cap: what the accountant assumes
            drawn = [d for d in sorted(checked_in) if self._rng.random() < self.config.privacy.dp_sampling_probability]
            for device_id in drawn:
                self.db.put_slot(conn, Slot(number, device_id, now, self.expiry(now, deadline)))
            if self.on_draw is not None and checked_in:
                self.on_draw(conn, number, drawn, now, deadline)
            return
        previous = self.db.reporters(number - 1)
        self._rng.shuffle(checked_in)
        checked_in.sort(key=lambda d: d in previous)  # stable: random within each group
        free = self.config.slots - self.db.count_held_slots(number, now)
        for device_id in checked_in[: max(0, free)]:
            self.db.put_slot(conn, Slot(number, device_id, now, self.expiry(now, deadline)))
        if self.on_draw is not None and checked_in:
            self.on_draw(conn, number, checked_in[: max(0, free)], now, deadline)

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
        return self._held(self.db.slot(number, device_id), now)

    def has_room(self, number: int, now: float) -> bool:
        return self.db.count_held_slots(number, now) < self.config.slots

    def may_report(self, number: int, device_id: str, now: float) -> bool:
        """An upload is admitted only from a device that holds an unexpired slot: a device that
        never asked, or whose slot expired, asks for a task again (and may get a slot back)."""
        return self.holds(number, device_id, now)

    def assign(self, number: int, device_id: str, now: float) -> Slot | None:
        """The device's slot in open round ``number``: the one it holds, else a free one, else
        None (every slot is held, the round already has ``target_clients`` updates, or it is no
        longer open). One transaction: the check and the claim cannot be split by another device."""
        with self.db.transaction() as conn:
            current = self.db.round(number)
            if current is None or current.state != RoundState.OPEN:
                return None
            held = self.db.slot(number, device_id)
            if held is not None and self._held(held, now):
                return held  # the same task again; asking again does not extend the slot
            if self.over_limit(number, device_id):
                return None
            waiting = number == 1 and self.db.get_meta(WAITING_KEY) == "1"  # for --start-devices
            if now < self.window_end(current.opened_at) or waiting:
                self.db.put_checkin(conn, number, device_id, now)
                return None
            if self.config.checkin_window:
                self._draw(conn, number, current.deadline, now)
                drawn = self.db.slot(number, device_id)
                if drawn is not None and self._held(drawn, now):
                    return drawn
            if self.config.privacy.dp or self.config.secure.secagg:  # the draw fixed the cohort
                return None
            if self.db.count_updates(number) >= self.config.target_clients or not self.has_room(number, now):
                return None
            slot = Slot(number, device_id, now, self.expiry(now, current.deadline))
            self.db.put_slot(conn, slot)
            return slot

    def retry_after(self, number: int, opened_at: float, deadline: float | None, now: float) -> int:
        """Seconds a device without a slot (or already reported) waits before asking again.

        Uniformly random in [lo, hi]: lo is the time until the round is expected to end (its
        opening plus the length of the last closed round), or until its deadline, or until the
        first held slot may expire, whichever comes first, and at least ``--retry-after``; hi is
        lo plus one expected round length (at least ``--retry-after``); both at most
        ``MAX_RETRY_AFTER``. Before any round has closed, the expected length is ``--retry-after``.
        """
        idle = self.config.retry_after
        if now < self.window_end(opened_at):  # checked in: come back when the slots are drawn
            wait = math.ceil(self.window_end(opened_at) - now)
            return self._rng.randint(wait, wait + 1)
        expected = self.db.last_closed_round_seconds() or float(idle)
        ends = [opened_at + expected, deadline, self.db.earliest_slot_expiry(number, now)]
        end = min(t for t in ends if t is not None)
        lo = min(MAX_RETRY_AFTER, max(idle, math.ceil(end - now)))
        hi = min(MAX_RETRY_AFTER, lo + max(idle, math.ceil(expected)))
        return self._rng.randint(lo, hi)
