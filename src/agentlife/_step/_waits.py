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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from agentlife._exceptions import ConfigError, WaitParked
from agentlife._replay import tool_call_digest
from agentlife.constants import MAX_ENV_SECONDS

if TYPE_CHECKING:
    from agentlife._journal._recovery import ReplayMap
    from agentlife._journal._writer import Journal
    from agentlife._step._host import StepHost

__all__ = ["MAX_WAIT_SECONDS", "WaitCall", "durable_wait", "sleep_seconds", "until_time"]

log = logging.getLogger("agentlife.waits")

#: The longest wait a step may ask for (about 31 years): past it, timers and the stores' times overflow.
MAX_WAIT_SECONDS: float = MAX_ENV_SECONDS


def sleep_seconds(seconds: object) -> float:
    """``seconds`` as a float when it is a valid sleep, else `ConfigError` saying what is wrong."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ConfigError(f"ctx.sleep: seconds must be a number, got {type(seconds).__name__}")
    value = float(seconds)
    if not math.isfinite(value) or value < 0 or value > MAX_WAIT_SECONDS:
        raise ConfigError(
            f"ctx.sleep: seconds must be a finite number from 0 to {MAX_WAIT_SECONDS:g}, got {seconds!r}"
        )
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


async def durable_wait(
    wait: WaitCall,
    until: float,
    *,
    host: StepHost,
    journal: Journal,
    replay: ReplayMap | None,
    on_mismatch: Any,
) -> None:
    """Wait until ``until`` (unix time) as a journaled call; see the module docstring.

    ``on_mismatch(call, recorded, current)`` handles a journal that recorded another wait (or another kind
    of call) at this call number: it raises, or voids the record and returns.

    Raises:
        WaitParked: the wait ends the step (too long to wait here, or a drain began).
    """
    record = replay.waits.get(wait.call) if replay is not None else None
    if record is not None and record.digest not in (None, wait.digest):
        on_mismatch(
            wait.call, f"wait {record.kind or '?'} ({record.digest})", f"wait {wait.kind} ({wait.digest})"
        )
        record = None
    if record is not None and record.status == "completed":
        log.info("%s (%s) replayed from the journal", wait.kind, wait.invocation_id)
        return
    if record is not None and record.until is not None:
        until = record.until  # started by an earlier attempt: only what is left of it
    else:
        await journal.append_durable("WAIT_STARTED", **_fields(wait), until=until)
    remaining = until - time.time()
    waiting_for = {"kind": wait.kind, "until": until, "invocation_id": wait.invocation_id}
    if remaining > host.constants.budget.park_after_seconds:
        log.info(
            "%s (%s): %.0f s left, longer than park_after: parking", wait.kind, wait.invocation_id, remaining
        )
        raise WaitParked(until, waiting_for)
    if remaining > 0:
        await _wait_here(host, remaining)
        if host.draining:
            raise WaitParked(until, waiting_for, drained=True)
    await journal.append_durable("WAIT_COMPLETED", **_fields(wait), outcome=None)


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


def _fields(wait: WaitCall) -> dict[str, Any]:
    return {
        "step": wait.step,
        "call": wait.call,
        "invocation_id": wait.invocation_id,
        "kind": wait.kind,
        "digest": wait.digest,
    }
