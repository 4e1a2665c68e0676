"""``ctx.llm.stream``: the same journaled call as ``ctx.llm.complete``, its events handed on as they arrive.

`LLMStream` runs the call in a task of its own task group, owned by the ``async with`` block, and hands the
adapter's events to the block through a queue (the adapter calls its ``on_event`` synchronously, under the
stream guard, so it cannot wait for a slow reader; a reply is finite, so the queue is unbounded). The
queue is a deque, not an anyio memory object stream (whose ``receive`` passes through the event loop once
more per item: 2.7x the guard alone per chunk in benchmarks/bench_streaming.py). A reader that finds it
empty first lets the loop pass once, which is all a call that reads one event per pass needs; when that
brought nothing it waits on a future the next event wakes, and keeps doing so (trying a pass again every
16 waits), so a silent call leaves the loop idle. Per chunk that is 1.7x the guard alone over a source
that suspends on every event (2.0x when every wait took a future), about the floor of a hand-off between
two tasks; reading the call from the block's own task would break the guard's clocks and the nesting of
cancel scopes (see the benchmark's docstring). Everything else is
``complete``'s: the call number, the request digest (``on_event`` is not a request parameter), the budget
check, ``LLM_STARTED`` / ``LLM_COMPLETED``, retries and telemetry.

- On replay (the call completed before a crash) nothing is sent: the recorded reply is streamed at once,
  one event per text or thinking block. An adapter without ``streams_events`` is streamed the same way,
  when its reply is complete.
- A retry after a transient error (a stall, a 529) sends an ``other`` event whose ``raw`` is
  ``{"type": "agentlife_retry", ...}``; the reply's text then starts over from its first delta.
- Leaving the block before the reply completed cancels the call: the stream guard closes the HTTP
  response, and nothing is journaled as completed. A failed call raises from the iteration, from
  `LLMStream.get_final_reply`, or when the block ends.
"""

from __future__ import annotations

import asyncio
import types
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

import anyio

from agentlife._llm._protocol import LLMReply, OnEvent, StreamEvent

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from agentlife._retry import RetryEvent

__all__ = ["RETRY_EVENT", "LLMStream", "emit_reply", "is_streaming_adapter", "retry_event"]

#: ``raw["type"]`` of the event a stream gets when its call is retried: the text starts over.
RETRY_EVENT = "agentlife_retry"
#: A reader that stopped passing before it waits tries again after this many waits (a power of 2, less 1).
_RESPIN_EVERY = 15


def emit_reply(reply: LLMReply, on_event: OnEvent, source: Literal["journal", "reply"]) -> None:
    """Hand a whole reply on as events: one per text or thinking block, one ``other`` per other block.

    ``source`` tells where the reply came from: ``"journal"`` (replayed) or ``"reply"`` (an adapter that
    does not stream events).
    """
    for index, block in enumerate(reply.content):
        raw = {"type": "agentlife_block", "source": source, "index": index, "content_block": dict(block)}
        kind = block.get("type")
        if kind == "text":
            on_event(StreamEvent("text", str(block.get("text", "")), raw))
        elif kind == "thinking":
            on_event(StreamEvent("thinking", str(block.get("thinking", "")), raw))
        else:
            on_event(StreamEvent("other", "", raw))


def retry_event(event: RetryEvent) -> StreamEvent:
    """The marker a stream gets before its call is tried again."""
    raw = {"type": RETRY_EVENT, **event.to_json()}
    return StreamEvent("other", "", raw)


