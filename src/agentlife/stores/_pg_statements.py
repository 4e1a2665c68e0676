"""The PostgreSQL store's longer statements, built once per table layout."""

from __future__ import annotations

from agentlife.stores._base import HISTORY_KEEP, TableNames

__all__ = ["write_checkpoint_sql"]


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
