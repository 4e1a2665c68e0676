"""The stream guard: connect, inter-chunk and total timeouts on any async iterator.

A model that stops streaming is the worst kind of hang: the socket stays open, nothing errors, and a
plain HTTP read timeout either fires during a legitimate long thinking pause or never fires at all when
something trickles keep-alives. `guard_stream` watches *progress* instead:

* **connect**: from the first ``__anext__`` until the source yields its first item;
* **chunk**: silence while waiting for each following item (every item counts, pings included);
* **total**: from the first ``__anext__``, whatever the source does.

On expiry the pending ``__anext__`` of the source is interrupted, the ``close`` callback is awaited (the
adapters pass one that closes the HTTP response, so the server sees the disconnect), the source is
``aclose()``-d when it has that method, and `LLMTimeout` is raised naming the clock that expired.

Why it is cheap: no task, cancel scope or timer is created per item, and no bookkeeping is done per
item at all: the guard is a plain async generator around ``async for``. A single asyncio timer per stream
does the watching, judging progress from *which* request the guard is awaiting (``ag_await``: every
``__anext__`` of the source is a new awaitable, so a different one means an item arrived):

* it ticks every ``chunk * precision`` seconds while items flow and notes when it last saw
  the request change; once the stream is silent it sleeps until that moment + ``chunk``. So the chunk
  timeout fires between ``chunk`` and ``chunk * (1 + precision)`` seconds after the last item (12.5 %
  late at most by default) and costs one timer callback per tick, not one timer per item;
* the connect and total deadlines are always exact.

Silence only counts while the guard waits on the source (``ag_running``): time the consumer spends on an
item between two ``__anext__`` calls is not the model's fault.

When a deadline passes, the timer cancels the waiting task, the way `asyncio.timeout` does, and the guard
tells its own cancellation from an outside one with ``Task.cancelling()``: an outside cancel (the drain
deadline, an enclosing anyio cancel scope) is re-raised after the response is closed, never turned into
a timeout. The guard needs the asyncio event loop (anyio's asyncio backend included) and must be
iterated from one task.
"""

from __future__ import annotations

import asyncio
import logging
import math
import types
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

import anyio

from agentlife._exceptions import ConfigError, LLMTimeout
from agentlife._llm._protocol import StreamTimeouts

if TYPE_CHECKING:
    from agentlife.constants import CallConstants

__all__ = [
    "CLOSE_TIMEOUT_SECONDS",
    "DEFAULT_PRECISION",
    "guard_stream",
    "stream_timeouts_from_constants",
    "stream_timeouts_from_env",
]

_log = logging.getLogger("agentlife.llm")

T = TypeVar("T")
TimeoutKind = Literal["connect", "chunk", "total"]

#: How long closing the response (and the source) may take once the guard is done with it.
CLOSE_TIMEOUT_SECONDS = 5.0
_TIMEOUT_ENV = {
    "connect": "AGENTLIFE_LLM_CONNECT_TIMEOUT_SECONDS",
    "chunk": "AGENTLIFE_LLM_INTER_CHUNK_TIMEOUT_SECONDS",
    "total": "AGENTLIFE_LLM_TOTAL_TIMEOUT_SECONDS",
}
#: The chunk timeout may fire up to this fraction of ``chunk`` late; the watch timer ticks that often.
DEFAULT_PRECISION = 0.125


