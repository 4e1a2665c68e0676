"""Delivery at most once per channel, and housekeeping that never masks it.

`DeliveryGuard` wraps an agent's ``deliver(result)``: it runs only when the store's delivery registry has no
``delivery:{job_id}:{channel}`` key, is retried on failure (3 attempts, 5 s then 10 s apart), and records the
key once it succeeded — so a retried job re-announces only what was never recorded as delivered.
`run_housekeeping` runs every housekeeping function even when an earlier one fails, and hands the errors back
instead of raising them. The registry's two operations, `is_delivered` and `record_delivery`, are the
store's (`JobStore`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

import anyio

from agentlife._exceptions import ConfigError, PermanentError, StoreUnavailable

if TYPE_CHECKING:
    from agentlife.stores._dialect import Tx
    from agentlife.stores._roles import JobStore

__all__ = ["DeliveryGuard", "delivery_key", "is_delivered", "record_delivery", "run_housekeeping"]

_log = logging.getLogger("agentlife.delivery")

Sleep = Callable[[float], Awaitable[object]]


async def is_delivered(tx: Tx, key: str) -> bool:
    """Whether the delivery registry holds ``key``."""
    return await tx.fetchval(tx.sql.is_delivered, key=key) is not None


async def record_delivery(tx: Tx, key: str, job_id: str, channel: str) -> None:
    """Record ``key`` as delivered (a key already there is left as it is)."""
    await tx.execute(tx.sql.record_delivery, key=key, job_id=job_id, channel=channel)


def delivery_key(job_id: str, channel: str) -> str:
    """The registry key of one job's delivery on one channel: ``delivery:{job_id}:{channel}``."""
    return f"delivery:{job_id}:{channel}"


class DeliveryGuard:
    """Delivers a job's result on one channel at most once, as far as the registry knows.

    Args:
        store: the open store whose delivery registry records what was delivered.
        job_id: the job.
        channel: where the result goes ("slack", "email", "pr-comment" ...); one key per channel.
        attempts: how many times ``fn`` is tried before its last error is raised.
        initial: seconds before the first retry.
        multiplier: each further retry waits this many times longer.
        sleep: the sleep to use (tests pass a recording one).

    The guarantee is at-least-once with deduplication: an effect that happened but whose key could not be
    recorded (the process died in between) is announced again by the next attempt. ``fn`` may make that
    harmless by passing `key` to the receiving system as an idempotency key.
    """

    def __init__(
        self,
        store: JobStore,
        job_id: str,
        channel: str,
        *,
        attempts: int = 3,
        initial: float = 5.0,
        multiplier: float = 2.0,
        sleep: Sleep = anyio.sleep,
    ) -> None:
        if attempts < 1 or initial < 0 or multiplier < 1:
            raise ConfigError(
                f"DeliveryGuard needs attempts >= 1, initial >= 0 and multiplier >= 1, got {attempts}, "
                f"{initial:g} and {multiplier:g}"
            )
        self.store = store
        self.job_id = job_id
        self.channel = channel
        self.key = delivery_key(job_id, channel)
        self._attempts = attempts
        self._initial = initial
        self._multiplier = multiplier
        self._sleep = sleep

    async def deliver(self, fn: Callable[[], Awaitable[object]]) -> bool:
        """Run ``fn`` unless this key was delivered before; True if it ran (and is now recorded).

        Errors are retried with backoff, except cancellation (never retried, never swallowed) and
        `PermanentError` (retrying cannot help). Once ``fn`` succeeded, recording the key is retried on
        `StoreUnavailable` with the same backoff.

        Raises:
            Exception: the last error of ``fn`` when every attempt failed; nothing is recorded then.
            StoreUnavailable: the registry could not be read, or the key could not be recorded.
        """
        if await self.store.is_delivered(self.key):
            _log.info("%s already delivered: skipped", self.key)
            return False
        await self._with_retries(fn, "delivery", retry_on=Exception)
        await self._with_retries(
            lambda: self.store.record_delivery(self.key, self.job_id, self.channel),
            "recording the delivery",
            retry_on=StoreUnavailable,
        )
        _log.info("%s delivered", self.key)
        return True

    async def _with_retries(
        self, fn: Callable[[], Awaitable[object]], what: str, *, retry_on: type[Exception]
    ) -> None:
        delay = self._initial
        for attempt in range(1, self._attempts + 1):
            try:
                await fn()
            except PermanentError:
                raise
            except retry_on as exc:
                if attempt == self._attempts:
                    _log.error(
                        "%s: %s failed %s times, giving up: %s", self.key, what, attempt, _describe(exc)
                    )
                    raise
                _log.warning(
                    "%s: %s failed (attempt %s/%s), retrying in %g s: %s",
                    self.key,
                    what,
                    attempt,
                    self._attempts,
                    delay,
                    _describe(exc),
                )
                await self._sleep(delay)
                delay *= self._multiplier
            else:
                return


async def run_housekeeping(fns: Iterable[Callable[[], Awaitable[object]]]) -> list[BaseException]:
    """Run every function in order, whatever the others did; return their errors (all-settled).

    Errors are logged and returned, never raised, so housekeeping can never mask a delivery. Cancellation
    (a drain deadline) still propagates at once and the remaining functions do not run: housekeeping is
    interruptible by design.
    """
    errors: list[BaseException] = []
    for fn in fns:
        try:
            await fn()
        except Exception as exc:  # cancellation is a BaseException and passes through
            _log.warning("housekeeping %s failed: %s", _name(fn), _describe(exc), exc_info=exc)
            errors.append(exc)
    return errors


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _name(fn: object) -> str:
    return str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn))
