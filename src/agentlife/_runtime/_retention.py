"""The retention pass: finished jobs past their period pruned, and their journals on this disk removed.

Run by each worker beside its reaper (every `RETENTION_PERIOD_SECONDS`, at most `MAX_BATCHES_PER_PASS`
batches a pass so a backlog is worked off over passes, never one long hold on a connection) and by
``python -m agentlife reap``. The periods are ``AGENTLIFE_RETAIN_*`` (`RetentionConstants`): off unless set.
Whatever the periods, each pass deletes the tombstones older than ``AGENTLIFE_RETAIN_PRUNED_IDS_DAYS`` and
removes the journals of pruned jobs (pruned by this pass, another worker or a hand-run ``job prune``).

A journal directory (``{data_dir}/sessions/{job_id}``) is removed only when the store answers that its job
was pruned (a tombstone and no row): never one of a live job, never when the store cannot be asked (an
outage raises before anything is removed), never a directory whose name is not a job id.
"""

from __future__ import annotations

import logging
import random
import shutil
from collections.abc import Sequence
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
    """Prune each status past its period, expire old tombstones, remove the journals of pruned jobs.

    The tombstones and the journals are seen to whether or not a period is set: a hand-run ``job prune``
    leaves both, and they go by `RetentionConstants.pruned_ids_days` and the store's answer alone.
    """
    pruned: list[str] = []
    for status, days in retention.periods().items():
        result = await store.prune_jobs(
            older_than=days * _DAY, statuses=[status], batch_size=BATCH_SIZE, max_batches=MAX_BATCHES_PER_PASS
        )
        pruned.extend(result.job_ids)
    tombstones = await store.expire_tombstones(retention.pruned_ids_days * _DAY)
    journals = 0
    if data_dir is not None:
        journals = await remove_pruned_journals(store, data_dir, first=pruned)
    if pruned or tombstones or journals:
        log.info(
            "retention: pruned %d jobs, %d old tombstones, %d journal directories",
            len(pruned),
            tombstones,
            journals,
        )
    return RetentionPass(tuple(pruned), tombstones, journals)


async def remove_pruned_journals(
    store: OperatorStore, data_dir: Path, *, first: Sequence[str] = (), limit: int = MAX_JOURNALS_PER_PASS
) -> int:
    """Remove ``{data_dir}/sessions/ID`` of each job the store says was pruned; how many were removed.

    At most ``limit`` directories a call, asked about in one query: those of ``first`` (the jobs this pass
    pruned), then a random sample of the others (a large disk is gone through over passes). A directory's
    age does not matter: only the store's answer does (a tombstone and no row). A store error propagates
    before anything is touched: nothing is removed on a guess.
    """
    sessions = Path(data_dir) / "sessions"
    try:
        entries = list(sessions.iterdir())
    except OSError:
        return 0  # no sessions directory: nothing journaled on this disk
    candidates: dict[str, Path] = {}
    for path in entries:
        if path.is_symlink() or not JOB_ID_PATTERN.fullmatch(path.name):
            continue
        try:
            if path.is_dir():
                candidates[path.name] = path
        except OSError:
            continue
    chosen = [name for name in dict.fromkeys(first) if name in candidates][:limit]
    rest = [name for name in candidates if name not in set(chosen)]
    chosen += random.sample(rest, min(limit - len(chosen), len(rest)))
    removed = 0
    for name in await store.pruned_ids(chosen):
        shutil.rmtree(candidates[name], ignore_errors=True)
        removed += 1
    return removed