def guard_stream(
    source: AsyncIterator[T],
    timeouts: StreamTimeouts,
    *,
    close: Callable[[], Awaitable[None]] | None = None,
    close_timeout: float = CLOSE_TIMEOUT_SECONDS,
    precision: float = DEFAULT_PRECISION,
) -> AsyncGenerator[T, None]:
    """Wrap ``source`` so that it can never stall silently.

    Args:
        source: any async iterator (an async generator, an SDK stream, a memory channel ...).
        timeouts: the connect, inter-chunk and total clocks, in seconds.
        close: awaited exactly once when the guarded stream ends for any reason (exhausted, error,
            timeout, cancellation, ``aclose()``); typically closes the HTTP response.
        close_timeout: how long ``close`` plus the source's ``aclose`` may take, shielded from
            cancellation; their own errors are logged at debug level and never mask the real outcome.
        precision: how late, as a fraction of ``timeouts.chunk``, the chunk timeout may fire; smaller is
            more exact and wakes the timer more often while items flow.

    Returns:
        An async generator. Iterate it with ``async for``; wrap it in `contextlib.aclosing` when you may
        stop before the end, so the response is closed at once rather than by the garbage collector.

    Raises:
        ValueError: a timeout or ``precision`` is not > 0.

    Example:
        >>> from contextlib import aclosing
        >>> async def read_all(events, timeouts):
        ...     async with aclosing(guard_stream(events, timeouts)) as stream:
        ...         return [event async for event in stream]
    """
    for name in ("connect", "chunk", "total"):
        value = getattr(timeouts, name)
        if not value > 0:
            raise ValueError(f"StreamTimeouts.{name} must be > 0, got {value!r}")
    if not precision > 0:
        raise ValueError(f"precision must be > 0, got {precision!r}")
    watch = _Watch(timeouts, precision)
    generator = _guarded(source, watch, close, close_timeout)
    # A weak reference: the generator's frame holds the watch, and a cycle would delay finalisation.
    watch.generator = weakref.ref(cast("types.AsyncGeneratorType[Any, None]", generator))
    return generator


async def _guarded(
    source: AsyncIterator[T],
    watch: _Watch,
    close: Callable[[], Awaitable[None]] | None,
    close_timeout: float,
) -> AsyncGenerator[T, None]:
    watch.start()
    try:
        try:
            first = await source.__anext__()
        except StopAsyncIteration:
            watch.raise_if_fired(None)
            return
        watch.first_item()
        yield first
        # The hot loop: nothing but the generator layer itself. Progress is judged by the timer from
        # which request the generator is awaiting (``ag_await``), so items need no bookkeeping.
        async for item in source:
            yield item
        watch.raise_if_fired(None)
    except GeneratorExit:
        raise
    except BaseException as exc:
        watch.raise_if_fired(exc)
        raise
    finally:
        watch.stop()
        await _close_quietly(close, source, close_timeout)


