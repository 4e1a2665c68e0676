"""SQLite's schema: the tables every store shares, and what each concern adds (made or mended at open).

A new database is made in one transaction: one fsync instead of one per statement. A database made by an
older version gets the columns it lacks (``ALTER TABLE``) and the indexes and triggers of this one.
"""

from __future__ import annotations

import sqlite3

from agentlife.stores._base import TableNames
from agentlife.stores._dialect import RUNNABLE_SQL, TERMINAL_SQL
from agentlife.stores._output_sql import sqlite_output_schema

__all__ = ["has_job_table", "make_schema"]

#: Columns added to a job table made before they existed, with their types (``PRAGMA table_info`` decides).
_ADDED_COLUMNS = (
    ("owner", "TEXT"),  # the claim token
    ("not_before", "REAL"),  # a 0.2 database: the worker's runnable-job lookup needs it
    ("approval", "TEXT"),  # the call a job is parked on and the calls approved (0.3)
    ("waiting", "TEXT"),  # what a WAITING job waits for (durable waits)
    ("parent_id", "TEXT"),  # who started a child job (child jobs)
    ("spawned_by", "TEXT"),
    ("detached", "INTEGER NOT NULL DEFAULT 0"),
    ("concurrency_key", "TEXT"),  # concurrency keys and priority
    ("priority", "INTEGER NOT NULL DEFAULT 0"),
    ("paused", "TEXT"),  # an operator's pause: the status it was paused in, or a running job's request
    ("incarnation", "TEXT"),  # which creation of the id the row is: a journal of another is never replayed
)


def has_job_table(conn: sqlite3.Connection, t: TableNames) -> bool:
    """Whether the file holds the job table (False for a file that is not a database at all)."""
    schema, _, base = t.job.rpartition(".")
    master = f"{schema}.sqlite_master" if schema else "sqlite_master"
    try:
        row = conn.execute(f"SELECT 1 FROM {master} WHERE type = 'table' AND name = ?", (base,)).fetchone()
    except sqlite3.DatabaseError:  # not a database at all ("file is not a database")
        return False
    return row is not None


def make_schema(conn: sqlite3.Connection, t: TableNames) -> None:
    """Create what is missing, a new database in one transaction.

    IMMEDIATE takes the write lock first, so a second process making the same file waits for the first and
    then finds every table there.
    """
    if has_job_table(conn, t):
        _make(conn, t)
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        _make(conn, t)
    except BaseException:
        if conn.in_transaction:  # SQLite may have rolled back already (a full disk)
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _make(conn: sqlite3.Connection, t: TableNames) -> None:
    for statement in _schema(t):
        conn.execute(statement)
    schema, _, base = t.job.rpartition(".")
    columns = conn.execute(f"PRAGMA {schema + '.' if schema else ''}table_info({base})").fetchall()
    names = {column[1] for column in columns}
    for column, kind in _ADDED_COLUMNS:
        if column not in names:
            conn.execute(f"ALTER TABLE {t.job} ADD COLUMN {column} {kind}")
    made = [
        *_job_indexes(t),
        *_event_schema(t),
        *_child_schema(t),
        *_step_record_schema(t),
        *sqlite_output_schema(t),
        *_key_indexes(t),
        *_prune_schema(t),
    ]
    for statement in made:
        conn.execute(statement)
    for statement in _rate_schema(t):
        conn.execute(statement)


def _rate_schema(t: TableNames) -> list[str]:
    """The rate-limit buckets and in-flight slots (SQLite)."""
    schema, _, base = t.rate_slot.rpartition(".")
    prefix = f"{schema}." if schema else ""
    return [
        f"""CREATE TABLE IF NOT EXISTS {t.rate_bucket} (
            key TEXT PRIMARY KEY,
            requests REAL,
            input_tokens REAL,
            output_tokens REAL,
            updated_at REAL NOT NULL,
            paused_until REAL NOT NULL DEFAULT 0
        )""",
        f"""CREATE TABLE IF NOT EXISTS {t.rate_slot} (
            id TEXT PRIMARY KEY,
            key TEXT NOT NULL,
            expires_at REAL NOT NULL
        )""",
        f"CREATE INDEX IF NOT EXISTS {prefix}{base}_key_idx ON {base} (key, expires_at)",
    ]


