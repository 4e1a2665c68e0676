"""Durable waits (``ctx.sleep``, ``ctx.sleep_until``): journaled calls that free the process while they wait.

A wait is a call of the step with an invocation id, like a tool call. Its start is journaled durably
(``WAIT_STARTED``) with the wall-clock time it ends, before any waiting; its outcome (``WAIT_COMPLETED``)
once it is over. A resumed step that reaches the same call gets the recorded outcome back, or, when the wait
had started and not ended, waits only for what is left of it.

A wait shorter than `BudgetConstants.park_after_seconds` stays in the process and gives way to a drain at
once: the step ends at the wait (`WaitParked`, drained) and the next attempt waits for the rest. A longer
one ends the step at the wait without waiting: the runtime writes the park checkpoint, sets the row
WAITING with ``not_before`` at the wait's end and exits 0 (``run``) or frees the worker slot; a worker
claims the row once it is due, and the step replays to the wait, which then returns.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from agentlife._exceptions import ConfigError, WaitParked
from agentlife._replay import tool_call_digest
from agentlife.constants import MAX_ENV_SECONDS
from agentlife.stores._events import check_event_name

if TYPE_CHECKING:
    from agentlife._journal._recovery import ReplayMap
    from agentlife._journal._steprecords import StepJournal
    from agentlife._step._context import StepContext
    from agentlife._step._host import StepHost

__all__ = [
    "MAX_WAIT_SECONDS",
    "TIMED_OUT",
    "Check",
    "WaitCall",
    "durable_wait",
    "sleep",
    "sleep_seconds",
    "sleep_until",
    "until_time",
    "wait_for_event",
]

log = logging.getLogger("agentlife.waits")

#: The longest wait a step may ask for (about 31 years): past it, timers and the stores' times overflow.
MAX_WAIT_SECONDS: float = MAX_ENV_SECONDS


def sleep_seconds(seconds: object, what: str = "ctx.sleep: seconds") -> float:
    """``seconds`` as a float when it is a valid duration, else `ConfigError` saying what is wrong."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ConfigError(f"{what} must be a number, got {type(seconds).__name__}")
    value = float(seconds)
    if not math.isfinite(value) or value < 0 or value > MAX_WAIT_SECONDS:
        raise ConfigError(f"{what} must be a finite number from 0 to {MAX_WAIT_SECONDS:g}, got {seconds!r}")
    return value


def until_time(when: object) -> float:
    """The unix time of ``when`` (an aware datetime), else `ConfigError` saying what is wrong."""
    if not isinstance(when, dt.datetime):
        raise ConfigError(f"ctx.sleep_until: when must be a datetime, got {type(when).__name__}")
    if when.tzinfo is None or when.utcoffset() is None:
        raise ConfigError(f"ctx.sleep_until: when must be timezone-aware, got naive {when.isoformat()}")
    until = when.timestamp()
    if until - time.time() > MAX_WAIT_SECONDS:
        raise ConfigError(f"ctx.sleep_until: {when.isoformat()} is more than {MAX_WAIT_SECONDS:g} s away")
    return until


@dataclass(frozen=True, slots=True)
class WaitCall:
    """One wait of a step: where it is (step, call number, invocation id) and what it waits for."""

    step: int
    call: int
    invocation_id: str
    kind: str
    #: What identifies the wait for replay: the asked duration (``sleep``) or time (``sleep_until``).
    spec: dict[str, Any]

    @property
    def digest(self) -> str:
        """The digest replay compares: the same wait at the same call returns its recorded outcome."""
        return tool_call_digest(f"agentlife.{self.kind}", self.spec)


#: A short event wait looks at the store this long after it starts, then at doubling intervals up to
#: `CHECK_MAX_SECONDS`: an answer sent soon after is seen at once, and a wait of half a minute costs
#: about thirty reads of one indexed row.
CHECK_FIRST_SECONDS = 0.05
CHECK_MAX_SECONDS = 1.0

#: What a wait asks the store each time it looks, given its deadline (unix time, None: no end): (over,
#: outcome); None for a plain timer. What happened after the deadline does not end the wait: a wait is
#: decided by what came first, not by when its step happened to look.
Check = Callable[[float | None], Awaitable[tuple[bool, Any]]]
#: The outcome a wait records when its timeout came first.
TIMED_OUT: dict[str, Any] = {"timed_out": True}


