"""Secure rounds on the server (docs/SECAGG.md; PROTOCOL.md, "Secure aggregation"): the open
round's SecAgg+ session, begun at the draw, every accepted message stored before it is answered,
and replayed from the database after a restart; which stage a round is in; and the round's sum
of weighted deltas at the end.

A stage ends at its time (fixed at the draw) or as soon as every device that could still take
part in it has: the key stage when the whole cohort advertised, the share stage when every device
that advertised shared, the masked stage when every device that shared sent its input, the
unmasking when every device in the sum answered. What a device sends for a stage that is over is
refused (``secagg_stage_closed``), and for one not begun it is told when to come back
(``secagg_stage_not_open``, with Retry-After).
"""

from __future__ import annotations

import json
import math
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedper.common.atomic_write import atomic_write_bytes
from fedper.common.protocol import (
    Header,
    OctetsError,
    SecAggKeys,
    SecAggNeighbours,
    SecAggSealed,
    SecAggTask,
    SecAggUnmaskRequest,
    octets,
    octets_text,
)
from fedper.common.secagg.config import SecAggConfig
from fedper.common.secagg.device_session import Advertisement
from fedper.common.secagg.fixed_point import FixedPoint
from fedper.common.secagg.graph import neighbour_graph
from fedper.common.secagg.server_session import DuplicateMessageError, ServerSession, StageError
from fedper.common.strategy.round_strategy import SecureSum
from fedper.server.clock import iso_time
from fedper.server.refusals import (
    AlreadyReportedError,
    NotInCohortError,
    RoundClosingError,
    RoundNotOpenError,
    SecureMessageError,
    SecureStageError,
    SecureStageNotOpenError,
)
from fedper.server.storage import Database, RoundState, SecAggSession, Transaction

STAGES = ("keys", "shares", "masked", "unmask")
DONE = "done"
# What GET relays for a stage is known once the stage at this index has begun: the neighbours'
# keys once the key stage is over, the shares once the share stage is, whom to unmask once the
# masked inputs are in.
RELAYED_AFTER = {"keys": 1, "shares": 2, "unmask": 3}
POLL_SECONDS = 2  # the longest Retry-After of a stage's 204 or 409 secagg_stage_not_open


