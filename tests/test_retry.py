"""Error classes, full-jitter backoff and `retry_call` inside a deadline."""

from __future__ import annotations

import random
import time

import aiohttp
import anyio
import httpx
import orjson
import pytest

from agentlife import (
    BudgetExhausted,
    ConfigError,
    LLMConfigurationError,
    LLMTimeout,
    PermanentError,
    PolicyUnavailable,
    ToolTimeout,
    TransientError,
)
from agentlife._retry import (
    ErrorClass,
    RetryEvent,
    classify,
    classify_status,
    full_jitter_backoff,
    retry_after_of,
    retry_call,
)


class StatusError(Exception):
    def __init__(self, status_code: int) -> None:
        super().__init__(f"HTTP {status_code}")
        self.status_code = status_code


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (LLMTimeout("chunk", 60), ErrorClass.TIMEOUT),
        (ToolTimeout("git_clone", 300), ErrorClass.TIMEOUT),
        (TimeoutError(), ErrorClass.TIMEOUT),
        (TransientError("529 overloaded"), ErrorClass.TRANSIENT),
        (PolicyUnavailable("policy down"), ErrorClass.TRANSIENT),
        (ConnectionResetError(), ErrorClass.TRANSIENT),
        (PermanentError("400"), ErrorClass.PERMANENT),
        (BudgetExhausted("spent"), ErrorClass.PERMANENT),
        (LLMConfigurationError("no key"), ErrorClass.CONFIGURATION),
        (ConfigError("bad env"), ErrorClass.CONFIGURATION),
        (ValueError("bug"), ErrorClass.PERMANENT),
        (StatusError(429), ErrorClass.TRANSIENT),
        (StatusError(503), ErrorClass.TRANSIENT),
        (StatusError(400), ErrorClass.PERMANENT),
        (StatusError(403), ErrorClass.CONFIGURATION),
        (httpx.ConnectError("refused"), ErrorClass.TRANSIENT),
        (httpx.RemoteProtocolError("incomplete chunked read"), ErrorClass.TRANSIENT),
        (httpx.ReadTimeout("slow"), ErrorClass.TIMEOUT),
        (aiohttp.ServerDisconnectedError(), ErrorClass.TRANSIENT),
        (aiohttp.ClientPayloadError("truncated"), ErrorClass.TRANSIENT),
        (ExceptionGroup("two", [TransientError("a"), LLMTimeout("total", 1)]), ErrorClass.TRANSIENT),
        (ExceptionGroup("two", [LLMTimeout("chunk", 1), ValueError("b")]), ErrorClass.PERMANENT),
        (ExceptionGroup("one", [LLMTimeout("chunk", 1)]), ErrorClass.TIMEOUT),
    ],
    ids=repr,
)
def test_classify(exc: BaseException, expected: ErrorClass) -> None:
    assert classify(exc) is expected
    assert expected.retryable == (expected in (ErrorClass.TRANSIENT, ErrorClass.TIMEOUT))


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (400, "permanent"),
        (401, "configuration"),
        (403, "configuration"),
        (404, "permanent"),
        (408, "transient"),
        (422, "permanent"),
        (429, "transient"),
        (500, "transient"),
        (529, "transient"),
    ],
)
def test_classify_status(status: int, expected: str) -> None:
    assert classify_status(status).value == expected


def test_retry_after_of() -> None:
    assert retry_after_of(TransientError("x", retry_after=2.5)) == 2.5
    assert retry_after_of(TransientError("x")) is None
    assert retry_after_of(ValueError()) is None
    assert retry_after_of(TransientError("x", retry_after=float("nan"))) is None


@pytest.mark.parametrize("attempt", [1, 2, 3, 5, 8, 12])
def test_full_jitter_stays_within_its_bounds_and_uses_them(attempt: int) -> None:
    rng = random.Random(attempt)
    ceiling = min(30.0, 1.0 * 2 ** (attempt - 1))
    samples = [full_jitter_backoff(attempt, 1.0, 30.0, rng) for _ in range(2000)]
    assert all(0.0 <= s <= ceiling for s in samples)
    # Full jitter: spread over the whole range, not bunched at the top or bottom.
    assert max(samples) > 0.95 * ceiling
    assert min(samples) < 0.05 * ceiling
    assert 0.4 * ceiling < sum(samples) / len(samples) < 0.6 * ceiling


def test_full_jitter_is_reproducible_with_a_seed_and_survives_huge_attempts() -> None:
    first = [full_jitter_backoff(n, rng=random.Random(7)) for n in range(1, 6)]
    again = [full_jitter_backoff(n, rng=random.Random(7)) for n in range(1, 6)]
    assert first == again
    assert 0.0 <= full_jitter_backoff(10_000, 1.0, 30.0, random.Random(1)) <= 30.0
    with pytest.raises(ValueError, match="attempt"):
        full_jitter_backoff(0)
    with pytest.raises(ValueError, match="initial"):
        full_jitter_backoff(1, initial=-1)


