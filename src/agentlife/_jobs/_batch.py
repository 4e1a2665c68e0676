"""Actions on many jobs: a bounded selection of job ids, and one action applied to each in turn.

``job retry|cancel|pause|resume`` with ``--status``, ``--agent``, ``--older-than`` or ``--ids-file``, and
`agentlife.Client.select` / `agentlife.Client.act_many`, run this one implementation:

* `select_jobs` reads the ids a `Selection` names, among the statuses the action allows, oldest first,
  and refuses (`SelectionTooLarge`, nothing done) a selection of more than its ``limit`` jobs (default
  `DEFAULT_LIMIT`, at most `MAX_LIMIT`): a filter typed wrong must not cancel a whole table.
* `act_on_each` applies a `BatchAction` to each id, each in its own transaction (the store operation the
  single-job command runs): a job whose status changed since it was selected (finished meanwhile, acted on
  by another batch at once) or that is gone is skipped with the store's reason, and the rest go on. An
  interrupted batch leaves each job either acted on or untouched, never half: what was done is done.

An action is a `BatchAction` in `BATCH_ACTIONS`: its name, the statuses it acts on, and the call that acts
on one job. A new operator action that applies to one job at a time plugs in by adding one.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentlife._config import validate_agent_id, validate_job_id
from agentlife._exceptions import ConfigError, JobNotFound, JobStateConflict
from agentlife._jobs._cursor import position_of
from agentlife._jobs._pause import pause_job, resume_job
from agentlife.stores import JobRecord, JobStatus, OperatorStore
from agentlife.stores._childjobs import cancel_with_children
from agentlife.stores._jobs import CANCELLABLE, PAUSABLE, RETRYABLE

__all__ = [
    "BATCH_ACTIONS",
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "BatchAction",
    "BatchReport",
    "Selection",
    "SelectionTooLarge",
    "act_on_each",
    "parse_age",
    "read_ids",
    "select_jobs",
    "selection_digest",
]

#: The most jobs a selection holds unless its ``limit`` says more.
DEFAULT_LIMIT = 10_000
#: The most jobs any selection may hold.
MAX_LIMIT = 100_000
#: Rows read per page while selecting.
_PAGE = 1000
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_AGE = re.compile(r"([0-9]{1,9})([smhdw])")


class SelectionTooLarge(ConfigError):
    """A selection matches more jobs than its limit: nothing was done."""


Act = Callable[[OperatorStore, str, str, "str | None"], Awaitable[JobRecord]]


@dataclass(frozen=True, slots=True)
class BatchAction:
    """An operator action `act_on_each` applies to one job at a time."""

    name: str
    """The command's name: ``retry``, ``cancel``, ``pause``, ``resume``."""
    statuses: tuple[str, ...]
    """The statuses it acts on; a selection reads only these."""
    act: Act
    """``act(store, job_id, actor, reason)``: the single-job operation, one transaction (or a cancel's
    chain of them, job first)."""
    takes_reason: bool = False
    """Whether ``reason`` means anything to it."""
    picks: Callable[[OperatorStore, JobRecord], Awaitable[bool]] | None = None
    """Of the rows in `statuses`, which it acts on (None: all of them)."""


async def _retry(store: OperatorStore, job_id: str, actor: str, reason: str | None) -> JobRecord:
    return await store.retry(job_id, actor=actor)


async def _cancel(store: OperatorStore, job_id: str, actor: str, reason: str | None) -> JobRecord:
    row, _ = await cancel_with_children(store, job_id, reason or "cancelled by an operator", actor=actor)
    return row


async def _pause(store: OperatorStore, job_id: str, actor: str, reason: str | None) -> JobRecord:
    return await pause_job(store, job_id, reason, actor)


async def _resume(store: OperatorStore, job_id: str, actor: str, reason: str | None) -> JobRecord:
    return await resume_job(store, job_id, actor)


async def _paused_or_requested(store: OperatorStore, row: JobRecord) -> bool:
    return row.status != JobStatus.RUNNING or await store.pause_requested(row.id, row.attempt)


def _names(statuses: Iterable[str]) -> tuple[str, ...]:
    return tuple(str(s) for s in statuses)


