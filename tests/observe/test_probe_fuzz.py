"""Hostile and broken clients against a real probe server: it never crashes and /healthz keeps answering."""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import string
import struct
import threading
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentlife._observe._probes import PROBE_PATHS, ProbeServer
from agentlife._observe._status import StatusBoard
from agentlife._state import State

CLIENT_TIMEOUT = 1.0
# Generous: a probe answers in about a millisecond; this only catches a server that is stuck.
HEALTHZ_WITHIN = 2.0


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class Target:
    def __init__(self, server: ProbeServer, board: StatusBoard, port: int, log: ListHandler) -> None:
        self.server, self.board, self.port, self.log = server, board, port, log


def start_target(**kwargs: object) -> Target:
    board = StatusBoard(job_id="fuzz", agent_id="a", attempt=1)
    board.update(state=State.EXECUTING)
    logger = logging.Logger("test.fuzz", logging.DEBUG)
    handler = ListHandler()
    logger.addHandler(handler)
    server = ProbeServer(
        board,
        "127.0.0.1",
        0,
        blocked_threshold=5.0,
        logger=logger,
        client_timeout=CLIENT_TIMEOUT,
        **kwargs,  # type: ignore[arg-type]
    )
    server.start()
    port = server.wait_started(20)
    assert port is not None
    return Target(server, board, port, handler)


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    t = start_target()
    yield t
    t.server.stop()
    assert not t.server.is_running


def connect(port: int, timeout: float = 3.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def read_all(sock: socket.socket, limit: int = 1 << 20) -> bytes:
    chunks = []
    total = 0
    with contextlib.suppress(TimeoutError, ConnectionResetError):
        while total < limit:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    return b"".join(chunks)


def exchange(port: int, data: bytes, *, timeout: float = 3.0) -> bytes:
    """Send ``data``, half-close, and read until the server closes (or ``timeout``)."""
    with connect(port, timeout) as sock:
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        return read_all(sock)


def status_of(response: bytes) -> int | None:
    if not response.startswith(b"HTTP/1."):
        return None
    return int(response.split(b" ", 2)[1])


def healthz(port: int) -> tuple[int | None, float]:
    started = time.monotonic()
    response = exchange(port, b"GET /healthz HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
    return status_of(response), time.monotonic() - started


def assert_healthy(target: Target) -> None:
    assert target.server.is_running
    status, took = healthz(target.port)
    assert status == 200
    assert took < HEALTHZ_WITHIN


FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=False
)


@FUZZ
@given(data=st.binary(min_size=1, max_size=4096))
def test_garbage_bytes_never_crash_the_server(target: Target, data: bytes) -> None:
    # An incomplete request is held until the client timeout; no need to wait that long for each example.
    response = exchange(target.port, data, timeout=0.2)
    status = status_of(response)
    assert response == b"" or status is not None
    assert status is None or status < 500
    assert_healthy(target)


TOKEN = st.text(alphabet=string.ascii_letters + string.digits + "-_", min_size=1, max_size=12)
# Visible ASCII and spaces: what RFC 9110 allows in a field value.
HEADER_VALUE = st.text(alphabet=string.ascii_letters + string.digits + string.punctuation + " ", max_size=200)


KNOWN_METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "TRACE", "PATCH")


@st.composite
def requests(draw: st.DrawFn) -> tuple[bytes, str, str, bool]:
    method = draw(st.sampled_from(KNOWN_METHODS) | TOKEN)
    path = draw(st.sampled_from(PROBE_PATHS) | TOKEN.map(lambda s: "/" + s))
    version = draw(st.sampled_from(["HTTP/1.1", "HTTP/1.0"]))
    headers = draw(st.lists(st.tuples(TOKEN, HEADER_VALUE), max_size=8))
    body = draw(st.none() | st.binary(min_size=1, max_size=2048))
    lines = [f"{method} {path} {version}", "Host: probe", "Connection: close"]
    lines += [f"X-{name}: {value}" for name, value in headers]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    raw = ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")
    return raw, method, path, body is not None


