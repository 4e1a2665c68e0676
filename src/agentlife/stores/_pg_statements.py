"""The PostgreSQL store's longer statements, built once per table layout."""

from __future__ import annotations

from agentlife.stores._base import HISTORY_KEEP, TableNames

__all__ = ["NOTIFY_PAYLOAD_LIMIT", "channel_prefix", "notify_call", "write_checkpoint_sql"]


def write_checkpoint_sql(t: TableNames, fence: str = "") -> str:
    """The fenced checkpoint write: job row, history entry and history trim in one statement.

    All CTEs see the same snapshot, so the trim cannot see the entry being inserted: it keeps the newest
    ``HISTORY_KEEP - 1`` *other* entries, which with the new one makes ``HISTORY_KEEP``. It deletes what is
    older than the oldest entry to keep (a row comparison against one index-ordered probe: about half the
    cost of ``NOT IN (... LIMIT n)``). Nothing happens to the history when the fenced UPDATE matched no row.
    """
    h = t.checkpoint_history
    if HISTORY_KEEP > 1:
        older_than_kept = f"""AND (created_at, step) < (
                SELECT created_at, step FROM {h} WHERE job_id = $1 AND checkpoint_id <> $5
                ORDER BY created_at DESC, step DESC OFFSET {HISTORY_KEEP - 2} LIMIT 1)"""
    else:
        older_than_kept = ""
    return f"""
        WITH fenced AS (
            UPDATE {t.job} SET checkpoint = $3, checkpoint_crc = $4, checkpoint_id = $5, updated_at = now()
            WHERE id = $1 AND attempt = $2{fence}
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
        )
        SELECT count(*) FROM fenced
    """


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
