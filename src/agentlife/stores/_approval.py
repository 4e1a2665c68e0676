"""Approvals on the job row: the call a process is parked on, and the calls an operator approved or refused.

The job row's ``approval`` column (JSON, written only through the store) holds three things:

``request``
    The call a process is parked on: its ``invocation_id`` (``{job_id}/{step}/{call}``), its ``digest``
    (of the tool's name and arguments, the digest the journal records), ``tool``, ``step``, ``attempt``
    and ``at``. It is written by the same statement that sets WAITING_FOR_APPROVAL
    (`CheckpointStore.request_approval`), so a park is durable from the moment it begins: a process killed
    while it waits leaves the row saying exactly which call waits, and the approval given afterwards is
    not lost.
``grants``
    Every call approved so far: the request as it was, plus ``approved_at``. A restricted call runs only
    when a grant names both its invocation id and its digest; the same position with other arguments
    (a model that asked for something else on a later attempt) is another call, and asks again.
``rejection``
    The request ``job reject`` refused, with its ``reason``, until ``job retry`` clears it. A retry never
    grants anything: the retried job reaches the call again, parks again, and asks.

Whatever the column holds that does not fit this shape (a row written by hand, a torn write) reads as no
grant at all: a bad record can only make a job ask again, never run a call nobody approved.

The operations of a job's process on it are here (`request_approval`, `get_approval`); an operator's
(approve, reject, retry) are in `_transitions`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import orjson

from agentlife._exceptions import AttemptFenced, JobStateConflict
from agentlife.stores._base import JobStatus
from agentlife.stores._jobs import TERMINAL
from agentlife.stores._pause import settle_pause
from agentlife.stores._rows import dumps

if TYPE_CHECKING:
    from agentlife.stores._dialect import Tx

__all__ = [
    "ApprovalRequest",
    "ApprovalState",
    "Decision",
    "check_request",
    "get_approval",
    "granted",
    "loads_approval",
    "rejected",
    "rejection_record",
    "request_approval",
    "requested",
    "retried",
]

log = logging.getLogger("agentlife.store")

#: What a row says about one call: approved; refused (the job ended: rejected, cancelled, failed); waiting
#: (the row is parked on this very call); unasked (the row is not parked on it: ask); paused (an operator
#: paused the row: the process parks and lets go of it).
Decision = Literal["granted", "refused", "waiting", "unasked", "paused"]


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """One restricted call that needs an operator's approval."""

    invocation_id: str
    """``{job_id}/{step}/{call}`` of the call."""
    digest: str
    """The call's digest (tool name and arguments), as the journal records it."""
    tool: str
    """The tool's name."""
    step: int | None = None
    """The step making the call."""
    attempt: int = 0
    """The attempt asking."""
    arguments: Any = None
    """The call's arguments as the operator is shown them: secrets masked, bounded, JSON (None: unknown)."""
    said: str | None = None
    """The model's text before the call in this step, masked and bounded (None: no model call came first)."""

    def to_json(self, at: float) -> dict[str, Any]:
        """The record stored in the ``approval`` column."""
        record = {
            "invocation_id": self.invocation_id,
            "digest": self.digest,
            "tool": self.tool,
            "step": self.step,
            "attempt": self.attempt,
            "at": at,
        }
        # Shown to the operator, never compared: a grant names the invocation id and the digest.
        if self.arguments is not None:
            record["arguments"] = self.arguments
        if self.said is not None:
            record["said"] = self.said
        return record

    def names(self, entry: Mapping[str, Any] | None) -> bool:
        """Whether ``entry`` (a stored request or grant) is this very call: same invocation id and digest."""
        return (
            entry is not None
            and entry.get("invocation_id") == self.invocation_id
            and entry.get("digest") == self.digest
        )

    def describe(self) -> str:
        """``tool (invocation id)``, for messages."""
        return f"{self.tool} ({self.invocation_id})"


@dataclass(frozen=True, slots=True)
class ApprovalState:
    """The row's status and its ``approval`` column, as `CheckpointStore.get_approval` reads them."""

    status: str
    """The row's status."""
    request: Mapping[str, Any] | None = None
    """The call the row is parked on, or None."""
    grants: tuple[Mapping[str, Any], ...] = ()
    """The calls approved so far, oldest first."""
    rejection: Mapping[str, Any] | None = None
    """The refused request (with ``reason``), or None."""

    @classmethod
    def from_column(cls, status: str, raw: Any) -> ApprovalState:
        """Read the column's decoded value; anything that does not fit reads as empty (no grant)."""
        column = _column(raw)
        return cls(
            status=status,
            request=column["request"],
            grants=tuple(column["grants"]),
            rejection=column["rejection"],
        )

    def granted(self, request: ApprovalRequest) -> bool:
        """Whether a grant names ``request`` (invocation id and digest)."""
        return any(request.names(grant) for grant in self.grants)

    def decide(self, request: ApprovalRequest) -> Decision:
        """What the row says about ``request``: a terminal status refuses whatever was granted before."""
        if self.status in TERMINAL:
            return "refused"
        if self.granted(request):
            return "granted"
        if self.status == JobStatus.PAUSED:
            return "paused"
        if self.status == JobStatus.WAITING_FOR_APPROVAL and request.names(self.request):
            return "waiting"
        return "unasked"

    def to_json(self) -> dict[str, Any]:
        """The state as JSON (``job show --json``)."""
        return {
            "request": None if self.request is None else dict(self.request),
            "grants": [dict(g) for g in self.grants],
            "rejection": None if self.rejection is None else dict(self.rejection),
        }


