"""The ``rounds`` and ``updates`` tables: each round's life, and the updates accepted in it."""

from __future__ import annotations

import json
from typing import Any

from fedper.server.storage.records import EndedRound, Round, RoundEnding, RoundState, StoredUpdate
from fedper.server.storage.transaction import SQLITE_MAX, Query, Row, Transaction


class RoundRecords:
    """Rounds and their accepted updates. Reads outside a transaction see committed state only."""

    def __init__(self, query: Query) -> None:
        self._query = query

    def get(self, number: int) -> Round | None:
        if not 0 <= number <= SQLITE_MAX:
            return None
        rows = self._query("SELECT * FROM rounds WHERE round = ?", (number,))
        return _round(rows[0]) if rows else None

    def latest(self) -> Round | None:
        rows = self._query("SELECT * FROM rounds ORDER BY round DESC LIMIT 1")
        return _round(rows[0]) if rows else None

    def count_closed(self) -> int:
        return int(self._query("SELECT COUNT(*) AS n FROM rounds WHERE state = 'closed'")[0]["n"])

    def last_closed_seconds(self) -> float | None:
        """How long the most recently closed round was open (for pace steering)."""
        rows = self._query("SELECT closed_at - opened_at AS s FROM rounds WHERE state = 'closed' "
                          "ORDER BY round DESC LIMIT 1")  # fmt: skip
        return float(rows[0]["s"]) if rows else None

    def ended_after(self, number: int) -> list[EndedRound]:
        """The ended rounds numbered above ``number``, oldest first (a reader that keeps the
        earlier ones asks only for the new)."""
        rows = self._query(
            "SELECT r.round, r.state, r.model_version, r.opened_at, r.closed_at, r.checked_in, r.drawn, r.reason,"
            " r.refused, r.secure_stages, r.filled_at, r.aggregation,"
            " (SELECT COUNT(*) FROM updates u WHERE u.round = r.round) AS reported"
            " FROM rounds r WHERE r.state != 'open' AND r.round > ? ORDER BY r.round",
            (number,),
        )
        return [
            EndedRound(
                row["round"], RoundState(row["state"]), row["closed_at"], row["closed_at"] - row["opened_at"],
                row["checked_in"], row["drawn"], row["reported"], row["model_version"], row["opened_at"],
                row["reason"], json.loads(row["refused"] or "{}"), json.loads(row["secure_stages"] or "{}"),
                None if row["filled_at"] is None else max(0.0, row["filled_at"] - row["opened_at"]),
                json.loads(row["aggregation"]) if row["aggregation"] else None,
            )
            for row in rows
        ]  # fmt: skip

    def reported_metrics(
        self, first_round: int, last_round: int, min_version: int = 0
    ) -> list[tuple[int, dict[str, float]]]:
        """The metrics each accepted update of rounds ``first_round``..``last_round`` that trained
        from version ``min_version`` or later reported, with that version (what the dashboard
        summarizes per version)."""
        rows = self._query(
            "SELECT r.model_version AS v, u.metrics FROM updates u JOIN rounds r ON r.round = u.round"
            " WHERE u.round BETWEEN ? AND ? AND r.model_version >= ?",
            (first_round, last_round, min_version),
        )
        return [(int(row["v"]), json.loads(row["metrics"])) for row in rows]

    def open(self, tx: Transaction, number: int, version: int, now: float, deadline: float | None) -> None:
        tx._execute(
            "INSERT INTO rounds (round, state, model_version, opened_at, deadline) VALUES (?, 'open', ?, ?, ?)",
            (number, version, now, deadline),
        )

    def start_clock(self, tx: Transaction, number: int, now: float, deadline: float | None) -> None:
        """Round ``number`` (open, waiting for devices) starts now: its window and deadline count from here."""
        tx._execute("UPDATE rounds SET opened_at = ?, deadline = ? WHERE round = ?", (now, deadline, number))

    def end(
        self,
        tx: Transaction,
        number: int,
        state: RoundState,
        now: float,
        result_version: int | None = None,
        metrics: dict[str, Any] | None = None,
        reason: str | None = None,
        *,
        ending: RoundEnding | None = None,
    ) -> None:
        """Record how round ``number`` ended (with how many devices checked in and held a slot,
        when its cohort was full, a secure round's messages per stage: those rows go now, and the
        ``ending``'s refusals); its update files are no longer needed."""
        ending = ending or RoundEnding()
        # Full at the fill_rank-th slot given out; a cohort fixed by a draw (fill_rank 0) at the draw.
        filled = (
            "(SELECT MIN(assigned_at) FROM slots WHERE round = ?)" if ending.fill_rank == 0
            else "(SELECT assigned_at FROM slots WHERE round = ? ORDER BY assigned_at LIMIT 1 OFFSET ?)"
        )  # fmt: skip
        stages = self._query("SELECT stage, COUNT(*) AS n FROM secagg_messages WHERE round = ? GROUP BY stage",
                             (number,))  # fmt: skip
        refused = self.refusals(number)
        for code, n in ending.refused.items():
            refused[code] = refused.get(code, 0) + n
        tx._execute(
            "UPDATE rounds SET checked_in = (SELECT COUNT(*) FROM checkins WHERE round = ?),"
            f" drawn = (SELECT COUNT(*) FROM slots WHERE round = ?), filled_at = {filled},"
            " refused = ?, secure_stages = ?, aggregation = ? WHERE round = ?",
            (number, number, number, *((ending.fill_rank - 1,) if ending.fill_rank else ()),
             json.dumps(dict(sorted(refused.items()))),
             json.dumps({str(r["stage"]): int(r["n"]) for r in stages}) if stages else None,
             None if ending.aggregation is None else json.dumps(ending.aggregation), number),
        )  # fmt: skip
        tx._execute("DELETE FROM checkins WHERE round <= ?", (number,))  # drawn long ago, or never to be
        tx._execute(
            "UPDATE rounds SET state = ?, closed_at = ?, result_version = ?, metrics = ?, reason = ? WHERE round = ?",
            (state.value, now, result_version, json.dumps(metrics) if metrics is not None else None, reason, number),
        )
        tx._execute("UPDATE updates SET file = NULL WHERE round = ?", (number,))
        tx._execute("DELETE FROM slots WHERE round = ?", (number,))  # an ended round has no cohort
        tx._execute("DELETE FROM checkins WHERE round = ?", (number,))
        tx._execute("DELETE FROM secagg_messages WHERE round = ?", (number,))  # sealed shares, answers
        tx._execute("DELETE FROM secagg_sessions WHERE round = ?", (number,))
        tx._execute("DELETE FROM refusal_counts WHERE round <= ?", (number,))
        tx._execute("DELETE FROM closers WHERE round <= ?", (number,))
        tx._execute("DELETE FROM region_sums WHERE round <= ?", (number,))
        tx._execute("DELETE FROM forwards WHERE round <= ?", (number,))

    def add_refusals(self, tx: Transaction, number: int, counts: dict[str, int]) -> None:
        """Add one process's refusals of open round ``number`` (several processes, one database)."""
        tx._executemany(
            "INSERT INTO refusal_counts (round, code, n) VALUES (?, ?, ?) ON CONFLICT (round, code)"
            " DO UPDATE SET n = refusal_counts.n + excluded.n",
            [(number, code, n) for code, n in sorted(counts.items())],
        )

    def refusals(self, number: int) -> dict[str, int]:
        """Round ``number``'s refusals that processes have added so far."""
        rows = self._query("SELECT code, n FROM refusal_counts WHERE round = ?", (number,))
        return {str(r["code"]): int(r["n"]) for r in rows}

    def mark_rolled_back(self, tx: Transaction, after_version: int, open_round: int | None) -> None:
        """The rounds a rollback to ``after_version`` undoes: those that closed into a later version,
        and the open one."""
        tx._execute("UPDATE rounds SET rolled_back = 1 WHERE state = 'closed' AND result_version > ?", (after_version,))
        if open_round is not None:
            tx._execute("UPDATE rounds SET rolled_back = 1 WHERE round = ?", (open_round,))

    # --- updates ------------------------------------------------------------------------

    def updates(self, number: int) -> list[StoredUpdate]:
        rows = self._query("SELECT * FROM updates WHERE round = ? ORDER BY received_at", (number,))
        return [
            StoredUpdate(
                r["round"],
                r["device_id"],
                r["num_samples"],
                r["base_version"],
                r["file"],
                json.loads(r["metrics"]),
                _bit(r["unclipped"]),
            )
            for r in rows
        ]

    def has_update(self, number: int, device_id: str) -> bool:
        return bool(self._query("SELECT 1 FROM updates WHERE round = ? AND device_id = ?", (number, device_id)))

    def count_updates(self, number: int) -> int:
        return int(self._query("SELECT COUNT(*) AS n FROM updates WHERE round = ?", (number,))[0]["n"])

    def insert_update(self, tx: Transaction, update: StoredUpdate, received_at: float) -> None:
        tx._execute(
            "INSERT INTO updates (round, device_id, num_samples, base_version, file, metrics, received_at, "
            "unclipped) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (update.round, update.device_id, update.num_samples, update.base_version, update.file,
             json.dumps(update.metrics), received_at, None if update.unclipped is None else int(update.unclipped)),
        )  # fmt: skip

    def delete_update(self, tx: Transaction, number: int, device_id: str) -> None:
        tx._execute("DELETE FROM updates WHERE round = ? AND device_id = ?", (number, device_id))


def _bit(value: int | None) -> bool | None:
    return None if value is None else bool(value)


def _round(row: Row) -> Round:
    return Round(
        round=row["round"],
        state=RoundState(row["state"]),
        model_version=row["model_version"],
        opened_at=row["opened_at"],
        deadline=row["deadline"],
        closed_at=row["closed_at"],
        result_version=row["result_version"],
        metrics=json.loads(row["metrics"]) if row["metrics"] else None,
        reason=row["reason"],
        rolled_back=bool(row["rolled_back"]),
        checked_in=row["checked_in"],
        drawn=row["drawn"],
    )
