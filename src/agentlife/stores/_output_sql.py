"""The schema and statements of a job's output (`_output`), for both databases, kept in one place.

``job_output`` holds each job's published events and status changes under one per-job ``seq``; a trigger
on the job table writes a ``status`` row (``end`` for a terminal status) in the statement that changes the
status, after the row's lock is taken, so a status change and a publish never read the same last ``seq``.
On PostgreSQL a trigger on ``job_output`` sends ``NOTIFY`` on the job's channel for every row (on commit);
SQLite keeps the recent delta batches in ``job_output_delta``; a job's end removes every job's batches
older than `DELTA_KEEP_SECONDS`.
"""

from __future__ import annotations

from typing import Any

from agentlife.stores._base import TableNames
from agentlife.stores._dialect import TERMINAL_SQL, Many, Sql, Statement
from agentlife.stores._output import DELTA_SLOTS

__all__ = ["pg_output_schema", "pg_output_statements", "sqlite_output_schema", "sqlite_output_statements"]

#: A job's recent delta batches outlive its end this long (its followers read the last ones), then the
#: next job to end removes them.
DELTA_KEEP_SECONDS = 60
_KIND = f"CASE WHEN NEW.status IN ({TERMINAL_SQL}) THEN 'end' ELSE 'status' END"


def _channel_sql(oid: str, job_id: str) -> str:
    """The job's channel, as `agentlife.stores._pg_output_listen.delta_channel` spells it."""
    return f"'agentlife_out_' || md5({oid} || ':' || {job_id})"


def pg_output_schema(t: TableNames) -> tuple[str, ...]:
    """The output table, its index, and the triggers that write status rows and notify (``db init``)."""
    o, j = t.output, t.job
    schema, _, base = j.rpartition(".")
    prefix = f"{schema}." if schema else ""
    obase = o.split(".")[-1]
    status_fn, notify_fn = f"{prefix}agentlife_{base}_output_status", f"{prefix}agentlife_{obase}_notify"
    status_body = f"""
        BEGIN
            INSERT INTO {o} (job_id, seq, kind, name, value, at)
            SELECT NEW.id, COALESCE(max(seq), 0) + 1, {_KIND}, NEW.status,
                json_build_object('status', NEW.status, 'attempt', NEW.attempt)::text, clock_timestamp()
            FROM {o} WHERE job_id = NEW.id
            ON CONFLICT DO NOTHING;
            RETURN NULL;
        END"""
    notify_body = f"""
        BEGIN
            PERFORM pg_notify({_channel_sql("TG_RELID::text", "NEW.job_id")}, '');
            RETURN NULL;
        END"""
    return (
        f"""CREATE TABLE IF NOT EXISTS {o} (
            job_id text NOT NULL,
            seq bigint NOT NULL,
            kind text NOT NULL,
            name text NOT NULL,
            value text,
            invocation_id text,
            at timestamptz NOT NULL DEFAULT clock_timestamp(),
            PRIMARY KEY (job_id, seq)
        )""",
        f"CREATE UNIQUE INDEX IF NOT EXISTS {obase}_invocation_idx ON {o} (job_id, invocation_id)"
        " WHERE invocation_id IS NOT NULL",
        f"CREATE OR REPLACE FUNCTION {status_fn}() RETURNS trigger LANGUAGE plpgsql"
        f" AS $agentlife${status_body}$agentlife$",
        f"DROP TRIGGER IF EXISTS {base}_output_status ON {j}",
        f"CREATE TRIGGER {base}_output_status AFTER UPDATE OF status ON {j} FOR EACH ROW"
        f" WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION {status_fn}()",
        f"CREATE OR REPLACE FUNCTION {notify_fn}() RETURNS trigger LANGUAGE plpgsql"
        f" AS $agentlife${notify_body}$agentlife$",
        f"DROP TRIGGER IF EXISTS {obase}_notify ON {o}",
        f"CREATE TRIGGER {obase}_notify AFTER INSERT ON {o} FOR EACH ROW EXECUTE FUNCTION {notify_fn}()",
    )


def sqlite_output_schema(t: TableNames) -> list[str]:
    """The output and delta tables and the trigger that writes status rows (SQLite)."""
    schema, _, base = t.job.rpartition(".")
    prefix = f"{schema}." if schema else ""
    obase, dbase = t.output.split(".")[-1], t.output_delta.split(".")[-1]
    # A seq another client wrote that is not a whole number must not make every status change fail.
    last = "max(CASE WHEN typeof(seq) = 'integer' THEN seq END)"
    return [
        f"""CREATE TABLE IF NOT EXISTS {t.output} (
            job_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            kind TEXT NOT NULL,
            name TEXT NOT NULL,
            value TEXT,
            invocation_id TEXT,
            at REAL NOT NULL,
            PRIMARY KEY (job_id, seq)
        )""",
        f"CREATE UNIQUE INDEX IF NOT EXISTS {prefix}{obase}_invocation ON {obase} (job_id, invocation_id)"
        " WHERE invocation_id IS NOT NULL",
        f"""CREATE TABLE IF NOT EXISTS {t.output_delta} (
            job_id TEXT NOT NULL,
            slot INTEGER NOT NULL,
            seq INTEGER NOT NULL,
            at REAL NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (job_id, slot)
        )""",
        f"""CREATE TRIGGER IF NOT EXISTS {prefix}{base}_output_status AFTER UPDATE OF status ON {base}
        WHEN OLD.status IS NOT NEW.status AND typeof(NEW.id) = 'text'
        BEGIN
            INSERT OR IGNORE INTO {obase} (job_id, seq, kind, name, value, at)
            SELECT NEW.id, COALESCE({last}, 0) + 1, {_KIND}, NEW.status,
                json_object('status', NEW.status, 'attempt', NEW.attempt),
                (julianday('now') - 2440587.5) * 86400.0
            FROM {obase} WHERE job_id = NEW.id;
            DELETE FROM {dbase} WHERE NEW.status IN ({TERMINAL_SQL})
                AND at < (julianday('now') - 2440587.5) * 86400.0 - {DELTA_KEEP_SECONDS};
        END""",
    ]


