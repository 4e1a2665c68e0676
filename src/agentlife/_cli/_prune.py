"""``python -m agentlife job prune``: delete finished jobs and every row of theirs, in batches.

Only COMPLETED, FAILED and DEAD_LETTER jobs last written more than ``--older-than`` ago (default 30d, at
least 1m), none whose children still run; each batch one short transaction (`agentlife.stores._prune`).
A pruned id keeps a tombstone: ``job show`` says when it was pruned, and ``job create`` refuses the id.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
from typing import Any

from agentlife._config import JOB_ID_PATTERN, data_dir_from_env, validate_agent_id
from agentlife._exceptions import ConfigError
from agentlife._jobs._batch import parse_age as age_seconds
from agentlife.stores._jobs import TERMINAL
from agentlife.stores._prune import DEFAULT_BATCH_SIZE, MAX_BATCH_SIZE

__all__ = ["DEFAULT_OLDER_THAN", "MIN_OLDER_THAN_SECONDS", "add_prune", "parse_age"]

#: ``--older-than`` unless told.
DEFAULT_OLDER_THAN = "30d"
#: The youngest a job may be pruned at: its followers may still read the output of a job that just ended.
MIN_OLDER_THAN_SECONDS = 60.0
#: The oldest ``--older-than`` says anything of (100 years: more is a typo, and past the clock's range).
MAX_OLDER_THAN_SECONDS = 100 * 365 * 86400.0


def parse_age(text: str, what: str = "--older-than") -> float:
    """Seconds of an age written ``30d``, ``12h``, ``90m``, ``45s`` or ``2w``; `ConfigError` otherwise."""
    seconds = age_seconds(text, what)  # the syntax every --older-than shares
    if not math.isfinite(seconds) or seconds > MAX_OLDER_THAN_SECONDS:
        raise ConfigError(f"{what} {text!r} is more than 100 years")
    if seconds < MIN_OLDER_THAN_SECONDS:
        raise ConfigError(
            f"{what} {text!r} is under 1m: a job that just ended may still be read by its followers"
        )
    return seconds


def add_prune(commands: Any, command: Any, open_store: Any) -> None:
    """Add ``job prune`` (``command`` and ``open_store`` are those of ``job``'s other subcommands)."""
    prune = command(
        commands, "prune", "delete finished jobs and all their rows, oldest first, in batches", _prune
    )
    prune.add_argument(
        "--older-than",
        default=DEFAULT_OLDER_THAN,
        metavar="AGE",
        help=f"only jobs finished more than AGE ago: 30d, 12h, 90m (default {DEFAULT_OLDER_THAN}, min 1m)",
    )
    prune.add_argument(
        "--status",
        action="append",
        metavar="STATUS",
        help=f"only jobs of this finished status ({', '.join(TERMINAL)}; repeatable; default all three)",
    )
    prune.add_argument("--agent", metavar="AGENT_ID", help="only this agent's jobs")
    prune.add_argument("--dry-run", action="store_true", help="change nothing: print the count and the ids")
    prune.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULT_BATCH_SIZE,
        metavar="N",
        help=f"jobs per transaction, 1 to {MAX_BATCH_SIZE} (default {DEFAULT_BATCH_SIZE})",
    )
    prune.set_defaults(open_store=open_store)


def _statuses(raw: list[str] | None) -> list[str]:
    if not raw:
        return [str(s) for s in TERMINAL]
    wanted = []
    for status in raw:
        upper = status.strip().upper()
        if upper not in TERMINAL:
            finished = ", ".join(TERMINAL)
            raise ConfigError(f"--status {status!r} is not a finished status: only {finished} may be pruned")
        wanted.append(upper)
    return wanted


async def _prune(args: argparse.Namespace) -> int:
    older_than = parse_age(args.older_than)
    statuses = _statuses(args.status)
    if args.agent is not None:
        validate_agent_id(args.agent)
    if not 1 <= args.batch_size <= MAX_BATCH_SIZE:
        raise ConfigError(f"--batch-size {args.batch_size} must be from 1 to {MAX_BATCH_SIZE}")
    store = await args.open_store(args)
    total = 0

    def batch(ids: list[str]) -> None:
        nonlocal total
        total += len(ids)
        sys.stdout.write(f"pruned {len(ids)} jobs ({total} so far)\n")
        sys.stdout.flush()

    try:
        result = await store.prune_jobs(
            older_than=older_than,
            statuses=statuses,
            agent_id=args.agent,
            batch_size=args.batch_size,
            dry_run=args.dry_run,
            on_batch=batch,
        )
    finally:
        await store.close()
    if args.dry_run:
        for job_id in result.job_ids:
            sys.stdout.write(f"{job_id}\n")
        more = result.count - len(result.job_ids)
        tail = f" (the first {len(result.job_ids)} listed)" if more > 0 else ""
        sys.stdout.write(f"would prune {result.count} jobs{tail}; nothing changed (--dry-run)\n")
        return 0
    removed = _remove_journals(result.job_ids)
    sys.stdout.write(f"pruned {result.count} jobs, {removed} journal directories on this disk\n")
    return 0


def _remove_journals(job_ids: tuple[str, ...]) -> int:
    """Remove ``{AGENTLIFE_DATA_DIR}/sessions/ID`` of each job this run pruned, on this disk."""
    data_dir = data_dir_from_env(os.environ)
    removed = 0
    for job_id in job_ids:
        path = data_dir / "sessions" / job_id
        if JOB_ID_PATTERN.fullmatch(job_id) and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    return removed
