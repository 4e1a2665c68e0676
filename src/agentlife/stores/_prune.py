"""Retention: finished jobs deleted with every row keyed by them, a tombstone kept for each id.

`prune` deletes in batches, each batch one short transaction: it picks up to ``batch_size`` finished rows
(a status of `TERMINAL` and asked for, last written before the cutoff, no child still running), locks them
(on PostgreSQL ``FOR UPDATE SKIP LOCKED``: a second prune at the same time takes other rows, a worker's
write in progress is skipped, and the status test is evaluated again on the locked row), deletes every row
of those jobs in the other tables, writes a tombstone per job, and deletes the job rows last. A process
killed mid-batch rolls the whole batch back: no table holds a row of a job whose row is gone. The tables
(`job_tables`): ``checkpoint_history``, ``conversation``, ``job_event``, ``step_record``, ``job_output``,
``job_output_delta`` (SQLite), ``delivery``; approvals, waits and the family live on the job row itself.
Children keep their own rows (and their ``parent_id``): each is pruned by its own age and status.

A tombstone (``job_pruned``: id, agent, status, when it finished, when it was pruned) lets ``job show``,
`agentlife.Client.get`, the HTTP API and the console say "pruned" rather than "does not exist", and makes
`create_job` refuse the id (a client retrying a create after the prune must not run the job again).
Tombstones older than their own retention are deleted by the same pass.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from agentlife._exceptions import ConfigError, JobNotFound
from agentlife.stores._base import TableNames
from agentlife.stores._jobs import TERMINAL
from agentlife.stores._rows import as_text

if TYPE_CHECKING:
    from agentlife.stores._dialect import Database, Dialect, Statement, Tx

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "MAX_BATCH_SIZE",
    "PruneResult",
    "PrunedJob",
    "check_prune",
    "expire_tombstones",
    "job_tables",
    "not_found",
    "prune",
    "prune_statements",
    "pruned_among",
    "pruned_job",
    "pruned_message",
    "pruned_text",
]

#: The rows one batch deletes unless told (``--batch-size``).
DEFAULT_BATCH_SIZE = 500
#: The most rows one batch deletes (each batch is one transaction; its locks last that long).
MAX_BATCH_SIZE = 10_000
#: The most ids a dry run lists (its count is of every row that would go).
DRY_RUN_IDS = 1000
_TERMINAL_SQL = ", ".join(repr(str(s)) for s in TERMINAL)


@dataclass(frozen=True, slots=True)
class PrunedJob:
    """The tombstone of a pruned job."""

    job_id: str
    """The id the job had."""
    agent_id: str
    """The agent that ran it."""
    status: str
    """Its final status."""
    finished_at: float
    """Unix time of its last write (when it finished)."""
    pruned_at: float
    """Unix time of the prune."""


@dataclass(frozen=True, slots=True)
class PruneResult:
    """What a prune did (or, dry, would do)."""

    count: int
    """Jobs pruned (dry run: that match)."""
    job_ids: tuple[str, ...]
    """Their ids, oldest first (a dry run lists at most the first `DRY_RUN_IDS`)."""
    tombstones: int = 0
    """Tombstones deleted for being older than their retention."""


def check_prune(older_than: float, statuses: Sequence[str], batch_size: int) -> None:
    """`ConfigError` (one line) unless the prune's arguments are usable: only finished statuses."""
    if (
        isinstance(older_than, bool)
        or not isinstance(older_than, int | float)
        or not math.isfinite(older_than)
    ):
        raise ConfigError(f"older_than {older_than!r} must be a finite number of seconds")
    if older_than < 0:
        raise ConfigError(f"older_than {older_than!r} must be >= 0")
    if (
        isinstance(batch_size, bool)
        or not isinstance(batch_size, int)
        or not 1 <= batch_size <= MAX_BATCH_SIZE
    ):
        raise ConfigError(f"batch_size {batch_size!r} must be an integer from 1 to {MAX_BATCH_SIZE}")
    if isinstance(statuses, str) or not statuses:
        raise ConfigError("statuses must be a non-empty list of finished statuses")
    for status in statuses:
        if status not in TERMINAL:
            finished = ", ".join(TERMINAL)
            raise ConfigError(f"status {status!r} is not a finished status: only {finished} may be pruned")


def job_tables(t: TableNames, *, delta: bool) -> tuple[str, ...]:
    """Every table other than the job table with rows keyed by a job (``delta``: SQLite's delta table)."""
    tables = (t.checkpoint_history, t.conversation, t.event, t.step_record, t.output, t.delivery)
    return (*tables, t.output_delta) if delta else tables


