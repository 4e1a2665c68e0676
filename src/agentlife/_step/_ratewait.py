"""A model call under fleet-wide rate limits: capacity first, waiting for it as a wait, never as a retry.

`limited_attempt` wraps one attempt of a call: it takes capacity from the process's `RateLimiter`
(waiting when the fleet has none: `CapacityWait`), makes the call, settles what the reply used, and tells
the fleet what the provider's headers said. A 429 (or a 529 with ``retry-after``) pauses the bucket for
every process and the call waits its turn again: not a retry, so it spends neither the retry allowance nor
the step's retry deadline (the waits are added back to it, `CapacityWait.waited`); only after
`MAX_RATE_LIMITED` such answers in a row does the 429 go to the ordinary retries.

A wait gives way to a drain at once (the step ends at the call, ``WaitParked(drained=True)``: exit 143,
the next attempt makes the call afresh), and waits longer than ``park_after_seconds`` in all park the job
like a durable sleep: WAITING until the capacity is expected, its slot free. The stream guard's timers do
not run while waiting: they start with the adapter's request, after the capacity was granted.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from agentlife._exceptions import WaitParked
from agentlife._llm._ratelimit_headers import RESPONSE_SEEN
from agentlife._retry import retry_after_of
from agentlife._step._waits import _wait_here

if TYPE_CHECKING:
    from agentlife._llm._protocol import LLMReply
    from agentlife._llm._ratelimiter import RateLimiter
    from agentlife._step._host import StepHost

__all__ = ["MAX_RATE_LIMITED", "CapacityWait", "limited_attempt"]

log = logging.getLogger("agentlife.ratelimit")

#: Rate-limit answers in a row one call waits out before the next counts as an ordinary retry.
MAX_RATE_LIMITED = 8


class CapacityWait:
    """How one call waits for capacity: in the process, parked, or drained; the seconds it waited."""

    def __init__(self, host: StepHost, invocation_id: str) -> None:
        self._host, self._invocation_id = host, invocation_id
        self.waited = 0.0

    def seconds_waited(self) -> float:
        """Seconds this call spent waiting for capacity: added back to its retry deadline."""
        return self.waited

    async def __call__(self, bucket: str, reason: str, seconds: float) -> None:
        """Wait ``seconds`` for ``bucket``; raises `WaitParked` to park the job or give way to a drain."""
        host = self._host
        what: dict[str, Any] = {
            "kind": "rate_limit",
            "bucket": bucket,
            "reason": reason,
            "invocation_id": self._invocation_id,
        }
        if host.draining:
            raise WaitParked(time.time() + seconds, what, drained=True)
        if self.waited + seconds > host.constants.budget.park_after_seconds:
            log.info(
                "%s waits %.1f s for rate limit %s (%s): parking",
                self._invocation_id,
                seconds,
                bucket,
                reason,
            )
            raise WaitParked(time.time() + seconds, what)
        host.notify("rate_limit_wait", bucket=bucket, reason=reason, seconds=seconds)
        began = time.monotonic()
        try:
            await _wait_here(host, seconds)
        finally:
            self.waited += time.monotonic() - began
            host.notify("rate_limit_waited", bucket=bucket)
        if host.draining:
            raise WaitParked(time.time(), what, drained=True)


def limited_attempt(
    limiter: RateLimiter,
    attempt: Callable[[], Awaitable[LLMReply]],
    *,
    model: str,
    estimate: int,
    wait: CapacityWait,
) -> Callable[[], Awaitable[LLMReply]]:
    """``attempt`` made under the limiter; see the module."""

    async def run() -> LLMReply:
        rate_limited = 0
        while True:
            permit = await limiter.acquire(model, estimate, wait)
            seen: dict[str, Any] = {}
            token = RESPONSE_SEEN.set(functools.partial(_record, seen))
            try:
                reply = await attempt()
            except Exception as exc:
                status = getattr(exc, "status_code", None)
                limited = status == 429 or (status == 529 and retry_after_of(exc) is not None)
                await limiter.release(permit, None, refund=limited)
                if await limiter.learn(permit, status, seen.get("headers"), retry_after_of(exc)):
                    rate_limited += 1
                    if rate_limited <= MAX_RATE_LIMITED:
                        log.info("%s: rate limited (%s); waiting for the fleet's capacity", model, status)
                        continue
                raise
            except BaseException:
                await limiter.release(permit, None)
                raise
            finally:
                RESPONSE_SEEN.reset(token)
            await limiter.release(permit, reply.usage)
            await limiter.learn(permit, seen.get("status", 200), seen.get("headers"), None)
            return reply

    return run


def _record(seen: dict[str, Any], status: int, headers: Mapping[str, str]) -> None:
    """What the adapter reported of the response: its status and headers."""
    seen["status"], seen["headers"] = status, headers