@FUZZ
@given(request=requests())
def test_well_formed_requests_get_the_documented_answer(
    target: Target, request: tuple[bytes, str, str, bool]
) -> None:
    raw, method, path, has_body = request
    response = exchange(target.port, raw)
    status = status_of(response)
    if method not in KNOWN_METHODS:
        expected = {400, 404, 405}  # the parser only knows registered methods; others are a bad request
    elif path not in PROBE_PATHS:
        expected = {404}
    elif method not in ("GET", "HEAD"):
        expected = {405}
    elif has_body:
        expected = {413}
    else:
        expected = {200}
    assert status in expected, response[:300]
    head, _, _ = response.partition(b"\r\n\r\n")
    assert b"Cache-Control: no-store" in head
    if status == 405:
        assert b"Allow: GET, HEAD" in head
    assert_healthy(target)


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n", id="100KB-header"),
        pytest.param(b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\n\r\n", id="100KB-request-line"),
        pytest.param(
            b"GET /healthz HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(1000)) + b"\r\n",
            id="1000-headers",
        ),
        pytest.param(b"GET /healthz HTTP/9.9\r\n\r\n", id="bad-version"),
        pytest.param(b"GET /healthz HTTP/1.1\r\nContent-Length: -5\r\n\r\n", id="negative-length"),
        pytest.param(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64), id="tls-hello"),
    ],
)
def test_oversized_or_malformed_requests_are_refused(target: Target, request_bytes: bytes) -> None:
    response = exchange(target.port, request_bytes)
    # 400, or the precise refusal: 414 URI too long, 431 header fields too large, 505 version not supported.
    assert status_of(response) in (400, 414, 431, 505), response[:200]
    assert_healthy(target)


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /healthz HTTP/1.1\r\nHost: p\r\nContent-Length: 1000000\r\n\r\n" + b"x" * 65536,
        b"GET /healthz HTTP/1.1\r\nHost: p\r\nContent-Length: 1000000000\r\n\r\nxx",
        b"GET /healthz HTTP/1.1\r\nHost: p\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
    ],
    ids=["post-1MB", "get-1GB-announced", "get-chunked"],
)
def test_bodies_are_refused_without_being_read(target: Target, request_bytes: bytes) -> None:
    started = time.monotonic()
    with connect(target.port) as sock:
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            sock.sendall(request_bytes)
        # No half-close: the body is still "in flight", the server must answer and close on its own.
        response = read_all(sock)
    assert status_of(response) in (405, 413)
    assert b"Connection: close" in response
    assert time.monotonic() - started < CLIENT_TIMEOUT + HEALTHZ_WITHIN
    assert_healthy(target)


def test_pipelined_requests_are_answered_in_order(target: Target) -> None:
    target.board.update(state=State.DRAINING)
    try:
        response = exchange(
            target.port,
            b"GET /healthz HTTP/1.1\r\nHost: p\r\n\r\n"
            b"GET /readyz HTTP/1.1\r\nHost: p\r\n\r\n"
            b"GET /nope HTTP/1.1\r\nHost: p\r\nConnection: close\r\n\r\n",
        )
    finally:
        target.board.update(state=State.EXECUTING)
    statuses = [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", response)]
    assert statuses == [200, 503, 404]


class SlowClients:
    """``count`` connections that each dribble a request one byte per ``every`` seconds."""

    REQUEST = b"GET /healthz HTTP/1.1\r\nHost: slow\r\nUser-Agent: slowloris\r\nX-Padding: " + b"p" * 200

    def __init__(self, port: int, count: int, every: float = 0.1) -> None:
        self.socks = [connect(port) for _ in range(count)]
        self.closed_by_server: set[int] = set()
        self._every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._dribble, daemon=True)

    def __enter__(self) -> SlowClients:
        for sock in self.socks:
            sock.setblocking(False)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        for sock in self.socks:
            sock.close()

    def _dribble(self) -> None:
        offset = 0
        while not self._stop.is_set() and offset < len(self.REQUEST):
            for i, sock in enumerate(self.socks):
                if i in self.closed_by_server:
                    continue
                try:
                    if sock.recv(1024) == b"":
                        self.closed_by_server.add(i)
                        continue
                except BlockingIOError:
                    pass
                except OSError:
                    self.closed_by_server.add(i)
                    continue
                with contextlib.suppress(BlockingIOError, OSError):
                    sock.send(self.REQUEST[offset : offset + 1])
            offset += 1
            self._stop.wait(self._every)