async def durable_wait(
    wait: WaitCall,
    until: float | None,
    *,
    host: StepHost,
    journal: StepJournal,
    replay: ReplayMap | None,
    on_mismatch: Callable[[int, str, str], None],
    check: Check | None = None,
    waiting_for: dict[str, Any] | None = None,
    on_timeout: Callable[[float | None], Awaitable[Any]] | None = None,
) -> Any:
    """Wait until ``check`` says the wait is over or ``until`` (unix time; None: no end) as a journaled call.

    Returns the outcome: ``check``'s, `TIMED_OUT` when ``until`` came first (or what ``on_timeout``
    returns then), None for a plain timer.
    ``on_mismatch(call, recorded, current)`` handles a journal that recorded another wait at this call
    number: it raises, or voids the record and returns. See the module docstring.

    Raises:
        WaitParked: the wait ends the step (too long to wait here, or a drain began).
    """
    record = replay.waits.get(wait.call) if replay is not None else None
    other = replay.recorded_other(wait.call, "wait") if replay is not None and record is None else None
    if other is not None:
        on_mismatch(wait.call, other, f"wait {wait.kind} ({wait.digest})")
    if record is not None and record.digest not in (None, wait.digest):
        on_mismatch(
            wait.call, f"wait {record.kind or '?'} ({record.digest})", f"wait {wait.kind} ({wait.digest})"
        )
        record = None
    if record is not None and record.status == "completed":
        log.info("%s (%s) replayed from the journal", wait.kind, wait.invocation_id)
        return record.outcome
    if record is not None and (record.until is not None or check is not None):
        until = record.until  # started by an earlier attempt: only what is left of it
    else:
        await journal.append_durable("WAIT_STARTED", **_fields(wait), until=until)
    what = {"kind": wait.kind, "until": until, "invocation_id": wait.invocation_id, **(waiting_for or {})}
    poll = CHECK_FIRST_SECONDS
    while True:
        over, outcome = await check(until) if check is not None else (False, None)
        left = math.inf if until is None else until - time.time()
        if not over and left <= 0:
            over, outcome = True, (None if check is None else TIMED_OUT)
            if on_timeout is not None:
                outcome = await on_timeout(until)
        if over:
            # In the store too before the step goes on: an attempt on any pod returns this very outcome (a
            # timed-out wait's view of its children is of this moment, and is not decided again).
            await journal.append_durable("WAIT_COMPLETED", **_fields(wait), outcome=outcome)
            return outcome
        if left > host.constants.budget.park_after_seconds:
            log.info("%s (%s): longer than park_after, parking", wait.kind, wait.invocation_id)
            raise WaitParked(time.time() + MAX_WAIT_SECONDS if until is None else until, what)
        await _wait_here(host, min(left, poll) if check is not None else left)
        poll = min(poll * 2, CHECK_MAX_SECONDS, host.constants.budget.approval_poll_seconds)
        if host.draining:
            raise WaitParked(time.time() + MAX_WAIT_SECONDS if until is None else until, what, drained=True)


async def _wait_here(host: StepHost, seconds: float) -> None:
    """Until the wait ends, or a drain begins, whichever comes first."""
    if host.draining:
        return
    event = host.drain_event
    with anyio.move_on_after(seconds):
        if event is None:
            await anyio.sleep(seconds)
        else:
            await event.wait()


async def sleep(ctx: StepContext, seconds: object) -> None:
    """``ctx.sleep``: see `StepContext.sleep`."""
    value = sleep_seconds(seconds)
    await _run_wait(ctx, "sleep", {"seconds": value}, time.time() + value)


async def sleep_until(ctx: StepContext, when: object) -> None:
    """``ctx.sleep_until``: see `StepContext.sleep_until`."""
    until = until_time(when)
    await _run_wait(ctx, "sleep_until", {"until": until}, until)


async def wait_for_event(ctx: StepContext, name: object, timeout: object) -> Any:
    """``ctx.wait_for_event``: see `StepContext.wait_for_event`."""
    check_event_name(name)
    assert isinstance(name, str)
    seconds = None if timeout is None else sleep_seconds(timeout, "ctx.wait_for_event: timeout")
    booted = ctx._env.approvals.booted
    store, job_id, attempt = booted.store, booted.settings.job_id, booted.settings.attempt

    def taker(invocation_id: str) -> Check:
        async def take(deadline: float | None) -> tuple[bool, Any]:
            taken = await store.take_event(job_id, attempt, [name], invocation_id, sent_by=deadline)
            return (False, None) if taken is None else (True, {"event": taken[0], "payload": taken[1]})

        return take

    outcome = await _run_wait(
        ctx,
        "event",
        {"name": name, "timeout": seconds},
        None if seconds is None else time.time() + seconds,
        checker=taker,
        waiting_for={"events": [name]},
    )
    return outcome.get("payload") if isinstance(outcome, dict) else None


async def _run_wait(
    ctx: StepContext,
    kind: str,
    spec: dict[str, Any],
    until: float | None,
    *,
    checker: Callable[[str], Check] | None = None,
    waiting_for: dict[str, Any] | None = None,
    on_timeout: Callable[[float | None], Awaitable[Any]] | None = None,
) -> Any:
    """One wait of the step: its call number and invocation id, then `durable_wait`."""
    env = ctx._env
    env.approvals.check()  # after a refusal nothing of the job runs
    call = ctx._claim_call()
    wait = WaitCall(ctx.step, call, ctx._invocation_id(call), kind, spec)
    ctx._calls.current = wait.invocation_id
    try:
        return await durable_wait(
            wait,
            until,
            host=env.host,
            journal=env.journal,
            replay=env.replay,
            on_mismatch=ctx._replay_mismatch,
            check=None if checker is None else checker(wait.invocation_id),
            waiting_for=waiting_for,
            on_timeout=on_timeout,
        )
    finally:
        ctx._calls.current = None


def _fields(wait: WaitCall) -> dict[str, Any]:
    return {
        "step": wait.step,
        "call": wait.call,
        "invocation_id": wait.invocation_id,
        "kind": wait.kind,
        "digest": wait.digest,
    }
