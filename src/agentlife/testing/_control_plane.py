"""The receiving side of the SSE heartbeat: a control-plane stub and a heartbeat monitor.

`ControlPlaneStub` is a real aiohttp server on 127.0.0.1 that accepts the agent's long-lived
``POST /agents/{agent_id}/events`` streams, parses the Server-Sent Events frames as they arrive and records
each one as a `ReceivedEvent`. It can be stopped and started again on the same port, to test reconnects.

`HeartbeatMonitor` is the control plane's judgement, as pure logic over an injectable clock: an agent is OK
while events arrive, WARNING when it has been silent for more than one interval, UNHEALTHY after
``unhealthy_after``. When one agent has two streams (a zombie and its successor), the newest stream wins.

Example:
    >>> async def test_heartbeats():                                      # doctest: +SKIP
    ...     async with ControlPlaneStub(token="s3cret-token") as plane:
    ...         ...  # point AGENTLIFE_CONTROL_PLANE_URL at plane.url
    ...         beat = await plane.wait_for(event="heartbeat", timeout=2.0)
    ...         assert plane.monitor.status(beat.agent_id) is HeartbeatStatus.OK

aiohttp is imported when the stub starts, so importing this module is cheap.
"""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:
    from aiohttp import web

__all__ = [
    "AgentHeartbeat",
    "ControlPlaneStub",
    "HeartbeatMonitor",
    "HeartbeatStatus",
    "ReceivedEvent",
    "SseParser",
    "StatusChange",
]

Clock = Callable[[], float]


# -- the monitor ----------------------------------------------------------------------------------------


class HeartbeatStatus(enum.Enum):
    """How the control plane judges an agent from its event stream."""

    UNKNOWN = "UNKNOWN"
    """Never heard from."""
    OK = "OK"
    """Heard from within the last interval."""
    WARNING = "WARNING"
    """Silent for more than one interval."""
    UNHEALTHY = "UNHEALTHY"
    """Silent for more than ``unhealthy_after`` (3 intervals by default)."""
    TERMINATED = "TERMINATED"
    """Said goodbye: its last ``lifecycleState`` was TERMINATED."""

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class AgentHeartbeat:
    """What the monitor knows about one agent at one instant."""

    agent_id: str
    status: HeartbeatStatus
    connection_id: int
    last_seen: float
    silence: float
    lifecycle_state: str | None
    events: int
    ignored: int


@dataclass(frozen=True, slots=True)
class StatusChange:
    """An agent's status moved from ``previous`` to ``current`` (reported by `HeartbeatMonitor.poll`)."""

    agent_id: str
    previous: HeartbeatStatus
    current: HeartbeatStatus
    at: float


@dataclass(slots=True)
class _Track:
    connection_id: int
    last_seen: float
    lifecycle_state: str | None = None
    events: int = 0
    ignored: int = 0
    reported: HeartbeatStatus = HeartbeatStatus.UNKNOWN