class SecureRounds:
    """The secure rounds of one server: the open round's session, cached, rebuilt on demand."""

    def __init__(
        self, settings: SecAggConfig, db: Database, words: int, folder: Path, dp_clip: Callable[[], float] | None = None
    ) -> None:
        """``dp_clip``: under DP-FedAvg, the open round's clip (each round's session takes it,
        with equal weights and the unclipped bit as a flag word)."""
        self.settings, self.db, self.words, self.folder = settings, db, words, folder
        self._dp_clip = dp_clip
        self._cached: _CachedSession | None = None
        # The cache is rebuilt by readers that do not hold the rounds' lock (a task's took_part, a
        # 204's retry_after): without this lock, a replay read before a post's message was stored
        # could replace the session holding it, and the device that sent it would be out of the
        # round as if it had never sent it (found as one device silently left out of CI's
        # secure rounds). Held for a rebuild and for a post's apply-and-store.
        self._cache_lock = threading.RLock()

    def begin(
        self, tx: Transaction, number: int, cohort: list[str], now: float, deadline: float | None
    ) -> SecAggSession | None:
        """At the draw: the round's fixed part, stored in the draw's transaction (None: fewer than
        two devices were drawn, and the round can have no secure sum)."""
        if len(cohort) < 2 or deadline is None:
            return None
        k = self.settings.neighbours(len(cohort))
        graph = neighbour_graph(sorted(cohort), k)
        timeout = self.settings.secagg_stage_timeout
        ends = {"keys": now + timeout, "shares": now + 2 * timeout, "masked": deadline - timeout, "unmask": deadline}
        dp = self._dp_clip is not None
        clip = self._dp_clip() if self._dp_clip is not None else self.settings.secagg_clip
        row = SecAggSession(number, secrets.token_hex(16), {d: sorted(v) for d, v in graph.items()},
                            self.settings.threshold(len(cohort)), clip, 1 if dp else self.settings.secagg_weight_cap,
                            ends, flags=1 if dp else 0)  # fmt: skip
        self.db.secagg.put_session(tx, row)
        self._cached = None  # not under the cache's lock: a post holding it may wait for this transaction
        return row

    def task(self, number: int) -> SecAggTask | None:
        """What a task of round ``number`` tells a drawn device (None: the round has no session)."""
        row = self.db.secagg.session(number)
        if row is None:
            return None
        k = len(next(iter(row.graph.values())))
        ends = {stage: str(iso_time(t)) for stage, t in row.stage_ends.items()}
        return SecAggTask(session=row.session, cohort=len(row.graph), neighbours=k, threshold=row.threshold,
                          clip_norm=row.clip, weight_cap=row.weight_cap, keys_by=ends["keys"],
                          shares_by=ends["shares"], masked_by=ends["masked"], unmask_by=ends["unmask"])  # fmt: skip

    def fixed_point(self, row: SecAggSession) -> FixedPoint:
        return FixedPoint(row.clip, len(row.graph), row.weight_cap, row.flags)

    def words_of(self, row: SecAggSession) -> int:
        """A masked input's words: the base's floats, the flags, the weight."""
        return self.words + row.flags + 1

    def session(self, number: int) -> tuple[SecAggSession, ServerSession] | None:
        """Round ``number``'s row and session, replayed from the stored messages when not cached."""
        with self._cache_lock:
            return self._session(number)

    def _session(self, number: int) -> tuple[SecAggSession, ServerSession] | None:
        row = self.db.secagg.session(number)
        if row is None:
            return None
        cached = self._cached
        if cached is not None and cached.number == number:
            if self.db.shared:  # other processes may have accepted messages since
                self._catch_up(cached)
            return row, cached.session
        k = len(next(iter(row.graph.values())))
        session = ServerSession(
            sorted(row.graph),
            k,
            row.threshold,
            self.words_of(row),
            row.session.encode(),
            row.graph,
            lambda device: read_masked(self.masked_path(number, device)),
        )
        cached = _CachedSession(number, session)
        self._catch_up(cached)
        self._cached = cached
        return row, session

    def _catch_up(self, cached: _CachedSession) -> None:
        """Apply the messages stored since this process last read the round's (all of them for a
        new session); one this process stored itself is in the session already."""
        try:
            for rowid, stage, device, body in self.db.secagg.messages_after(cached.number, cached.seen):
                if not cached.session.sent(stage, device):
                    apply(cached.session, stage, device, body, self.folder)
                cached.seen = rowid
        except (StageError, OSError, ValueError, KeyError, TypeError) as e:
            self._cached = None
            raise SessionBrokenError(f"round {cached.number}'s stored secure session does not replay: {e}") from e

    def stage(self, number: int, now: float) -> str | None:
        """The stage round ``number`` is in (``DONE`` once the unmasking ended), None if not secure."""
        with self._cache_lock:
            return self._stage(number, now)

    def _stage(self, number: int, now: float) -> str | None:
        found = self.session(number)
        if found is None:
            return None
        row, s = found
        for stage in STAGES:
            if now < row.stage_ends[stage] and s.eligible(stage) - s.done(stage):
                return stage
        return DONE

    def summed(self, number: int, layout: list[tuple[str, tuple[int, ...]]]) -> SecureSum | None:
        """The survivors' unmasked sum (None when the round has no session); RoundFailedError
        when the masks cannot be removed."""
        found = self.session(number)
        if found is None:
            return None
        row, s = found
        fixed = self.fixed_point(row)
        summed, weight, flags = fixed.decode_sum(s.total())
        out, at = {}, 0
        for name, shape in layout:
            size = math.prod(shape)
            out[name] = summed[at : at + size].reshape(shape)
            at += size
        return SecureSum(out, weight, flags, fixed, len(s.included()))

    def took_part(self, number: int, device: str) -> bool:
        """Whether the device advertised its keys in round ``number``'s session: it cannot take
        part again with new ones, so it gets no task until the next round."""
        with self._cache_lock:
            found = self.session(number)
            return found is not None and device in found[1].advertised

    def masked_path(self, number: int, device_id: str) -> Path:
        return self.folder / f"r{number}" / f"{device_id}.masked"

    def referenced(self, number: int) -> set[str]:
        """The masked inputs' files of round ``number`` (relative to the updates folder)."""
        return {MaskedBody.parse(body).file for stage, _, body in self.db.secagg.messages(number) if stage == "masked"}

    # --- a device's requests (the caller holds the rounds' lock) ---------------------------

    def _check(self, number: int, device: str, stage: str, now: float) -> ServerSession:
        """The round's session if ``stage`` is the one it is in and the device may take part in it."""
        found = self.session(number)
        if found is None or device not in found[0].graph:
            raise NotInCohortError(f"this device is not in round {number}'s secure cohort")
        s = found[1]
        if device in s.done(stage):  # a retry whose first answer was lost, maybe after the stage ended
            raise AlreadyReportedError(f"{device!r} already sent its part of the {stage} stage")
        current = self.stage(number, now)
        if current != stage and current is not None and _index(current) < _index(stage):
            wait = self.retry_after(number, now)
            raise SecureStageNotOpenError(f"round {number} is in its {current} stage; {stage} has not begun", wait)
        if current != stage:
            raise SecureStageError(f"round {number} is in its {current} stage, not {stage}")
        if device not in s.eligible(stage):
            raise SecureStageError(f"this device missed a stage before {stage}: it is out of round {number}")
        return s

    def post(self, number: int, device: str, stage: str, body: bytes, now: float, unopened: str = "") -> None:
        """A device's message for ``stage`` (JSON body; for ``masked``, the words' bytes and the
        ids of the neighbours whose shares it could not open), checked, stored, then applied."""
        with self._cache_lock:
            self._post(number, device, stage, body, now, unopened)

    def _post(self, number: int, device: str, stage: str, body: bytes, now: float, unopened: str) -> None:
        """Checked, applied and stored inside one transaction (the database's write lock): a
        process sharing the database cannot accept the same device's message meanwhile, nor seal
        or end the round."""
        applied = False
        try:
            with self.db.transaction() as tx:
                current = self.db.rounds.get(number)
                if current is None or current.state != RoundState.OPEN:
                    raise RoundNotOpenError(f"round {number} is not open")
                if self.db.closers.sealed(number):
                    raise RoundClosingError(f"round {number} is being closed: it takes nothing more")
                self._apply_new(tx, number, device, stage, body, now, unopened)
                applied = True
        except BaseException:
            if applied:  # the session is ahead of the database: rebuild it from there
                self._cached = None
            raise

    def _apply_new(
        self, tx: Transaction, number: int, device: str, stage: str, body: bytes, now: float, unopened: str
    ) -> None:
        s = self._check(number, device, stage, now)
        stored = body
        path = None
        if stage == "masked":
            path = self.masked_path(number, device)
            words = s.words
            if len(body) != 4 * words:
                raise SecureMessageError(f"a masked input is {words} uint32 words, got {len(body)} bytes")
            ids = [d.strip() for d in unopened.split(",") if d.strip()]
            if len(ids) != len(set(ids)):
                raise SecureMessageError(f"{Header.SECAGG_UNOPENED} names a device twice")
            store_masked(path, np.frombuffer(body, dtype="<u4"))
            stored = MaskedBody(str(path.relative_to(self.folder)), ids).encode()
        try:
            apply(s, stage, device, stored, self.folder)
        except DuplicateMessageError as e:
            raise AlreadyReportedError(str(e)) from e
        except (StageError, KeyError, TypeError, ValueError) as e:
            if path is not None:
                path.unlink(missing_ok=True)
            raise SecureMessageError(f"{stage}: {e}") from e
        self.db.secagg.put_message(tx, number, stage, device, stored, now)

    def get(self, number: int, device: str, stage: str, now: float) -> dict[str, object] | None:
        """What the server relays to the device for ``stage`` once the stage before it is over
        (None: not yet)."""
        with self._cache_lock:
            return self._get(number, device, stage, now)

    def _get(self, number: int, device: str, stage: str, now: float) -> dict[str, object] | None:
        found = self.session(number)
        if found is None or device not in found[0].graph:
            raise NotInCohortError(f"this device is not in round {number}'s secure cohort")
        row, s = found
        current = self.stage(number, now)
        if current is None or _index(current) < RELAYED_AFTER[stage]:
            return None
        if stage == "keys":
            if device not in s.advertised:
                raise SecureStageError(f"this device advertised no keys: it is out of round {number}")
            return SecAggNeighbours(threshold=row.threshold, neighbours={
                n: SecAggKeys(channel_key=octets_text(a.channel), mask_key=octets_text(a.mask))
                for n, a in s.neighbours(device).items()}).model_dump()  # fmt: skip
        if stage == "shares":
            if device not in s.shared:
                raise SecureStageError(f"this device sent no shares: it is out of round {number}")
            return SecAggSealed(shares={n: octets_text(c) for n, c in s.shares_for(device).items()}).model_dump()
        if device not in s.masked:
            raise SecureStageError(f"this device sent no masked input: it is out of round {number}")
        if device not in s.included():
            raise SecureStageError(f"this device's input was left out of round {number}'s sum (docs/SECAGG.md, "
                                   "'Who is in the sum'): it is out of the round")  # fmt: skip
        dropped, survivors = s.unmask_request(device)
        return SecAggUnmaskRequest(dropped=dropped, survivors=survivors).model_dump()

    def retry_after(self, number: int, now: float) -> int:
        """Seconds a device waits before it asks again: until the current stage's end, but at most
        POLL_SECONDS (a stage ends early once everyone who can has sent, and the next stage's
        time starts then: a device that slept to the end could miss a short one)."""
        row = self.db.secagg.session(number)
        current = self.stage(number, now)
        if row is None or current in (None, DONE):
            return 1
        return max(1, min(POLL_SECONDS, int(row.stage_ends[current] - now) + 1))