def pg_output_statements(t: TableNames, fence: str) -> dict[str, Any]:
    """The output statements in PostgreSQL's spelling (``fence``: the claim-token test, or nothing)."""
    o, j = t.output, t.job
    channel = _channel_sql(f"'{o}'::regclass::oid::text", ":job_id")
    text = {
        "lock_publisher": (
            f"SELECT 1 FROM {j} WHERE id = :job_id AND attempt = :attempt{fence}"
            f" AND status NOT IN ({TERMINAL_SQL}) FOR UPDATE"
        ),
        "published_by": f"SELECT seq FROM {o} WHERE job_id = :job_id AND invocation_id = :invocation_id",
        "output_head": f"SELECT max(seq) FROM {o} WHERE job_id = :job_id",
        "insert_output": (
            f"INSERT INTO {o} (job_id, seq, kind, name, value, invocation_id, at)"
            " VALUES (:job_id, :seq, 'published', :name, :value, :invocation_id, clock_timestamp())"
        ),
        "output_job_head": (
            f"SELECT (SELECT max(seq) FROM {o} WHERE job_id = :job_id) FROM {j} WHERE id = :job_id"
        ),
        "read_output": (
            f"SELECT seq, kind, name, value, EXTRACT(EPOCH FROM at)::float8 FROM {o}"
            " WHERE job_id = :job_id AND seq > :after ORDER BY seq LIMIT :limit"
        ),
        "send_deltas": (
            f"SELECT pg_notify({channel}, p)"
            " FROM unnest(:payloads::text[]) WITH ORDINALITY AS x(p, n) ORDER BY n"
        ),
        # Deltas reach PostgreSQL's followers as notifications: nothing to read back.
        "delta_head": "SELECT NULL",
        "read_deltas": "SELECT NULL, NULL WHERE false",
    }
    statements: dict[str, Any] = {name: Sql.numbered(statement) for name, statement in text.items()}
    return {**statements, "unsynced_on": None, "unsynced_off": None}


def sqlite_output_statements(t: TableNames, fence: str) -> dict[str, Statement | None]:
    """The output statements in SQLite's spelling."""
    o, d, j = t.output, t.output_delta, t.job
    last = "max(CASE WHEN typeof(seq) = 'integer' THEN seq END)"
    text = {
        "lock_publisher": (
            f"SELECT 1 FROM {j} WHERE id = :job_id AND attempt = :attempt{fence}"
            f" AND status NOT IN ({TERMINAL_SQL})"
        ),
        "published_by": f"SELECT seq FROM {o} WHERE job_id = :job_id AND invocation_id = :invocation_id",
        "output_head": f"SELECT {last} FROM {o} WHERE job_id = :job_id",
        "insert_output": (
            f"INSERT INTO {o} (job_id, seq, kind, name, value, invocation_id, at)"
            " VALUES (:job_id, :seq, 'published', :name, :value, :invocation_id, :now)"
        ),
        "output_job_head": (
            f"SELECT (SELECT {last} FROM {o} WHERE job_id = :job_id) FROM {j} WHERE id = :job_id"
        ),
        "read_output": (
            f"SELECT seq, CAST(kind AS BLOB), CAST(name AS BLOB), CAST(value AS BLOB), at FROM {o}"
            " WHERE job_id = :job_id AND seq > :after AND typeof(seq) = 'integer' ORDER BY seq LIMIT :limit"
        ),
        "delta_head": f"SELECT max(seq) FROM {d} WHERE job_id = :job_id",
        "read_deltas": (
            f"SELECT seq, CAST(data AS BLOB) FROM {d} WHERE job_id = :job_id AND seq > :after ORDER BY seq"
        ),
    }
    statements: dict[str, Statement | None] = {name: Sql.named(s) for name, s in text.items()}
    send = Sql.named(
        f"INSERT OR REPLACE INTO {d} (job_id, slot, seq, at, data)"
        f" SELECT :job_id, (m + 1) % {DELTA_SLOTS}, m + 1, :now, :payloads"
        f" FROM (SELECT COALESCE(max(seq), 0) AS m FROM {d} WHERE job_id = :job_id)"
        f" WHERE EXISTS (SELECT 1 FROM {j} WHERE id = :job_id AND status NOT IN ({TERMINAL_SQL}))"
    )
    statements["send_deltas"] = Many(send, ("payloads",))
    # A delta batch is not durable: its write skips the fsync that every other write of the file makes.
    statements["unsynced_on"] = Sql.named("PRAGMA synchronous=OFF")
    statements["unsynced_off"] = Sql.named("PRAGMA synchronous=FULL")
    return statements