#: The actions a selection may be given to, by name.
BATCH_ACTIONS: dict[str, BatchAction] = {
    "retry": BatchAction("retry", _names(RETRYABLE), _retry),
    "cancel": BatchAction("cancel", _names(CANCELLABLE), _cancel, takes_reason=True),
    "pause": BatchAction("pause", _names(PAUSABLE), _pause, takes_reason=True),
    # A resume also withdraws the pause requested of a RUNNING job, as `job resume ID` does: a batch resume
    # undoes a batch pause whatever each job was doing.
    "resume": BatchAction(
        "resume", (str(JobStatus.PAUSED), str(JobStatus.RUNNING)), _resume, picks=_paused_or_requested
    ),
}


@dataclass(frozen=True, slots=True)
class Selection:
    """Which jobs an action is given to, at most ``limit`` of them.

    All of ``status`` (else every status the action acts on), of ``agent_id``, last written at least
    ``older_than`` seconds ago, among ``ids`` when given.
    """

    status: str | None = None
    agent_id: str | None = None
    older_than: float | None = None
    ids: tuple[str, ...] | None = None
    limit: int = DEFAULT_LIMIT

    def describe(self) -> str:
        """The selection as the flags that made it, for a message."""
        parts = [
            f"--status {self.status}" if self.status else "",
            f"--agent {self.agent_id}" if self.agent_id else "",
            f"--older-than {self.older_than:g}s" if self.older_than is not None else "",
            f"{len(self.ids)} ids from a file" if self.ids is not None else "",
        ]
        return " ".join(p for p in parts if p) or "every job"