async def request_approval(
    tx: Tx, job_id: str, attempt: int, owner: str, request: ApprovalRequest
) -> ApprovalState:
    """Park the held row on ``request`` unless a grant names it or the row has ended; the row's state.

    Raises:
        AttemptFenced: the row belongs to another attempt or process.
    """
    async with tx.atomic():
        found = await tx.fetchrow(tx.sql.lock_approval, job_id=job_id, attempt=attempt, owner=owner)
        if found is None:
            raise AttemptFenced(f"job {job_id}: approval request by attempt {attempt} refused")
        approval = loads_approval(found["approval"])
        state = ApprovalState.from_column(found["status"], approval)
        if state.status in TERMINAL or state.status == JobStatus.PAUSED or state.granted(request):
            return state
        column = requested(approval, request, tx.now)
        waiting = str(JobStatus.WAITING_FOR_APPROVAL)
        await tx.execute(tx.sql.park_approval, job_id=job_id, status=waiting, approval=dumps(column))
        if await settle_pause(tx, job_id):  # an operator's pause requested meanwhile: parked PAUSED
            waiting = str(JobStatus.PAUSED)
    return ApprovalState.from_column(waiting, column)


async def get_approval(tx: Tx, job_id: str) -> ApprovalState | None:
    """The row's status and approval record, or None when there is no such row."""
    found = await tx.fetchrow(tx.sql.get_approval, job_id=job_id)
    return (
        None
        if found is None
        else ApprovalState.from_column(found["status"], loads_approval(found["approval"]))
    )


def loads_approval(value: str | bytes | None) -> Any:
    """The column's stored text decoded; text that is not JSON reads as None (an empty column)."""
    if value is None:
        return None
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        log.warning("the approval column holds text that is not JSON: read as empty")
        return None


def requested(raw: Any, request: ApprovalRequest, at: float) -> dict[str, Any]:
    """The column after a process parks on ``request``."""
    column = _column(raw)
    column["request"] = request.to_json(at)
    return column


def granted(raw: Any, at: float, actor: str | None = None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The column after ``job approve``, and the grant made (None when no request was recorded).

    ``actor``: who approved, recorded in the grant as ``approved_by`` when given.
    """
    column = _column(raw)
    request, column["request"] = column["request"], None
    if request is None:
        return column, None
    grant = {**request, "approved_at": at}
    if actor is not None:
        grant["approved_by"] = actor
    column["grants"] = [*column["grants"], grant]
    return column, grant


def rejected(
    raw: Any, reason: str, at: float, actor: str | None = None
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The column after ``job reject``, and the refused request (None when none was recorded)."""
    column = _column(raw)
    request, column["request"] = column["request"], None
    column["rejection"] = {**(request or {}), "reason": reason, "rejected_at": at}
    if actor is not None:
        column["rejection"]["rejected_by"] = actor
    return column, request


def check_request(
    job_id: str, raw: Any, invocation_id: str | None, digest: str | None, *, no_call: bool = False
) -> None:
    """Raise `JobStateConflict` unless the recorded request is the call named (when one is named).

    ``no_call``: the caller was shown no call, so a request recorded since is refused, not granted.
    """
    if no_call:
        shown = _column(raw)["request"]
        if shown is not None:
            raise JobStateConflict(
                f"cannot approve job {job_id}: it now waits for {shown.get('tool', '?')} "
                f"({shown['invocation_id']}), a call that was not shown"
            )
        return
    if invocation_id is None and digest is None:
        return
    request = _column(raw)["request"]
    if request is None:
        raise JobStateConflict(f"cannot approve job {job_id}: it records no call waiting for approval")
    if invocation_id not in (None, request["invocation_id"]) or digest not in (None, request["digest"]):
        raise JobStateConflict(
            f"cannot approve job {job_id}: it waits for {request.get('tool', '?')} "
            f"({request['invocation_id']}, digest {request['digest']}), not the call named"
        )


def rejection_record(entry: dict[str, Any], request: Mapping[str, Any] | None) -> dict[str, Any]:
    """The crash-history entry of ``job reject``, naming the refused call when one was recorded."""
    if request is not None:
        entry.update(invocation_id=request["invocation_id"], tool=request.get("tool"))
    return entry


def retried(raw: Any) -> dict[str, Any]:
    """The column after ``job retry``: nothing pending, nothing refused; earlier grants stand."""
    column = _column(raw)
    column["request"] = None
    column["rejection"] = None
    return column


def _column(raw: Any) -> dict[str, Any]:
    """``{"request", "grants", "rejection"}`` from the stored value, keeping only entries that fit."""
    raw = raw if isinstance(raw, Mapping) else {}
    grants = raw.get("grants")
    return {
        "request": _entry(raw.get("request")),
        "grants": [g for g in grants if _entry(g) is not None] if isinstance(grants, list) else [],
        "rejection": dict(raw["rejection"]) if isinstance(raw.get("rejection"), Mapping) else None,
    }


def _entry(value: Any) -> dict[str, Any] | None:
    """A request or grant record: an object whose invocation id and digest are strings."""
    if not isinstance(value, Mapping):
        return None
    if not isinstance(value.get("invocation_id"), str) or not isinstance(value.get("digest"), str):
        return None
    return dict(value)
