"""The secure rounds' tables (docs/SECAGG.md): each round's session, and the stage messages
accepted in it."""

from __future__ import annotations

import json

from fedper.server.storage.records import SecAggSession
from fedper.server.storage.transaction import SQLITE_MAX, Query, Transaction


class SecAggRecords:
    """A secure round's session and messages; both go when the round ends (:meth:`RoundRecords.end`)."""

    def __init__(self, query: Query) -> None:
        self._query = query

    def put_session(self, tx: Transaction, session: SecAggSession) -> None:
        tx._execute(
            "INSERT INTO secagg_sessions (round, session, graph, threshold, clip, weight_cap, stage_ends, flags)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (round) DO UPDATE SET session = excluded.session,"
            " graph = excluded.graph, threshold = excluded.threshold, clip = excluded.clip,"
            " weight_cap = excluded.weight_cap, stage_ends = excluded.stage_ends, flags = excluded.flags",
            (session.round, session.session, json.dumps(session.graph, sort_keys=True), session.threshold,
             session.clip, session.weight_cap, json.dumps(session.stage_ends, sort_keys=True), session.flags),
        )  # fmt: skip

    def session(self, number: int) -> SecAggSession | None:
        rows = self._query("SELECT * FROM secagg_sessions WHERE round = ?", (min(number, SQLITE_MAX),))
        if not rows:
            return None
        r = rows[0]
        return SecAggSession(int(r["round"]), str(r["session"]), json.loads(r["graph"]), int(r["threshold"]),
                             float(r["clip"]), int(r["weight_cap"]), json.loads(r["stage_ends"]),
                             int(r["flags"]))  # fmt: skip

    def put_message(self, tx: Transaction, number: int, stage: str, device_id: str, body: bytes, now: float) -> None:
        tx._execute(
            "INSERT INTO secagg_messages (round, stage, device_id, body, at) VALUES (?, ?, ?, ?, ?)",
            (number, stage, device_id, body, now),
        )

    def count_messages(self, number: int, stage: str) -> int:
        rows = self._query("SELECT COUNT(*) AS n FROM secagg_messages WHERE round = ? AND stage = ?", (number, stage))
        return int(rows[0]["n"])

    def messages(self, number: int) -> list[tuple[str, str, bytes]]:
        """(stage, device, body) of round ``number``'s accepted messages, in the order they were stored."""
        return [(stage, device, body) for _, stage, device, body in self.messages_after(number, 0)]

    def messages_after(self, number: int, after: int) -> list[tuple[int, str, str, bytes]]:
        """(rowid, stage, device, body) of round ``number``'s messages stored after the one whose
        rowid is ``after`` (0: all), in the order they were stored. Writers take the database's
        write lock, so rowids grow in the order transactions commit, on both engines."""
        rows = self._query(
            "SELECT rowid, stage, device_id, body FROM secagg_messages WHERE round = ? AND rowid > ? ORDER BY rowid",
            (number, after),
        )
        return [(int(r["rowid"]), str(r["stage"]), str(r["device_id"]), bytes(r["body"])) for r in rows]