class _Watch:
    """The one timer of a guarded stream and what it needs to judge progress."""

    __slots__ = (
        "baseline",
        "cancels",
        "chunk",
        "connect",
        "connect_end",
        "done",
        "fired",
        "generator",
        "got_first",
        "last_wait",
        "loop",
        "quiet_since",
        "resolution",
        "task",
        "tick",
        "timer",
        "total",
        "total_end",
    )

    def __init__(self, timeouts: StreamTimeouts, precision: float) -> None:
        self.connect = float(timeouts.connect)
        self.chunk = float(timeouts.chunk)
        self.total = float(timeouts.total)
        self.tick = self.chunk * precision
        self.generator: weakref.ref[types.AsyncGeneratorType[Any, None]] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[Any] | None = None
        self.resolution = 0.0
        self.baseline = 0
        self.connect_end = math.inf
        self.total_end = math.inf
        self.quiet_since = 0.0
        self.got_first = False
        self.last_wait: object = None
        self.timer: asyncio.TimerHandle | None = None
        self.fired: TimeoutKind | None = None
        self.cancels = 0
        self.done = False

    def start(self) -> None:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("guard_stream must be iterated from an asyncio task")
        loop = task.get_loop()
        self.task = task
        self.loop = loop
        # asyncio runs timers up to one clock resolution early; that is not a missed deadline.
        self.resolution = float(getattr(loop, "_clock_resolution", 1e-9))
        # Cancellation requests pending before we start are not ours to judge.
        self.baseline = task.cancelling()
        now = loop.time()
        self.connect_end = now + self.connect
        self.total_end = now + self.total
        self.quiet_since = now
        self.timer = loop.call_at(min(self.connect_end, self.total_end, now + self.tick), self._on_timer)

    def stop(self) -> None:
        self.done = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def first_item(self) -> None:
        self.got_first = True

    def _on_timer(self) -> None:
        self.timer = None
        generator = self.generator() if self.generator is not None else None
        if self.done or generator is None:
            return
        assert self.loop is not None
        now = self.loop.time()
        # The request the guard is waiting on; None while the consumer works on an item.
        pending = generator.ag_await if generator.ag_running else None
        waiting = pending is not None
        if self.fired is not None:
            # The source swallowed our cancellation; keep insisting, like anyio's level cancellation.
            if waiting:
                self._cancel()
            self._arm(now + max(self.tick, 0.001))
            return
        if pending is None or pending is not self.last_wait:
            # A new request since the last tick (so an item arrived), or the consumer is busy: the
            # chunk clock restarts.
            self.last_wait = pending
            self.quiet_since = now
        late = now + self.resolution
        if waiting and late >= self.total_end:
            self._fire("total")
        elif waiting and not self.got_first and late >= self.connect_end:
            self._fire("connect")
        elif waiting and self.got_first and late >= self.quiet_since + self.chunk:
            self._fire("chunk")
        elif not self.got_first:
            # Keep ticking before the first item too, so the chunk clock starts soon after it.
            self._arm(min(self.connect_end, self.total_end, now + self.tick))
        elif self.quiet_since == now:
            self._arm(min(now + self.tick, self.total_end))
        else:
            self._arm(min(self.quiet_since + self.chunk, self.total_end))

    def _arm(self, when: float) -> None:
        assert self.loop is not None
        self.timer = self.loop.call_at(when, self._on_timer)

    def _fire(self, kind: TimeoutKind) -> None:
        self.fired = kind
        self._cancel()
        assert self.loop is not None
        # Re-check soon in case the source swallows the cancellation.
        self._arm(self.loop.time() + max(self.tick, 0.001))

    def _cancel(self) -> None:
        assert self.task is not None
        self.cancels += 1
        self.task.cancel(f"agentlife stream guard: {self.fired} timeout")

    def raise_if_fired(self, exc: BaseException | None) -> None:
        """After the source ended or raised: turn our own cancellation into `LLMTimeout`.

        An outside cancellation that arrived together with our timeout wins and is left to propagate: a
        drain deadline must never be mistaken for a slow model.
        """
        fired = self.fired
        if fired is None:
            return
        self.stop()
        assert self.task is not None
        while self.cancels:
            self.task.uncancel()
            self.cancels -= 1
        cancelled = isinstance(exc, asyncio.CancelledError)
        if cancelled and self.task.cancelling() > self.baseline:
            return
        seconds = {"connect": self.connect, "chunk": self.chunk, "total": self.total}[fired]
        if exc is None or cancelled:
            raise LLMTimeout(fired, seconds) from None
        raise LLMTimeout(fired, seconds) from exc


async def _close_quietly(
    close: Callable[[], Awaitable[None]] | None, source: AsyncIterator[Any], close_timeout: float
) -> None:
    """Close the response, then the source: shielded, time-limited, their own failures only logged."""
    with anyio.move_on_after(close_timeout, shield=True):
        if close is not None:
            try:
                await close()
            except Exception:
                _log.debug("closing a guarded stream's response failed", exc_info=True)
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            try:
                await aclose()
            except Exception:
                _log.debug("closing a guarded stream's source failed", exc_info=True)


def stream_timeouts_from_constants(calls: CallConstants) -> StreamTimeouts:
    """The `StreamTimeouts` of a `CallConstants` (its env overrides and time scaling included).

    This is what the runtime passes to ``LLMClient.complete`` on every call.
    """
    return StreamTimeouts(
        connect=calls.llm_connect_timeout_seconds,
        chunk=calls.llm_inter_chunk_timeout_seconds,
        total=calls.llm_total_timeout_seconds,
    )


def stream_timeouts_from_env(env: Mapping[str, str]) -> StreamTimeouts:
    """The stream timeouts set by ``AGENTLIFE_LLM_{CONNECT,INTER_CHUNK,TOTAL}_TIMEOUT_SECONDS``.

    Only those three variables are read, so an adapter made outside the runtime does not trip over an
    unrelated setting; missing ones keep `CallConstants`' defaults.

    Raises:
        ConfigError: a value is not a number of seconds > 0.
    """
    values: dict[str, float] = {}
    for field_name, var in _TIMEOUT_ENV.items():
        raw = env.get(var)
        if raw is None or not raw.strip():
            continue
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(f"{var}={raw!r} is not a number of seconds") from None
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{var}={raw!r} must be a finite number of seconds > 0")
        values[field_name] = value
    return StreamTimeouts(**values)