def _schema(t: TableNames) -> list[str]:
    return [
        f"""CREATE TABLE IF NOT EXISTS {t.job} (
            id TEXT PRIMARY KEY,
            agent_id TEXT NOT NULL,
            status TEXT NOT NULL DEFAULT 'PENDING',
            payload TEXT,
            attempt INTEGER NOT NULL DEFAULT 0,
            checkpoint BLOB,
            checkpoint_crc INTEGER,
            checkpoint_id TEXT,
            heartbeat_at REAL,
            tokens_consumed TEXT NOT NULL DEFAULT '{{"input": 0, "output": 0, "cost_usd": 0.0}}',
            token_budget TEXT,
            error TEXT NOT NULL DEFAULT '[]',
            result TEXT,
            updated_at REAL NOT NULL,
            owner TEXT,
            not_before REAL
        )""",
        f"""CREATE TABLE IF NOT EXISTS {t.checkpoint_history} (
            job_id TEXT NOT NULL,
            checkpoint_id TEXT NOT NULL,
            step INTEGER NOT NULL,
            checkpoint BLOB NOT NULL,
            crc INTEGER NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (job_id, checkpoint_id)
        )""",
        _history_index(t.checkpoint_history),
        f"""CREATE TABLE IF NOT EXISTS {t.delivery} (
            key TEXT PRIMARY KEY,
            job_id TEXT NOT NULL,
            channel TEXT NOT NULL,
            delivered_at REAL NOT NULL
        )""",
        f"""CREATE TABLE IF NOT EXISTS {t.conversation} (
            job_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            step INTEGER NOT NULL,
            message BLOB NOT NULL,
            PRIMARY KEY (job_id, seq)
        )""",
    ]


def _history_index(table: str) -> str:
    # SQLite wants the schema on the index name, not on the table: CREATE INDEX s.i ON t (...).
    schema, _, base = table.rpartition(".")
    name = f"{schema + '.' if schema else ''}{base}_job_created"
    return f"CREATE INDEX IF NOT EXISTS {name} ON {base} (job_id, created_at DESC)"


def _job_indexes(t: TableNames) -> list[str]:
    """The indexes of the runnable-job lookup (run after the ``not_before`` column exists)."""
    schema, _, base = t.job.rpartition(".")
    prefix = f"{schema}." if schema else ""
    return [
        # The indexes before WAITING was runnable: their predicate no longer matches the claim's.
        f"DROP INDEX IF EXISTS {prefix}{base}_runnable",
        f"DROP INDEX IF EXISTS {prefix}{base}_agent_runnable",
        f"CREATE INDEX IF NOT EXISTS {prefix}{base}_agent_due ON {base} (agent_id, not_before, id)"
        f" WHERE {RUNNABLE_SQL}",
        # `list_jobs` pages by (updated_at, id) from a cursor: each of its orders is one index range.
        f"CREATE INDEX IF NOT EXISTS {prefix}{base}_listed ON {base} (updated_at DESC, id)",
        f"CREATE INDEX IF NOT EXISTS {prefix}{base}_status_listed ON {base} (status, updated_at DESC, id)",
        f"CREATE INDEX IF NOT EXISTS {prefix}{base}_agent_listed ON {base} (agent_id, updated_at DESC, id)",
    ]


def _index_name(table: str, suffix: str) -> tuple[str, str]:
    schema, _, base = table.rpartition(".")
    return f"{schema + '.' if schema else ''}{base}_{suffix}", base


def _event_schema(t: TableNames) -> list[str]:
    """The event table and its index (SQLite)."""
    index, base = _index_name(t.event, "job_name")
    return [
        f"""CREATE TABLE IF NOT EXISTS {t.event} (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            job_id TEXT NOT NULL,
            name TEXT NOT NULL,
            payload TEXT,
            sent_at REAL NOT NULL,
            taken_by TEXT
        )""",
        f"CREATE INDEX IF NOT EXISTS {index} ON {base} (job_id, name, seq)",
    ]