def prune_statements(t: TableNames, d: Dialect, *, skip_locked: bool, delta: bool) -> dict[str, Any]:
    """The prune's statements in ``d``'s spelling (``skip_locked``: PostgreSQL's row locks)."""
    j, p = t.job, t.pruned
    ids = d.in_list("id", "job_ids", "text")
    lock = " FOR UPDATE OF j SKIP LOCKED" if skip_locked else ""

    # SQLite: a row whose id another client stored as a BLOB is left alone (no statement here could name it).
    # One whose id is text but not UTF-8 is skipped by the next batches (``:skip``, their ids in hex).
    text_ids = (
        ""
        if skip_locked
        else " AND typeof(j.id) = 'text' AND hex(j.id) NOT IN (SELECT value FROM json_each(:skip))"
    )

    def pick(agent: bool, locked: bool) -> Statement:
        mine = " AND j.agent_id = :agent_id" if agent else ""
        return d.sql(
            f"SELECT {d.raw('j.id')} FROM {j} AS j"
            f" WHERE j.status IN ({_TERMINAL_SQL}) AND {d.in_list('j.status', 'statuses', 'text')}"
            f" AND j.updated_at < {d.time('cutoff')}{mine}{text_ids}"
            f" AND NOT EXISTS (SELECT 1 FROM {j} AS c WHERE c.parent_id = j.id"
            f" AND c.status NOT IN ({_TERMINAL_SQL}))"
            f" ORDER BY j.updated_at, j.id LIMIT :limit{lock if locked else ''}"
        )

    def count(agent: bool) -> Statement:
        mine = " AND j.agent_id = :agent_id" if agent else ""
        return d.sql(
            f"SELECT count(*) FROM {j} AS j"
            f" WHERE j.status IN ({_TERMINAL_SQL}) AND {d.in_list('j.status', 'statuses', 'text')}"
            f" AND j.updated_at < {d.time('cutoff')}{mine}{text_ids}"
            f" AND NOT EXISTS (SELECT 1 FROM {j} AS c WHERE c.parent_id = j.id"
            f" AND c.status NOT IN ({_TERMINAL_SQL}))"
        )

    by_job = d.in_list("job_id", "job_ids", "text")
    return {
        "prune_pick": {(a, k): pick(a, k) for a in (False, True) for k in (False, True)},
        "prune_count": {a: count(a) for a in (False, True)},
        "prune_rows": tuple(
            d.sql(f"DELETE FROM {table} WHERE {by_job}") for table in job_tables(t, delta=delta)
        ),
        "prune_tombstone": d.sql(
            f"INSERT INTO {p} (id, agent_id, status, finished_at, pruned_at)"
            f" SELECT id, agent_id, status, updated_at, {d.now} FROM {j}"
            f" WHERE {ids} AND status IN ({_TERMINAL_SQL})"
            " ON CONFLICT (id) DO UPDATE SET agent_id = excluded.agent_id, status = excluded.status,"
            " finished_at = excluded.finished_at, pruned_at = excluded.pruned_at"
        ),
        "prune_jobs": d.sql(f"DELETE FROM {j} WHERE {ids} AND status IN ({_TERMINAL_SQL})"),
        "prune_tombstones": d.sql(f"DELETE FROM {p} WHERE pruned_at < {d.time('cutoff')}"),
        "pruned_job": d.sql(
            f"SELECT id, agent_id, status, {d.epoch('finished_at')}, {d.epoch('pruned_at')}"
            f" FROM {p} WHERE id = :job_id"
        ),
        "pruned_among": d.sql(
            f"SELECT p.id FROM {p} AS p WHERE {d.in_list('p.id', 'job_ids', 'text')}"
            f" AND NOT EXISTS (SELECT 1 FROM {j} AS j WHERE j.id = p.id)"
        ),
    }