def test_slow_clients_cannot_hold_up_healthz_and_are_disconnected(target: Target) -> None:
    with SlowClients(target.port, count=50) as slow:
        latencies = []
        for _ in range(10):
            status, took = healthz(target.port)
            assert status == 200
            latencies.append(took)
            time.sleep(0.05)
        assert max(latencies) < HEALTHZ_WITHIN
        # The server gives a connection CLIENT_TIMEOUT to send its request, then drops it.
        deadline = time.monotonic() + CLIENT_TIMEOUT + 3.0
        while len(slow.closed_by_server) < 50 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(slow.closed_by_server) == 50
    assert_healthy(target)


def test_half_open_and_reset_connections_are_harmless(target: Target) -> None:
    half_closed, idle = [], []
    try:
        for _ in range(20):
            sock = connect(target.port)
            sock.sendall(b"GET /heal")
            sock.shutdown(socket.SHUT_WR)  # never finishes the request, never reads
            half_closed.append(sock)
        for _ in range(20):
            sock = connect(target.port)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHo")
            # SO_LINGER 0: close() sends a RST instead of a FIN.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        for _ in range(20):
            idle.append(connect(target.port))  # connects, says nothing
        assert_healthy(target)
        for sock in half_closed + idle:
            sock.settimeout(CLIENT_TIMEOUT + 3.0)
            assert read_all(sock) == b""  # closed by the server, without an answer
    finally:
        for sock in half_closed + idle:
            sock.close()
    assert_healthy(target)


def test_a_connection_flood_evicts_the_oldest_and_never_locks_out_a_probe() -> None:
    small = start_target(max_connections=8)
    socks = []
    try:
        for _ in range(30):
            socks.append(connect(small.port))
            time.sleep(0.002)  # keep the accept order deterministic
        assert_healthy(small)
        socks[0].settimeout(2.0)
        assert read_all(socks[0]) == b""  # the oldest was closed to make room
        metrics = exchange(
            small.port, b"GET /metrics HTTP/1.1\r\nHost: p\r\nConnection: close\r\n\r\n"
        ).decode()
        evicted = next(
            line
            for line in metrics.splitlines()
            if line.startswith("agentlife_probe_connections_evicted_total ")
        )
        assert int(evicted.split()[1]) >= 20
        eviction_lines = [r for r in small.log.records if "limit of 8 connections" in r.getMessage()]
        assert len(eviction_lines) == 1  # 20+ evictions, one line: rate-limited
    finally:
        for sock in socks:
            sock.close()
        small.server.stop()


def test_malformed_requests_do_not_flood_the_log_with_tracebacks() -> None:
    quiet = start_target()
    try:
        for _ in range(30):
            exchange(quiet.port, b"GET /healthz HTTP/1.1\r\nBad Header Without Colon\r\n\r\n")
        assert_healthy(quiet)
    finally:
        quiet.server.stop()
    assert not [r for r in quiet.log.records if r.levelno >= logging.ERROR]
    assert not [r for r in quiet.log.records if r.exc_info]
    refused = [r for r in quiet.log.records if "malformed request" in r.getMessage()]
    assert len(refused) == 1
    assert refused[0].levelno == logging.WARNING