@dataclass(frozen=True, slots=True)
class BatchReport:
    """What `act_on_each` did: the jobs acted on, and those skipped with why (one line each)."""

    action: str
    done: tuple[str, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()
    rows: tuple[JobRecord, ...] = field(default=(), repr=False)
    """The rows as each action left them (same order as ``done``)."""

    def summary(self) -> str:
        """``retry: 198 done, 2 skipped`` (with the first reason when some were skipped)."""
        line = f"{self.action}: {len(self.done)} done, {len(self.skipped)} skipped"
        if self.skipped:
            line += f" (e.g. {self.skipped[0][1]})"
        return line


def selection_digest(job_ids: Sequence[str]) -> str:
    """A short digest of the ids a selection named: a confirmation acts only on exactly these jobs."""
    import hashlib

    return hashlib.sha256("\n".join(sorted(job_ids)).encode("utf-8", "surrogatepass")).hexdigest()[:32]


def parse_age(text: str, what: str = "--older-than") -> float:
    """Seconds of an age written as a whole number and a unit: ``30m``, ``12h``, ``7d`` (also ``s``, ``w``).

    Raises:
        ConfigError: anything else (a sign, a space inside, a fraction, no unit), in one line.
    """
    if not isinstance(text, str):
        raise ConfigError(f"{what} must be an age such as 7d, 12h or 30m")
    match = _AGE.fullmatch(text.strip())
    if match is None:
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise ConfigError(f"{what} {shown!r} is not an age: a whole number and s, m, h, d or w (e.g. 7d)")
    return int(match.group(1)) * _UNITS[match.group(2)]


def check_limit(limit: object) -> int:
    """``limit`` when it is a whole number from 1 to `MAX_LIMIT`; else `ConfigError`."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ConfigError(f"the limit must be a whole number from 1 to {MAX_LIMIT}, got {limit!r}")
    return limit


def read_ids(lines: Iterable[str], limit: int) -> tuple[str, ...]:
    """The job ids of an ids file: one per line, blanks and ``#`` comments skipped, duplicates once.

    Raises:
        ConfigError: a line that is not a job id (its number said), or more than ``limit`` ids.
    """
    ids: dict[str, None] = {}
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            ids[validate_job_id(line)] = None
        except ConfigError as exc:
            raise ConfigError(f"line {number} of the ids file: {exc}") from None
        if len(ids) > limit:
            raise SelectionTooLarge(f"the ids file names more than {limit} jobs; nothing was done")
    return tuple(ids)


def _check(action: BatchAction, selection: Selection) -> list[str]:
    """The statuses to read; `ConfigError` for a selection the action cannot take."""
    check_limit(selection.limit)
    if selection.agent_id is not None:
        validate_agent_id(selection.agent_id)
    if selection.older_than is not None and (
        not isinstance(selection.older_than, int | float) or not math.isfinite(selection.older_than)
    ):
        raise ConfigError("older_than must be a number of seconds")
    if selection.status is None:
        return list(action.statuses)
    if selection.status not in action.statuses:
        allowed = ", ".join(action.statuses)
        raise ConfigError(f"{action.name} acts on {allowed} jobs, not {selection.status}")
    return [selection.status]


async def select_jobs(
    store: OperatorStore, action: BatchAction, selection: Selection, now: float | None = None
) -> list[str]:
    """The ids ``selection`` names among the jobs ``action`` acts on, least recently written first.

    Raises:
        ConfigError: a status the action does not act on, an agent id or limit that is not one.
        SelectionTooLarge: more than ``selection.limit`` jobs match; nothing was done.
        JobNotFound: no job matches.
    """
    statuses = _check(action, selection)
    cutoff = None if selection.older_than is None else (now or time.time()) - selection.older_than
    if selection.ids is not None:
        found = await _among_ids(store, action, selection, statuses, cutoff)
    else:
        found = await _by_filter(store, action, selection, statuses, cutoff)
    if not found:
        raise JobNotFound(
            f"no job matches the selection ({selection.describe()}) among {', '.join(statuses)}"
        )
    found.sort(key=lambda item: item[0])
    return [job_id for _, job_id in found]


async def _by_filter(
    store: OperatorStore,
    action: BatchAction,
    selection: Selection,
    statuses: Sequence[str],
    cutoff: float | None,
) -> list[tuple[float, str]]:
    found: list[tuple[float, str]] = []
    for status in statuses:
        # Pages from the cutoff down: the rows newer than it are never read (the list's keyset order).
        after: tuple[Any, Any] | None = None if cutoff is None else (cutoff, "")
        while True:
            rows = await store.list_jobs(status, selection.agent_id, _PAGE, after=after)
            found += [(_when(row), row.id) for row in await _picked(store, action, rows)]
            if len(found) > selection.limit:
                raise SelectionTooLarge(
                    f"the selection ({selection.describe()}) matches more than {selection.limit} jobs: "
                    f"narrow it, or raise the limit (at most {MAX_LIMIT}); nothing was done"
                )
            if len(rows) < _PAGE:
                break
            after = position_of(rows[-1])
    return found


async def _among_ids(
    store: OperatorStore,
    action: BatchAction,
    selection: Selection,
    statuses: Sequence[str],
    cutoff: float | None,
) -> list[tuple[float, str]]:
    assert selection.ids is not None
    if len(selection.ids) > selection.limit:
        raise SelectionTooLarge(f"{len(selection.ids)} ids is more than the limit of {selection.limit}")
    found: list[tuple[float, str]] = []
    for job_id in selection.ids:
        row = await store.get_job(job_id)
        if row is None or row.status not in statuses:
            continue
        if selection.agent_id is not None and row.agent_id != selection.agent_id:
            continue
        if cutoff is not None and _when(row) > cutoff:
            continue
        if not await _picked(store, action, [row]):
            continue
        found.append((_when(row), job_id))
    return found


async def _picked(store: OperatorStore, action: BatchAction, rows: Sequence[JobRecord]) -> list[JobRecord]:
    """The rows with a text id that ``action`` acts on."""
    return [
        r for r in rows if isinstance(r.id, str) and (action.picks is None or await action.picks(store, r))
    ]


def _when(row: JobRecord) -> float:
    at = row.updated_at
    return float(at) if isinstance(at, int | float) and not isinstance(at, bool) else 0.0


async def act_on_each(
    store: OperatorStore,
    action: BatchAction,
    job_ids: Sequence[str],
    *,
    actor: str,
    reason: str | None = None,
    on_each: Callable[[str, JobRecord | None, str | None], None] | None = None,
) -> BatchReport:
    """Apply ``action`` to each job of ``job_ids`` in turn, each in its own transaction.

    A job the store refuses (`JobStateConflict`: its status changed since it was selected; `JobNotFound`:
    it is gone) is skipped with the store's one-line reason, and the rest go on. ``on_each(job_id, row,
    why)`` is called after each job (``row`` None and ``why`` the reason when skipped), so a caller can
    say at once what was done: should the batch be interrupted, every job said done was done.

    Raises:
        ConfigError: ``reason`` or ``actor`` is not one (before any job is touched).
    """
    done: list[str] = []
    rows: list[JobRecord] = []
    skipped: list[tuple[str, str]] = []
    for job_id in job_ids:
        try:
            row = await action.act(store, job_id, actor, reason)
        except (JobStateConflict, JobNotFound) as exc:
            skipped.append((job_id, str(exc)))
            if on_each is not None:
                on_each(job_id, None, str(exc))
            continue
        done.append(job_id)
        rows.append(row)
        if on_each is not None:
            on_each(job_id, row, None)
    return BatchReport(action.name, tuple(done), tuple(skipped), tuple(rows))
