"""What `agentlife.Client` answers with: frozen, read-only records of a job as the store holds it.

Unlike what ``job show`` prints, the values are the job's own (its payload and result are the
application's data, given back as stored, never masked); only `JobSnapshot.waits_for`, the human lines
``job show`` prints, are masked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from agentlife._jobs._mask import Masker
from agentlife._jobs._pause import pause_of
from agentlife._jobs._view import JobState, show_job
from agentlife.stores import JobRecord, JobStatus
from agentlife.stores._jobs import TERMINAL, is_crash

__all__ = ["JobPage", "JobSnapshot", "JobSummary", "snapshot", "summary"]

_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class JobSummary:
    """One job as a list shows it (`agentlife.Client.list`) and as an action leaves it."""

    job_id: str
    """The job's id."""
    agent_id: str
    """The agent that runs it."""
    status: str
    """Its status (`agentlife.stores.JobStatus`)."""
    attempt: int
    """The attempt that owns the row (0 before the first claim)."""
    updated_at: float | None
    """Unix time of the row's last change."""
    crashes: int
    """How many crash records its history holds (operator records not counted)."""

    @property
    def finished(self) -> bool:
        """Whether the job has ended: COMPLETED, FAILED or DEAD_LETTER (a retry can start it again)."""
        return self.status in TERMINAL


@dataclass(frozen=True, slots=True)
class JobSnapshot:
    """A job as it stood when `agentlife.Client.get` read it. A copy: it never changes."""

    job_id: str
    """The job's id."""
    agent_id: str
    """The agent that runs it."""
    status: str
    """Its status (`agentlife.stores.JobStatus`)."""
    attempt: int
    """The attempt that owns the row (0 before the first claim)."""
    payload: Any
    """The payload it was started with, as stored."""
    result: Any
    """What its step returned with ``Done(result=...)``, once COMPLETED; else None."""
    tokens_used: Mapping[str, Any]
    """What it spent over all attempts: ``input`` and ``output`` tokens, ``cost_usd``."""
    budget: Mapping[str, Any] | None
    """Its budget (``max_cost_usd``, ``max_input_tokens``), when it was given one."""
    errors: tuple[Mapping[str, Any], ...]
    """Its crash history, oldest first: crash records, reaps, operators' cancels, rejects and retries."""
    crashes: int
    """How many of `errors` are crash records."""
    waits_for: tuple[str, ...]
    """What it waits for, the lines ``job show`` prints (masked): the call parked for approval, the calls
    approved and refused, its durable wait and its end, the events sent and not yet taken."""
    approval_request: Mapping[str, Any] | None
    """The call it is parked on while WAITING_FOR_APPROVAL (``tool``, ``invocation_id``, ``digest``)."""
    waiting: Mapping[str, Any] | None
    """What it waits for while WAITING (``kind``, ``events`` or ``jobs``, ``until``)."""
    events_kept: Mapping[str, int]
    """Events sent to it that no wait has taken yet, by name."""
    updated_at: float | None
    """Unix time of the row's last change."""
    heartbeat_at: float | None
    """Unix time of the last heartbeat of the process running it."""
    not_before: float | None
    """Unix time from which it is runnable (the end of a crash backoff or of a wait)."""
    unreadable: Mapping[str, str]
    """Columns the store could not decode (a row written badly by another client), and why."""
    concurrency_key: str | None = None
    """Its concurrency key: workers run at most the key's limit of such jobs at once (None: none)."""
    priority: int = 0
    """Its priority: higher is claimed first."""
    paused: Mapping[str, Any] | None = None
    """An operator's pause in force (``reason``, ``actor``, ``at``; ``requested``: True while a RUNNING job
    has yet to reach its next step boundary), or None."""

    @property
    def finished(self) -> bool:
        """Whether the job has ended: COMPLETED, FAILED or DEAD_LETTER (a retry can start it again)."""
        return self.status in TERMINAL


@dataclass(frozen=True, slots=True)
class JobPage:
    """One page of `agentlife.Client.list`, most recently updated first."""

    jobs: tuple[JobSummary, ...]
    """The jobs of this page."""
    next_cursor: str | None
    """Pass it as ``after=`` for the next page; None on the last one."""


def summary(row: JobRecord) -> JobSummary:
    """The summary of ``row``."""
    crashes = sum(1 for entry in row.error if is_crash(entry))
    return JobSummary(row.id, row.agent_id, row.status, row.attempt, row.updated_at, crashes)


def snapshot(state: JobState, masker: Masker) -> JobSnapshot:
    """The snapshot of what `read_job_state` read; its waits as the lines ``job show`` prints."""
    row = state.row
    pause = pause_of(row)
    request = None
    parked = row.status == JobStatus.WAITING_FOR_APPROVAL
    if state.approval is not None and state.approval.request is not None and parked:
        request = MappingProxyType(dict(state.approval.request))
    waiting = None
    if state.wait is not None and row.status == JobStatus.WAITING:
        waiting = MappingProxyType({"until": state.wait.until, **state.wait.waiting_for})
    return JobSnapshot(
        job_id=row.id,
        agent_id=row.agent_id,
        status=row.status,
        attempt=row.attempt,
        payload=row.payload,
        result=row.result,
        tokens_used=_frozen(row.tokens_consumed),
        budget=None if row.token_budget is None else _frozen(row.token_budget),
        errors=tuple(MappingProxyType(dict(e)) if isinstance(e, dict) else e for e in row.error),
        crashes=sum(1 for entry in row.error if is_crash(entry)),
        waits_for=tuple(show_job(state, masker).waits_for),
        approval_request=request,
        waiting=waiting,
        events_kept=MappingProxyType(dict(state.kept)) if state.kept else _EMPTY,
        updated_at=row.updated_at,
        heartbeat_at=row.heartbeat_at,
        not_before=row.not_before,
        unreadable=MappingProxyType(dict(row.unreadable)) if row.unreadable else _EMPTY,
        concurrency_key=row.concurrency_key,
        priority=row.priority,
        paused=None if pause is None else MappingProxyType(pause),
    )


def _frozen(value: Any) -> Mapping[str, Any]:
    """A read-only copy of a column that should hold an object (a row written badly reads as empty)."""
    return MappingProxyType(dict(value)) if isinstance(value, dict) else _EMPTY
