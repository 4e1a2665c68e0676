"""The retention pass: finished jobs past their period pruned, and their journals on this disk removed.

Run by each worker beside its reaper (every `RETENTION_PERIOD_SECONDS`, at most `MAX_BATCHES_PER_PASS`
batches a pass so a backlog is worked off over passes, never one long hold on a connection) and by
``python -m agentlife reap``. The periods are ``AGENTLIFE_RETAIN_*`` (`RetentionConstants`): off unless set.

A journal directory (``{data_dir}/sessions/{job_id}``) is removed only when the store answers that its job
was pruned (a tombstone and no row): never one of a live job, never when the store cannot be asked (an
outage raises before anything is removed), never a directory whose name is not a job id.
"""

from __future__ import annotations

import logging
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from agentlife._config import JOB_ID_PATTERN
from agentlife.constants import RetentionConstants
from agentlife.stores import OperatorStore

__all__ = [
    "MAX_BATCHES_PER_PASS",
    "RETENTION_PERIOD_SECONDS",
    "RetentionPass",
    "apply_retention",
    "remove_pruned_journals",
]

log = logging.getLogger("agentlife.retention")

#: How often a worker runs the retention pass.
RETENTION_PERIOD_SECONDS = 300.0
#: The most batches one pass of one worker deletes (each of `BATCH_SIZE` jobs).
MAX_BATCHES_PER_PASS = 5
#: Jobs per batch of the retention pass.
BATCH_SIZE = 500
#: The most journal directories one pass asks the store about.
MAX_JOURNALS_PER_PASS = 1000
_DAY = 86400.0


@dataclass(frozen=True, slots=True)
class RetentionPass:
    """What one pass did."""

    pruned: tuple[str, ...]
    """The ids of the jobs pruned."""
    tombstones: int
    """Tombstones deleted for being older than their period."""
    journals: int
    """Journal directories removed from this disk."""


async def apply_retention(
    store: OperatorStore, retention: RetentionConstants, data_dir: Path | None
) -> RetentionPass:
    """Prune each status past its period, then remove the journals of pruned jobs under ``data_dir``."""
    pruned: list[str] = []
    tombstones = 0
    periods = retention.periods()
    for status, days in periods.items():
        result = await store.prune_jobs(
            older_than=days * _DAY,
            statuses=[status],
            batch_size=BATCH_SIZE,
            max_batches=MAX_BATCHES_PER_PASS,
            tombstones_older_than=retention.pruned_ids_days * _DAY,
        )
        pruned.extend(result.job_ids)
        tombstones += result.tombstones
    journals = 0
    if data_dir is not None and periods:
        youngest = min(periods.values()) * _DAY  # a journal younger than every period has no pruned job
        journals = await remove_pruned_journals(store, data_dir, min_age_seconds=youngest)
    if pruned or tombstones or journals:
        log.info(
            "retention: pruned %d jobs, %d old tombstones, %d journal directories",
            len(pruned),
            tombstones,
            journals,
        )
    return RetentionPass(tuple(pruned), tombstones, journals)


async def remove_pruned_journals(
    store: OperatorStore, data_dir: Path, *, min_age_seconds: float = 0.0, limit: int = MAX_JOURNALS_PER_PASS
) -> int:
    """Remove ``{data_dir}/sessions/ID`` of each job the store says was pruned; how many were removed.

    Only directories untouched for ``min_age_seconds`` are asked about, at most ``limit`` a call (a random
    sample of them, so a large disk is gone through over passes). A store error propagates before the
    directory in question is touched: nothing is removed on a guess.
    """
    sessions = Path(data_dir) / "sessions"
    try:
        entries = list(sessions.iterdir())
    except OSError:
        return 0  # no sessions directory: nothing journaled on this disk
    now = time.time()
    candidates = []
    for path in entries:
        name = path.name
        if path.is_symlink() or not JOB_ID_PATTERN.fullmatch(name):
            continue
        try:
            if not path.is_dir() or now - path.stat().st_mtime < min_age_seconds:
                continue
        except OSError:
            continue
        candidates.append(path)
    removed = 0
    for path in random.sample(candidates, min(limit, len(candidates))):
        name = path.name
        if await store.pruned_job(name) is None or await store.get_job(name) is not None:
            continue  # live, unknown or created again: never removed
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    return removed
