"""Secure rounds on the server (docs/SECAGG.md; PROTOCOL.md revision 1.6): the open round's
SecAgg+ session, begun at the draw, every accepted message stored before it is answered, and
replayed from the database after a restart; which stage a round is in; and the round's sum of
weighted deltas at the end.

A stage ends at its time (fixed at the draw) or as soon as every device that could still take
part in it has: the key stage when the whole cohort advertised, the share stage when every device
that advertised shared, the masked stage when every device that shared sent its input, the
unmasking when every device that sent an input answered. What a device sends for a stage that is
over is refused (``secagg_stage_closed``), and for one not begun it is told to come back.

WORK IN PROGRESS (issue 32, part 2): not wired into the rounds or the routes yet.
"""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from fedper.common.atomic_write import atomic_write_bytes
from fedper.common.secagg.config import SecAggConfig
from fedper.common.secagg.device_session import Advertisement
from fedper.common.secagg.fixed_point import FixedPoint
from fedper.common.secagg.graph import neighbour_graph
from fedper.common.secagg.server_session import ServerSession, StageError
from fedper.server.storage import Database, SecAggSession

STAGES = ("keys", "shares", "masked", "unmask")
DONE = "done"


class SecureRounds:
    """The secure rounds of one server: the open round's session, cached, rebuilt on demand."""

    def __init__(self, settings: SecAggConfig, db: Database, words: int, folder: Path) -> None:
        self.settings, self.db, self.words, self.folder = settings, db, words, folder
        self._cached: tuple[int, ServerSession] | None = None

    def begin(self, conn: object, number: int, cohort: list[str], now: float, deadline: float) -> SecAggSession | None:
        """At the draw: the round's fixed part, stored in the draw's transaction (None: fewer than
        two devices were drawn, and the round can have no secure sum)."""
        if len(cohort) < 2:
            return None
        k = self.settings.neighbours(len(cohort))
        graph = neighbour_graph(sorted(cohort), k)
        timeout = self.settings.secagg_stage_timeout
        ends = {"keys": now + timeout, "shares": now + 2 * timeout, "masked": deadline - timeout, "unmask": deadline}
        row = SecAggSession(number, secrets.token_hex(16), {d: sorted(v) for d, v in graph.items()},
                            self.settings.threshold(len(cohort)), self.settings.secagg_clip,
                            self.settings.secagg_weight_cap, ends)  # fmt: skip
        self.db.put_secagg_session(conn, row)  # type: ignore[arg-type]
        self._cached = None
        return row

    def fixed_point(self, row: SecAggSession) -> FixedPoint:
        return FixedPoint(row.clip, len(row.graph), row.weight_cap)

    def session(self, number: int) -> tuple[SecAggSession, ServerSession] | None:
        """Round ``number``'s row and session, replayed from the stored messages when not cached."""
        row = self.db.secagg_session(number)
        if row is None:
            return None
        if self._cached is not None and self._cached[0] == number:
            return row, self._cached[1]
        k = len(next(iter(row.graph.values())))
        session = ServerSession(sorted(row.graph), k, row.threshold, self.words + 1, row.session.encode(), row.graph)
        for stage, device, body in self.db.secagg_messages(number):
            apply(session, stage, device, body, self.folder)
        self._cached = (number, session)
        return row, session

    def stage(self, number: int, now: float) -> str | None:
        """The stage round ``number`` is in (``DONE`` once the unmasking ended), None if not secure."""
        found = self.session(number)
        if found is None:
            return None
        row, s = found
        waiting = {
            "keys": set(s.graph) - s.advertised.keys(),
            "shares": set(s.advertised) - s.shared,
            "masked": s.shared - s.masked,
            "unmask": s.masked - s.answers.keys(),
        }
        for stage in STAGES:
            if now < row.stage_ends[stage] and waiting[stage]:
                return stage
        return DONE

    def masked_path(self, number: int, device_id: str) -> Path:
        return self.folder / f"r{number}" / f"{device_id}.masked"


def apply(session: ServerSession, stage: str, device: str, body: bytes, folder: Path) -> None:
    """One stored (or arriving) message into the session; StageError if it does not fit."""
    if stage == "keys":
        keys = json.loads(body)
        session.advertise(device, Advertisement(_b64(keys["channel_key"]), _b64(keys["mask_key"])))
    elif stage == "shares":
        session.share(device, {to: _b64(v) for to, v in json.loads(body)["shares"].items()})
    elif stage == "masked":
        path = folder / body.decode()
        session.submit(device, np.frombuffer(path.read_bytes(), dtype="<u4").astype(np.uint32))
    elif stage == "unmask":
        session.answer(device, {about: _b64(v) for about, v in json.loads(body)["shares"].items()})
    else:
        raise StageError(f"no stage {stage!r}")


def store_masked(path: Path, words: np.ndarray) -> None:
    """A masked input, as the little-endian words it is (the only form of an update the server keeps)."""
    atomic_write_bytes(path, words.astype("<u4").tobytes())


def _b64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (ValueError, TypeError) as e:
        raise StageError(f"not base64: {e}") from e


def sealed_body(shares: Mapping[str, bytes]) -> bytes:
    return json.dumps({"shares": {k: base64.b64encode(v).decode() for k, v in sorted(shares.items())}}).encode()
