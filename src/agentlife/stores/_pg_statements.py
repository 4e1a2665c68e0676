"""The PostgreSQL store's longer statements, built once per table layout."""

from __future__ import annotations

from agentlife.stores._base import HISTORY_KEEP, TableNames
from agentlife.stores._jobs import TERMINAL

__all__ = ["HEARTBEAT_AGE", "NOTIFY_PAYLOAD_LIMIT", "channel_prefix", "notify_call", "write_checkpoint_sql"]


#: Seconds since the row's ``heartbeat_at``, each side taken as epoch seconds first: PostgreSQL keeps
#: ``'infinity'`` and ``'-infinity'`` as timestamps (a row written by another client) and refuses to
#: subtract them, while their epochs are floats (a heartbeat for ever fresh, or for ever stale).
HEARTBEAT_AGE = "(EXTRACT(EPOCH FROM now()) - EXTRACT(EPOCH FROM heartbeat_at))::float8"


# A checkpoint never lands on a job that has ended: a terminal row is not rewritten by a late writer.
_LIVE = f" AND status NOT IN ({', '.join(repr(str(s)) for s in TERMINAL)})"


def write_checkpoint_sql(
    t: TableNames,
    *,
    owner: bool = True,
    conversation: bool = True,
    records: bool = False,
    prune: bool = False,
) -> str:
    """The fenced checkpoint write: the step's whole durable record in one statement, one round trip.

    Parameters: ``$1`` job id, ``$2`` attempt, ``$3`` bytes, ``$4`` CRC, ``$5`` checkpoint id, ``$6`` step,
    ``$7``/``$8``/``$9`` the step's input tokens, output tokens and cost (added to ``tokens_consumed``), then
    in this order only those asked for: the conversation's new rows (two arrays: sequence numbers,
    messages), step records of this session (four: the session, then arrays of steps, seqs and lines), the
    first step whose records are kept (one), and last the claim token (with ``owner``). A step that adds no
    conversation rows and no records sends no array: the arrays' types are not built in to asyncpg, so each
    connection's first statement that sends them costs a catalog query (about 3 ms of server time), which a
    worker's freshly opened connections would otherwise pay for every step.
    The job row (checkpoint, usage, ``heartbeat_at``), the history entry, the history trim and
    the conversation rows commit together or not at all: a statement is atomic without a transaction
    block, which would cost a round trip for ``BEGIN`` and one for ``COMMIT``.

    All CTEs see the same snapshot, so the trim cannot see the entry being inserted: it keeps the newest
    ``HISTORY_KEEP - 1`` *other* entries, which with the new one makes ``HISTORY_KEEP``. It deletes what is
    older than the oldest entry to keep (a row comparison against one index-ordered probe: about half the
    cost of ``NOT IN (... LIMIT n)``). Nothing else happens when the fenced UPDATE matched no row.
    ``tokens_consumed`` fields that are not numbers (a row written by hand) count from 0.
    """
    h = t.checkpoint_history
    numbers = iter(range(10, 100))
    messages = (next(numbers), next(numbers)) if conversation else None
    stored = (next(numbers), next(numbers), next(numbers), next(numbers)) if records else None
    kept_from = next(numbers) if prune else None
    fence = f" AND (owner IS NULL OR owner = ${next(numbers)})" if owner else ""
    if HISTORY_KEEP > 1:
        older_than_kept = f"""AND (created_at, step) < (
                SELECT created_at, step FROM {h} WHERE job_id = $1 AND checkpoint_id <> $5
                ORDER BY created_at DESC, step DESC OFFSET {HISTORY_KEEP - 2} LIMIT 1)"""
    else:
        older_than_kept = ""
    extra: list[str] = []
    if messages is not None:
        extra.append(
            f"""saved AS (
            INSERT INTO {t.conversation} (job_id, seq, step, message)
            SELECT $1, rows.seq, $6, rows.message
            FROM unnest(${messages[0]}::integer[], ${messages[1]}::bytea[]) AS rows(seq, message)
            WHERE EXISTS (SELECT 1 FROM fenced)
            ON CONFLICT (job_id, seq) DO UPDATE SET step = EXCLUDED.step, message = EXCLUDED.message
            RETURNING 1
        )"""
        )
    if stored is not None:
        session, steps, seqs, lines = stored
        extra.append(
            f"""recorded AS (
            INSERT INTO {t.step_record} (job_id, step, attempt, session, seq, data)
            SELECT $1, r.step, $2, ${session}, r.seq, r.data
            FROM unnest(${steps}::integer[], ${seqs}::integer[], ${lines}::bytea[]) AS r(step, seq, data)
            WHERE EXISTS (SELECT 1 FROM fenced)
            ON CONFLICT DO NOTHING
            RETURNING 1
        )"""
        )
    if kept_from is not None:
        extra.append(
            f"""pruned AS (
            DELETE FROM {t.step_record}
            WHERE job_id = $1 AND step < ${kept_from}::integer AND EXISTS (SELECT 1 FROM fenced)
            RETURNING 1
        )"""
        )
    return f"""
        WITH fenced AS (
            UPDATE {t.job} SET checkpoint = $3, checkpoint_crc = $4, checkpoint_id = $5, updated_at = now(),
                heartbeat_at = now(),
                tokens_consumed = CASE WHEN $7::bigint = 0 AND $8::bigint = 0 AND $9::float8 = 0
                    THEN tokens_consumed ELSE jsonb_build_object(
                        'input', {_counted("input")} + $7::bigint,
                        'output', {_counted("output")} + $8::bigint,
                        'cost_usd', round({_counted("cost_usd")} + $9::float8::numeric, 6)) END
            WHERE id = $1 AND attempt = $2{_LIVE}{fence}
            RETURNING id
        ), appended AS (
            INSERT INTO {h} (job_id, checkpoint_id, step, checkpoint, crc, created_at)
            SELECT id, $5, $6, $3, $4, clock_timestamp() FROM fenced
            ON CONFLICT (job_id, checkpoint_id) DO UPDATE
                SET step = EXCLUDED.step, checkpoint = EXCLUDED.checkpoint, crc = EXCLUDED.crc,
                    created_at = EXCLUDED.created_at
            RETURNING job_id
        ), trimmed AS (
            DELETE FROM {h}
            WHERE job_id = $1 AND checkpoint_id <> $5 AND EXISTS (SELECT 1 FROM fenced)
              {older_than_kept}
            RETURNING 1
        ){"".join(", " + part for part in extra)}
        SELECT count(*) FROM fenced
    """


