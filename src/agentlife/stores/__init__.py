"""Job stores: the roles callers play, SQLite (embedded) and PostgreSQL (asyncpg).

A caller is typed by its role: `JobStore`, `WorkQueue` or `OperatorStore` (their union: `CheckpointStore`).

`store_from_url` picks the implementation from ``AGENTLIFE_DATABASE_URL``; asyncpg is imported only when a
``postgresql://`` URL is used.

The map, for a maintainer: `_roles` declares what callers use; `_store` (`SQLStore`) runs each operation,
written once in the module of its concern (`_claims`, `_checkpoints`, `_transitions`, `_reaper`,
`_approval`, `_waits`, `_events`, `_childjobs`, `_steprecords`, `_rewind`, `_delivery`) against
`_dialect`'s `Tx`; each database supplies its dialect: `_sqlite` with `_sqlite_sql` and `_sqlite_schema`,
`_postgres` with `_pg_statements`, `_pg_schema` and `_pg_listen`. Below them: the records (`_base`),
reading rows another client wrote (`_rows`), the job rules (`_jobs`), the crash policy (`_policy`),
concurrency keys, priority and the running limits a claim enforces (`_limits`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentlife._config import validate_database_url
from agentlife._exceptions import ConfigError
from agentlife.stores._approval import ApprovalRequest, ApprovalState
from agentlife.stores._base import (
    HISTORY_KEEP,
    JobRecord,
    JobStatus,
    LoadedCheckpoint,
    TableNames,
    crc32,
)
from agentlife.stores._childjobs import JobFamily
from agentlife.stores._jobs import ReapDecision
from agentlife.stores._limits import ClaimLimits
from agentlife.stores._roles import (
    CheckpointStore,
    Handback,
    JobRows,
    JobStore,
    OperatorStore,
    RateBuckets,
    WorkQueue,
)
from agentlife.stores._sqlite import SQLiteStore
from agentlife.stores._steprecords import StepRecord
from agentlife.stores._waits import WaitState

if TYPE_CHECKING:
    from agentlife.stores._postgres import PostgresStore

__all__ = [
    "HISTORY_KEEP",
    "ApprovalRequest",
    "ApprovalState",
    "CheckpointStore",
    "ClaimLimits",
    "Handback",
    "JobFamily",
    "JobRecord",
    "JobRows",
    "JobStatus",
    "JobStore",
    "LoadedCheckpoint",
    "OperatorStore",
    "PostgresStore",
    "RateBuckets",
    "ReapDecision",
    "SQLiteStore",
    "StepRecord",
    "TableNames",
    "WaitState",
    "WorkQueue",
    "crc32",
    "store_from_url",
]


def store_from_url(
    url: str,
    *,
    tables: TableNames | None = None,
    must_exist: bool = False,
    connections: int | None = None,
    warm: int = 0,
) -> CheckpointStore:
    """The store for ``url`` (``sqlite:///path`` or ``postgresql://...``), not yet opened.

    ``must_exist``: for commands that read or operate on jobs: a SQLite file that does not exist (or holds
    no job table) is refused at `open` with ``no store at PATH`` (`agentlife.StoreError`) instead of being
    created empty. A PostgreSQL database without the schema is refused by its first query either way.
    ``connections``: the most connections a PostgreSQL store's pool opens (default 4); a worker running
    several jobs at once asks for more, so its slots do not queue for a connection, and ``warm``: how many
    of them to open at once (best effort), so its first jobs do not each start a session.

    Raises:
        ConfigError: the scheme is not supported.
    """
    validate_database_url(url)
    if url.startswith("sqlite:"):
        return SQLiteStore.from_url(url, tables=tables, must_exist=must_exist)
    if url.startswith(("postgresql://", "postgres://")):
        from agentlife.stores._postgres import PostgresStore

        if connections is None:
            return PostgresStore(url, tables=tables, warm=warm)
        return PostgresStore(url, tables=tables, max_size=connections, warm=warm)
    scheme = url.split(":", 1)[0] if ":" in url else url[:20]
    raise ConfigError(
        f"AGENTLIFE_DATABASE_URL scheme {scheme!r} is not supported (use sqlite:/// or postgresql://)"
    )


def __getattr__(name: str) -> object:
    # PostgresStore is public but asyncpg is heavy: import it on first use only.
    if name == "PostgresStore":
        from agentlife.stores._postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