class Flaky:
    """Fails with the given errors in turn, then returns ``"ok"``; records when each attempt started."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.started: list[float] = []

    async def __call__(self) -> str:
        self.started.append(anyio.current_time())
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


@pytest.mark.anyio
async def test_transient_errors_and_timeouts_are_retried_until_success() -> None:
    flaky = Flaky(TransientError("overloaded"), LLMTimeout("chunk", 0.1), TransientError("500"))
    events: list[RetryEvent] = []
    result = await retry_call(flaky, initial=0.01, cap=0.04, rng=random.Random(3), on_retry=events.append)
    assert result == "ok"
    assert len(flaky.started) == 4
    assert [e.attempt for e in events] == [1, 2, 3]
    assert [e.error_class for e in events] == ["transient", "timeout", "transient"]
    assert [e.error_type for e in events] == ["TransientError", "LLMTimeout", "TransientError"]
    for event, ceiling in zip(events, (0.01, 0.02, 0.04), strict=True):
        assert 0.0 <= event.delay <= ceiling
        assert event.remaining_budget is None
    for gap, event in zip(
        (b - a for a, b in zip(flaky.started, flaky.started[1:], strict=False)), events, strict=True
    ):
        assert gap >= event.delay - 0.002
    assert (
        orjson.loads(orjson.dumps(events[1].to_json()))["message"] == "LLM stream chunk timeout after 0.1 s"
    )


@pytest.mark.anyio
@pytest.mark.parametrize(
    "error", [PermanentError("400 bad request"), LLMConfigurationError("401"), KeyError("x")]
)
async def test_permanent_and_configuration_errors_are_not_retried(error: Exception) -> None:
    flaky = Flaky(error)
    events: list[RetryEvent] = []
    with pytest.raises(type(error)) as caught:
        await retry_call(flaky, initial=0.01, on_retry=events.append)
    assert caught.value is error
    assert len(flaky.started) == 1
    assert events == []


@pytest.mark.anyio
async def test_no_attempt_is_scheduled_past_the_deadline() -> None:
    errors = [TransientError(f"fail {i}") for i in range(100)]
    flaky = Flaky(*errors)
    events: list[RetryEvent] = []
    deadline = anyio.current_time() + 0.3
    with pytest.raises(TransientError) as caught:
        await retry_call(
            flaky, initial=0.05, cap=0.2, deadline=deadline, rng=random.Random(11), on_retry=events.append
        )
    ended = anyio.current_time()
    assert all(started < deadline for started in flaky.started)
    # The last error comes back at once, rather than after a sleep past the deadline.
    assert ended < deadline + 0.05
    assert caught.value is errors[len(flaky.started) - 1]
    for event in events:
        assert event.remaining_budget is not None
        assert event.delay < event.remaining_budget + 1e-6
    assert len(flaky.started) >= 2


@pytest.mark.anyio
async def test_retry_after_is_a_lower_bound() -> None:
    flaky = Flaky(TransientError("429", retry_after=0.15))
    events: list[RetryEvent] = []
    assert await retry_call(flaky, initial=0.001, cap=0.001, on_retry=events.append) == "ok"
    assert events[0].delay >= 0.15
    assert events[0].retry_after == 0.15
    assert flaky.started[1] - flaky.started[0] >= 0.15 - 0.002


@pytest.mark.anyio
async def test_a_retry_after_beyond_the_deadline_fails_at_once() -> None:
    error = TransientError("429", retry_after=30)
    flaky = Flaky(error)
    started = time.monotonic()
    with pytest.raises(TransientError) as caught:
        await retry_call(flaky, initial=0.01, deadline=anyio.current_time() + 10.0)
    assert caught.value is error
    assert time.monotonic() - started < 5.0  # at once: neither the 30 s asked for nor the 10 s deadline


@pytest.mark.anyio
async def test_max_attempts_counts_the_first_call() -> None:
    flaky = Flaky(*(TransientError(str(i)) for i in range(5)))
    with pytest.raises(TransientError, match=r"^2$"):
        await retry_call(flaky, initial=0.001, max_attempts=3)
    assert len(flaky.started) == 3
    with pytest.raises(ValueError, match="max_attempts"):
        await retry_call(flaky, max_attempts=0)


@pytest.mark.anyio
async def test_cancellation_during_backoff_is_not_swallowed() -> None:
    flaky = Flaky(TransientError("once", retry_after=5.0))
    with anyio.move_on_after(0.05) as scope:
        await retry_call(flaky, initial=0.01)
    assert scope.cancelled_caught
    assert len(flaky.started) == 1
