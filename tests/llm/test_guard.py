"""The stream guard on plain async iterators: the three clocks, closing, and outside cancellation."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import aclosing

import anyio
import pytest

from agentlife import ConfigError, LLMTimeout, StreamTimeouts
from agentlife._llm._guard import guard_stream, stream_timeouts_from_constants, stream_timeouts_from_env
from agentlife.constants import Constants

pytestmark = pytest.mark.anyio

FAST = StreamTimeouts(connect=0.2, chunk=0.15, total=2.0)


class Closer:
    """A ``close`` callback that counts its calls."""

    def __init__(self, *, fail: bool = False) -> None:
        self.calls = 0
        self.fail = fail

    async def __call__(self) -> None:
        self.calls += 1
        await anyio.sleep(0)  # a real close awaits the network
        if self.fail:
            raise RuntimeError("close failed")


class Source:
    """An async generator with a record of how it ended."""

    def __init__(self, items: int = 3, *, gap: float = 0.0, then: str = "end", first_delay: float = 0.0):
        self.items, self.gap, self.then, self.first_delay = items, gap, then, first_delay
        self.finalized = False
        self.cancelled = False

    async def run(self) -> AsyncIterator[int]:
        try:
            if self.first_delay:
                await anyio.sleep(self.first_delay)
            for i in range(self.items):
                if self.gap and i:
                    await anyio.sleep(self.gap)
                yield i
            if self.then == "stall":
                await anyio.sleep_forever()
            elif self.then == "trickle":
                while True:
                    await anyio.sleep(0.01)
                    yield -1
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        finally:
            self.finalized = True


async def drain(source: AsyncIterator[int], timeouts: StreamTimeouts, closer: Closer) -> list[int]:
    out = []
    async with aclosing(guard_stream(source, timeouts, close=closer)) as stream:
        async for item in stream:
            out.append(item)
    return out


async def test_items_pass_through_and_close_runs_once_at_the_end() -> None:
    source, closer = Source(5, gap=0.01), Closer()
    assert await drain(source.run(), FAST, closer) == [0, 1, 2, 3, 4]
    assert closer.calls == 1
    assert source.finalized
    assert not source.cancelled


async def test_no_first_item_is_a_connect_timeout() -> None:
    source, closer = Source(1, first_delay=10), Closer()
    started = time.monotonic()
    with pytest.raises(LLMTimeout) as caught:
        await drain(source.run(), FAST, closer)
    elapsed = time.monotonic() - started
    assert caught.value.kind == "connect"
    assert caught.value.seconds == FAST.connect
    assert isinstance(caught.value, TimeoutError)
    assert FAST.connect - 0.01 <= elapsed < FAST.connect + 1.0
    assert closer.calls == 1
    assert source.cancelled
    assert source.finalized


async def test_silence_after_some_items_is_a_chunk_timeout() -> None:
    source, closer = Source(2, then="stall"), Closer()
    got: list[int] = []

    async def consume() -> None:
        async for item in guard_stream(source.run(), FAST, close=closer):
            got.append(item)

    with pytest.raises(LLMTimeout) as caught:
        await consume()
    assert caught.value.kind == "chunk"
    assert got == [0, 1]
    assert closer.calls == 1
    assert source.cancelled
    assert source.finalized


async def test_chunk_timeout_never_fires_early() -> None:
    timeouts = StreamTimeouts(connect=1.0, chunk=0.12, total=5.0)
    last_item_at = 0.0

    async def stalls() -> AsyncIterator[int]:
        nonlocal last_item_at
        for i in range(3):
            await anyio.sleep(0.03)
            last_item_at = time.monotonic()
            yield i
        await anyio.sleep_forever()

    with pytest.raises(LLMTimeout, match="chunk"):
        async for _ in guard_stream(stalls(), timeouts):
            pass
    silence = time.monotonic() - last_item_at
    # At least the chunk timeout; at most chunk x (1 + precision) plus scheduling slack.
    assert timeouts.chunk - 0.005 <= silence < timeouts.chunk + 1.0


async def test_items_keep_the_stream_alive_past_the_chunk_timeout() -> None:
    # Twelve gaps of 0.04 s: three times the chunk timeout in all, never silent for long.
    source, closer = Source(13, gap=0.04), Closer()
    assert len(await drain(source.run(), StreamTimeouts(connect=0.2, chunk=0.15, total=5.0), closer)) == 13
    assert closer.calls == 1


async def test_a_stream_that_never_stops_hits_the_total_timeout() -> None:
    source, closer = Source(1, then="trickle"), Closer()
    timeouts = StreamTimeouts(connect=0.2, chunk=0.1, total=0.4)
    started = time.monotonic()
    count = 0

    async def consume() -> None:
        nonlocal count
        async for _ in guard_stream(source.run(), timeouts, close=closer):
            count += 1

    with pytest.raises(LLMTimeout) as caught:
        await consume()
    assert caught.value.kind == "total"
    assert time.monotonic() - started >= timeouts.total - 0.01
    assert count > 10
    assert closer.calls == 1


async def test_time_the_consumer_spends_between_items_is_not_silence() -> None:
    source, closer = Source(3), Closer()
    got = []
    async with aclosing(guard_stream(source.run(), StreamTimeouts(0.2, 0.1, 5.0), close=closer)) as stream:
        async for item in stream:
            await anyio.sleep(0.25)  # longer than both the connect and chunk clocks
            got.append(item)
    assert got == [0, 1, 2]


async def test_outside_cancellation_propagates_and_still_closes() -> None:
    source, closer = Source(1, then="stall"), Closer()
    with anyio.move_on_after(0.1) as scope:
        await drain(source.run(), StreamTimeouts(connect=5, chunk=5, total=10), closer)
    assert scope.cancelled_caught
    assert closer.calls == 1
    assert source.cancelled


async def test_outside_cancellation_wins_over_a_simultaneous_timeout() -> None:
    """A drain deadline and our own timeout landing together: the drain's cancellation must win."""
    loop = asyncio.get_running_loop()
    # Margins a loaded machine keeps: the loop must reach the blocking callback before our 0.5 s deadline.
    timeouts = StreamTimeouts(connect=0.5, chunk=5.0, total=10.0)
    closer = Closer()

    def block_then_cancel(scope: anyio.CancelScope) -> None:
        # Block the loop past the guard's deadline, then queue the outside cancel ahead of the guard's
        # timer: both now happen before the stream's task runs again.
        time.sleep(0.7)
        loop.call_soon(scope.cancel)

    with anyio.CancelScope() as scope:
        loop.call_later(0.01, block_then_cancel, scope)
        await drain(Source(1, first_delay=10).run(), timeouts, closer)
    assert scope.cancelled_caught
    assert closer.calls == 1
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0


