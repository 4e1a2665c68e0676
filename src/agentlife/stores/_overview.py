"""What an on-call operator looks at first: counts of jobs by status and agent, the queue, stale runs.

`job_overview` is a few statements, each answered from an index of the job table (status first) and each
bounded: at most `MAX_GROUPS` (status, agent) counts and `MAX_STALE` stale rows named. The counts are of
the same rows ``job list`` shows, so the overview and the list agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentlife.stores._base import JobStatus
from agentlife.stores._rows import as_text

if TYPE_CHECKING:
    from agentlife.stores._dialect import Tx

__all__ = ["MAX_GROUPS", "MAX_STALE", "Overview", "job_overview"]

#: The most (status, agent) counts read; more are said to exist, not counted.
MAX_GROUPS = 500
#: The most RUNNING rows with a stale heartbeat named (all of them are counted).
MAX_STALE = 20


@dataclass(frozen=True, slots=True)
class Overview:
    """The job table at one moment, as the console's overview shows it."""

    at: float
    """The store's clock when it was read (unix seconds)."""
    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    """(status, agent id) -> rows; an id that is not UTF-8 has U+FFFD in place of its bad bytes."""
    more_groups: bool = False
    """There are more than `MAX_GROUPS` (status, agent) pairs: ``counts`` holds the first of them."""
    runnable: int = 0
    """Rows a worker may claim now (PENDING, RETRYING or WAITING, and due)."""
    oldest_runnable: float | None = None
    """Since when the longest-waiting of them has been runnable (unix seconds)."""
    stale: int = 0
    """RUNNING rows whose heartbeat is older than ``stale_after`` seconds (or missing)."""
    stale_after: float = 0.0
    """The heartbeat age past which a RUNNING row was counted stale (seconds)."""
    stale_rows: list[tuple[str, float | None]] = field(default_factory=list)
    """The `MAX_STALE` stalest of them: (id, heartbeat time or None)."""
    ended: dict[str, int] = field(default_factory=dict)
    """Rows that ended (COMPLETED, FAILED, DEAD_LETTER) within ``window`` seconds, per status."""


async def job_overview(tx: Tx, stale_after: float, window: float) -> Overview:
    """The overview now: counts, the runnable queue, RUNNING rows without a fresh heartbeat, recent ends."""
    now = tx.now
    groups = await tx.fetch(tx.sql.overview_counts, limit=MAX_GROUPS + 1)
    counts: dict[tuple[str, str], int] = {}
    for status, agent, count in groups[:MAX_GROUPS]:
        counts[(str(status), as_text(agent, errors="replace") or "")] = int(count)
    queue = await tx.fetchrow(tx.sql.overview_runnable)
    stale_before = now - stale_after
    stale = await tx.fetchval(tx.sql.overview_stale, status=JobStatus.RUNNING, stale_before=stale_before)
    named = await tx.fetch(
        tx.sql.overview_stale_rows, status=JobStatus.RUNNING, stale_before=stale_before, limit=MAX_STALE
    )
    ended = await tx.fetch(tx.sql.overview_ended, since=now - window)
    return Overview(
        at=now,
        counts=counts,
        more_groups=len(groups) > MAX_GROUPS,
        runnable=int(queue[0]) if queue is not None else 0,
        oldest_runnable=None if queue is None else _time(queue[1]),
        stale=int(stale or 0),
        stale_after=stale_after,
        stale_rows=[(as_text(row[0], errors="replace") or "", _time(row[1])) for row in named],
        ended={str(row[0]): int(row[1]) for row in ended},
    )


def _time(value: Any) -> float | None:
    """A time column's value as unix seconds; None for none, or for what is not one (text, infinity)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)
