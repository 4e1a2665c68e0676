"""One job as an operator sees it: read from the store, then masked into the lines both tools show.

`read_job_state` reads what the store holds about a job (unmasked: the tools need its id and status to
address it); `show_job` is everything of it a person is shown, each value through the `Masker` before a
line is built from it, so a secret under a key named like a credential is masked before the key is lost.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Any

from agentlife._exceptions import StoreError
from agentlife._jobs._mask import Masker
from agentlife._jobs._pause import pause_of
from agentlife.stores import ApprovalState, JobRecord, JobStatus, OperatorStore, WaitState
from agentlife.stores._childjobs import job_ids_waited_for
from agentlife.stores._prune import pruned_message

__all__ = [
    "SHOWN_CHILDREN",
    "JobState",
    "ShownJob",
    "call_text",
    "missing_job",
    "more",
    "read_job_state",
    "show_job",
    "to_json",
    "utc",
]

#: How many child jobs one line names.
SHOWN_CHILDREN = 10


@dataclass(frozen=True, slots=True)
class JobState:
    """What the store holds about one job, unmasked: for addressing it, never for showing it."""

    row: JobRecord
    approval: ApprovalState | None
    wait: WaitState | None
    kept: dict[str, int]


@dataclass(frozen=True, slots=True)
class ShownJob:
    """What a person is shown of one job: every value masked and bounded."""

    row: JobRecord
    """The row, every field masked (`Masker.row`)."""
    request: dict[str, Any] | None
    """The call the job is parked on, masked, while it waits for approval."""
    history: list[str]
    """One line per crash-history entry, oldest first."""
    waits_for: list[str]
    """What the job waits for: the parked call, the calls approved and refused, its wait, events kept."""


async def read_job_state(store: OperatorStore, job_id: str) -> JobState | None:
    """The row of ``job_id`` with its approval, its wait and the events not yet taken; None if no row.

    A PostgreSQL database that predates approvals, waits or events (``db init`` adds them) reads as if the
    job had none, so the row can still be shown.
    """
    row = await store.get_job(job_id)
    if row is None:
        return None
    try:
        kept = await store.kept_events(job_id)
    except StoreError:
        kept = {}
    try:
        approval = await store.get_approval(job_id)
    except StoreError:
        approval = None
    wait = None
    if row.status == JobStatus.WAITING:
        try:
            wait = await store.get_wait(job_id)
        except StoreError:
            wait = None
    return JobState(row, approval, wait, kept)


def show_job(state: JobState, masker: Masker) -> ShownJob:
    """Everything of ``state`` a person is shown, masked before any line is built from it."""
    row = masker.row(state.row)
    approval = _masked_approval(state.approval, masker)
    wait = _masked_wait(state.wait, masker)
    request = None
    if approval is not None and approval.request is not None and row.status == JobStatus.WAITING_FOR_APPROVAL:
        request = dict(approval.request)
    kept = {masker.text(name, 200): count for name, count in state.kept.items()}
    return ShownJob(
        row=row,
        request=request,
        history=[masker.text(_history_line(entry)) for entry in row.error],
        waits_for=[
            masker.text(line)
            for line in (
                _pause_lines(state.row) + _approval_lines(approval) + _wait_lines(wait) + _kept_lines(kept)
            )
        ],
    )


def _masked_approval(state: ApprovalState | None, masker: Masker) -> ApprovalState | None:
    if state is None:
        return None
    return dataclasses.replace(
        state,
        request=None if state.request is None else _mapping(masker.value(dict(state.request))),
        grants=tuple(_mapping(masker.value(dict(grant))) for grant in state.grants),
        rejection=None if state.rejection is None else _mapping(masker.value(dict(state.rejection))),
    )


def _masked_wait(state: WaitState | None, masker: Masker) -> WaitState | None:
    if state is None:
        return None
    return dataclasses.replace(state, waiting_for=_mapping(masker.value(state.waiting_for)))


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _pause_lines(row: JobRecord) -> list[str]:
    """An operator's pause of the job: who, when and why; or a RUNNING job's pause request."""
    pause = pause_of(row)
    if pause is None:
        return []
    who = f" by {pause['actor']}" if isinstance(pause["actor"], str) else ""
    when = f" at {utc(pause['at'])}" if pause["at"] is not None else ""
    why = f": {pause['reason']}" if isinstance(pause["reason"], str) else ""
    if pause["requested"]:
        return [f"pause       requested{who}{when}{why} (stops at its next step boundary)"]
    return [f"paused      {who.strip() or 'by an operator'}{when}{why} (job resume puts it back)"]


def _kept_lines(kept: dict[str, int]) -> list[str]:
    """The events sent to the job that no wait has taken yet, by name."""
    if not kept:
        return []
    names = ", ".join(f"{name!r} ({count})" for name, count in kept.items())
    return [f"events      {names} not taken"]


def _wait_lines(state: WaitState | None) -> list[str]:
    """What a WAITING job waits for: the kind of wait, its end and the call it is."""
    if state is None or state.status != JobStatus.WAITING:
        return []
    what = state.waiting_for
    kind = str(what["kind"]) if isinstance(what.get("kind"), str) else "wait"
    if kind == "rate_limit":
        bucket = what.get("bucket")
        kind = "rate limit" + (f" {bucket}" if isinstance(bucket, str) else "")
    events = what.get("events")
    if isinstance(events, list) and events:
        kind += " " + ", ".join(repr(e) for e in events if isinstance(e, str))
    jobs = job_ids_waited_for(what)
    if jobs:
        kind += " " + ", ".join(jobs[:SHOWN_CHILDREN]) + more(len(jobs))
    call = what.get("invocation_id")
    at = f" ({call})" if isinstance(call, str) else ""
    until = what.get("until", state.until)
    end = f"until {utc(until)}" if isinstance(until, int | float) else "(no timeout)"
    return [f"waits for   {kind} {end}{at}"]


def more(count: int) -> str:
    """`` and N more`` when ``count`` is more than one line names."""
    return f" and {count - SHOWN_CHILDREN} more" if count > SHOWN_CHILDREN else ""


def _approval_lines(state: ApprovalState | None) -> list[str]:
    """The call waiting for approval, the calls approved and the one refused, when the row has any."""
    if state is None:
        return []
    out = []
    if state.request is not None and state.status == JobStatus.WAITING_FOR_APPROVAL:
        out.append(f"waits for   {call_text(state.request)}")
    out += [
        f"approved    {call_text(grant)} at {utc(grant.get('approved_at'))}{by(grant.get('approved_by'))}"
        for grant in state.grants
    ]
    if state.rejection is not None:
        reason = state.rejection.get("reason") or ""
        who = by(state.rejection.get("rejected_by"))
        out.append(f"rejected    {call_text(state.rejection)}{who}: {reason}")
    return out


def call_text(entry: Any) -> str:
    """A recorded call as one phrase: ``tool (invocation id, digest d)``."""
    call, digest = entry.get("invocation_id") or "?", entry.get("digest") or "?"
    return f"{entry.get('tool') or '?'} ({call}, digest {digest})"


def _history_line(entry: Any) -> str:
    if not isinstance(entry, dict):
        return to_json(entry)
    at = entry.get("at")
    when = utc(at) if isinstance(at, (int, float)) else "?"
    what = entry.get("error_class") or entry.get("event") or "?"
    what += by(entry.get("actor"))
    line = f"{when}  attempt {entry.get('attempt', '?')}  {what}: {entry.get('message', '')}"
    if entry.get("decision"):
        line += f" -> {entry['decision']}"
        if isinstance(entry.get("not_before"), (int, float)):
            line += f" not before {utc(entry['not_before'])}"
    return line


def by(actor: Any) -> str:
    """`` by ACTOR`` for an operator's entry that records who did it (text), else nothing."""
    return f" by {actor}" if isinstance(actor, str) and actor else ""


def utc(ts: Any) -> str:
    """``ts`` as UTC to the millisecond, ``-`` for None, ``?`` for what is no time (a row written badly)."""
    if ts is None:
        return "-"
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        return "?"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"
    except (OverflowError, ValueError, OSError):  # inf, NaN, a year past 9999
        return "?"


def to_json(value: Any) -> str:
    """``value`` as one line of JSON, keys sorted, non-ASCII kept."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


async def missing_job(store: OperatorStore, job_id: str) -> str:
    """What to say of an id with no row: when it was pruned (its tombstone), or that it does not exist."""
    return pruned_message(job_id, await store.pruned_job(job_id))
