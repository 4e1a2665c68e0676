"""Heartbeats: the SSE stream to the control plane and the job row's ``heartbeat_at``.

`SseHeartbeat` keeps one long-lived streaming ``POST {url}/agents/{agent_id}/events`` open whose request
body is a never-ending ``text/event-stream``: a ``heartbeat`` event every interval and a ``lifecycle`` event
the moment the state machine moves. It reconnects forever with jittered exponential backoff and never raises
out of `SseHeartbeat.run` except on cancellation. `SseHeartbeat.push_lifecycle` is synchronous and only
appends to a bounded buffer, so a dead or slow control plane can never slow a step or a drain.

`JobHeartbeat` sets the job row's ``heartbeat_at`` every interval so the control plane can tell a live
attempt from a zombie; failures are counted and logged, never fatal, and a fenced write (a later attempt
owns the job) stops it.

httpx is imported inside `SseHeartbeat.run`, so importing this module stays cheap.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import anyio
import orjson

from agentlife._exceptions import describe_error
from agentlife._observe._status import StatusBoard
from agentlife._observe._telemetry import process_start_time
from agentlife._redact import MASK, Redactor
from agentlife._state import State, Transition

if TYPE_CHECKING:
    import httpx


__all__ = [
    "SseHeartbeat",
    "SseStats",
    "format_sse",
    "reconnect_delay",
]

_log = logging.getLogger("agentlife.heartbeat")

#: Lifecycle events kept while the stream is down, oldest dropped first (a process makes about six).
DEFAULT_BUFFER_SIZE = 64
#: Fraction of the backoff delay added as random jitter, so a fleet does not reconnect in lockstep.
JITTER_FRACTION = 0.2
#: A failure is logged at WARNING the first time and every this many times after; DEBUG otherwise.
_LOG_EVERY = 10
#: How long `SseHeartbeat.aclose` waits for the server's answer once the last frame is written: a round
#: trip for a live plane; a plane that accepts but never answers would otherwise hold a drain for the timeout.
_ANSWER_GRACE_SECONDS = 0.25


def reconnect_delay(failures: int, initial: float, maximum: float, rng: random.Random | None = None) -> float:
    """Seconds to wait before reconnect attempt number ``failures`` (1-based).

    The base doubles from ``initial`` up to ``maximum`` (1, 2, 4 ... 30 s by default); a random jitter of up
    to `JITTER_FRACTION` of the base is added on top.
    """
    exponent = max(0, failures - 1)
    base = maximum if exponent >= 64 else min(maximum, initial * (2.0**exponent))
    jitter = (rng or random).uniform(0.0, JITTER_FRACTION * base)
    return base + jitter


def format_sse(event: str, data: Mapping[str, Any], event_id: int | None = None) -> bytes:
    """One Server-Sent Events frame: optional ``id:``, ``event:``, one ``data:`` line, a blank line."""
    head = b"" if event_id is None else b"id: %d\n" % event_id
    return head + b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data, default=str) + b"\n\n"


def _iso_utc(unix_seconds: float) -> str:
    return datetime.fromtimestamp(unix_seconds, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _rss_mb() -> float:
    """Resident set size in MiB: current from ``/proc/self/statm``, else the peak from getrusage."""
    try:
        with open("/proc/self/statm", "rb") as f:
            resident_pages = int(f.read().split()[1])
        return round(resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)
    except (OSError, ValueError, IndexError):
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return round(peak / (2**20 if sys.platform == "darwin" else 2**10), 1)


@dataclass(frozen=True, slots=True)
class SseStats:
    """Counters of an `SseHeartbeat`, for ``/status`` and tests."""

    connections: int
    connected: bool
    heartbeats_sent: int
    lifecycle_sent: int
    lifecycle_pending: int
    lifecycle_dropped: int
    consecutive_failures: int
    last_error: str | None


@dataclass(slots=True)
class _Frame:
    seq: int
    kind: str  # "heartbeat" or "lifecycle"
    data: bytes


class _Signal:
    """A reusable wake-up: `set` wakes every current waiter; waiters re-check their condition after waking."""

    def __init__(self) -> None:
        self._event: anyio.Event | None = None

    def set(self) -> None:
        if self._event is not None:
            self._event.set()

    async def wait(self) -> None:
        if self._event is None or self._event.is_set():
            self._event = anyio.Event()
        await self._event.wait()


class _Connection:
    """State of one streaming POST: the network stream httpcore opened, what is in flight, how it ended."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.opened_at = time.monotonic()
        self.stream: Any = None
        self.headers_sent = anyio.Event()
        self.accepted = False
        self.request_scope = anyio.CancelScope()
        self.watch_scope = anyio.CancelScope()
        self.watch_done = anyio.Event()
        self.in_flight: _Frame | None = None
        self.frames_written = 0
        self.error: str | None = None

    async def trace(self, name: str, info: dict[str, Any]) -> None:
        """The httpx ``trace`` extension: keep the socket stream so `_watch` notices the server hang up."""
        if name in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            stream = info.get("return_value")
            if stream is not None and hasattr(stream, "read"):
                self.stream = stream
        elif name == "http11.send_request_headers.complete":
            self.headers_sent.set()


