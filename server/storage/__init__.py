"""The server's durable state: one SQLite database in WAL mode (devices, rounds, updates,
model versions) and a blob directory for weights (written to a temp file, fsynced, renamed).

Data directory layout::

    state.db                     SQLite database (WAL: state.db-wal, state.db-shm beside it)
    admin_token, enrollment_key  generated secrets (mode 0600), unless given by environment
    models/v<N>.safetensors      aggregated base of model version N (v0 = the export's)
    updates/r<R>/<device>.safetensors   accepted updates of the open round (deleted once aggregated)
    tmp/                         request bodies and files being written (emptied at start)
    quarantine/                  stored updates that could not be loaded at start (for inspection)

All SQL of the server lives in this package (the schema's steps in :mod:`.migrations`, the
connection core in :mod:`.database`, one module per table group). Writes go through a
:class:`Transaction`, reads return typed records: no other module sees SQLite.
"""

from fedper.server.storage.cohort import CohortRecords
from fedper.server.storage.database import READERS, Database
from fedper.server.storage.devices import DeviceRecords
from fedper.server.storage.errors import DatabaseBusyError, StorageError, StorageFullError
from fedper.server.storage.records import (
    Device,
    EndedRound,
    ModelVersion,
    Round,
    RoundEnding,
    RoundState,
    RunState,
    SecAggSession,
    Slot,
    StoredUpdate,
)
from fedper.server.storage.rounds import RoundRecords
from fedper.server.storage.secagg import SecAggRecords
from fedper.server.storage.transaction import SQLITE_MAX, Transaction
from fedper.server.storage.versions import VersionRecords

__all__ = [
    "READERS",
    "SQLITE_MAX",
    "CohortRecords",
    "Database",
    "DatabaseBusyError",
    "Device",
    "DeviceRecords",
    "EndedRound",
    "ModelVersion",
    "Round",
    "RoundEnding",
    "RoundRecords",
    "RoundState",
    "RunState",
    "SecAggRecords",
    "SecAggSession",
    "Slot",
    "StorageError",
    "StorageFullError",
    "StoredUpdate",
    "Transaction",
    "VersionRecords",
]
