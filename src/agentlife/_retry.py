"""Error classes and retries with full-jitter backoff inside a deadline.

`classify` sorts any exception into an `ErrorClass`; only ``TRANSIENT`` and ``TIMEOUT`` are worth
another attempt. `retry_call` retries those with full-jitter exponential backoff (1 s -> 30 s by default),
honours a server's ``retry_after`` as a lower bound, and never schedules an attempt past its deadline: when
the next attempt would start at or after it, the last error is re-raised at once instead of sleeping into
a budget that is already spent. Every retry is described by a `RetryEvent`, which the runtime journals
and logs as the step's retry trace.
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio

from agentlife._exceptions import (
    AgentlifeError,
    CallError,
    ConfigError,
    LLMConfigurationError,
    PermanentError,
    TransientError,
)
from agentlife.constants import RetryConstants

__all__ = [
    "ErrorClass",
    "RetryEvent",
    "classify",
    "classify_status",
    "error_for_http_status",
    "full_jitter_backoff",
    "retry_after_of",
    "retry_call",
]

T = TypeVar("T")

# Exception class names of common HTTP clients, matched anywhere in the MRO so that classifying never
# imports httpx, aiohttp or an SDK.
_TIMEOUT_NAMES = frozenset({"TimeoutException", "APITimeoutError", "ServerTimeoutError"})
_TRANSIENT_NAMES = frozenset(
    {
        "TransportError",  # httpx: connect / read / write / protocol errors
        "NetworkError",
        "RemoteProtocolError",
        "ClientConnectionError",  # aiohttp
        "ClientPayloadError",
        "ServerDisconnectedError",
        "APIConnectionError",  # anthropic, openai
    }
)
#: The defaults of the backoff: `RetryConstants`'.
_RETRY = RetryConstants()
# An exponent past this cannot change min(cap, initial * 2**n) and would overflow a float.
_MAX_EXPONENT = 64


class ErrorClass(enum.Enum):
    """How a failed call should be treated."""

    TRANSIENT = "transient"
    """Rate limits, overload, 5xx, dropped connections: retry with backoff."""
    TIMEOUT = "timeout"
    """The call made no progress in time (`LLMTimeout`, `ToolTimeout`, `TimeoutError`): retry."""
    PERMANENT = "permanent"
    """The request itself is wrong (HTTP 400, a tool's refusal): retrying cannot help."""
    CONFIGURATION = "configuration"
    """Missing or refused credentials (HTTP 401/403): fix the configuration, do not retry."""

    @property
    def retryable(self) -> bool:
        """Whether `retry_call` tries again after an error of this class."""
        return self in (ErrorClass.TRANSIENT, ErrorClass.TIMEOUT)


def classify_status(status: int) -> ErrorClass:
    """The class of an HTTP error status: 401/403 configuration, 408/409/425/429/5xx transient."""
    if status in (401, 403):
        return ErrorClass.CONFIGURATION
    if status in (408, 409, 425, 429) or status >= 500:
        return ErrorClass.TRANSIENT
    return ErrorClass.PERMANENT


def error_for_http_status(
    status: int,
    *,
    api: str,
    key_variable: str,
    error_type: str | None = None,
    message: str | None = None,
    retry_after: float | None = None,
) -> CallError:
    """The agentlife error for an HTTP error status of a model API, by `classify_status`.

    ``api`` names the API in the message (``"Anthropic API"``); ``key_variable`` is the variable a 401/403
    points at. The returned exception carries ``status_code``, like the SDKs' own errors, so `classify` and
    callers can branch on the status.
    """
    detail = f"{api} error {status}"
    if error_type:
        detail += f" {error_type}"
    if message:
        detail += f": {message}"
    error_class = classify_status(status)
    error: CallError
    if error_class is ErrorClass.CONFIGURATION:
        error = LLMConfigurationError(f"{detail} (check {key_variable} and its permissions)")
    elif error_class is ErrorClass.TRANSIENT:
        error = TransientError(detail, retry_after=retry_after)
    else:
        error = PermanentError(detail)
    setattr(error, "status_code", status)  # noqa: B010
    return error


def classify(exc: BaseException) -> ErrorClass:
    """Sort ``exc`` into an `ErrorClass`.

    agentlife's own errors decide by type (`LLMTimeout` and every `TimeoutError` are ``TIMEOUT``,
    `TransientError` ``TRANSIENT``, `LLMConfigurationError` and `ConfigError` ``CONFIGURATION``).
    Builtin `ConnectionError`, connection errors of httpx, aiohttp and the model SDKs (by class name, no
    import) are ``TRANSIENT``; an exception carrying an HTTP ``status_code`` (or ``status``) is classified
    by `classify_status`; an exception group by its worst member; anything else is ``PERMANENT``.
    """
    if isinstance(exc, BaseExceptionGroup):
        return _classify_group(exc)
    if isinstance(exc, TimeoutError):
        return ErrorClass.TIMEOUT
    if isinstance(exc, TransientError):
        return ErrorClass.TRANSIENT
    if isinstance(exc, (LLMConfigurationError, ConfigError)):
        return ErrorClass.CONFIGURATION
    if isinstance(exc, (PermanentError, AgentlifeError)):
        return ErrorClass.PERMANENT
    if isinstance(exc, ConnectionError):
        return ErrorClass.TRANSIENT
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & _TIMEOUT_NAMES:
        return ErrorClass.TIMEOUT
    status = _http_status(exc)
    if status is not None:
        return classify_status(status)
    if names & _TRANSIENT_NAMES:
        return ErrorClass.TRANSIENT
    return ErrorClass.PERMANENT


def _classify_group(group: BaseExceptionGroup[Any]) -> ErrorClass:
    classes = {classify(exc) for exc in group.exceptions}
    for worst in (ErrorClass.CONFIGURATION, ErrorClass.PERMANENT, ErrorClass.TRANSIENT):
        if worst in classes:
            return worst
    return ErrorClass.TIMEOUT


def _http_status(exc: BaseException) -> int | None:
    for name in ("status_code", "status"):
        value = getattr(exc, name, None)
        if isinstance(value, int) and 100 <= value <= 599:
            return value
    return None


def retry_after_of(exc: BaseException) -> float | None:
    """The seconds ``exc`` says to wait (its ``retry_after`` attribute), when it says so."""
    value = getattr(exc, "retry_after", None)
    if isinstance(value, (int, float)) and math.isfinite(value) and value >= 0:
        return float(value)
    return None


def full_jitter_backoff(
    attempt: int,
    initial: float = _RETRY.transient_initial_seconds,
    cap: float = _RETRY.transient_max_seconds,
    rng: random.Random | None = None,
) -> float:
    """The delay before retry number ``attempt`` (1 = after the first failure), "full jitter" style.

    Uniform in ``[0, min(cap, initial * 2 ** (attempt - 1))]``: exponential growth spreads load away
    from an overloaded server, and the full jitter keeps many clients that failed together from coming
    back together.

    Raises:
        ValueError: ``attempt`` < 1 or a negative ``initial`` / ``cap``.
    """
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    if initial < 0 or cap < 0:
        raise ValueError(f"initial and cap must be >= 0, got {initial} and {cap}")
    ceiling = min(cap, initial * 2.0 ** min(attempt - 1, _MAX_EXPONENT))
    return (rng or random).uniform(0.0, ceiling)


@dataclass(frozen=True, slots=True)
class RetryEvent:
    """One scheduled retry, as journaled and logged.

    Attributes:
        attempt: the attempt that failed (1 = the first call).
        delay: seconds until the next attempt.
        error_class: the `ErrorClass` value of the failure (``"transient"`` or ``"timeout"``).
        error_type: the exception's class name (``"LLMTimeout"``, ``"TransientError"`` ...).
        message: the exception's message.
        remaining_budget: what was left of the deadline when the retry was scheduled (None: no deadline).
        retry_after: the wait the server asked for, when it did.
    """

    attempt: int
    delay: float
    error_class: str
    error_type: str
    message: str
    remaining_budget: float | None = None
    retry_after: float | None = None

    def to_json(self) -> dict[str, Any]:
        """A plain dict for the journal and the log line."""
        return {
            "attempt": self.attempt,
            "delay": round(self.delay, 6),
            "error_class": self.error_class,
            "error_type": self.error_type,
            "message": self.message,
            "remaining_budget": None if self.remaining_budget is None else round(self.remaining_budget, 6),
            "retry_after": self.retry_after,
        }


async def retry_call(
    fn: Callable[[], Awaitable[T]],
    *,
    initial: float = _RETRY.transient_initial_seconds,
    cap: float = _RETRY.transient_max_seconds,
    deadline: float | None = None,
    rng: random.Random | None = None,
    on_retry: Callable[[RetryEvent], None] | None = None,
    max_attempts: int | None = None,
    classify_error: Callable[[BaseException], ErrorClass] = classify,
    waited: Callable[[], float] | None = None,
) -> T:
    """Await ``fn()`` until it succeeds, retrying transient errors and timeouts within ``deadline``.

    Args:
        fn: makes one attempt; called anew for each (a coroutine cannot be awaited twice).
        initial: the backoff ceiling of the first retry, in seconds.
        cap: the largest backoff ceiling, in seconds.
        deadline: an `anyio.current_time` instant; no attempt is scheduled to start at or after it.
        rng: the jitter source (seed it for reproducible tests).
        on_retry: called with a `RetryEvent` before each backoff sleep (journal, log, metrics).
        max_attempts: the most attempts in all, including the first (None: only the deadline limits).
        classify_error: how to classify failures (default `classify`).
        waited: seconds ``fn`` spent waiting for capacity (a rate limit) so far, which the deadline does
            not count: waiting for one's turn spends no retry allowance.

    Returns:
        What the first successful attempt returned.

    Raises:
        Exception: the last error, unchanged, when it is not retryable, when ``max_attempts`` is reached,
            or when the next attempt would start past ``deadline``. Cancellation is never caught.
    """
    if max_attempts is not None and max_attempts < 1:
        raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
    rng = rng or random.Random()
    attempt = 0
    while True:
        attempt += 1
        try:
            return await fn()
        except Exception as exc:
            until = deadline if deadline is None or waited is None else deadline + waited()
            delay = _next_delay(exc, attempt, initial, cap, until, rng, max_attempts, classify_error)
            if delay is None:
                raise
            if on_retry is not None:
                on_retry(_event(exc, attempt, delay, until, classify_error))
        await anyio.sleep(delay)


def _next_delay(
    exc: Exception,
    attempt: int,
    initial: float,
    cap: float,
    deadline: float | None,
    rng: random.Random,
    max_attempts: int | None,
    classify_error: Callable[[BaseException], ErrorClass],
) -> float | None:
    """The backoff before the next attempt, or None when there must be no next attempt."""
    if not classify_error(exc).retryable:
        return None
    if max_attempts is not None and attempt >= max_attempts:
        return None
    delay = full_jitter_backoff(attempt, initial, cap, rng)
    retry_after = retry_after_of(exc)
    if retry_after is not None:
        delay = max(delay, retry_after)
    if deadline is not None and anyio.current_time() + delay >= deadline:
        return None
    return delay


def _event(
    exc: Exception,
    attempt: int,
    delay: float,
    deadline: float | None,
    classify_error: Callable[[BaseException], ErrorClass],
) -> RetryEvent:
    remaining = None if deadline is None else max(0.0, deadline - anyio.current_time())
    return RetryEvent(
        attempt=attempt,
        delay=delay,
        error_class=classify_error(exc).value,
        error_type=type(exc).__name__,
        message=str(exc),
        remaining_budget=remaining,
        retry_after=retry_after_of(exc),
    )