async def test_the_guard_leaves_no_pending_cancellation_behind() -> None:
    with pytest.raises(LLMTimeout):
        await drain(Source(1, first_delay=10).run(), FAST, Closer())
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0
    await anyio.sleep(0.01)  # would raise CancelledError if a cancel were still queued


async def test_a_failing_close_does_not_hide_the_timeout() -> None:
    source, closer = Source(1, then="stall"), Closer(fail=True)
    with pytest.raises(LLMTimeout, match="chunk"):
        await drain(source.run(), FAST, closer)
    assert closer.calls == 1


async def test_errors_of_the_source_pass_unchanged() -> None:
    closer = Closer()

    async def broken() -> AsyncIterator[int]:
        yield 1
        raise ConnectionResetError("peer reset")

    with pytest.raises(ConnectionResetError, match="peer reset"):
        await drain(broken(), FAST, closer)
    assert closer.calls == 1


async def test_stopping_early_closes_once() -> None:
    source, closer = Source(10, gap=0.001), Closer()
    stream = guard_stream(source.run(), FAST, close=closer)
    async with aclosing(stream):
        async for item in stream:
            if item == 2:
                break
    await stream.aclose()
    assert closer.calls == 1
    assert source.finalized


async def test_a_source_that_swallows_the_cancellation_is_cancelled_again() -> None:
    swallowed = 0

    async def stubborn() -> AsyncIterator[int]:
        nonlocal swallowed
        try:
            await anyio.sleep(10)
        except asyncio.CancelledError:
            swallowed += 1
        await anyio.sleep(10)
        yield 1

    started = time.monotonic()
    with pytest.raises(LLMTimeout, match="connect"):
        await drain(stubborn(), FAST, Closer())
    assert swallowed == 1
    assert time.monotonic() - started < 5


async def test_any_async_iterator_works_and_is_closed() -> None:
    send, receive = anyio.create_memory_object_stream[int](10)
    got: list[int] = []

    async def produce() -> None:
        async with send:
            for i in range(3):
                await send.send(i)
                await anyio.sleep(0.01)
            await anyio.sleep(10)  # then silence, with the channel open

    caught: LLMTimeout | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(produce)
        try:
            async for item in guard_stream(receive, FAST):
                got.append(item)
        except LLMTimeout as exc:
            caught = exc
        tg.cancel_scope.cancel()
    assert caught is not None
    assert caught.kind == "chunk"
    assert got == [0, 1, 2]
    with pytest.raises(anyio.ClosedResourceError):
        receive.receive_nowait()


async def test_no_task_is_started_per_item() -> None:
    async def many() -> AsyncIterator[int]:
        for i in range(2000):
            await asyncio.sleep(0)
            yield i

    before = len(asyncio.all_tasks())
    seen = set()
    async for _ in guard_stream(many(), FAST):
        seen.add(len(asyncio.all_tasks()))
    assert seen == {before}


@pytest.mark.parametrize("field", ["connect", "chunk", "total"])
async def test_timeouts_must_be_positive(field: str) -> None:
    values = {"connect": 1.0, "chunk": 1.0, "total": 1.0, field: 0.0}
    with pytest.raises(ValueError, match=field):
        guard_stream(Source().run(), StreamTimeouts(**values))


def test_timeouts_from_env_and_constants() -> None:
    env = {
        "AGENTLIFE_LLM_CONNECT_TIMEOUT_SECONDS": "1.5",
        "AGENTLIFE_LLM_INTER_CHUNK_TIMEOUT_SECONDS": "2",
        "AGENTLIFE_LLM_TOTAL_TIMEOUT_SECONDS": "9",
    }
    assert stream_timeouts_from_env(env) == StreamTimeouts(1.5, 2.0, 9.0)
    assert stream_timeouts_from_env({}) == StreamTimeouts()
    assert stream_timeouts_from_constants(Constants.from_env(env).calls) == StreamTimeouts(1.5, 2.0, 9.0)
    scaled = stream_timeouts_from_constants(Constants().scaled(0.01).calls)
    assert scaled == StreamTimeouts(0.3, 0.6, 3.0)
    with pytest.raises(ConfigError, match="AGENTLIFE_LLM_TOTAL_TIMEOUT_SECONDS"):
        stream_timeouts_from_env({"AGENTLIFE_LLM_TOTAL_TIMEOUT_SECONDS": "soon"})
    with pytest.raises(ConfigError, match="> 0"):
        stream_timeouts_from_env({"AGENTLIFE_LLM_CONNECT_TIMEOUT_SECONDS": "0"})