class HeartbeatMonitor:
    """Per-agent liveness from heartbeat and lifecycle events; pure logic, no I/O, no threads.

    An agent is OK while it is heard from; WARNING once silent for more than ``interval`` seconds; UNHEALTHY
    once silent for more than ``unhealthy_after`` seconds; TERMINATED after it reported the TERMINATED
    lifecycle state (silence is then expected). Any event proves life, not only heartbeats.

    Last writer wins: connection ids grow with every stream the control plane accepts, and the newest
    stream of an agent is the one that counts. Once an event arrived on a newer stream, events from older
    streams of that agent are ignored (counted in ``ignored``): a zombie pod cannot keep its successor's
    status alive or overwrite its state.

    Args:
        interval: the agents' heartbeat interval (``AGENTLIFE_HEARTBEAT_SSE_INTERVAL_SECONDS``).
        unhealthy_after: silence after which an agent is unhealthy
            (``AGENTLIFE_HEARTBEAT_UNHEALTHY_AFTER_SECONDS``, 3 intervals).
        clock: seconds on a monotonic clock; tests pass a fake one and run in virtual time.
    """

    def __init__(
        self, interval: float = 15.0, unhealthy_after: float = 45.0, clock: Clock = time.monotonic
    ) -> None:
        if not 0 < interval <= unhealthy_after:
            raise ValueError(f"need 0 < interval <= unhealthy_after, got {interval} and {unhealthy_after}")
        self.interval = interval
        self.unhealthy_after = unhealthy_after
        self.clock = clock
        self._tracks: dict[str, _Track] = {}

    def observe(
        self,
        agent_id: str,
        connection_id: int,
        event: str = "heartbeat",
        data: Any = None,
        at: float | None = None,
    ) -> bool:
        """Take one event into account; False when it was ignored (from a stream older than the newest).

        ``data`` is the event's decoded payload; its ``lifecycleState`` is remembered.
        """
        now = self.clock() if at is None else at
        track = self._tracks.get(agent_id)
        if track is None:
            track = self._tracks[agent_id] = _Track(connection_id=connection_id, last_seen=now)
        elif connection_id < track.connection_id:
            track.ignored += 1
            return False
        track.connection_id = connection_id
        track.last_seen = max(track.last_seen, now)
        track.events += 1
        if isinstance(data, dict) and isinstance(data.get("lifecycleState"), str):
            track.lifecycle_state = data["lifecycleState"]
        return True

    def status(self, agent_id: str, now: float | None = None) -> HeartbeatStatus:
        """The status of ``agent_id`` now (UNKNOWN when never heard from)."""
        track = self._tracks.get(agent_id)
        if track is None:
            return HeartbeatStatus.UNKNOWN
        return self._judge(track, self.clock() if now is None else now)

    def agent(self, agent_id: str, now: float | None = None) -> AgentHeartbeat | None:
        """A snapshot of what is known about ``agent_id``, or None."""
        track = self._tracks.get(agent_id)
        if track is None:
            return None
        now = self.clock() if now is None else now
        return AgentHeartbeat(
            agent_id=agent_id,
            status=self._judge(track, now),
            connection_id=track.connection_id,
            last_seen=track.last_seen,
            silence=max(0.0, now - track.last_seen),
            lifecycle_state=track.lifecycle_state,
            events=track.events,
            ignored=track.ignored,
        )

    def agents(self, now: float | None = None) -> dict[str, AgentHeartbeat]:
        """Snapshots of every agent heard from."""
        now = self.clock() if now is None else now
        out = {}
        for agent_id in self._tracks:
            snap = self.agent(agent_id, now)
            assert snap is not None
            out[agent_id] = snap
        return out

    def poll(self, now: float | None = None) -> list[StatusChange]:
        """The status changes since the previous `poll`, for a control plane's periodic sweep."""
        now = self.clock() if now is None else now
        changes = []
        for agent_id, track in self._tracks.items():
            current = self._judge(track, now)
            if current is not track.reported:
                changes.append(StatusChange(agent_id, track.reported, current, now))
                track.reported = current
        return changes

    def _judge(self, track: _Track, now: float) -> HeartbeatStatus:
        if track.lifecycle_state == "TERMINATED":
            return HeartbeatStatus.TERMINATED
        silence = now - track.last_seen
        if silence > self.unhealthy_after:
            return HeartbeatStatus.UNHEALTHY
        if silence > self.interval:
            return HeartbeatStatus.WARNING
        return HeartbeatStatus.OK


# -- SSE parsing ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _RawEvent:
    event: str
    data: str
    event_id: str | None


