"""The ``nonces`` table: attestation nonces that any process sharing the database can take
(:class:`fedper.server.attestation.SharedNonces`): a device's challenge and its enrollment may
reach different replicas. Wall-clock expiry times."""

from __future__ import annotations

from fedper.server.storage.transaction import Query, Transaction


class NonceRecords:
    def __init__(self, query: Query) -> None:
        self._query = query

    def issue(self, tx: Transaction, nonce: str, expires_at: float) -> None:
        tx._execute("INSERT INTO nonces (nonce, expires_at) VALUES (?, ?)", (nonce, expires_at))

    def take(self, tx: Transaction, nonce: str, now: float) -> bool:
        """Whether ``nonce`` was issued and has not expired (it is gone now, taken or expired)."""
        return tx._execute("DELETE FROM nonces WHERE nonce = ? AND expires_at > ?", (nonce, now)) == 1

    def prune(self, tx: Transaction, now: float) -> int:
        return tx._execute("DELETE FROM nonces WHERE expires_at <= ?", (now,))