class SseHeartbeat:
    """Streams ``heartbeat`` and ``lifecycle`` events to the control plane over one long-lived POST.

    Run `run` in the runtime's task group; call `push_lifecycle` from a state-machine listener; at the end
    of a drain call `flush` (bounded) and then `aclose`.

    Args:
        url: base URL of the control plane (``AGENTLIFE_CONTROL_PLANE_URL``).
        token: bearer token (``AGENTLIFE_CONTROL_PLANE_TOKEN``) or None; it is sent in the
            ``Authorization`` header only and masked from every log line and error this class produces.
        agent_id: the ``{agent_id}`` of the events path and the payload's ``agentId``.
        job_id: the payload's ``jobId``.
        pod_name: the payload's ``podName`` (``HOSTNAME``).
        interval: seconds between ``heartbeat`` events.
        snapshot_metrics: returns the counters of the payload's ``metrics`` (``stepsCompleted``,
            ``llmCallsTotal``, ``toolCallsTotal``); ``rssMb`` and ``uptimeSeconds`` are filled in here unless
            it returns them. Called on the event loop once per heartbeat; it must be cheap and not block.
        board: where results are recorded (``record_heartbeat("sse", ...)``) and where ``lifecycleState``
            and ``currentStep`` are read from unless ``progress`` is given.
        progress: returns the job's own (lifecycle state, current step); in a worker running several jobs
            at once the board's one-job fields name none of them, so each job's stream reads its own.
        reconnect_initial: first reconnect delay, doubled after each failure.
        reconnect_max: cap of the reconnect delay (jitter comes on top).
        rng: random source of the jitter (tests pass a seeded one).
        buffer_size: lifecycle events kept while disconnected (the oldest are dropped first).
        connect_timeout: TCP/TLS connect timeout of one attempt.
        redactor: masks secrets in errors and in the ``extra`` fields of lifecycle events.
    """

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        agent_id: str,
        job_id: str,
        pod_name: str,
        interval: float,
        snapshot_metrics: Callable[[], Mapping[str, Any]],
        board: StatusBoard | None = None,
        progress: Callable[[], tuple[State, int | None]] | None = None,
        reconnect_initial: float = 1.0,
        reconnect_max: float = 30.0,
        rng: random.Random | None = None,
        buffer_size: int = DEFAULT_BUFFER_SIZE,
        connect_timeout: float = 10.0,
        redactor: Redactor | None = None,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"heartbeat interval must be > 0, got {interval}")
        if not 0 < reconnect_initial <= reconnect_max:
            raise ValueError(
                f"need 0 < reconnect_initial <= reconnect_max, got {reconnect_initial}, {reconnect_max}"
            )
        self.endpoint = f"{url.rstrip('/')}/agents/{quote(agent_id, safe='')}/events"
        self._token = token
        self._agent_id, self._job_id, self._pod_name = agent_id, job_id, pod_name
        self.interval = interval
        self._snapshot_metrics = snapshot_metrics
        self._board = board
        self._progress = progress
        self._reconnect_initial, self._reconnect_max = reconnect_initial, reconnect_max
        self._rng = rng or random.Random()
        self._connect_timeout = connect_timeout
        self._redactor = _TokenRedactor(redactor or Redactor(), token)
        self._process_start = process_start_time()

        self._pending: deque[_Frame] = deque()
        self._buffer_size = max(1, buffer_size)
        self._seq = 0
        # push_lifecycle may come from another thread; sequence numbers and the buffer bound stay exact.
        self._seq_lock = threading.Lock()
        self._last_state = State.BOOTING.value
        self._changed = _Signal()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None

        self._connection: _Connection | None = None
        self._connections = 0
        self._heartbeats_sent = 0
        self._lifecycle_sent = 0
        self._dropped = 0
        self._drop_logged = False
        self._failures = 0
        self._failed_attempts = 0  # never reset: `flush` stops waiting once an attempt fails
        self._backoff_level = 0
        # A refusal (401, 404) comes back within a round trip; this much silence means the stream is accepted.
        self._accept_grace = min(1.0, interval / 2)
        self._last_error: str | None = None
        self._running = False
        self._started = False
        self._closing = False
        self._body_ended = False
        self._hurry = False
        self._done = anyio.Event()
        self._run_scope: anyio.CancelScope | None = None

    # -- public API -----------------------------------------------------------------------------------

    def push_lifecycle(self, transition: Transition, extra: Mapping[str, Any] | None = None) -> None:
        """Queue a ``lifecycle`` event for ``transition``; it goes out at once on the open stream.

        Never blocks and never touches the network, so it is safe in a state-machine listener. While the
        stream is down the newest `DEFAULT_BUFFER_SIZE` events are kept and sent after reconnecting.
        ``extra`` adds fields (say ``exitCode`` or ``drainReason``) but cannot replace the standard ones.
        """
        payload: dict[str, Any] = {
            "type": "lifecycle",
            "timestamp": _iso_utc(transition.at),
            "agentId": self._agent_id,
            "jobId": self._job_id,
            "podName": self._pod_name,
            "from": transition.source.value,
            "to": transition.target.value,
            "reason": self._redactor.redact(transition.reason),
            "lifecycleState": transition.target.value,
            "currentStep": self._position()[1],
        }
        if extra:
            redacted = self._redactor.redact_obj(dict(extra))
            for key, value in redacted.items():
                payload.setdefault(key, value)
        self._last_state = transition.target.value
        with self._seq_lock:
            seq = self._next_seq()
            frame = _Frame(seq, "lifecycle", format_sse("lifecycle", payload, seq))
            if len(self._pending) >= self._buffer_size:
                self._pending.popleft()
                self._dropped += 1
                dropped_first = not self._drop_logged
                self._drop_logged = True
            else:
                dropped_first = False
            self._pending.append(frame)
        if dropped_first:  # once per outage: logging must not become the cost of a push
            _log.warning("SSE heartbeat buffer full (%d events): dropping the oldest", self._buffer_size)
        self._notify()

    async def run(self) -> None:
        """Stream events until cancelled or closed with `aclose`; reconnect forever on failure.

        Raises:
            RuntimeError: `run` was already started once.
        """
        if self._started:
            raise RuntimeError("SseHeartbeat.run() can only be started once")
        self._started = True
        self._bind_loop()
        self._running = True
        try:
            with anyio.CancelScope() as scope:
                self._run_scope = scope
                async with self._client() as client:
                    await self._reconnect_loop(client)
        finally:
            self._running = False
            self._connection = None
            self._done.set()
            self._changed.set()

    async def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s until every queued lifecycle event was written to the stream.

        A pending reconnect backoff is cut short so the events get one prompt try; when a connection attempt
        fails meanwhile, it returns at once (a dead plane must not hold a drain for ``timeout``). Returns True
        when nothing is left queued. "Written" means handed to the socket; `aclose` also waits (briefly) for
        the server's answer.
        """
        if not self._pending_or_in_flight():
            return True
        if not self._running:
            return False
        failed_attempts = self._failed_attempts
        self._hurry = True
        self._notify()
        with anyio.move_on_after(timeout):
            while self._pending_or_in_flight() and self._running and self._failed_attempts == failed_attempts:
                await self._changed.wait()
        return not self._pending_or_in_flight()

    async def aclose(self, timeout: float = 2.0) -> None:
        """End the stream cleanly after the queued events, waiting at most ``timeout`` s; idempotent.

        The request body is terminated so the control plane sees the end of the stream (rather than a reset)
        and answers; `run` then returns. The answer is awaited for a round trip at most once the last frame is
        written. When the time is up, or the caller is cancelled first, `run` is cancelled instead: the
        caller's own deadline always wins.
        """
        self._closing = True
        self._hurry = True
        self._notify()
        if not self._running:
            return
        try:
            with anyio.move_on_after(timeout):
                while not (self._done.is_set() or self._body_ended):
                    await self._changed.wait()
                with anyio.move_on_after(_ANSWER_GRACE_SECONDS):
                    await self._done.wait()
        finally:
            if not self._done.is_set() and self._run_scope is not None:
                self._run_scope.cancel()

    @property
    def stats(self) -> SseStats:
        """The counters so far."""
        conn = self._connection
        return SseStats(
            connections=self._connections,
            connected=conn is not None and conn.accepted,
            heartbeats_sent=self._heartbeats_sent,
            lifecycle_sent=self._lifecycle_sent,
            lifecycle_pending=len(self._pending),
            lifecycle_dropped=self._dropped,
            consecutive_failures=self._failures,
            last_error=self._last_error,
        )

    def __repr__(self) -> str:
        # Never show the token.
        return f"SseHeartbeat({self._redactor.redact(self.endpoint)!r}, interval={self.interval:g})"

    # -- the reconnect loop ---------------------------------------------------------------------------

    def _client(self) -> httpx.AsyncClient:
        import httpx

        timeout = httpx.Timeout(
            connect=self._connect_timeout,
            # A write that blocks this long means the server stopped reading: reconnect.
            write=max(10.0, 2 * self.interval),
            # Only used after the body ended (aclose): the server's final answer.
            read=5.0,
            pool=self._connect_timeout,
        )
        # No keep-alive: every attempt opens a fresh connection, so the trace hook always sees its socket.
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=0)
        return httpx.AsyncClient(timeout=timeout, limits=limits)

    async def _reconnect_loop(self, client: httpx.AsyncClient) -> None:
        last_try_while_closing = False
        while not (self._closing and (last_try_while_closing or not self._pending)):
            last_try_while_closing = self._closing
            conn = await self._session(client)
            lived = time.monotonic() - conn.opened_at
            if conn.error is None:
                self._failures = 0
                self._record(ok=True)
                continue
            self._failures += 1
            self._failed_attempts += 1
            self._changed.set()
            # A stream that stayed up a full interval was healthy: start the backoff over. One refused or
            # dropped at once keeps doubling, so a crash-looping control plane is not hammered.
            healthy = conn.accepted and lived >= self.interval
            self._backoff_level = 1 if healthy else self._backoff_level + 1
            self._last_error = conn.error
            delay = reconnect_delay(
                self._backoff_level, self._reconnect_initial, self._reconnect_max, self._rng
            )
            self._record(ok=False, error=conn.error)
            self._log_failure(conn.error, delay)
            if not self._closing:
                await self._backoff(delay)

    async def _session(self, client: httpx.AsyncClient) -> _Connection:
        self._connections += 1
        conn = _Connection(self._connections)
        self._connection = conn
        body = self._frames(conn)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch, conn)
                with conn.request_scope:
                    await self._post(client, conn, body)
                tg.cancel_scope.cancel()
        finally:
            self._connection = None
            if conn.in_flight is not None and conn.in_flight.kind == "lifecycle":
                # Never confirmed written: send it again on the next stream (the id lets receivers dedupe).
                self._pending.appendleft(conn.in_flight)
            with anyio.CancelScope(shield=True):
                await body.aclose()
        return conn

    async def _post(self, client: httpx.AsyncClient, conn: _Connection, body: AsyncIterator[bytes]) -> None:
        import httpx

        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        try:
            response = await client.post(
                self.endpoint, content=body, headers=headers, extensions={"trace": conn.trace}
            )
        except (httpx.HTTPError, OSError) as exc:
            conn.error = conn.error or self._describe(exc)
        except Exception as exc:  # never let a surprise kill the heartbeat
            _log.debug("unexpected SSE heartbeat error", exc_info=True)
            conn.error = conn.error or self._describe(exc)
        else:
            if not response.is_success:
                conn.error = f"control plane answered HTTP {response.status_code}"
            elif not self._closing:
                conn.error = "control plane ended the stream"

    async def _watch(self, conn: _Connection) -> None:
        """Notice at once when the server hangs up or answers early (say 401) while we are still sending.

        httpcore does not read during the upload, so without this a closed stream would only show at the next
        write, an interval later, and the event written in between would be lost.
        """
        try:
            with conn.watch_scope:
                await conn.headers_sent.wait()
                with anyio.move_on_after(self._accept_grace):
                    await self._hang_up(conn)
                    return
                self._accepted(conn)
                await self._hang_up(conn)
        finally:
            conn.watch_done.set()

    async def _hang_up(self, conn: _Connection) -> None:
        """Return once the server closed the connection or answered, having cancelled the request."""
        if conn.stream is None:  # no socket to watch (a proxy, a future httpcore): rely on write errors
            await anyio.sleep_forever()
        try:
            data = await conn.stream.read(4096)
        except Exception:
            data = b""
        conn.error = self._early_answer(data)
        conn.request_scope.cancel()

    def _accepted(self, conn: _Connection) -> None:
        conn.accepted = True
        if self._failures:
            _log.info("SSE heartbeat stream to %s is back", self._redactor.redact(self.endpoint))
        self._failures = 0
        self._record(ok=True)

    async def _frames(self, conn: _Connection) -> AsyncGenerator[bytes, None]:
        """The request body: a heartbeat at once, lifecycle events as they come, heartbeats every interval."""
        next_beat = anyio.current_time()
        while True:
            while self._pending:
                frame = self._pending.popleft()
                conn.in_flight = frame
                yield frame.data
                self._written(conn, frame)
            if self._closing:
                await self._stop_watching(conn)
                self._body_ended = True
                self._changed.set()
                return
            if anyio.current_time() >= next_beat:
                frame = self._heartbeat_frame()
                conn.in_flight = frame
                yield frame.data
                self._written(conn, frame)
                next_beat = max(next_beat + self.interval, anyio.current_time())
                continue
            with anyio.move_on_after(next_beat - anyio.current_time()):
                await self._changed.wait()

    async def _stop_watching(self, conn: _Connection) -> None:
        # httpcore is about to read the server's answer; the watcher must not be reading the same socket.
        conn.watch_scope.cancel()
        await conn.watch_done.wait()

    def _written(self, conn: _Connection, frame: _Frame) -> None:
        conn.in_flight = None
        conn.frames_written += 1
        if frame.kind == "heartbeat":
            self._heartbeats_sent += 1
            if conn.accepted:
                self._record(ok=True)
        else:
            self._lifecycle_sent += 1
            self._drop_logged = False
        self._changed.set()

    async def _backoff(self, delay: float) -> None:
        with anyio.move_on_after(delay):
            while not (self._hurry or self._closing):
                await self._changed.wait()
        self._hurry = False

    # -- helpers --------------------------------------------------------------------------------------

    def _heartbeat_frame(self) -> _Frame:
        payload = self._heartbeat_payload()
        with self._seq_lock:
            seq = self._next_seq()
        return _Frame(seq, "heartbeat", format_sse("heartbeat", payload, seq))

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _heartbeat_payload(self) -> dict[str, Any]:
        metrics: dict[str, Any] = {
            "rssMb": _rss_mb(),
            "uptimeSeconds": round(max(0.0, time.time() - self._process_start), 3),
            "stepsCompleted": 0,
            "llmCallsTotal": 0,
            "toolCallsTotal": 0,
        }
        try:
            metrics.update(self._snapshot_metrics())
        except Exception:
            _log.debug("snapshot_metrics failed; sending zeros", exc_info=True)
        state, step = self._position()
        return {
            "type": "heartbeat",
            "timestamp": _iso_utc(time.time()),
            "agentId": self._agent_id,
            "jobId": self._job_id,
            "podName": self._pod_name,
            "lifecycleState": state,
            "currentStep": step,
            "metrics": metrics,
        }

    def _position(self) -> tuple[str, int | None]:
        """The job's lifecycle state and current step, from ``progress``, else the board."""
        if self._progress is not None:
            state, step = self._progress()
            return state.value, step
        if self._board is not None:
            snap = self._board.snapshot()
            return snap.state.value, snap.step
        return self._last_state, None

    def _pending_or_in_flight(self) -> bool:
        conn = self._connection
        in_flight = conn is not None and conn.in_flight is not None and conn.in_flight.kind == "lifecycle"
        return bool(self._pending) or in_flight

    def _bind_loop(self) -> None:
        self._loop_thread = threading.get_ident()
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    def _notify(self) -> None:
        """Wake the sender; from another thread hop onto the loop first (anyio events are not thread-safe)."""
        if self._loop_thread is None or threading.get_ident() == self._loop_thread:
            self._changed.set()
        elif self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._changed.set)

    def _record(self, *, ok: bool, error: str | None = None) -> None:
        if self._board is not None:
            self._board.record_heartbeat("sse", ok=ok, error=error, failures=self._failures)

    def _log_failure(self, error: str, delay: float) -> None:
        level = logging.WARNING if self._failures % _LOG_EVERY == 1 else logging.DEBUG
        _log.log(
            level,
            "SSE heartbeat stream to %s failed (%s); reconnecting in %.1fs (failure %d)",
            self._redactor.redact(self.endpoint),
            error,
            delay,
            self._failures,
        )

    def _describe(self, exc: BaseException) -> str:
        return describe_error(exc, redact=self._redactor.redact)

    def _early_answer(self, data: bytes) -> str:
        if not data:
            return "control plane closed the stream"
        status_line = data.split(b"\r\n", 1)[0].decode("latin-1", "replace")[:80]
        return self._redactor.redact(f"control plane answered before the stream ended: {status_line}")


class _TokenRedactor(Redactor):
    """A caller's redactor plus this heartbeat's own token, masked whatever its length."""

    def __init__(self, base: Redactor, token: str | None) -> None:
        super().__init__()
        self._base, self._token = base, token

    def redact(self, text: str) -> str:
        text = self._base.redact(text)
        return text.replace(self._token, MASK) if self._token else text
