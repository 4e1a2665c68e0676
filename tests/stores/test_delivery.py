"""DeliveryGuard and run_housekeeping against real SQLite and PostgreSQL stores."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import anyio
import pytest

from agentlife import ConfigError, PermanentError, StoreUnavailable
from agentlife.stores import CheckpointStore, PostgresStore, SQLiteStore
from agentlife.stores._delivery import DeliveryGuard, delivery_key, run_housekeeping

pytestmark = pytest.mark.anyio

OpenStore = Callable[[], Awaitable[CheckpointStore]]


@pytest.fixture(params=["sqlite", "postgresql"])
async def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[OpenStore]:
    """Opens stores on one fresh database; each call is a separate instance, like a separate attempt."""
    url = request.getfixturevalue("postgres_url") if request.param == "postgresql" else ""
    opened: list[CheckpointStore] = []

    async def make() -> CheckpointStore:
        store: CheckpointStore = PostgresStore(url) if url else SQLiteStore(tmp_path / "db.sqlite")
        await store.open()
        await store.init_schema()
        opened.append(store)
        return store

    yield make
    for store in opened:
        await store.close()


class Recorder:
    """A delivery function that fails a given number of times first, and a sleep that only records."""

    def __init__(self, failures: int = 0, error: type[Exception] = ConnectionError) -> None:
        self.failures = failures
        self.error = error
        self.calls = 0
        self.sleeps: list[float] = []

    async def __call__(self) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error(f"failure {self.calls}")

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)


def test_delivery_key_format() -> None:
    assert delivery_key("job-1", "slack") == "delivery:job-1:slack"


async def test_delivers_once_and_records_the_key(open_store: OpenStore) -> None:
    store = await open_store()
    fn = Recorder()
    guard = DeliveryGuard(store, "job-1", "slack", sleep=fn.sleep)
    assert guard.key == "delivery:job-1:slack"

    assert await guard.deliver(fn) is True
    assert fn.calls == 1
    assert await store.is_delivered("delivery:job-1:slack")
    assert await guard.deliver(fn) is False
    assert fn.calls == 1


async def test_next_attempt_skips_what_was_delivered(open_store: OpenStore) -> None:
    first_attempt, next_attempt = await open_store(), await open_store()
    fn = Recorder()
    assert await DeliveryGuard(first_attempt, "job-1", "slack").deliver(fn)
    assert not await DeliveryGuard(next_attempt, "job-1", "slack").deliver(fn)
    assert fn.calls == 1
    # Another channel, or another job, is a different key.
    assert await DeliveryGuard(next_attempt, "job-1", "email").deliver(fn)
    assert await DeliveryGuard(next_attempt, "job-2", "slack").deliver(fn)
    assert fn.calls == 3


async def test_failures_are_retried_with_backoff(open_store: OpenStore) -> None:
    store = await open_store()
    fn = Recorder(failures=2)
    guard = DeliveryGuard(store, "job-1", "slack", sleep=fn.sleep)
    assert await guard.deliver(fn) is True
    assert fn.calls == 3
    assert fn.sleeps == [5.0, 10.0]
    assert await store.is_delivered(guard.key)


async def test_last_error_is_raised_and_nothing_recorded(
    open_store: OpenStore, caplog: pytest.LogCaptureFixture
) -> None:
    store = await open_store()
    fn = Recorder(failures=10)
    guard = DeliveryGuard(store, "job-1", "slack", attempts=3, initial=2.0, multiplier=3.0, sleep=fn.sleep)
    with (
        caplog.at_level(logging.WARNING, logger="agentlife.delivery"),
        pytest.raises(ConnectionError, match="failure 3"),
    ):
        await guard.deliver(fn)
    assert fn.calls == 3
    assert fn.sleeps == [2.0, 6.0]
    assert not await store.is_delivered(guard.key)
    assert sum("retrying in" in m for m in caplog.messages) == 2
    # Nothing was recorded, so the next attempt announces it again.
    later = Recorder()
    assert await DeliveryGuard(await open_store(), "job-1", "slack").deliver(later)
    assert later.calls == 1


async def test_permanent_errors_are_not_retried(open_store: OpenStore) -> None:
    store = await open_store()
    fn = Recorder(failures=1, error=PermanentError)
    with pytest.raises(PermanentError):
        await DeliveryGuard(store, "job-1", "slack", sleep=fn.sleep).deliver(fn)
    assert (fn.calls, fn.sleeps) == (1, [])
    assert not await store.is_delivered("delivery:job-1:slack")


async def test_cancellation_is_neither_retried_nor_swallowed(open_store: OpenStore) -> None:
    store = await open_store()
    calls = 0
    sleeps: list[float] = []

    async def hangs() -> None:
        nonlocal calls
        calls += 1
        await anyio.sleep_forever()

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    with anyio.move_on_after(0.05) as scope:
        await DeliveryGuard(store, "job-1", "slack", sleep=sleep).deliver(hangs)
    assert scope.cancelled_caught
    assert (calls, sleeps) == (1, [])
    assert not await store.is_delivered("delivery:job-1:slack")


async def test_real_sleep_between_attempts(open_store: OpenStore) -> None:
    store = await open_store()
    fn = Recorder(failures=1)
    started = anyio.current_time()
    assert await DeliveryGuard(store, "job-1", "slack", attempts=2, initial=0.05).deliver(fn)
    assert anyio.current_time() - started >= 0.05
    assert fn.calls == 2


async def test_recording_is_retried_when_the_store_is_briefly_down(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "db.sqlite")
    await store.open()
    sleeps: list[float] = []

    async def deliver_then_lose_the_store() -> None:
        await store.close()  # the store goes away right after the effect happened

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        await store.open()  # ... and comes back during the backoff

    try:
        assert await DeliveryGuard(store, "job-1", "slack", sleep=sleep).deliver(deliver_then_lose_the_store)
        assert sleeps == [5.0]
        assert await store.is_delivered("delivery:job-1:slack")
    finally:
        await store.close()


async def test_recording_failure_is_raised_after_the_attempts(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "db.sqlite")
    await store.open()
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    with pytest.raises(StoreUnavailable):
        await DeliveryGuard(store, "job-1", "slack", sleep=sleep).deliver(store.close)
    assert sleeps == [5.0, 10.0]


@pytest.mark.parametrize(
    ("attempts", "initial", "multiplier"), [(0, 5.0, 2.0), (3, -1.0, 2.0), (3, 5.0, 0.5)]
)
def test_guard_rejects_nonsense(tmp_path: Path, attempts: int, initial: float, multiplier: float) -> None:
    with pytest.raises(ConfigError):
        DeliveryGuard(
            SQLiteStore(tmp_path / "db"),
            "job",
            "c",
            attempts=attempts,
            initial=initial,
            multiplier=multiplier,
        )


# -- housekeeping ---------------------------------------------------------------------------------------


async def test_housekeeping_runs_everything_and_returns_errors(caplog: pytest.LogCaptureFixture) -> None:
    ran: list[str] = []

    async def archive() -> None:
        ran.append("archive")
        raise ValueError("archive bucket missing")

    async def compact() -> None:
        ran.append("compact")

    async def notify() -> None:
        ran.append("notify")
        raise RuntimeError("webhook 500")

    with caplog.at_level(logging.WARNING, logger="agentlife.delivery"):
        errors = await run_housekeeping([archive, compact, notify])

    assert ran == ["archive", "compact", "notify"]
    assert [type(e) for e in errors] == [ValueError, RuntimeError]
    assert str(errors[0]) == "archive bucket missing"
    assert any("archive" in m and "archive bucket missing" in m for m in caplog.messages)


async def test_housekeeping_without_errors_returns_empty() -> None:
    ran: list[int] = []

    async def work() -> None:
        ran.append(1)

    assert await run_housekeeping([work, work]) == []
    assert ran == [1, 1]


async def test_housekeeping_is_interruptible() -> None:
    ran: list[str] = []

    async def slow() -> None:
        ran.append("slow")
        await anyio.sleep_forever()

    async def after() -> None:
        ran.append("after")

    with anyio.move_on_after(0.05) as scope:
        await run_housekeeping([slow, after])
    assert scope.cancelled_caught
    assert ran == ["slow"]


async def test_housekeeping_with_a_real_store(open_store: OpenStore) -> None:
    store = await open_store()

    async def record_archive() -> None:
        await store.record_delivery("archive:job-1", "job-1", "archive")

    async def broken() -> None:
        raise OSError("disk full")

    errors = await run_housekeeping([broken, record_archive])
    assert [type(e) for e in errors] == [OSError]
    assert await store.is_delivered("archive:job-1")
