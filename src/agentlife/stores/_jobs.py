"""The rules of job operations: the transition table, crash-history records and the reaper's decision.

The operations a person or a control plane performs on job rows (``python -m agentlife job ...``), each one
conditional on the row's status so that two of them racing on one row cannot both win:

- approve: WAITING_FOR_APPROVAL -> RUNNING when a live process still holds the row (it is polling and takes
  the approval), else PENDING (the next run or worker resumes it); the call the row is parked on is
  granted, bound to its invocation id and digest (see ``_approval``);
- reject: WAITING_FOR_APPROVAL -> FAILED, final, ``ApprovalRejected`` recorded in the crash history;
- cancel: PENDING, RETRYING, RUNNING, WAITING_FOR_APPROVAL, WAITING or PAUSED -> FAILED, ``Cancelled``
  recorded, and ``attempt + 1`` so that a process still running the job is fenced out at its next write;
- pause: PENDING, RETRYING, WAITING or WAITING_FOR_APPROVAL -> PAUSED, the status it was in kept in the
  row's ``paused`` column; RUNNING stays RUNNING with the request in that column, and the process holding
  it parks the job PAUSED at its next step boundary or wait (`_pause`);
- resume: PAUSED -> the status it was paused in (a RUNNING row's pending request is withdrawn);
- retry: FAILED or DEAD_LETTER -> PENDING, runnable now; the crashes before it stop counting to the limits,
  and it approves nothing.

The zombie reaper (`CheckpointStore.reap`) moves RUNNING rows whose heartbeat is older than the threshold to
RETRYING (``not_before`` from the crash backoff schedule) or to DEAD_LETTER / FAILED, as
`agentlife.should_retry_after_crash` decides from the row's crash history, and holds the retries of an agent
whose crashes open the per-agent circuit breaker (`BudgetConstants.circuit_failure_threshold` crashes within
``circuit_window_seconds``) until ``circuit_cooldown_seconds`` have passed. It fences the dead process out by
its claim token (``owner`` becomes `REAPED_OWNER`), not by bumping the attempt: the next claim bumps it, once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentlife._exceptions import JobNotFound, JobStateConflict
from agentlife.constants import Constants
from agentlife.stores._base import REAPED_OWNER, JobRecord, JobStatus

__all__ = [
    "APPROVABLE",
    "CANCELLABLE",
    "HELD",
    "OWNER_GONE_REASON",
    "PAUSABLE",
    "REAPED_OWNER",
    "RETRYABLE",
    "REWIND_EVENT",
    "RUNNABLE",
    "SET_ASIDE_PER_CLAIM",
    "TERMINAL",
    "ReapDecision",
    "check_transition",
    "crash_count",
    "decide_reap",
    "expected_statuses",
    "is_crash",
    "operator_record",
    "retry_marker",
    "since_last_retry",
]

#: How many unreadable rows one `CheckpointStore.claim_next` call sets aside at most before it returns None
#: (the caller claims again at its next poll): a table full of them cannot hold a claim, or a lock, for long.
SET_ASIDE_PER_CLAIM = 32
#: Statuses a worker may claim once their ``not_before`` has passed (for WAITING: the end of its wait).
RUNNABLE = (JobStatus.PENDING, JobStatus.RETRYING, JobStatus.WAITING)
APPROVABLE = (JobStatus.WAITING_FOR_APPROVAL,)
CANCELLABLE = (
    JobStatus.PENDING,
    JobStatus.RETRYING,
    JobStatus.RUNNING,
    JobStatus.WAITING_FOR_APPROVAL,
    JobStatus.WAITING,
    JobStatus.PAUSED,
)
#: Statuses ``job pause`` takes (RUNNING as a request the process holding the row carries out).
PAUSABLE = (
    JobStatus.PENDING,
    JobStatus.RETRYING,
    JobStatus.RUNNING,
    JobStatus.WAITING_FOR_APPROVAL,
    JobStatus.WAITING,
)
#: Statuses a requested pause turns into PAUSED when the process holding the row hands it back in one.
SETTLES_PAUSE = (JobStatus.PENDING, JobStatus.RETRYING, JobStatus.WAITING_FOR_APPROVAL, JobStatus.WAITING)
RETRYABLE = (JobStatus.FAILED, JobStatus.DEAD_LETTER)
#: Statuses a job never leaves except through ``job retry``: no late writer may change them.
TERMINAL = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.DEAD_LETTER)
#: Statuses the process holding a row (its attempt and claim token) may find it in and write over: its own
#: RUNNING, its own park, or PENDING after an approval that did not see it alive. Never a terminal one.
HELD = (JobStatus.RUNNING, JobStatus.WAITING_FOR_APPROVAL, JobStatus.PENDING)
#: Statuses a process may hand its RUNNING job back in (`CheckpointStore.release`).
RELEASABLE = (JobStatus.PENDING, JobStatus.RETRYING, JobStatus.FAILED, JobStatus.DEAD_LETTER)


def expected_statuses(expect: Sequence[str] | None) -> tuple[str, ...]:
    """The statuses a status write may find the row in: ``expect``, or by default any but a terminal one.

    Nor PAUSED by default: an operator's pause is undone only by ``job resume`` or ``job cancel``.
    """
    if expect is None:
        return tuple(str(s) for s in JobStatus if s not in TERMINAL and s != JobStatus.PAUSED)
    return tuple(str(s) for s in expect)


def check_releasable(status: str) -> str:
    """``status`` as a string when a job may be released in it, else `ValueError` (a caller's bug)."""
    if status not in RELEASABLE:
        raise ValueError(f"cannot release a job as {status}: one of {', '.join(RELEASABLE)}")
    return str(status)


#: The crash-history entry ``retry`` appends: the retry limits count crashes after the last one.
RETRY_EVENT = "retry"
#: The crash-history ``event`` of a rewind (and of a fork's first entry): like a retry, it ends the count
#: of the crashes before it.
REWIND_EVENT = "rewound"
#: The reaper's reason, in every crash-history entry it writes.
REAP_REASON = "heartbeat stale"
#: The reason when the process that claimed the row ran on this host and has exited.
OWNER_GONE_REASON = "claiming process gone"


@dataclass(frozen=True, slots=True)
class ReapDecision:
    """What the zombie reaper did with one RUNNING row whose heartbeat stopped."""

    job_id: str
    """The row."""
    agent_id: str
    """Its agent."""
    attempt: int
    """The attempt the job's next run gets (the dead process's attempt + 1).

    The row keeps the dead attempt until that claim; the dead process is fenced out by its claim token.
    """
    status: str
    """RETRYING, DEAD_LETTER or FAILED."""
    not_before: float | None
    """Unix time before which no worker claims the row (RETRYING only)."""
    reason: str
    """One line: the backoff step, the retry limit reached, or the open circuit breaker."""
    heartbeat_age_seconds: float
    """How old the row's heartbeat was when it was reaped."""
    circuit_open: bool = False
    """The agent's circuit breaker is open: the retry is held for its cooldown."""


def check_transition(job_id: str, operation: str, row: JobRecord | None, allowed: Sequence[str]) -> JobRecord:
    """``row`` when its status allows ``operation``; else `JobNotFound` or `JobStateConflict`."""
    if row is None:
        raise JobNotFound(f"job {job_id} does not exist")
    if row.status not in allowed:
        raise JobStateConflict(
            f"cannot {operation} job {job_id}: it is {row.status} "
            f"({operation} needs {' or '.join(str(s) for s in allowed)})"
        )
    return row


def operator_record(
    error_class: str, message: str, attempt: int, at: float, *, actor: str | None = None
) -> dict[str, Any]:
    """The crash-history entry of reject / cancel: exit code 0, so no retry limit counts it as a crash.

    ``actor``: who did it (`agentlife._jobs._actor.check_actor`), recorded as ``actor`` when given.
    """
    entry = {"at": at, "attempt": attempt, "exit_code": 0, "error_class": error_class, "message": message}
    return _with_actor(entry, actor)


def retry_marker(attempt: int, at: float, *, actor: str | None = None) -> dict[str, Any]:
    """The crash-history entry of ``retry`` (``actor``: who retried, when given)."""
    entry = {"at": at, "attempt": attempt, "event": RETRY_EVENT, "message": "retried by an operator"}
    return _with_actor(entry, actor)


def _with_actor(entry: dict[str, Any], actor: str | None) -> dict[str, Any]:
    if actor is not None:  # checked by the caller, as the reason is (`agentlife._jobs._actor`)
        entry["actor"] = actor
    return entry


def since_last_retry(history: Sequence[Any]) -> list[Mapping[str, Any]]:
    """The crash records after the last ``retry`` marker (operator records left out)."""
    out: list[Mapping[str, Any]] = []
    for entry in history:
        if not isinstance(entry, Mapping):
            continue
        if entry.get("event") in (RETRY_EVENT, REWIND_EVENT):
            out = []
        elif is_crash(entry):
            out.append(entry)
    return out


def is_crash(entry: Any) -> bool:
    """Whether a crash-history entry records a crash (operator records and retry markers do not)."""
    if not isinstance(entry, Mapping):
        return False
    return "exit_code" in entry and entry.get("exit_code") != 0


def crash_count(histories: Iterable[Sequence[Any]], since: float) -> int:
    """How many crash records in ``histories`` (job rows' ``error`` lists) happened at or after ``since``."""
    count = 0
    for history in histories:
        for entry in history or ():
            if is_crash(entry):
                at = entry.get("at")
                if isinstance(at, (int, float)) and at >= since:
                    count += 1
    return count


def decide_reap(
    row: JobRecord,
    *,
    now: float,
    heartbeat_age: float,
    threshold: float,
    agent_crashes: int,
    constants: Constants,
    owner_gone: bool = False,
) -> tuple[ReapDecision, dict[str, Any]]:
    """The decision for one stale RUNNING row and the crash-history entry that records it.

    ``agent_crashes`` is the number of crashes of the row's agent within the circuit window, not counting
    this one; with this one at or over the threshold the breaker is open and the retry waits its cooldown.
    ``owner_gone``: the row is reaped because its claiming process, on this host, has exited (whatever the
    heartbeat's age), not because its heartbeat is stale.
    """
    from agentlife.stores._policy import should_retry_after_crash

    budget = constants.budget
    if owner_gone:
        error_class, reason_text = "OwnerGone", OWNER_GONE_REASON
        message = f"{OWNER_GONE_REASON}: last heartbeat {heartbeat_age:.0f} s ago"
    else:
        error_class, reason_text = "HeartbeatStale", REAP_REASON
        message = f"{REAP_REASON}: none for {heartbeat_age:.0f} s (threshold {threshold:g} s)"
    record: dict[str, Any] = {
        "at": now,
        "attempt": row.attempt,
        "exit_code": None,
        "error_class": error_class,
        "message": message,
        "reason": reason_text,
        "heartbeat_at": row.heartbeat_at,
    }
    history = [*since_last_retry(row.error), record]
    verdict = should_retry_after_crash(history, row.token_budget, row.tokens_consumed, constants=constants)
    circuit_open = False
    not_before: float | None = None
    reason = verdict.reason
    if verdict.retry:
        delay = verdict.delay_seconds
        if agent_crashes + 1 >= budget.circuit_failure_threshold:
            circuit_open = True
            delay = max(delay, budget.circuit_cooldown_seconds)
            reason = (
                f"circuit breaker open for agent {row.agent_id}: {agent_crashes + 1} crashes within "
                f"{budget.circuit_window_seconds:g} s, retry held {delay:g} s"
            )
        not_before = now + delay
        status = str(JobStatus.RETRYING)
    else:
        status = str(verdict.status)
    decision = ReapDecision(
        job_id=row.id,
        agent_id=row.agent_id,
        attempt=row.attempt + 1,
        status=status,
        not_before=not_before,
        reason=reason,
        heartbeat_age_seconds=heartbeat_age,
        circuit_open=circuit_open,
    )
    record.update(decision=status, not_before=not_before, detail=reason)
    return decision, record