def _child_schema(t: TableNames) -> list[str]:
    """The parent index and the trigger that wakes a parent when its last child ends (SQLite)."""
    schema, _, base = t.job.rpartition(".")
    prefix = f"{schema}." if schema else ""
    # Trigger bodies take unqualified table names. The parent's column is named with its table: bare, inside
    # the subquery that joins the children it would be the child's. A column that is not JSON, or whose
    # ``jobs`` is not a list, reads as waiting for nothing (CASE, not AND: json_type refuses bad JSON).
    waiting = f"{base}.waiting"
    jobs = (
        f"json_each(CASE WHEN NOT json_valid({waiting}) THEN '{{}}'"
        f" WHEN json_type({waiting}, '$.jobs') = 'array' THEN {waiting} ELSE '{{}}' END, '$.jobs')"
    )
    return [
        f"CREATE INDEX IF NOT EXISTS {prefix}{base}_parent ON {base} (parent_id) WHERE parent_id IS NOT NULL",
        # The first version of this trigger read the child's column in its second check (so a parent woke
        # while another child still ran, and replayed only to park again): replaced, under a new name so
        # the two never leave a moment without one.
        f"""CREATE TRIGGER IF NOT EXISTS {prefix}{base}_wakes_parent AFTER UPDATE OF status ON {base}
        WHEN NEW.parent_id IS NOT NULL AND NEW.status IN ({TERMINAL_SQL})
            AND OLD.status IS NOT NEW.status
        BEGIN
            UPDATE {base} SET not_before = (julianday('now') - 2440587.5) * 86400.0
            WHERE id = NEW.parent_id AND status = 'WAITING'
                AND EXISTS (SELECT 1 FROM {jobs} WHERE value = NEW.id)
                AND NOT EXISTS (
                    SELECT 1 FROM {jobs} AS w JOIN {base} AS c ON c.id = w.value
                    WHERE c.status NOT IN ({TERMINAL_SQL})
                );
        END""",
        f"DROP TRIGGER IF EXISTS {prefix}{base}_child_ended",
    ]


def _step_record_schema(t: TableNames) -> list[str]:
    """The ``step_record`` table (SQLite)."""
    return [
        f"""CREATE TABLE IF NOT EXISTS {t.step_record} (
            job_id TEXT NOT NULL,
            step INTEGER NOT NULL,
            attempt INTEGER NOT NULL,
            session INTEGER NOT NULL,
            seq INTEGER NOT NULL,
            data BLOB NOT NULL,
            PRIMARY KEY (job_id, step, attempt, session, seq)
        )"""
    ]


def _prune_schema(t: TableNames) -> list[str]:
    """The tombstones of pruned jobs, and the index a prune's delete of a job's deliveries uses (SQLite)."""
    at_index, pbase = _index_name(t.pruned, "at")
    job_index, dbase = _index_name(t.delivery, "job")
    return [
        f"""CREATE TABLE IF NOT EXISTS {t.pruned} (
            id TEXT PRIMARY KEY,
            agent_id TEXT NOT NULL,
            status TEXT NOT NULL,
            finished_at REAL NOT NULL,
            pruned_at REAL NOT NULL
        )""",
        f"CREATE INDEX IF NOT EXISTS {at_index} ON {pbase} (pruned_at)",
        f"CREATE INDEX IF NOT EXISTS {job_index} ON {dbase} (job_id)",
    ]


def _key_indexes(t: TableNames) -> list[str]:
    """The claim's indexes in its order: priority first (higher first), then due time and id (SQLite)."""
    schema, _, base = t.job.rpartition(".")
    prefix = f"{schema}." if schema else ""
    return [
        f"DROP INDEX IF EXISTS {prefix}{base}_due",
        f"CREATE INDEX IF NOT EXISTS {prefix}{base}_claim ON {base} (priority DESC, not_before, id)"
        f" WHERE {RUNNABLE_SQL}",
        f"CREATE INDEX IF NOT EXISTS {prefix}{base}_agent_claim ON {base}"
        f" (agent_id, priority DESC, not_before, id) WHERE {RUNNABLE_SQL}",
    ]
