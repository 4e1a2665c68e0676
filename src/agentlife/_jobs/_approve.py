"""Approving a parked job: exactly the call it is parked on, never one it asks for meanwhile."""

from __future__ import annotations

from typing import Any

from agentlife._exceptions import JobStateConflict
from agentlife._jobs._view import call_text
from agentlife.stores import JobRecord, OperatorStore

__all__ = ["approve_parked"]


async def approve_parked(
    store: OperatorStore,
    job_id: str,
    call: str | None = None,
    *,
    given_by: str = "--call",
    shown: bool = False,
    actor: str | None = None,
) -> tuple[JobRecord, Any]:
    """Approve the call ``job_id`` is parked on (only if it is ``call``, when given): (the row, the request).

    ``given_by`` names where ``call`` came from in the refusal (``--call``, a form's field). ``shown``: the
    caller showed the operator ``call``, None being "no call" (a page): then a job that records a call the
    operator did not see is refused, never approved. ``actor``: who approves, recorded in the grant.

    Raises:
        JobStateConflict: the job is not parked, or waits for another call than ``call``.
        JobNotFound: there is no such job.
    """
    # Approve exactly the call read here: if the job asks for another one meanwhile, the store refuses.
    state = await store.get_approval(job_id)
    request = state.request if state is not None else None
    if request is None:
        if call is not None:
            raise JobStateConflict(f"cannot approve job {job_id}: it records no call waiting to be approved")
        return await store.approve(job_id, no_call=shown, actor=actor), None
    if shown and call is None:
        waits_for = call_text(request)
        raise JobStateConflict(f"cannot approve job {job_id}: it now waits for {waits_for}, a call not shown")
    if call is not None and call != request.get("invocation_id"):
        # The given id is not echoed: it is the operator's text and may not even be printable.
        waits_for = call_text(request)
        raise JobStateConflict(
            f"cannot approve job {job_id}: it waits for {waits_for}, not the call given by {given_by}"
        )
    row = await store.approve(
        job_id, invocation_id=request["invocation_id"], digest=request["digest"], actor=actor
    )
    return row, request