class LLMStream:
    """What ``async with ctx.llm.stream(...) as s`` gives: the reply's events as they arrive, then the reply.

    Iterate one of `text_stream` (text deltas), `thinking_stream` (thinking deltas) or the stream itself
    (every `StreamEvent`, ``raw`` being the provider's event); they share one queue, so each event is read
    once. `get_final_reply` waits for the whole reply, which is also `reply` once complete.

    Attributes:
        reply: the complete `LLMReply`, once the call completed (None before, or when the block was left
            early).
    """

    def __init__(self, begin: Callable[[], Callable[[OnEvent], Awaitable[LLMReply]]]) -> None:
        # ``begin()`` claims the call's number, when the block is entered (in order with the step's other
        # calls), and returns the call to run.
        self._begin = begin
        self.reply: LLMReply | None = None
        self._error: Exception | None = None
        self._error_raised = False
        self._done = anyio.Event()
        self._tg: TaskGroup | None = None
        # The queue between the call's task and the block: appended to by the adapter's on_event, read by
        # the block; the block, when it finds it empty, waits on ``_waiter``, which the next event wakes.
        self._queue: deque[StreamEvent] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._finished = False  # the call ended, or the block was left: no event will be added
        # Whether a reader that finds the queue empty lets the loop run one pass before it waits on a
        # future; off after a pass that brought nothing, until `_RESPIN_EVERY` waits later.
        self._spin = True
        self._waits = 0
        self._loop: asyncio.AbstractEventLoop  # set on entering the block, where the readers run

    async def __aenter__(self) -> LLMStream:
        if self._tg is not None:
            raise RuntimeError("an LLMStream can be entered only once")
        self._loop = asyncio.get_running_loop()
        call = self._begin()
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        tg.start_soon(self._run, call)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        tg = self._tg
        if tg is None:
            raise RuntimeError("LLMStream.__aexit__ without __aenter__")
        if not self._done.is_set():
            tg.cancel_scope.cancel()  # left early: the guard closes the response
        try:
            if exc is None or isinstance(exc, Exception):
                # The block's own error goes on as it is: handed to the group, it would come out wrapped
                # in an ExceptionGroup. Cancellations go through the group, which keeps their accounting.
                await tg.__aexit__(None, None, None)
            else:
                await tg.__aexit__(exc_type, exc, tb)
        finally:
            self._finished = True
            self._queue.clear()
        if exc_type is None and self._error is not None and not self._error_raised:
            self._error_raised = True
            raise self._error
        return False

    async def _run(self, call: Callable[[OnEvent], Awaitable[LLMReply]]) -> None:
        append = self._queue.append

        def on_event(event: StreamEvent) -> None:
            append(event)
            waiter = self._waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

        try:
            self.reply = await call(on_event)
        except Exception as exc:  # surfaced to the block: the task group must not wrap it in a group
            self._error = exc
        finally:
            self._finished = True
            self._done.set()
            waiter = self._waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    def __aiter__(self) -> AsyncIterator[StreamEvent]:
        return _Events(self, None)

    @property
    def text_stream(self) -> AsyncIterator[str]:
        """The text deltas, as ``str``, in order (after a retry they start over)."""
        return _Events(self, "text")

    @property
    def thinking_stream(self) -> AsyncIterator[str]:
        """The thinking deltas, as ``str``, in order."""
        return _Events(self, "thinking")

    async def get_final_reply(self) -> LLMReply:
        """Wait for the whole reply (reading what is left of the stream) and return it.

        Raises:
            Exception: whatever the call raised (`LLMTimeout`, `BudgetExhausted` ...).
            RuntimeError: the block was left before the reply completed.
        """
        await self._done.wait()
        self._raise_error()
        if self.reply is None:
            raise RuntimeError("the stream was left before its reply completed")
        return self.reply

    def _raise_error(self) -> None:
        if self._error is not None:
            self._error_raised = True
            raise self._error


class _Events:
    """An async iterator over one kind of event of an `LLMStream` (all of them for ``kind=None``)."""

    __slots__ = ("_kind", "_stream")

    def __init__(self, stream: LLMStream, kind: Literal["text", "thinking"] | None) -> None:
        if stream._tg is None:
            raise RuntimeError("read an LLMStream inside its block: async with ctx.llm.stream(...) as s")
        self._stream = stream
        self._kind = kind

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> Any:
        stream, kind, queue = self._stream, self._kind, self._stream._queue
        while True:
            if not queue and stream._spin and not stream._finished:
                # One pass of the event loop first: a call that hands on an event per pass has queued the
                # next one by then, and this costs no future, no done-callback and no wake-up handle.
                await _one_pass()
                if not queue:
                    stream._spin = False
            while not queue:  # inline, not a helper coroutine: this runs once per chunk
                if stream._finished:
                    stream._raise_error()
                    raise StopAsyncIteration
                stream._waiter = waiter = stream._loop.create_future()
                try:
                    await waiter
                finally:
                    stream._waiter = None
                stream._waits += 1
                if stream._waits & _RESPIN_EVERY == 0:
                    stream._spin = True  # try a pass again now and then: the call's pace may change
            event = queue.popleft()
            if kind is None:
                return event
            if event.kind == kind:
                return event.text


@types.coroutine
def _one_pass() -> Generator[None, None, None]:
    """Let every other ready callback run once (what ``asyncio.sleep(0)`` does, minus two frames)."""
    yield


def is_streaming_adapter(client: object) -> bool:
    """Whether ``client.complete`` accepts ``on_event=`` (its class sets ``streams_events = True``)."""
    return bool(getattr(type(client), "streams_events", False))