async def prune(
    db: Database,
    *,
    older_than: float,
    statuses: Sequence[str],
    agent_id: str | None,
    batch_size: int,
    dry_run: bool,
    tombstones_older_than: float | None = None,
    on_batch: Any = None,
    max_batches: int | None = None,
) -> PruneResult:
    """Prune (see the module); ``on_batch(ids)`` after each batch commits. ``older_than`` in seconds."""
    wanted = [str(s) for s in statuses if s in TERMINAL]
    if not wanted:
        return PruneResult(0, ())
    clock: float = await db.run(_clock)
    cutoff = clock - older_than
    params: dict[str, Any] = {"statuses": wanted, "cutoff": cutoff, "agent_id": agent_id, "skip": []}
    if dry_run:
        return await db.run(_dry, params)
    pruned: list[str] = []
    batches = 0
    while max_batches is None or batches < max_batches:
        batches += 1
        picked, ids = await db.run(_batch, params, batch_size)
        if ids:
            pruned.extend(ids)
            if on_batch is not None:
                on_batch(ids)
        if picked < batch_size:
            break  # a batch picked rows only while any were left: each is pruned or skipped from then on
    gone = 0
    if tombstones_older_than is not None:
        gone = await db.run(_drop_tombstones, clock - tombstones_older_than)
    return PruneResult(len(pruned), tuple(pruned), gone)


async def _clock(tx: Tx) -> float:
    return float(await tx.fetchval(tx.sql.clock))


async def _dry(tx: Tx, params: dict[str, Any]) -> PruneResult:
    agent = params["agent_id"] is not None
    count = int(await tx.fetchval(tx.sql.prune_count[agent], **params))
    rows = await tx.fetch(tx.sql.prune_pick[(agent, False)], **params, limit=DRY_RUN_IDS)
    return PruneResult(count, tuple(_ids(rows)))


def _ids(rows: Sequence[Any], skip: list[str] | None = None) -> list[str]:
    """The picked ids that are text; one another client wrote that is not UTF-8 is left (hex in ``skip``)."""
    ids = []
    for row in rows:
        job_id = as_text(row[0])
        if job_id is not None:
            ids.append(job_id)
        elif skip is not None:
            skip.append(bytes(row[0]).hex().upper())
    return ids


async def _batch(tx: Tx, params: dict[str, Any], batch_size: int) -> tuple[int, list[str]]:
    """One batch in one transaction: lock the picked rows, delete what hangs off them, then them.

    (How many rows it picked, the ids it pruned.)
    """
    agent = params["agent_id"] is not None
    async with tx.atomic():
        rows = await tx.fetch(tx.sql.prune_pick[(agent, True)], **params, limit=batch_size)
        ids = _ids(rows, params["skip"])
        if ids:
            for statement in tx.sql.prune_rows:
                await tx.execute(statement, job_ids=ids)
            await tx.execute(tx.sql.prune_tombstone, job_ids=ids)
            await tx.execute(tx.sql.prune_jobs, job_ids=ids)
    return len(rows), ids


async def expire_tombstones(db: Database, older_than: float) -> int:
    """Delete the tombstones older than ``older_than`` seconds (by the database's clock); how many."""
    clock: float = await db.run(_clock)
    return await db.run(_drop_tombstones, clock - older_than)


async def pruned_among(tx: Tx, job_ids: Sequence[str]) -> set[str]:
    """Those of ``job_ids`` whose job was pruned: a tombstone and no row (one created again is not)."""
    rows = await tx.fetch(tx.sql.pruned_among, job_ids=list(job_ids))
    return {str(row[0]) for row in rows}


async def _drop_tombstones(tx: Tx, cutoff: float) -> int:
    async with tx.atomic():
        return await tx.execute(tx.sql.prune_tombstones, cutoff=cutoff)


def _utc(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pruned_message(job_id: str, tomb: PrunedJob | None) -> str:
    """What ``job show`` and `JobNotFound` say of an id: pruned (and when), or that it does not exist."""
    if tomb is None:
        return f"job {job_id} does not exist"
    return (
        f"job {job_id} was pruned at {_utc(tomb.pruned_at)} ({tomb.status}, agent {tomb.agent_id},"
        f" finished {_utc(tomb.finished_at)})"
    )


async def not_found(tx: Tx, job_id: str) -> JobNotFound:
    """The `JobNotFound` of an id with no row (read in ``tx``): when its job was pruned, or that none is.

    Every operation on an id says so (send, cancel, retry, rewind...), not only ``job show``.
    """
    return JobNotFound(await pruned_text(tx, job_id))


async def pruned_text(tx: Tx, job_id: str) -> str:
    """`pruned_message` of ``job_id``, read in ``tx``."""
    return pruned_message(job_id, await pruned_job(tx, job_id))


async def pruned_job(tx: Tx, job_id: str) -> PrunedJob | None:
    """The tombstone of ``job_id``, or None."""
    row = await tx.fetchrow(tx.sql.pruned_job, job_id=job_id)
    if row is None:
        return None
    return PrunedJob(str(row[0]), str(row[1]), str(row[2]), float(row[3]), float(row[4]))