@dataclass
class _CachedSession:
    """A round's replayed session and the rowid of the last stored message it has seen."""

    number: int
    session: ServerSession
    seen: int = 0


class SessionBrokenError(RuntimeError):
    """A stored session that no longer replays (a masked input's file lost, a message in a layout
    this server does not read): its round cannot go on and is abandoned."""


def _index(stage: str) -> int:
    return len(STAGES) if stage == DONE else STAGES.index(stage)


def apply(session: ServerSession, stage: str, device: str, body: bytes, folder: Path) -> None:
    """One stored (or arriving) message into the session; StageError if it does not fit."""
    if stage == "keys":
        keys = json.loads(body)
        session.advertise(device, Advertisement(_b64(keys["channel_key"]), _b64(keys["mask_key"])))
    elif stage == "shares":
        session.share(device, {to: _b64(v) for to, v in json.loads(body)["shares"].items()})
    elif stage == "masked":
        stored = MaskedBody.parse(body)
        session.submit(device, read_masked(folder / stored.file), stored.unopened)
    elif stage == "unmask":
        session.answer(device, {about: _b64(v) for about, v in json.loads(body)["shares"].items()})
    else:
        raise StageError(f"no stage {stage!r}")


@dataclass(frozen=True)
class MaskedBody:
    """How a masked input is recorded: its file (relative to the updates folder) and the
    neighbours whose shares its device could not open."""

    file: str
    unopened: list[str]

    def encode(self) -> bytes:
        return json.dumps({"file": self.file, "unopened": self.unopened}).encode()

    @classmethod
    def parse(cls, body: bytes) -> MaskedBody:
        if not body.startswith(b"{"):  # a server of protocol revision 1.6 recorded the file alone
            return cls(body.decode(), [])
        data = json.loads(body)
        return cls(str(data["file"]), [str(d) for d in data["unopened"]])


def store_masked(path: Path, words: np.ndarray) -> None:
    """A masked input, as the little-endian words it is (the only form of an update the server keeps)."""
    atomic_write_bytes(path, words.astype("<u4").tobytes())


def read_masked(path: Path) -> np.ndarray:
    return np.frombuffer(path.read_bytes(), dtype="<u4").astype(np.uint32)


def _b64(text: str) -> bytes:
    try:
        return octets(text)
    except OctetsError as e:
        raise StageError(str(e)) from e
