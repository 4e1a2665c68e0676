"""Child jobs (``ctx.start_job``, ``ctx.wait_for_jobs``): fan work out to other jobs and wait for their ends.

``start_job`` is a journaled call with an invocation id, run like a side-effecting tool named
``agentlife.start_job``: its start is durable before the row is written, and its recorded result is the
`JobHandle`. The row is inserted if absent, keyed on the child's id (derived from the invocation id when
the step names none), so a process killed between the insert and the journal record creates the child
exactly once: the resumed call finds its own row and records the handle.

``wait_for_jobs`` is a durable wait (`durable_wait`, kind ``jobs``) whose check reads the children's rows: it
is over when every child has ended. A wait shorter than ``park_after_seconds`` polls in the process and
gives way to a drain; a longer one parks the job WAITING with the child ids in its ``waiting`` column, and
the store wakes it when the last child ends (see ``agentlife.stores._childjobs``). The outcomes, one per
handle, are recorded once: a resumed step gets the same list back.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agentlife._config import validate_job_id
from agentlife._exceptions import ChildJobError, ConfigError
from agentlife._jobrefs import JobHandle, JobOutcome, check_child_agent, check_child_payload, child_job_id
from agentlife._step._waits import TIMED_OUT, Check, _run_wait, sleep_seconds
from agentlife._tools import NOT_DONE, tool
from agentlife.stores._limits import validate_concurrency_key, validate_priority

if TYPE_CHECKING:
    from agentlife._step._context import StepContext
    from agentlife.stores._roles import JobStore

__all__ = ["MAX_CHILDREN_PER_WAIT", "ChildJobCalls", "start_job", "wait_for_jobs"]

#: The most jobs one ``wait_for_jobs`` may name: their ids are the parked row's ``waiting`` column.
MAX_CHILDREN_PER_WAIT = 1000
#: The name the starting call is journaled under.
START_TOOL = "agentlife.start_job"


class ChildJobCalls:
    """The child-job calls of `StepContext` (kept here so the context module stays one concern)."""

    async def start_job(
        self,
        agent_id: str,
        payload: Any = None,
        job_id: str | None = None,
        *,
        detached: bool = False,
        concurrency_key: str | None = None,
        priority: int = 0,
    ) -> JobHandle:
        """Start a child job of agent ``agent_id`` with ``payload``; returns its `JobHandle`.

        A journaled call: a resumed step gets the recorded handle back and no second job is created, even
        when the process died between creating the row and recording the call. Without ``job_id`` the
        child's id is ``{job_id}.{step}.{call}`` of this call. A ``detached`` child is not cancelled with
        this job. A worker of ``agent_id`` runs the child; nothing checks that one exists. The child's
        ``concurrency_key`` and ``priority`` (higher is claimed first, -1000 to 1000) are those of
        ``job create --concurrency-key KEY --priority N``.

        Raises:
            ConfigError: an agent id, job id, concurrency key or priority that is not allowed, or a payload
                that is not JSON.
            ChildJobError: ``job_id`` is the id of a job that this call did not start.
        """
        return await start_job(
            _ctx(self),
            agent_id,
            payload,
            job_id,
            detached=detached,
            concurrency_key=concurrency_key,
            priority=priority,
        )

    async def wait_for_jobs(
        self, handles: Sequence[JobHandle], timeout: float | None = None
    ) -> list[JobOutcome]:
        """Wait until every child job of ``handles`` has ended; their `JobOutcome`, in the same order.

        A durable wait like ``wait_for_event``: journaled, replayed, parked (WAITING) when it may last
        longer than ``park_after_seconds``, and woken when the last of the children ends. After
        ``timeout`` seconds it returns what it has: a child still running has its current status,
        ``result`` None and ``timed_out`` true.

        Raises:
            ConfigError: no handles, something that is not a `JobHandle`, or a timeout that is not a
                finite number of seconds.
            ChildJobError: a handle names a job that is not a child of this job.
        """
        return await wait_for_jobs(_ctx(self), handles, timeout)


def _ctx(calls: ChildJobCalls) -> StepContext:
    return calls  # type: ignore[return-value]  # mixed into StepContext only


async def start_job(
    ctx: StepContext,
    agent_id: object,
    payload: Any,
    job_id: object,
    *,
    detached: object = False,
    concurrency_key: object = None,
    priority: object = 0,
) -> JobHandle:
    """``ctx.start_job``: see `ChildJobCalls.start_job`."""
    key = validate_concurrency_key(concurrency_key, "ctx.start_job: concurrency_key")
    rank = validate_priority(priority, "ctx.start_job: priority")
    agent = check_child_agent(agent_id)
    check_child_payload(payload)
    if job_id is not None and not isinstance(job_id, str):
        raise ConfigError(f"ctx.start_job: job_id must be a string or None, got {type(job_id).__name__}")
    if job_id is not None:
        validate_job_id(job_id)
    if not isinstance(detached, bool):
        raise ConfigError(f"ctx.start_job: detached must be True or False, got {type(detached).__name__}")
    booted = ctx._env.approvals.booted
    store, parent, attempt = booted.store, booted.settings.job_id, booted.settings.attempt
    # The call number this start will get: the child's id is derived from it, the same on every attempt.
    child = job_id if job_id is not None else child_job_id(parent, ctx.step, ctx._calls.next)
    if child == parent:
        raise ChildJobError(f"ctx.start_job: job {parent} cannot be its own child")

    def handle(invocation_id: str) -> dict[str, Any]:
        return JobHandle(child, agent, detached, parent, invocation_id).to_json()

    async def create(invocation_id: str) -> dict[str, Any]:
        await store.start_child(
            parent,
            attempt,
            child,
            agent,
            payload,
            invocation_id=invocation_id,
            detached=detached,
            concurrency_key=key,
            priority=rank,
        )
        return handle(invocation_id)

    async def verify(invocation_id: str) -> Any:
        # Started before a crash: the row tells whether the insert happened (and was this call's).
        created = await _own_child(store, parent, child, invocation_id)
        return handle(invocation_id) if created else NOT_DONE

    spec = tool(name=START_TOOL, side_effects=True, verify=verify)(_start_call(create))
    args: dict[str, Any] = {"agent_id": agent, "payload": payload, "job_id": child, "detached": detached}
    # Only when given: a call journaled before keys existed keeps its digest, and replays.
    if key is not None:
        args["concurrency_key"] = key
    if rank:
        args["priority"] = rank
    recorded: Any = await ctx.call_tool(spec, **args)
    return JobHandle.from_json(recorded)


def _start_call(create: Any) -> Any:
    async def start(
        agent_id: str,
        payload: Any,
        job_id: str,
        detached: bool,
        invocation_id: str,
        concurrency_key: str | None = None,
        priority: int = 0,
    ) -> Any:
        """Create the child job's row (if absent) and return its handle."""
        return await create(invocation_id)

    return start