class SseParser:
    """Incremental Server-Sent Events parser: feed bytes as they arrive, get complete events back.

    Follows the WHATWG event-stream rules that matter here: ``event``, ``data`` (several lines joined with
    newlines), ``id``, comments (``:``), LF or CRLF line ends, a blank line dispatches.
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None

    def feed(self, chunk: bytes) -> Iterator[_RawEvent]:
        """Yield every event completed by ``chunk``."""
        self._buffer += chunk
        while True:
            line, sep, rest = self._buffer.partition(b"\n")
            if not sep:
                return
            self._buffer = rest
            event = self._line(line.removesuffix(b"\r").decode("utf-8", "replace"))
            if event is not None:
                yield event

    def _line(self, line: str) -> _RawEvent | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            self._id = value
        return None

    def _dispatch(self) -> _RawEvent | None:
        event, data, event_id = self._event or "message", self._data, self._id
        self._event, self._data, self._id = "", [], None
        if not data:
            return None
        return _RawEvent(event, "\n".join(data), event_id)


# -- the stub server ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReceivedEvent:
    """One event the stub received."""

    agent_id: str
    """From the request path."""
    event: str
    """The SSE ``event:`` name (``heartbeat``, ``lifecycle``)."""
    data: Any
    """The ``data:`` payload, decoded from JSON when it is JSON, else the raw text."""
    received_at: float
    """The monitor's clock (monotonic seconds by default) when the frame was parsed."""
    connection_id: int
    """Which stream carried it; grows with every accepted stream."""
    event_id: str | None = None
    """The SSE ``id:``, when the frame had one."""


@dataclass(slots=True)
class _Stream:
    connection_id: int
    agent_id: str
    request: Any
    events: int = 0


@dataclass(slots=True)
class _Waiters:
    event: anyio.Event | None = None

    def notify(self) -> None:
        if self.event is not None:
            self.event.set()

    async def wait(self) -> None:
        if self.event is None or self.event.is_set():
            self.event = anyio.Event()
        await self.event.wait()


@dataclass(slots=True)
class _Counters:
    accepted: int = 0
    rejected: int = 0
    ended: int = 0
    open: dict[int, _Stream] = field(default_factory=dict)


