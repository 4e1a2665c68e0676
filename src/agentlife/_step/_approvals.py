"""Approvals for ``restricted=True`` tools: park on the call, poll the row, give up at the idle timeout.

An approval is bound to the call it was given for. Parking writes the call's request (invocation id,
digest of its tool and arguments, tool, step, attempt) onto the job row together with WAITING_FOR_APPROVAL,
in one fenced write (`CheckpointStore.request_approval`): the park is durable from its first moment, so a
process killed while it waits loses nothing. ``job approve`` turns the recorded request into a grant on the
row; the call runs when a grant names both its invocation id and its digest, in this attempt or any later
one (a resumed step reaches the same call again, so it runs without asking twice). A step that reaches a
different call, or the same position with other arguments, asks again. Nothing else approves: not a status
set by hand, not ``job retry``. A job whose payload holds ``"approved": true`` was approved as a whole by
whoever created it.

A refusal is final: ``job reject`` (or any terminal status while the call waits) raises `ApprovalRejected`,
every later call of the job raises it again, and the runtime ends the job FAILED whatever the step does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import anyio
import orjson

from agentlife._exceptions import PAUSED_AT_APPROVAL, ApprovalRejected, ParkRequested
from agentlife._redact import bound
from agentlife.stores import ApprovalRequest, ApprovalState, JobStatus
from agentlife.stores._jobs import HELD

if TYPE_CHECKING:
    from agentlife._agent import Job
    from agentlife._checkpoint import CheckpointDoc
    from agentlife._step._host import Booted, DrainState

__all__ = ["Approvals"]

log = logging.getLogger("agentlife.approvals")

#: The most characters of the model's text, and of each string of the arguments, an approval request keeps.
SHOWN_LIMIT = 4000


def shown_arguments(arguments: Mapping[str, Any]) -> Any:
    """The call's arguments as an approval request stores them: JSON, bounded (`bound`).

    A value JSON cannot hold (an object a tool takes) is kept as its ``str``. Arguments JSON cannot hold at
    all (a lone surrogate, an integer past 64 bits, nesting past orjson's limit) are replaced by a note:
    what is shown must never stop the request from being stored.
    """
    try:
        plain = orjson.loads(orjson.dumps(dict(arguments), default=str, option=orjson.OPT_NON_STR_KEYS))
    except (TypeError, ValueError, RecursionError):  # orjson.JSONEncodeError is a TypeError
        return "(the arguments cannot be shown: they are not JSON)"
    return bound(plain, SHOWN_LIMIT)


def shown_text(text: str) -> str:
    """The model's text as an approval request stores it: cut, and encodable (no lone surrogate)."""
    return text[:SHOWN_LIMIT].encode("utf-8", "replace").decode("utf-8")


class Approvals:
    """The job's approvals: the calls granted so far in this process, a refusal, and the parking loop.

    Args:
        booted: the job's settings, store and journal.
        job: the job, as hydration found it (its payload may carry ``"approved": true``).
        drain: stops the wait when a drain begins.
        current_step: the step in progress, for the journal.

    Attributes:
        approved: the whole job is approved (its payload says so).
        rejection: the refusal, once one was seen: the job ends FAILED.
    """

    def __init__(
        self, booted: Booted, job: Job, drain: DrainState, current_step: Callable[[], int | None]
    ) -> None:
        self.booted = booted
        self.job = job
        self.drain = drain
        self.current_step = current_step
        payload = job.payload
        self.approved = isinstance(payload, dict) and payload.get("approved") is True
        self.rejection: ApprovalRejected | None = None
        self._granted: set[tuple[str, str]] = set()
        # One request on the row at a time: concurrent restricted calls ask one after the other.
        self._lock = anyio.Lock()

    def restore(self, doc: CheckpointDoc) -> None:
        """Say what hydration found: the grants themselves are read from the row when a call needs one."""
        if doc.phase == "awaiting_approval":
            log.info("resuming a parked job: its call runs if the row grants it, else it asks again")

    def check(self) -> None:
        """Raise `ApprovalRejected` again once a call was refused: nothing of the job may run after it."""
        if self.rejection is not None:
            raise ApprovalRejected(str(self.rejection))

    async def require_approval(
        self,
        tool_name: str,
        invocation_id: str,
        digest: str,
        *,
        arguments: Mapping[str, Any] | None = None,
        said: str | None = None,
    ) -> None:
        """Return once this call (invocation id and digest) is approved; park on the row until then.

        ``arguments`` and ``said`` (the model's text before the call), masked by the caller, are what the
        operator is shown: stored bounded with the request, they play no part in what a grant names.

        Raises:
            ApprovalRejected: the call was refused, or the job ended while it waited.
            ParkRequested: the idle timeout expired or a drain began.
            AttemptFenced: the row is another process's now.
        """
        self.check()
        if self.approved:
            return
        request = ApprovalRequest(
            invocation_id,
            digest,
            tool_name,
            self.current_step(),
            self.booted.settings.attempt,
            arguments=None if arguments is None else shown_arguments(arguments),
            said=shown_text(said) if said else None,
        )
        async with self._lock:
            # Another call may have been refused, or this one granted, while this one waited its turn.
            self.check()
            if (invocation_id, digest) not in self._granted:
                await self._obtain(request)

    async def _obtain(self, request: ApprovalRequest) -> None:
        s, store = self.booted.settings, self.booted.store
        budget = s.constants.budget
        state = await store.request_approval(s.job_id, s.attempt, request)
        if await self._settled(request, state):
            return
        self.booted.journal.append(
            "APPROVAL_REQUESTED",
            tool=request.tool,
            step=request.step,
            invocation_id=request.invocation_id,
            digest=request.digest,
        )
        log.info(
            "%s needs approval: job parked in WAITING_FOR_APPROVAL (polling every %gs, idle timeout %gs)",
            request.describe(),
            budget.approval_poll_seconds,
            budget.idle_timeout_seconds,
        )
        deadline = anyio.current_time() + budget.idle_timeout_seconds
        while True:
            remaining = deadline - anyio.current_time()
            if self.drain.draining or remaining <= 0:
                raise ParkRequested
            await self._wait(min(budget.approval_poll_seconds, remaining))
            if self.drain.draining:
                raise ParkRequested
            if await self._settled(request, await store.get_approval(s.job_id)):
                return

    async def _settled(self, request: ApprovalRequest, state: ApprovalState | None) -> bool:
        """True once ``request`` is granted (the row taken back), False while it waits; raises if refused."""
        decision = "refused" if state is None else state.decide(request)
        if decision == "unasked":
            # The row left WAITING_FOR_APPROVAL without a grant for this call (a status set by hand, or a
            # request overwritten): it approves nothing, so the call asks again.
            assert state is not None
            log.warning(
                "job %s is %s without an approval of %s: asking again",
                self.job.id,
                state.status,
                request.describe(),
            )
            s = self.booted.settings
            state = await self.booted.store.request_approval(s.job_id, s.attempt, request)
            decision = state.decide(request)
        if decision == "refused":
            raise self._refused(request, state)
        if decision == "paused":  # an operator paused the job: park it (checkpoint, let go), the call not run
            log.info("job %s paused by an operator while %s waits for approval: parking", self.job.id,
                     request.describe())  # fmt: skip
            raise ParkRequested(PAUSED_AT_APPROVAL)
        if decision == "waiting":
            return False
        await self._take_back(request)
        return True

    async def _take_back(self, request: ApprovalRequest) -> None:
        """RUNNING again, conditional and fenced, before the granted call runs.

        ``job approve`` may have left the row PENDING (it did not see this process alive): if a worker has
        claimed it since, this write is fenced and the call never runs here.
        """
        s = self.booted.settings
        await self.booted.store.set_status(s.job_id, s.attempt, JobStatus.RUNNING, expect=HELD)
        self._granted.add((request.invocation_id, request.digest))
        self.booted.journal.append(
            "APPROVAL_GRANTED", tool=request.tool, step=request.step, invocation_id=request.invocation_id
        )
        log.info("%s approved", request.describe())

    def _refused(self, request: ApprovalRequest, state: ApprovalState | None) -> ApprovalRejected:
        rejection = state.rejection if state is not None else None
        if rejection is not None and request.names(rejection):
            why = f"rejected: {rejection.get('reason') or 'no reason given'}"
        else:
            why = f"the job is {state.status if state is not None else 'gone'}"
        self.rejection = ApprovalRejected(f"{request.describe()} refused, {why}")
        self.booted.journal.append(
            "APPROVAL_REJECTED", tool=request.tool, step=request.step, invocation_id=request.invocation_id
        )
        log.warning("%s", self.rejection)
        return self.rejection

    async def _wait(self, seconds: float) -> None:
        """Until the next poll, or the drain, whichever comes first."""
        event = self.drain.drain_event
        with anyio.move_on_after(seconds):
            if event is None:
                await anyio.sleep(seconds)
            else:
                await event.wait()
