"""The HTTP API's event stream: SSE framing and one follower per job shared by every stream of it.

A stream is ``text/event-stream``: a ``retry:`` line first, then one frame per event (``id:`` the event's
cursor, ``event:`` its kind, ``data:`` one line of JSON), a comment line as a heartbeat whenever the
stream was quiet for `SseLimits.heartbeat` seconds, and the end of the response after the job's ``end``.

`Fanout` keeps one follower per job in the console process and serves every stream of that job from
what it read, so a thousand browsers following one job cost the store one read per event, not a thousand.
It keeps the newest `SseLimits.kept` frames of each job; a stream joins at the cursor it names when that
cursor is among them, and otherwise gets a follower of its own from that cursor (a client that rejoins
after a long absence, or names a cursor the shared follower has not reached yet). The followers never
write and never wait for a stream: a stream that falls behind the kept frames is closed (a browser's
EventSource reconnects with its ``Last-Event-ID`` and gets a follower of its own from there), and one
whose client does not read is closed after `SseLimits.write_timeout` seconds.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Protocol

import anyio
from anyio.abc import TaskGroup

__all__ = ["Fanout", "Frame", "SseLimits", "comment", "frame", "retry"]

log = logging.getLogger("agentlife.console")

#: The kinds an ``event:`` line may name; anything else a follower yields is sent as ``message``.
_KIND_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz_")


@dataclass(frozen=True, slots=True)
class SseLimits:
    """The stream's timings and bounds (seconds, frames, streams)."""

    heartbeat: float = 15.0
    """A comment line is sent when the stream was quiet this long (proxies close idle connections)."""
    retry_ms: int = 2000
    """What the ``retry:`` line tells an EventSource to wait before it reconnects."""
    write_timeout: float = 30.0
    """A stream whose client takes longer than this to accept one frame is closed."""
    kept: int = 1000
    """The newest frames kept per followed job: a stream that falls further behind is closed."""
    linger: float = 10.0
    """How long a job's follower outlives its last stream (a reconnect within it reads nothing again)."""
    max_streams: int = 1000
    """The most streams open at once in one console process; one more is refused with 503."""


@dataclass(frozen=True, slots=True)
class Frame:
    """One event as a stream sends it: its cursor, its kind, its JSON (masked), whether it ends the job.

    ``durable`` is False for model text deltas: they carry the cursor of the durable event before them
    but no ``id:`` line, so a browser's ``Last-Event-ID`` stays that event's, and a stream that joins
    late is not sent the deltas kept before it joined (a follower of its own would not see them either).
    ``seq`` orders the durable events of a job (None when the follower's cursors say no order).
    """

    cursor: str
    kind: str
    data: bytes
    last: bool = False
    durable: bool = True
    seq: int | None = None

    def encode(self) -> bytes:
        """The SSE frame: ``id:`` (durable events only), ``event:`` and one ``data:`` line."""
        return frame(self.cursor if self.durable else None, self.kind, self.data)


def frame(cursor: str | None, kind: str, data: bytes) -> bytes:
    """An SSE frame; a cursor or kind that could break the framing is refused (a follower's bug).

    ``data`` is JSON, which holds no raw line break: one ``data:`` line.
    """
    shown = kind if kind and set(kind) <= _KIND_CHARS else "message"
    body = b"event: %s\ndata: %s\n\n" % (shown.encode(), data)
    if cursor is None:
        return body
    if not cursor.isprintable() or len(cursor) > 1024:
        raise ValueError("a cursor is printable text on one line")
    return b"id: %s\n%s" % (cursor.encode(), body)


def comment(text: str) -> bytes:
    """A comment line: a heartbeat the client ignores."""
    return f": {text}\n\n".encode()


def retry(milliseconds: int) -> bytes:
    """The ``retry:`` field: how long an EventSource waits before it reconnects."""
    return f"retry: {milliseconds}\n\n".encode()


class Follow(Protocol):
    """A job's events from a cursor (None: from its first), as `Frame`s; ends after the job's end."""

    def __call__(self, job_id: str, after: str | None) -> AsyncIterator[Frame]: ...


class StreamLimit(RuntimeError):
    """The console serves `SseLimits.max_streams` streams already."""


class FellBehind(RuntimeError):
    """A stream fell behind the frames its job's follower keeps."""