async def _own_child(store: JobStore, parent: str, child: str, invocation_id: str) -> bool:
    family = await store.get_family(child)
    return family is not None and family.parent_id == parent and family.spawned_by == invocation_id


async def wait_for_jobs(ctx: StepContext, handles: object, timeout: object) -> list[JobOutcome]:
    """``ctx.wait_for_jobs``: see `ChildJobCalls.wait_for_jobs`."""
    ids = _handle_ids(handles)
    seconds = None if timeout is None else sleep_seconds(timeout, "ctx.wait_for_jobs: timeout")
    booted = ctx._env.approvals.booted
    store, parent = booted.store, booted.settings.job_id
    replay = ctx._env.replay
    record = replay.waits.get(ctx._calls.next) if replay is not None else None
    if record is None or record.status != "completed":
        await store.child_outcomes(parent, ids)  # a stranger's job is refused before anything is journaled

    until = None if seconds is None else time.time() + seconds

    def checker(invocation_id: str) -> Check:
        async def check(deadline: float | None) -> tuple[bool, Any]:
            outcomes = await store.child_outcomes(parent, ids, ended_by=deadline)
            if all(o.finished for o in outcomes):
                return True, {"jobs": [o.to_json() for o in outcomes]}
            return False, None

        return check

    async def on_timeout(deadline: float | None) -> Any:
        outcomes = await store.child_outcomes(parent, ids, ended_by=deadline)
        return {**TIMED_OUT, "jobs": [_timed_out(o).to_json() for o in outcomes]}

    outcome = await _run_wait(
        ctx,
        "jobs",
        {"jobs": ids, "timeout": seconds},
        until,
        checker=checker,
        waiting_for={"jobs": ids},
        on_timeout=on_timeout,
    )
    recorded = outcome.get("jobs") if isinstance(outcome, dict) else None
    if not isinstance(recorded, list) or len(recorded) != len(ids):
        raise ConfigError(f"ctx.wait_for_jobs: the recorded outcome of this wait is not {len(ids)} jobs")
    return [JobOutcome.from_json(item) for item in recorded]


def _timed_out(outcome: JobOutcome) -> JobOutcome:
    if outcome.finished:
        return outcome
    return JobOutcome(outcome.job_id, outcome.status, None, None, timed_out=True)


def _handle_ids(handles: object) -> list[str]:
    """The job ids of ``handles``, else `ConfigError` in one line."""
    if isinstance(handles, JobHandle):
        raise ConfigError("ctx.wait_for_jobs: pass a list of handles, e.g. [handle]")
    if isinstance(handles, str | bytes) or not isinstance(handles, Sequence):
        raise ConfigError(
            f"ctx.wait_for_jobs: handles must be a list of JobHandle, got {type(handles).__name__}"
        )
    if not handles:
        raise ConfigError("ctx.wait_for_jobs: no handles to wait for (start a child job first)")
    if len(handles) > MAX_CHILDREN_PER_WAIT:
        raise ConfigError(f"ctx.wait_for_jobs: {len(handles)} handles, more than {MAX_CHILDREN_PER_WAIT}")
    ids: list[str] = []
    for item in handles:
        if not isinstance(item, JobHandle):
            raise ConfigError(f"ctx.wait_for_jobs: expected JobHandle, got {type(item).__name__}")
        ids.append(item.job_id)
    return ids