class ControlPlaneStub:
    """A control plane that receives SSE heartbeat streams, for tests and demos.

    Args:
        host: where to listen; loopback by default.
        port: 0 picks a free port on the first `start`; later starts reuse the port actually bound, so a
            test can stop the stub and start it again where the agent expects it.
        token: when set, a request without ``Authorization: Bearer <token>`` is answered 401 and closed.
        monitor: fed with every event; the default judges with the design's 15 s / 45 s.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        monitor: HeartbeatMonitor | None = None,
    ) -> None:
        self.host = host
        self._port = port
        self._token = token
        self.monitor = monitor or HeartbeatMonitor()
        self._events: list[ReceivedEvent] = []
        self._counters = _Counters()
        self._changed = _Waiters()
        self._runner: web.AppRunner | None = None

    # -- lifecycle ------------------------------------------------------------------------------------

    async def start(self) -> ControlPlaneStub:
        """Listen (again); returns self. Raises `RuntimeError` when already running."""
        if self._runner is not None:
            raise RuntimeError("ControlPlaneStub is already running")
        from aiohttp import web

        app = web.Application()
        app.router.add_post("/agents/{agent_id}/events", self._handle)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5, handle_signals=False)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self._port, reuse_address=True)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        if self._port == 0:
            self._port = int(runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        """Stop listening and close every open stream at once (agents see the connection drop); idempotent."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        for stream in list(self._counters.open.values()):
            transport = stream.request.transport
            if transport is not None:
                transport.close()
        with anyio.CancelScope(shield=True):
            await runner.cleanup()

    async def __aenter__(self) -> ControlPlaneStub:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # -- what was received ----------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The bound port (0 before the first `start` when none was given)."""
        return self._port

    @property
    def url(self) -> str:
        """Base URL for ``AGENTLIFE_CONTROL_PLANE_URL``."""
        return f"http://{self.host}:{self._port}"

    @property
    def running(self) -> bool:
        """Whether the stub is listening."""
        return self._runner is not None

    @property
    def events(self) -> list[ReceivedEvent]:
        """Every event received so far, in arrival order (a copy)."""
        return list(self._events)

    @property
    def accepted(self) -> int:
        """Streams accepted (authorised) so far."""
        return self._counters.accepted

    @property
    def rejected(self) -> int:
        """Requests refused with 401."""
        return self._counters.rejected

    @property
    def open_streams(self) -> int:
        """Streams currently open."""
        return len(self._counters.open)

    def events_of(self, event: str | None = None, agent_id: str | None = None) -> list[ReceivedEvent]:
        """The events received with this ``event`` name and/or for this agent."""
        return [e for e in self._events if _matches(e, None, event, agent_id)]

    async def wait_for(
        self,
        predicate: Callable[[ReceivedEvent], bool] | None = None,
        *,
        event: str | None = None,
        agent_id: str | None = None,
        after: int = 0,
        timeout: float = 5.0,
    ) -> ReceivedEvent:
        """The first event at index ``after`` or later that matches, waiting up to ``timeout`` seconds.

        Pass ``after=len(stub.events)`` to wait for an event that has not arrived yet.

        Raises:
            TimeoutError: nothing matched in time; the message lists what did arrive.
        """
        index = after
        with anyio.move_on_after(timeout):
            while True:
                while index < len(self._events):
                    candidate = self._events[index]
                    index += 1
                    if _matches(candidate, predicate, event, agent_id):
                        return candidate
                await self._changed.wait()
        seen = ", ".join(f"{e.event}@{e.connection_id}" for e in self._events[after:][-10:]) or "nothing"
        raise TimeoutError(f"no matching event within {timeout:g}s (received since index {after}: {seen})")

    async def wait_for_streams(self, count: int, *, timeout: float = 5.0) -> None:
        """Wait until ``count`` streams were accepted in total.

        Raises:
            TimeoutError: fewer were accepted in time.
        """
        with anyio.move_on_after(timeout):
            while self._counters.accepted < count:
                await self._changed.wait()
            return
        raise TimeoutError(
            f"{self._counters.accepted} stream(s) accepted within {timeout:g}s, wanted {count}"
        )

    # -- the handler ----------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        agent_id = request.match_info["agent_id"]
        if self._token is not None and request.headers.get("Authorization") != f"Bearer {self._token}":
            self._counters.rejected += 1
            self._changed.notify()
            refused = web.Response(status=401, text="unauthorized")
            refused.force_close()
            return refused
        self._counters.accepted += 1
        stream = _Stream(self._counters.accepted, agent_id, request)
        self._counters.open[stream.connection_id] = stream
        self._changed.notify()
        try:
            await self._consume(stream)
        finally:
            del self._counters.open[stream.connection_id]
            self._counters.ended += 1
            self._changed.notify()
        return web.Response(status=200, text="ok")

    async def _consume(self, stream: _Stream) -> None:
        parser = SseParser()
        try:
            async for chunk in stream.request.content.iter_any():
                for raw in parser.feed(chunk):
                    self._record(stream, raw)
        except Exception:
            # The agent went away mid-stream (reset, truncated chunk): that is what a real plane sees too.
            return

    def _record(self, stream: _Stream, raw: _RawEvent) -> None:
        try:
            data: Any = json.loads(raw.data)
        except ValueError:
            data = raw.data
        received = ReceivedEvent(
            agent_id=stream.agent_id,
            event=raw.event,
            data=data,
            received_at=self.monitor.clock(),
            connection_id=stream.connection_id,
            event_id=raw.event_id,
        )
        stream.events += 1
        self._events.append(received)
        self.monitor.observe(stream.agent_id, stream.connection_id, raw.event, data, at=received.received_at)
        self._changed.notify()


def _matches(
    candidate: ReceivedEvent,
    predicate: Callable[[ReceivedEvent], bool] | None,
    event: str | None,
    agent_id: str | None,
) -> bool:
    if event is not None and candidate.event != event:
        return False
    if agent_id is not None and candidate.agent_id != agent_id:
        return False
    return predicate is None or predicate(candidate)
