"""The probe server, over real HTTP on 127.0.0.1, driven through the health decision matrix."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import anyio
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentlife._observe._lag import run_lag_monitor
from agentlife._observe._probes import PROBE_PATHS, ProbeServer
from agentlife._observe._status import StatusBoard
from agentlife._redact import Redactor
from agentlife._state import State

SECRET = "sk-ant-api03-verysecretvalue123456"


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self, level: int) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno == level]


@dataclass
class Probe:
    board: StatusBoard
    server: ProbeServer
    client: httpx.Client
    log: ListHandler
    port: int


def plain_client(port: int, timeout: float = 5.0) -> httpx.Client:
    # Plain HTTP on loopback: verify=False only spares loading the CA bundle for every client (~80 ms).
    return httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=timeout, verify=False)


def make_logger() -> tuple[logging.Logger, ListHandler]:
    # A private logger: no global logging state is touched, and the records are ours alone.
    logger = logging.Logger("test.probes", logging.DEBUG)
    handler = ListHandler()
    logger.addHandler(handler)
    return logger, handler


@pytest.fixture
def probe() -> Iterator[Probe]:
    board = StatusBoard(job_id="job-42", agent_id="reviewer", attempt=3, pod_name="pod-a")
    logger, handler = make_logger()
    server = ProbeServer(
        board, "127.0.0.1", 0, blocked_threshold=5.0, logger=logger, redactor=Redactor([SECRET])
    )
    server.start()
    port = server.wait_started(timeout=20)
    assert port is not None
    with plain_client(port) as client:
        yield Probe(board, server, client, handler, port)
    server.stop()
    assert not server.is_running


# -- the decision matrix ------------------------------------------------------------------------

MATRIX = [
    # state, store has a free connection, /healthz, /healthz body, /readyz
    (State.BOOTING, None, 200, "ok", 503),
    (State.HYDRATING, None, 200, "ok", 503),
    (State.READY, None, 200, "ok", 200),
    (State.EXECUTING, None, 200, "ok", 200),
    (State.DRAINING, None, 200, "ok", 503),
    (State.TERMINATED, None, 503, "TERMINATED", 503),
    (State.READY, True, 200, "ok", 200),
    (State.EXECUTING, False, 503, "store pool has no free connection", 200),
    (State.HYDRATING, False, 503, "store pool has no free connection", 503),
    # Draining on purpose stays alive: a liveness kill mid-drain would lose the checkpoint.
    (State.DRAINING, False, 200, "ok", 503),
    (State.TERMINATED, False, 503, "TERMINATED", 503),
]


@pytest.mark.parametrize(("state", "store_free", "health", "reason", "ready"), MATRIX)
def test_decision_matrix(
    probe: Probe, state: State, store_free: bool | None, health: int, reason: str, ready: int
) -> None:
    probe.board.update(state=state)
    if store_free is not None:
        probe.board.store_has_free_connection = lambda: store_free
    r = probe.client.get("/healthz")
    assert (r.status_code, r.text) == (health, reason + "\n")
    r = probe.client.get("/readyz")
    assert r.status_code == ready
    assert r.text == ("ok\n" if ready == 200 else state.value + "\n")


def test_store_check_that_raises_counts_as_no_free_connection(probe: Probe) -> None:
    def broken() -> bool:
        raise RuntimeError("pool closed")

    probe.board.update(state=State.EXECUTING)
    probe.board.store_has_free_connection = broken
    r = probe.client.get("/healthz")
    assert (r.status_code, r.text) == (503, "store pool has no free connection\n")


def test_healthz_follows_the_board_as_it_changes(probe: Probe) -> None:
    seen = []
    for state in (
        State.BOOTING,
        State.HYDRATING,
        State.READY,
        State.EXECUTING,
        State.DRAINING,
        State.TERMINATED,
    ):
        probe.board.update(state=state)
        seen.append((probe.client.get("/healthz").status_code, probe.client.get("/readyz").status_code))
    assert seen == [(200, 503), (200, 503), (200, 200), (200, 200), (200, 503), (503, 503)]


# -- HTTP surface ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", PROBE_PATHS)
def test_head_answers_like_get_without_a_body(probe: Probe, path: str) -> None:
    probe.board.update(state=State.READY)
    get, head = probe.client.get(path), probe.client.head(path)
    assert head.status_code == get.status_code
    assert head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]
    assert head.headers["cache-control"] == "no-store"


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
@pytest.mark.parametrize("path", PROBE_PATHS)
def test_other_methods_get_405_with_allow(probe: Probe, method: str, path: str) -> None:
    r = probe.client.request(method, path)
    assert r.status_code == 405
    assert r.headers["allow"] == "GET, HEAD"
    assert r.headers["cache-control"] == "no-store"


@pytest.mark.parametrize("path", ["/", "/healthz/", "/HEALTHZ", "/metrics/x", "/favicon.ico", "/statusz"])
def test_unknown_paths_are_404(probe: Probe, path: str) -> None:
    r = probe.client.get(path)
    assert r.status_code == 404
    assert r.headers["cache-control"] == "no-store"


def test_query_string_is_ignored(probe: Probe) -> None:
    assert probe.client.get("/healthz", params={"verbose": "1"}).text == "ok\n"


def test_a_request_body_is_refused_and_the_connection_closed(probe: Probe) -> None:
    r = probe.client.request("GET", "/healthz", content=b"x" * 1000)
    assert r.status_code == 413
    assert r.headers["connection"] == "close"


def test_responses_never_advertise_library_versions(probe: Probe) -> None:
    r = probe.client.get("/healthz")
    assert r.headers["server"] == "agentlife"
    assert r.headers["x-content-type-options"] == "nosniff"


# -- /status and /metrics -------------------------------------------------------------------------


def test_status_reports_the_process_and_no_secret(probe: Probe) -> None:
    probe.board.update(state=State.EXECUTING, step=7)
    probe.board.tick(0.0123)
    probe.board.record_heartbeat(
        "sse", ok=False, error=f"401 from control plane: Bearer {SECRET}", failures=2
    )
    probe.board.record_heartbeat("job", ok=True)
    r = probe.client.get("/status")
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["state"] == "EXECUTING"
    assert body["step"] == 7
    assert body["attempt"] == 3
    assert body["job_id"] == "job-42"
    assert body["probe_port"] == probe.port
    assert body["loop_lag_seconds"] == pytest.approx(0.0123)
    assert 0 <= body["uptime_seconds"] < 600
    assert body["heartbeats"]["sse"]["failures"] == 2
    assert body["heartbeats"]["job"]["ok"] is True
    assert SECRET not in r.text
    assert "***" in body["heartbeats"]["sse"]["error"]


def metric_families(text: str) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    return {
        family.name: [(s.name, s.labels, s.value) for s in family.samples]
        for family in text_string_to_metric_families(text)
    }


def test_metrics_without_telemetry_serves_the_core_gauges(probe: Probe) -> None:
    probe.board.update(state=State.EXECUTING)
    probe.board.tick(0.25)
    for _ in range(3):
        probe.client.get("/healthz")
    probe.client.get("/nope")
    r = probe.client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = metric_families(r.text)
    assert families["agent_event_loop_lag_seconds"] == [("agent_event_loop_lag_seconds", {}, 0.25)]
    states = {labels["state"]: value for _, labels, value in families["agent_lifecycle_state"]}
    assert states == {s.value: float(s is State.EXECUTING) for s in State}
    requests = {
        (labels["path"], labels["code"]): value for _, labels, value in families["agentlife_probe_requests"]
    }
    assert requests[("/healthz", "200")] == 3
    assert requests[("other", "404")] == 1
    assert families["agentlife_probe_event_loop_blocked"][0][2] == 0


def test_metrics_serves_telemetry_text_plus_the_probe_figures(probe: Probe) -> None:
    probe.board.metrics_text = lambda: (
        "# HELP agent_steps_completed_total Steps.\n# TYPE agent_steps_completed_total counter\n"
        "agent_steps_completed_total 12.0"
    )
    families = metric_families(probe.client.get("/metrics").text)
    assert families["agent_steps_completed"] == [("agent_steps_completed_total", {}, 12.0)]
    assert "agentlife_probe_event_loop_blocks" in families
    # Telemetry owns the core gauges then: the probe server must not emit duplicates.
    assert "agent_event_loop_lag_seconds" not in families


def test_metrics_falls_back_when_telemetry_rendering_fails(probe: Probe) -> None:
    def broken() -> str:
        raise RuntimeError("exporter exploded")

    probe.board.metrics_text = broken
    r = probe.client.get("/metrics")
    assert r.status_code == 200
    assert "agent_event_loop_lag_seconds" in metric_families(r.text)
    assert any("exporter exploded" in m for m in probe.log.messages(logging.WARNING))


# -- start, stop, bind ------------------------------------------------------------------------------


def test_port_zero_is_published_on_the_board_and_logged(probe: Probe) -> None:
    assert probe.board.snapshot().probe_port == probe.port == probe.server.port
    assert f"probe server listening on 127.0.0.1:{probe.port}" in probe.log.messages(logging.INFO)


def test_stop_is_idempotent_closes_the_port_and_clears_the_board() -> None:
    board = StatusBoard(job_id="j", agent_id="a", attempt=1)
    server = ProbeServer(board, "127.0.0.1", 0, blocked_threshold=5.0, client_timeout=10.0)
    server.start()
    port = server.wait_started(20)
    assert port is not None
    # An idle keep-alive connection must not hold the stop up until its timeout.
    with plain_client(port) as client:
        assert client.get("/healthz").status_code == 200
        started = time.monotonic()
        server.stop()
        assert time.monotonic() - started < 5.0
    server.stop()
    assert not server.is_running
    assert server.port is None
    assert board.snapshot().probe_port is None
    with plain_client(port) as client, pytest.raises(httpx.ConnectError):
        client.get("/healthz")


def test_stop_before_start_and_double_start() -> None:
    board = StatusBoard(job_id="j", agent_id="a", attempt=1)
    server = ProbeServer(board, "127.0.0.1", 0, blocked_threshold=5.0)
    server.stop()
    assert server.wait_started(0.1) is None
    other = ProbeServer(board, "127.0.0.1", 0, blocked_threshold=5.0)
    other.start()
    try:
        with pytest.raises(RuntimeError, match="already"):
            other.start()
    finally:
        other.stop()


def test_stop_right_after_start_does_not_hang_or_leak_a_thread() -> None:
    board = StatusBoard(job_id="j", agent_id="a", attempt=1)
    server = ProbeServer(board, "127.0.0.1", 0, blocked_threshold=5.0)
    server.start()
    server.stop(timeout=10.0)
    assert not server.is_running
    assert board.snapshot().probe_port is None


def test_port_in_use_is_logged_and_never_crashes_the_agent() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        board = StatusBoard(job_id="j", agent_id="a", attempt=1)
        logger, handler = make_logger()
        server = ProbeServer(board, "127.0.0.1", port, blocked_threshold=5.0, logger=logger)
        server.start()
        assert server.wait_started(20) is None
        server.stop()
    errors = handler.messages(logging.ERROR)
    assert len(errors) == 1
    assert f"cannot listen on 127.0.0.1:{port}" in errors[0]
    assert "without probes" in errors[0]
    assert board.snapshot().probe_port is None


def test_blocked_threshold_is_written_to_the_board_so_both_sides_agree() -> None:
    board = StatusBoard(job_id="j", agent_id="a", attempt=1, blocked_threshold_seconds=5.0)
    ProbeServer(board, "127.0.0.1", 0, blocked_threshold=0.7)
    assert board.snapshot().blocked_threshold_seconds == 0.7


# -- the blocked loop ---------------------------------------------------------------------------------


@dataclass
class Observation:
    sent: float
    answered: float
    status: int
    text: str


class Poller:
    """Polls /healthz from its own thread, as the kubelet would, recording every answer."""

    def __init__(self, port: int, every: float = 0.02) -> None:
        self.observations: list[Observation] = []
        self._port, self._every = port, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Poller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        with plain_client(self._port, timeout=10.0) as client:
            while not self._stop.is_set():
                sent = time.monotonic()
                r = client.get("/healthz")
                self.observations.append(Observation(sent, time.monotonic(), r.status_code, r.text))
                self._stop.wait(self._every)


THRESHOLD, INTERVAL, BLOCK = 0.3, 0.05, 1.5


def blocking_sleep() -> None:
    time.sleep(BLOCK)


def blocking_cpu() -> None:
    # Holds the GIL except when the interpreter hands it over every switch interval (5 ms).
    end = time.monotonic() + BLOCK
    while time.monotonic() < end:
        pass


@pytest.mark.anyio
@pytest.mark.parametrize("block", [blocking_sleep, blocking_cpu], ids=["time.sleep", "cpu-bound"])
async def test_healthz_turns_503_while_the_agent_loop_is_blocked(block: Callable[[], None]) -> None:
    board = StatusBoard(job_id="j", agent_id="a", attempt=1)
    board.update(state=State.EXECUTING)
    logger, handler = make_logger()
    server = ProbeServer(board, "127.0.0.1", 0, blocked_threshold=THRESHOLD, logger=logger)
    server.start()
    port = server.wait_started(20)
    assert port is not None
    try:
        with Poller(port) as poller:
            async with anyio.create_task_group() as tg:
                tg.start_soon(run_lag_monitor, board, INTERVAL)
                await anyio.sleep(0.4)
                block_start = time.monotonic()
                block()  # this very event loop is now stuck
                block_end = time.monotonic()
                recovered_by = None
                with anyio.move_on_after(5):
                    while recovered_by is None:
                        await anyio.sleep(0.05)
                        if any(o.sent > block_end and o.status == 200 for o in poller.observations):
                            recovered_by = time.monotonic()
                await anyio.sleep(THRESHOLD)  # several watchdog checks, so it sees the recovery
                tg.cancel_scope.cancel()
    finally:
        server.stop()

    obs = poller.observations
    assert any(o.status == 200 and o.answered < block_start for o in obs), "never healthy before the block"
    during = [o for o in obs if o.status == 503 and o.answered < block_end]
    assert during, f"no 503 while the loop was blocked: {[(o.status, o.answered - block_start) for o in obs]}"
    assert during[0].answered - block_start <= THRESHOLD + 1.5
    assert during[0].text.startswith("event loop blocked for ")
    assert recovered_by is not None, "/healthz did not return to 200 after the block"

    warnings = handler.messages(logging.WARNING)
    assert len(warnings) == 1
    assert warnings[0].startswith("event loop blocked for ")
    assert len([m for m in handler.messages(logging.INFO) if m.startswith("event loop recovered")]) == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"blocked_threshold": 0.0},
        {"blocked_threshold": 5.0, "client_timeout": 0.0},
        {"blocked_threshold": 5.0, "max_connections": 0},
        {"blocked_threshold": 5.0, "check_interval": 0.0},
    ],
)
def test_nonsense_settings_are_refused(kwargs: dict[str, float]) -> None:
    board = StatusBoard(job_id="j", agent_id="a", attempt=1)
    with pytest.raises(ValueError, match="must be"):
        ProbeServer(board, "127.0.0.1", 0, **kwargs)  # type: ignore[arg-type]
