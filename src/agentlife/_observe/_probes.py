"""The probe server: ``/healthz``, ``/readyz``, ``/status``, ``/metrics`` on a thread of its own.

Why a thread: a probe served from the agent's event loop can only answer when that loop is free, so the one
moment liveness matters - a loop wedged by a blocking call - is the moment it goes silent, and the kubelet
sees a timeout instead of a reason. `ProbeServer` runs its own asyncio loop on one daemon thread; it reads the
`StatusBoard` (a lock-protected snapshot the agent's loop writes) and answers from the last values written.
The loop's *silence* on the board is what turns ``/healthz`` to 503 during a block (see
`agentlife._observe._lag`).

Why no web framework: ``aiohttp.web`` costs ~370 ms to import on the target machine, CPU that
would compete with boot for the interpreter lock and delay the first ``/readyz`` 200. The probes speak a
deliberately small, strictly limited HTTP/1.1 (`agentlife._observe._probe_http`) on stdlib asyncio streams
instead.
`ProbeServer.start` only spawns the thread; the bind and the first log line happen there.

Example:
    >>> from agentlife._observe._status import StatusBoard
    >>> board = StatusBoard(job_id="j1", agent_id="a1", attempt=1)
    >>> server = ProbeServer(board, "127.0.0.1", 0, blocked_threshold=5.0)
    >>> server.start()
    >>> port = server.wait_started(timeout=10)   # only tests and tools need to wait
    >>> server.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import anyio
import orjson

from agentlife._logging import get_logger, log_fields
from agentlife._observe._lag import LoopWatchdog
from agentlife._observe._probe_http import HttpRequest, RequestError, read_request, render_response
from agentlife._observe._status import StatusBoard
from agentlife._redact import Redactor
from agentlife._state import State

__all__ = ["PROBE_PATHS", "PROBE_SWITCH_INTERVAL", "ProbeResponse", "ProbeRouter", "ProbeServer"]

#: The only paths the probe server answers; anything else is 404.
PROBE_PATHS: tuple[str, ...] = ("/healthz", "/readyz", "/status", "/metrics")
_ALLOWED_METHODS = ("GET", "HEAD")
_TEXT = "text/plain; charset=utf-8"
_JSON = "application/json"
_PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"
_COMMON_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Server": "agentlife",
}

#: The thread switch interval `ProbeServer.start` sets (seconds), so a busy agent loop yields the GIL fast.
PROBE_SWITCH_INTERVAL = 0.001
_EVICTION_LOG_EVERY_SECONDS = 60.0
_READ_LIMIT = 8192  # StreamReader buffer: a longer line is refused (414/431) instead of buffered
_MALFORMED_LOG_EVERY_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class ProbeResponse:
    """What the router decided: status, body and headers, independent of the HTTP library."""

    status: int
    body: bytes
    content_type: str = _TEXT
    allow: str | None = None


class ProbeRouter:
    """The endpoints, as a pure function of method, path and the board.

    Kept apart from the HTTP server so every decision is testable without sockets, and so the server's
    glue stays a few lines. Runs on the probe thread only (its request counters are not locked).

    Args:
        board: the status board.
        watchdog: the loop watchdog whose figures ``/metrics`` publishes.
        redactor: masks secret-shaped strings in ``/status`` (heartbeat errors may quote a server's reply).
        logger: where metrics rendering failures go.
    """

    def __init__(
        self,
        board: StatusBoard,
        watchdog: LoopWatchdog,
        redactor: Redactor,
        logger: logging.Logger,
    ) -> None:
        self._board = board
        self._watchdog = watchdog
        self._redactor = redactor
        self._logger = logger
        self._routes: dict[str, Callable[[], ProbeResponse]] = {
            "/healthz": self._healthz,
            "/readyz": self._readyz,
            "/status": self._status,
            "/metrics": self._metrics,
        }
        self._requests: Counter[tuple[str, int]] = Counter()
        #: Connections closed because the server was at its connection limit.
        self.evictions_total = 0

    def respond(self, method: str, path: str, *, has_body: bool = False) -> ProbeResponse:
        """Answer one request.

        Args:
            method: the HTTP method, as received.
            path: the URL path without the query string.
            has_body: whether the request carries a body (refused: probes never send one).

        Returns:
            The response to send; the server sends no body for HEAD.
        """
        response = self._route(method, path, has_body)
        self._requests[(path if path in self._routes else "other", response.status)] += 1
        return response

    def _route(self, method: str, path: str, has_body: bool) -> ProbeResponse:
        endpoint = self._routes.get(path)
        if endpoint is None:
            return ProbeResponse(404, b"not found\n")
        if method not in _ALLOWED_METHODS:
            return ProbeResponse(405, b"method not allowed\n", allow=", ".join(_ALLOWED_METHODS))
        if has_body:
            return ProbeResponse(413, b"request body not accepted\n")
        return endpoint()

    def _healthz(self) -> ProbeResponse:
        verdict = self._board.health()
        return ProbeResponse(verdict.status, _one_line(verdict.reason))

    def _readyz(self) -> ProbeResponse:
        verdict = self._board.readiness()
        return ProbeResponse(verdict.status, _one_line(verdict.reason))

    def _status(self) -> ProbeResponse:
        body = self._redactor.redact_obj(self._board.snapshot().to_json())
        return ProbeResponse(200, orjson.dumps(body, option=orjson.OPT_APPEND_NEWLINE), _JSON)

    def _metrics(self) -> ProbeResponse:
        render = self._board.metrics_text
        text = self.board_metrics() if render is None else self._render(render)
        return ProbeResponse(200, (text + self.worker_metrics() + self.probe_metrics()).encode(), _PROMETHEUS)

    def _render(self, render: Callable[[], str | None]) -> str:
        try:
            text = render()
        except Exception as exc:
            # A broken exporter must not take the probe's own figures down with it.
            self._logger.warning(
                "metrics rendering failed, serving the probe server's own metrics: %s: %s",
                type(exc).__name__,
                exc,
                extra=log_fields(event="metrics_render_failed"),
            )
            return self.board_metrics()
        if text is None:  # the telemetry could not be built (in time): the core gauges stand in
            return self.board_metrics()
        return text if not text or text.endswith("\n") else text + "\n"

    def board_metrics(self) -> str:
        """The agent's core gauges, for when telemetry has not plugged ``board.metrics_text`` in."""
        snap = self._board.snapshot()
        lines = [
            *_family(
                "agent_event_loop_lag_seconds", "gauge", "Drift of the agent's event loop at its last sample."
            ),
            f"agent_event_loop_lag_seconds {snap.loop_lag_seconds:.6f}",
            *_family(
                "agent_lifecycle_state", "gauge", "1 for the current lifecycle state, 0 for the others."
            ),
            *(f'agent_lifecycle_state{{state="{s.value}"}} {int(s is snap.state)}' for s in State),
            *_family("agent_uptime_seconds", "gauge", "Seconds since the agent process booted."),
            f"agent_uptime_seconds {time.monotonic() - snap.started_monotonic:.3f}",
        ]
        return "\n".join(lines) + "\n"

    def worker_metrics(self) -> str:
        """A worker's gauges: runnable jobs per agent (what an autoscaler scales the pool on), jobs run."""
        worker = self._board.snapshot().worker
        if worker is None:
            return ""
        runnable: dict[str, int] = worker.get("runnable_jobs") or {}
        lines = [
            *_family(
                "agentlife_runnable_jobs",
                "gauge",
                "Jobs claimable now (PENDING, or RETRYING past not_before), per agent, as last counted.",
            ),
            *(
                f'agentlife_runnable_jobs{{agent_id="{_label(agent)}"}} {count}'
                for agent, count in sorted(runnable.items())
            ),
            *_family(
                "agentlife_worker_jobs_total", "counter", "Jobs this worker process has run, by outcome."
            ),
            *(
                f'agentlife_worker_jobs_total{{outcome="{outcome}"}} {worker.get(key, 0)}'
                for outcome, key in (("done", "jobs_done"), ("crashed", "jobs_crashed"))
            ),
            *_family("agentlife_worker_busy", "gauge", "1 while this worker runs a job."),
            f"agentlife_worker_busy {int(worker.get('state') == 'busy')}",
        ]
        return "\n".join(lines) + "\n"

    def probe_metrics(self) -> str:
        """The probe server's own figures; the ``agentlife_probe_`` prefix is reserved for them."""
        snap = self._board.snapshot()
        lines = [
            *_family(
                "agentlife_probe_event_loop_silence_seconds",
                "gauge",
                "Seconds since the agent loop last ticked.",
            ),
            f"agentlife_probe_event_loop_silence_seconds {snap.loop_silence():.3f}",
            *_family(
                "agentlife_probe_event_loop_blocked", "gauge", "1 while the watchdog sees a blocked loop."
            ),
            f"agentlife_probe_event_loop_blocked {int(self._watchdog.blocked)}",
            *_family(
                "agentlife_probe_event_loop_blocks_total", "counter", "Blocks of the agent loop detected."
            ),
            f"agentlife_probe_event_loop_blocks_total {self._watchdog.blocks_total}",
            *_family(
                "agentlife_probe_connections_evicted_total", "counter", "Connections shed at the limit."
            ),
            f"agentlife_probe_connections_evicted_total {self.evictions_total}",
            *_family(
                "agentlife_probe_requests_total", "counter", "Probe requests answered, by path and code."
            ),
        ]
        for (path, code), count in sorted(self._requests.items()):
            lines.append(f'agentlife_probe_requests_total{{path="{path}",code="{code}"}} {count}')
        return "\n".join(lines) + "\n"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _family(name: str, kind: str, help_text: str) -> tuple[str, str]:
    return f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"


def _one_line(reason: str) -> bytes:
    return (" ".join(reason.split()) + "\n").encode()


class ProbeServer:
    """HTTP probes on their own thread and event loop.

    Args:
        board: the status board the agent's loop writes.
        host: interface to bind (``AGENTLIFE_HEALTH_HOST``; ``0.0.0.0`` in a pod).
        port: port to bind (``AGENTLIFE_HEALTH_PORT``); 0 picks a free one, published on the board and by
            `wait_started`.
        blocked_threshold: seconds without a lag-sampler tick after which the loop counts as blocked. It is
            written to the board, so ``/healthz`` and the watchdog's log line use the same threshold.
        logger: where start-up, bind failures and watchdog lines go.
        redactor: masks secrets in ``/status``; defaults to the secret-shape patterns only.
        client_timeout: a connection must complete a request within this many seconds of opening (and may
            stay idle this long between requests); slower clients are disconnected.
        max_connections: above this many open connections, the oldest is closed to make room, so a flood of
            slow clients can never lock the kubelet out.
        check_interval: how often the watchdog looks at the board; defaults to ``blocked_threshold / 4``.
    """

    def __init__(
        self,
        board: StatusBoard,
        host: str,
        port: int,
        *,
        blocked_threshold: float,
        logger: logging.Logger | None = None,
        redactor: Redactor | None = None,
        client_timeout: float = 3.0,
        max_connections: int = 64,
        check_interval: float | None = None,
    ) -> None:
        if not blocked_threshold > 0:
            raise ValueError(f"blocked_threshold must be > 0 s, got {blocked_threshold!r}")
        if (
            not client_timeout > 0
            or max_connections < 1
            or not (check_interval is None or check_interval > 0)
        ):
            raise ValueError("client_timeout and check_interval must be > 0 s, max_connections >= 1")
        self._board = board
        self._host = host
        self._requested_port = port
        self._logger = logger or get_logger("agentlife.probes")
        self._client_timeout = client_timeout
        self._max_connections = max_connections
        self._check_interval = check_interval if check_interval is not None else blocked_threshold / 4
        if board.snapshot().blocked_threshold_seconds != blocked_threshold:
            board.update(blocked_threshold_seconds=blocked_threshold)
        self._watchdog = LoopWatchdog(board, self._logger)
        self._router = ProbeRouter(board, self._watchdog, redactor or Redactor(), self._logger)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._stop_requested = False
        self._started = threading.Event()
        self._port: int | None = None
        self._last_eviction_log = -_EVICTION_LOG_EVERY_SECONDS
        self._last_malformed_log = -_MALFORMED_LOG_EVERY_SECONDS
        self._malformed_suppressed = 0
        self._connections: list[asyncio.StreamWriter] = []
        self._handlers: set[asyncio.Task[object]] = set()

    @property
    def port(self) -> int | None:
        """The bound port once listening, else None."""
        return self._port

    @property
    def is_running(self) -> bool:
        """Whether the probe thread is alive."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def router(self) -> ProbeRouter:
        """The endpoint logic (exposed for tests and for embedding the probes in another server)."""
        return self._router

    def start(self) -> None:
        """Spawn the probe thread and return at once; binding happens on that thread.

        It also lowers the interpreter's thread switch interval to `PROBE_SWITCH_INTERVAL` (1 ms). An answer
        takes several GIL hand-offs, and at CPython's default 5 ms interval each one waits up to 5 ms while
        the agent's loop is busy: /healthz p99 was 77 ms under 1 000 busy tasks, 15 ms at 1 ms. Threads
        that are idle, as the probe thread almost always is, make the interval cost nothing.

        Raises:
            RuntimeError: the server was already started.
        """
        with self._lock:
            if self._thread is not None:
                raise RuntimeError("ProbeServer.start() was already called")
            self._thread = threading.Thread(target=self._thread_main, name="agentlife-probes", daemon=True)
        if sys.getswitchinterval() > PROBE_SWITCH_INTERVAL:
            sys.setswitchinterval(PROBE_SWITCH_INTERVAL)
        self._thread.start()

    def wait_started(self, timeout: float | None = None) -> int | None:
        """Wait until the server listens (or gave up) and return its port.

        Args:
            timeout: seconds to wait; None waits as long as it takes.

        Returns:
            The bound port, or None when binding failed, the server was stopped, or ``timeout`` ran out.
        """
        self._started.wait(timeout)
        return self._port

    def stop(self, timeout: float = 2.0) -> None:
        """Close the listener and its connections and join the thread. Idempotent; safe before `start`.

        Args:
            timeout: seconds to wait for the thread; in-flight requests get the same budget.
        """
        with self._lock:
            self._stop_requested = True
            loop, stop_event, thread = self._loop, self._stop_event, self._thread
        if loop is not None and stop_event is not None:
            # RuntimeError: the loop already closed, the thread is on its way out.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop_event.set)
        if thread is None:
            self._started.set()  # nobody waits forever on a server that will never start
            return
        if thread is threading.current_thread():
            return
        thread.join(timeout)
        if thread.is_alive():
            self._logger.warning(
                "probe server thread did not stop within %.1fs; it is a daemon and dies with the process",
                timeout,
                extra=log_fields(event="probe_server_stop_timeout"),
            )

    # -- the probe thread --------------------------------------------------------------------------

    def _stopping(self) -> bool:
        with self._lock:
            return self._stop_requested

    def _thread_main(self) -> None:
        try:
            anyio.run(self._serve, backend="asyncio")
        except Exception:
            self._logger.exception(
                "probe server failed; the agent goes on without probes",
                extra=log_fields(event="probe_failed"),
            )
        finally:
            self._port = None
            self._started.set()

    async def _serve(self) -> None:
        stop_event = asyncio.Event()
        with self._lock:
            if self._stop_requested:
                return
            self._loop, self._stop_event = asyncio.get_running_loop(), stop_event
        listener = await self._bind()
        if listener is None:
            return
        try:
            self._publish_port(listener)
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch)
                await stop_event.wait()
                tg.cancel_scope.cancel()
        finally:
            listener.close()
            for writer in list(self._connections):
                writer.close()
            with anyio.CancelScope(shield=True), anyio.move_on_after(self._client_timeout):
                await listener.wait_closed()
                # Before Python 3.12 wait_closed does not wait for the handlers; one still running when the
                # loop ends is cancelled there, and asyncio logs that as "Exception in callback" (ERROR).
                if self._handlers:
                    await asyncio.wait(set(self._handlers))
            self._board.update(probe_port=None)

    async def _bind(self) -> asyncio.Server | None:
        try:
            return await asyncio.start_server(
                self._connection,
                self._host,
                self._requested_port,
                reuse_address=True,
                backlog=128,
                limit=_READ_LIMIT,
            )
        except OSError as exc:
            self._logger.error(  # one clear line: a traceback adds nothing to "port in use"
                "probe server cannot listen on %s:%s (%s); the agent goes on without probes",
                self._host,
                self._requested_port,
                exc.strerror or exc,
                extra=log_fields(event="probe_bind_failed", host=self._host, port=self._requested_port),
            )
            return None

    def _publish_port(self, listener: asyncio.Server) -> None:
        port = int(listener.sockets[0].getsockname()[1])
        self._port = port
        self._board.update(probe_port=port)
        self._started.set()
        self._logger.info(
            "probe server listening on %s:%d",
            self._host,
            port,
            extra=log_fields(event="probe_listening", host=self._host, port=port),
        )

    async def _watch(self) -> None:
        while True:
            self._watchdog.check()
            await anyio.sleep(self._check_interval)

    def _make_room(self) -> None:
        """Close the oldest connections beyond the limit: with newer ones behind them, they are stuck."""
        while len(self._connections) >= self._max_connections:
            self._connections.pop(0).close()
            self._router.evictions_total += 1
            self._log_eviction()

    def _log_eviction(self) -> None:
        now = time.monotonic()
        if now - self._last_eviction_log >= _EVICTION_LOG_EVERY_SECONDS:
            self._last_eviction_log = now
            self._logger.warning(
                "probe server at its limit of %d connections: closing the oldest (logged once a minute)",
                self._max_connections,
                extra=log_fields(
                    event="probe_connection_evicted", evicted_total=self._router.evictions_total
                ),
            )

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer requests until the client closes, asks to, errs, or stalls past the client timeout."""
        self._make_room()
        self._connections.append(writer)
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            keep_alive = True
            while keep_alive:
                answer, keep_alive = await self._answer(reader)
                if not answer:
                    break
                writer.write(answer)
                async with asyncio.timeout(self._client_timeout):
                    await writer.drain()
        except (ConnectionError, TimeoutError, OSError):
            pass  # the client went away or stalled reading its answer: nothing to tell anyone
        finally:
            if writer in self._connections:
                self._connections.remove(writer)
            if task is not None:
                self._handlers.discard(task)
            writer.close()

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[bytes, bool]:
        try:
            async with asyncio.timeout(self._client_timeout):
                request = await read_request(reader)
        except (EOFError, TimeoutError):
            return b"", False  # closed, idle or too slow: hang up without an answer
        except RequestError as exc:
            return self._refusal(exc.status, str(exc)), False
        ready = self._board.metrics_ready
        if ready is not None and request.path == "/metrics":
            # The telemetry is being built for this scrape: wait on a worker thread, not on this loop.
            await asyncio.to_thread(ready)
        return self._render(request), request.keep_alive

    def _render(self, request: HttpRequest) -> bytes:
        answer = self._router.respond(request.method, request.path, has_body=request.has_body)
        headers = dict(_COMMON_HEADERS)
        if answer.allow is not None:
            headers["Allow"] = answer.allow
        return render_response(
            answer.status,
            answer.body,
            answer.content_type,
            headers,
            head=request.method == "HEAD",
            keep_alive=request.keep_alive,
        )

    def _refusal(self, status: int, reason: str) -> bytes:
        now = time.monotonic()
        self._malformed_suppressed += 1
        if now - self._last_malformed_log >= _MALFORMED_LOG_EVERY_SECONDS:
            self._logger.warning(
                "probe server refused a malformed request (%s); %d such since the last line",
                reason,
                self._malformed_suppressed,
                extra=log_fields(event="probe_bad_request", status=status),
            )
            self._last_malformed_log, self._malformed_suppressed = now, 0
        return render_response(status, f"{reason}\n".encode(), _TEXT, dict(_COMMON_HEADERS))