def _counted(key: str) -> str:
    """``tokens_consumed.key`` as a number, 0 when it is missing or not a number."""
    return (
        f"(CASE WHEN jsonb_typeof(tokens_consumed -> '{key}') = 'number'"
        f" THEN (tokens_consumed ->> '{key}')::numeric ELSE 0 END)"
    )


# -- notifications: SQL text only, so a module reachable on SQLite can name them without the listener

#: PostgreSQL refuses a payload of 8000 bytes or more; a longer agent id is sent as '' (wakes every waiter).
NOTIFY_PAYLOAD_LIMIT = 7900
_BASE_CHARS = 40  # the channel is an identifier: at most 63 bytes with the prefix and the OID


def channel_prefix(t: TableNames) -> str:
    """``agentlife_<table>_``: the channel is this followed by the job table's OID."""
    return f"agentlife_{t.job.split('.')[-1][:_BASE_CHARS]}_"


def notify_call(t: TableNames, agent_column: str = "agent_id") -> str:
    """The SQL ``pg_notify(channel, agent id)`` call, for a statement's RETURNING list or SELECT.

    The table name is a validated plain identifier (`TableNames`), safe inside the string literals.
    """
    channel = f"'{channel_prefix(t)}' || '{t.job}'::regclass::oid::text"
    payload = (
        f"CASE WHEN octet_length({agent_column}) < {NOTIFY_PAYLOAD_LIMIT} THEN {agent_column} ELSE '' END"
    )
    return f"pg_notify({channel}, {payload})"