@dataclass
class _Channel:
    """One job's frames as this process's one follower read them, shared by every stream of the job."""

    job_id: str
    origin: str | None = None  # the cursor the follower started after (None: the job's first event)
    origin_seq: int | None = None
    frames: list[Frame] = field(default_factory=list)
    base: int = 0  # the position of frames[0] in everything the follower read
    index: dict[str, int] = field(default_factory=dict)  # cursor -> position
    streams: int = 0
    finished: bool = False
    failed: str | None = None
    changed: anyio.Event = field(default_factory=anyio.Event)
    idle: anyio.Event = field(default_factory=anyio.Event)

    def add(self, item: Frame, kept: int) -> None:
        if item.durable:
            self.index[item.cursor] = self.base + len(self.frames)
        self.frames.append(item)
        if len(self.frames) > kept:
            dropped = self.frames[: len(self.frames) - kept]
            del self.frames[: len(dropped)]
            self.base += len(dropped)
            for old in dropped:
                self.index.pop(old.cursor, None)
        self.wake()

    def wake(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()

    def start(self, after: str | None, seq: int | None) -> int | None:
        """Where a stream that saw ``after`` starts in this channel, or None when it cannot be served here.

        While the channel keeps everything its follower read, it serves any cursor at or after the one
        its follower started from: the stream passes over the durable events up to ``seq`` (those the
        follower has not reached yet included).
        """
        if self.base == 0:
            if after is None:
                return 0 if self.origin is None else None
            if after == self.origin:
                return 0
            if seq is not None and (
                self.origin is None or (self.origin_seq is not None and seq >= self.origin_seq)
            ):
                return 0
        position = self.index.get(after) if after is not None else None
        return None if position is None else position + 1


class Fanout:
    """One follower per job in this process; every stream of the job reads what it read.

    Runs its followers in the task group it is given (the application's); `stream` is an async context
    manager a request enters: it yields the frames after a cursor, from the shared follower when it can.
    """

    def __init__(self, follow: Follow, limits: SseLimits, tasks: TaskGroup) -> None:
        self._follow = follow
        self._limits = limits
        self._tasks = tasks
        self._channels: dict[str, _Channel] = {}
        self._open = 0
        self.reads = 0  # followers started: what a test counts to see that streams share one

    @asynccontextmanager
    async def stream(
        self, job_id: str, after: str | None, seq: int | None = None
    ) -> AsyncIterator[AsyncIterator[Frame]]:
        """The frames of ``job_id`` after ``after`` (whose order is ``seq``); `StreamLimit` past the bound."""
        if self._open >= self._limits.max_streams:
            raise StreamLimit(f"the console serves {self._limits.max_streams} event streams already")
        self._open += 1
        try:
            async with AsyncExitStack() as stack:
                channel = self._channel(job_id, after, seq)
                channel.streams += 1
                stack.callback(self._leave, channel)
                start = channel.start(after, seq)
                if start is None:
                    self.reads += 1
                    yield self._own(job_id, after)
                else:
                    yield self._shared(channel, start, seq if after is not None else None)
        finally:
            self._open -= 1

    def _channel(self, job_id: str, after: str | None, seq: int | None) -> _Channel:
        channel = self._channels.get(job_id)
        if channel is None or channel.finished:  # a job retried after its end goes on: follow it anew
            # From the first stream's cursor: a rejoin does not read the job's history again.
            channel = self._channels[job_id] = _Channel(job_id, after, seq)
            self.reads += 1
            self._tasks.start_soon(self._run, channel)
        return channel

    def _leave(self, channel: _Channel) -> None:
        channel.streams -= 1
        if channel.streams == 0:
            channel.idle.set()

    async def _own(self, job_id: str, after: str | None) -> AsyncIterator[Frame]:
        async for item in self._follow(job_id, after):
            yield item

    async def _shared(self, channel: _Channel, position: int, seen: int | None) -> AsyncIterator[Frame]:
        joined = channel.base + len(channel.frames)  # deltas kept before this are not sent
        while True:
            if position < channel.base:
                raise FellBehind(f"the stream fell more than {self._limits.kept} events behind")
            offset = position - channel.base
            if offset < len(channel.frames):
                item = channel.frames[offset]
                position += 1
                if item.durable and seen is not None and item.seq is not None and item.seq <= seen:
                    continue  # seen before this stream joined
                if not item.durable and position <= joined:
                    continue
                yield item
                if item.last:
                    return
                continue
            if channel.failed is not None:
                raise RuntimeError(channel.failed)
            if channel.finished:
                return
            await channel.changed.wait()

    async def _run(self, channel: _Channel) -> None:
        """Follow the job until it ends and its last stream has been gone `SseLimits.linger` seconds."""
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self._read, channel)
                await self._until_unused(channel)
                tasks.cancel_scope.cancel()
        finally:
            if self._channels.get(channel.job_id) is channel:
                del self._channels[channel.job_id]
            channel.finished = True
            channel.wake()

    async def _read(self, channel: _Channel) -> None:
        try:
            async for item in self._follow(channel.job_id, channel.origin):
                channel.add(item, self._limits.kept)
        except Exception as exc:  # a stream says the follower stopped; the next stream starts another
            log.warning("console: following job events failed: %s", type(exc).__name__)
            channel.failed = "the job's events could not be read"
            if self._channels.get(channel.job_id) is channel:
                del self._channels[channel.job_id]
        channel.finished = True
        channel.wake()

    async def _until_unused(self, channel: _Channel) -> None:
        linger = self._limits.linger if math.isfinite(self._limits.linger) else 3600.0
        while True:
            await channel.idle.wait()
            channel.idle = anyio.Event()
            if channel.streams == 0:
                with anyio.move_on_after(linger):
                    await channel.idle.wait()  # set again only by the next stream leaving: a new one joined
                if channel.streams == 0:
                    return
