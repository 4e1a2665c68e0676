"""``job retry|cancel|pause|resume`` over a selection (``--status``, ``--agent``, ``--older-than``, ...).

One ID acts on that job as before. Without one, the flags select jobs among the statuses the action acts
on (`agentlife._jobs._batch`), at most ``--limit`` of them (default 10 000, at most 100 000: a larger
selection is refused and nothing is done). ``--dry-run`` prints the ids and the count and changes nothing;
a selection of more than one job needs ``--yes`` (a terminal is asked instead). Each job is acted on in its
own transaction, one line printed as it is done, and a summary line at the end; a job whose status changed
meanwhile is skipped and the rest go on. Exit codes: 0 every selected job acted on, 4 some were skipped,
3 the selection matches nothing, 2 a usage error (a bad flag, a selection too large, no ``--yes``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from agentlife._cli._common import say
from agentlife._exceptions import ConfigError
from agentlife._exitcode import ExitCode
from agentlife._jobs._batch import (
    BATCH_ACTIONS,
    DEFAULT_LIMIT,
    MAX_LIMIT,
    Selection,
    act_on_each,
    parse_age,
    read_ids,
    select_jobs,
)
from agentlife._jobs._reason import check_reason
from agentlife.stores import JobRecord, JobStatus

__all__ = ["add_selection", "batch_or_single"]

_Handler = Callable[[argparse.Namespace], Awaitable[int]]
_SELECTING = ("status", "agent", "older_than", "ids_file")


def add_selection(parser: argparse.ArgumentParser, action: str) -> None:
    """Make ``ID`` optional and add the selection flags of ``job ACTION``."""
    statuses = ", ".join(BATCH_ACTIONS[action].statuses)
    group = parser.add_argument_group("acting on many jobs (instead of one ID)")
    group.add_argument(
        "--status",
        type=str.upper,
        choices=[str(s) for s in JobStatus],
        metavar="STATUS",
        help=f"only jobs in this status (default: each it acts on: {statuses})",
    )
    group.add_argument("--agent", metavar="AGENT_ID", help="only this agent's jobs")
    group.add_argument(
        "--older-than", metavar="AGE", help="only jobs last written at least AGE ago: 30m, 12h, 7d"
    )
    group.add_argument(
        "--ids-file", metavar="PATH", help="only these jobs: one id a line ('-': stdin; # comments)"
    )
    group.add_argument("--dry-run", action="store_true", help="change nothing: print the ids and the count")
    group.add_argument("--yes", action="store_true", help="act on a selection of more than one job")
    group.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"refuse a selection of more than N jobs (default {DEFAULT_LIMIT}, at most {MAX_LIMIT})",
    )


def batch_or_single(single: _Handler, action: str, open_store: Any, actor_of: Any, masked: Any) -> _Handler:
    """The handler of ``job ACTION``: ``single`` for one ID, the batch for a selection.

    ``open_store(args)``, ``actor_of(args)`` and ``masked(args)`` are those of the ``job`` commands.
    """

    async def handler(args: argparse.Namespace) -> int:
        selecting = any(getattr(args, name, None) is not None for name in _SELECTING)
        if args.id is not None:
            if selecting or args.dry_run:
                raise ConfigError(f"job {action}: give one ID or a selection (--status, ...), not both")
            return await single(args)
        if not selecting:
            raise ConfigError(
                f"job {action}: give a job ID, or select jobs with --status, --agent, --older-than "
                "or --ids-file"
            )
        return await _batch(args, action, open_store, actor_of(args), masked(args))

    return handler


def _selection(args: argparse.Namespace) -> Selection:
    if not 1 <= args.limit <= MAX_LIMIT:
        raise ConfigError(f"--limit {args.limit} must be from 1 to {MAX_LIMIT}")
    older = None if args.older_than is None else parse_age(args.older_than)
    ids = None
    if args.ids_file is not None:
        ids = read_ids(_lines(args.ids_file), args.limit)
    return Selection(args.status, args.agent, older, ids, args.limit)


def _lines(path: str) -> list[str]:
    if path == "-":
        return sys.stdin.read().splitlines()
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--ids-file {path}: {exc.__class__.__name__}: cannot be read") from None


async def _batch(
    args: argparse.Namespace, name: str, open_store: Any, actor: str, mask: Callable[[str], str]
) -> int:
    action = BATCH_ACTIONS[name]
    selection = _selection(args)
    reason = getattr(args, "reason", None)
    if reason is not None:
        reason = check_reason(reason) or None
    store = await open_store(args)
    try:
        ids = await select_jobs(store, action, selection)
        if args.dry_run:
            sys.stdout.write("".join(mask(job_id) + "\n" for job_id in ids))
            sys.stdout.write(f"would {name} {len(ids)} jobs; nothing changed (--dry-run)\n")
            return ExitCode.DONE
        if len(ids) > 1 and not args.yes and not _confirmed(name, len(ids)):
            raise ConfigError(
                f"job {name} would act on {len(ids)} jobs: pass --yes (see them first with --dry-run)"
            )
        report = await act_on_each(store, action, ids, actor=actor, reason=reason, on_each=_said(name, mask))
    finally:
        await store.close()
    sys.stdout.write(report.summary() + "\n")
    return ExitCode.CONFLICT if report.skipped else ExitCode.DONE


def _confirmed(name: str, count: int) -> bool:
    """Whether a person at a terminal says yes; False (refused) when stdin is not a terminal."""
    if not sys.stdin.isatty():
        return False
    sys.stderr.write(f"{name} {count} jobs? [y/N] ")
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def _said(name: str, mask: Callable[[str], str]) -> Callable[[str, JobRecord | None, str | None], None]:
    def each(job_id: str, row: JobRecord | None, why: str | None) -> None:
        if row is not None:
            sys.stdout.write(mask(f"{name} {job_id}: {row.status}, attempt {row.attempt}") + "\n")
            sys.stdout.flush()  # said only once the store has it: an interrupted batch printed what it did
        else:
            say(mask(f"agentlife: skipped {job_id}: {why}"))

    return each
