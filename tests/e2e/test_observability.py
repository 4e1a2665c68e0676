"""Observability through the runtime: probes, heartbeats, /metrics, secrets, JSON logs of real processes.

The unit tests of `_probes`, `_lag`, `_heartbeat` and `_telemetry` prove each part alone; these prove them
wired together: real ``python -m agentlife run`` processes (`agents.obs_agent.ObsAgent`, paced by marker
files) with real signals and real HTTP, real PostgreSQL, and the `ControlPlaneStub` receiving real SSE. Two
cases run in-process (`AgentHarness` with ``probes=True``) because they need a hand inside the runtime: the
exhausted store pool and the answers at TERMINATED.
"""

from __future__ import annotations

import contextlib
import itertools
import secrets
import signal
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from _pg import PostgresServer
from agentlife import State, tool
from agentlife.stores import PostgresStore
from agentlife.testing import ControlPlaneStub, HeartbeatMonitor, HeartbeatStatus
from procs import agent_env, spawn

AGENT = "agents.obs_agent:ObsAgent"
AGENT_ID = "obs-agent"
POD = "obs-pod-7"
STATES = {s.value for s in State}

# -- helpers --------------------------------------------------------------------------------------------


def _env(tmp_path: Path, job_id: str, **extra: str) -> dict[str, str]:
    markers = tmp_path / "markers"
    markers.mkdir(exist_ok=True)
    return agent_env(
        tmp_path / "data", AGENTLIFE_JOB_ID=job_id, TEST_MARKER_DIR=str(markers), HOSTNAME=POD, **extra
    )


class Agent:
    """A real agent process; its stdout and stderr are collected line by line while it runs."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.markers = Path(env["TEST_MARKER_DIR"])
        self.proc = spawn(AGENT, env, *args)
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.exited_at: float | None = None
        self._readers = [
            threading.Thread(target=_collect, args=(self.proc.stdout, self.stdout), daemon=True),
            threading.Thread(target=_collect, args=(self.proc.stderr, self.stderr), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def marker(self, name: str) -> Path:
        return self.markers / name

    def release(self, step: int) -> None:
        """Let the ``gate`` of ``step`` pass."""
        self.marker(f"go-{step}").touch()

    def wait_marker(self, name: str, timeout: float = 15.0) -> float:
        """Wait (blocking) until the agent touched ``name``; returns when this side saw it."""
        deadline = time.monotonic() + timeout
        while not self.marker(name).exists():
            self._check_alive(name)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} not reached in {timeout}s\n{self.output()}")
            time.sleep(0.005)
        return time.monotonic()

    async def await_marker(self, name: str, timeout: float = 15.0) -> None:
        """Like `wait_marker`, without blocking the test's event loop (the control-plane stub runs on it)."""
        with anyio.fail_after(timeout):
            while not self.marker(name).exists():
                self._check_alive(name)
                await anyio.sleep(0.01)

    def _check_alive(self, waiting_for: str) -> None:
        if self.proc.poll() is not None:
            self.join()
            raise AssertionError(f"agent exited {self.proc.returncode} before {waiting_for}\n{self.output()}")

    def probe_port(self, timeout: float = 15.0) -> int:
        """The port of the ``probe server listening on`` log line (``AGENTLIFE_HEALTH_PORT=0``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.stdout):
                entry = orjson.loads(line)
                if entry.get("event") == "probe_listening":
                    return int(entry["port"])
            self._check_alive("the probe server")
            time.sleep(0.005)
        raise TimeoutError(f"no probe_listening log line in {timeout}s\n{self.output()}")

    def signal(self, sig: int = signal.SIGTERM) -> float:
        self.proc.send_signal(sig)
        return time.monotonic()

    def poll_exit(self) -> int | None:
        code = self.proc.poll()
        if code is not None and self.exited_at is None:
            self.exited_at = time.monotonic()
        return code

    def wait(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while self.poll_exit() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"agent still running after {timeout}s\n{self.output()}")
            time.sleep(0.005)
        self.join()
        return self.proc.returncode

    async def await_exit(self, timeout: float = 30.0) -> int:
        with anyio.fail_after(timeout):
            while self.poll_exit() is None:
                await anyio.sleep(0.01)
        self.join()
        return self.proc.returncode

    def join(self) -> None:
        for reader in self._readers:
            reader.join(5)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.join()

    def output(self) -> str:
        return "\n".join(["--- stdout", *self.stdout[-40:], "--- stderr", *self.stderr[-40:]])


def _collect(pipe: Any, into: list[str]) -> None:
    for raw in pipe:
        into.append(raw.decode(errors="replace").rstrip("\n"))


@contextlib.contextmanager
def running(agent: Agent) -> Iterator[Agent]:
    """Never leave a child behind when an assertion fails half-way."""
    try:
        yield agent
    finally:
        agent.kill()


@contextlib.contextmanager
def black_hole() -> Iterator[int]:
    """A TCP server that accepts connections and never reads from or answers on them."""
    server = socket.create_server(("127.0.0.1", 0), backlog=64)
    server.settimeout(0.05)  # closing a socket does not wake a blocked accept(): poll a flag instead
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            held.append(conn)

    thread = threading.Thread(target=accept, name="black-hole", daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        stop.set()
        thread.join(5)
        server.close()
        for conn in held:
            conn.close()


def closed_port() -> int:
    """A port nothing listens on (bound once, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(client: httpx.Client, path: str) -> tuple[int, str]:
    response = client.get(path)
    return response.status_code, response.text.strip()


def probe_client(port: int) -> httpx.Client:
    return httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5.0)


def families(text: str) -> dict[str, Any]:
    """``/metrics`` parsed by the reference Prometheus parser (it raises on malformed exposition)."""
    return {family.name: family for family in text_string_to_metric_families(text)}


def sample(family: Any, suffix: str = "", **labels: str) -> float:
    """The value of the one sample ``{family}{suffix}`` of ``family`` whose labels include ``labels``."""
    matches = [
        s.value
        for s in family.samples
        if s.name == family.name + suffix and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(matches) == 1, (family.name, suffix, labels, family.samples)
    return float(matches[0])


def journal_events(data_dir: Path, job_id: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for path in sorted((data_dir / "sessions" / job_id).glob("session_*.jsonl")):
        events.extend(orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip())
    return events


#: Instrument -> the Prometheus family `_telemetry` renders for it (counters drop ``_total``).
INSTRUMENT_FAMILIES = {
    "agent.lifecycle.state": ("agent_lifecycle_state", "gauge"),
    "agent.steps.completed": ("agent_steps_completed", "counter"),
    "agent.llm.calls": ("agent_llm_calls", "counter"),
    "agent.tool.calls": ("agent_tool_calls", "counter"),
    "agent.drains": ("agent_drains", "counter"),
    "agent.event_loop.lag": ("agent_event_loop_lag_seconds", "gauge"),
    "agent.hydration.duration": ("agent_hydration_duration_seconds", "histogram"),
    "agent.step.duration": ("agent_step_duration_seconds", "histogram"),
    "agent.drain.duration": ("agent_drain_duration_seconds", "histogram"),
    "agent.bootstrap_seconds": ("agent_bootstrap_seconds", "histogram"),
    "agent.execution_seconds": ("agent_execution_seconds", "histogram"),
}


# -- 1. probes of a real process in every state -----------------------------------------------------------

BLOCK_THRESHOLD = 0.6
BLOCK_SECONDS = 1.8
MEMORY_TIMEOUT = 1.0


@dataclass
class ProbedRun:
    """What the probes answered during one real run (see `probed_run`)."""

    port: int
    hydrating: list[tuple[tuple[int, str], tuple[int, str]]] = field(default_factory=list)
    hydrating_seconds: float = 0.0
    executing: dict[str, Any] = field(default_factory=dict)
    blocked: dict[str, Any] = field(default_factory=dict)
    draining: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def probed_run(tmp_path_factory: pytest.TempPathFactory) -> ProbedRun:
    """One real agent taken through HYDRATING, EXECUTING, a blocked loop and DRAINING, probed all along.

    Hydration is slow on purpose: ``AGENTLIFE_QDRANT_URL`` names a server that accepts and never answers,
    so the memory step waits for its (scaled) timeout. Step 0 makes an LLM and a tool call and waits at a
    gate; step 1 blocks the event loop with ``time.sleep``; step 2 waits at a gate while SIGTERM arrives.
    """
    tmp_path = tmp_path_factory.mktemp("probes")
    with black_hole() as qdrant_port:
        env = _env(
            tmp_path,
            "obs-probes",
            OBS_PLAN=f"llm+tool+gate,block:{BLOCK_SECONDS},gate,sleep:0",
            AGENTLIFE_QDRANT_URL=f"http://127.0.0.1:{qdrant_port}",
            AGENTLIFE_HYDRATION_MEMORY_TIMEOUT_SECONDS=str(MEMORY_TIMEOUT),
            AGENTLIFE_PROBE_BLOCKED_THRESHOLD_SECONDS=str(BLOCK_THRESHOLD),
            AGENTLIFE_PROBE_LAG_INTERVAL_SECONDS="0.1",
        )
        with running(Agent(env)) as agent:
            run = ProbedRun(port=agent.probe_port())
            with probe_client(run.port) as client:
                _observe_hydration(agent, client, run)
                _observe_executing(agent, client, run)
                _observe_block(agent, client, run)
                _observe_drain(agent, client, run)
                run.exit_code = agent.wait()  # a keep-alive probe connection is still open at the exit
            run.stdout, run.stderr = list(agent.stdout), list(agent.stderr)
    return run


def _state(client: httpx.Client) -> str:
    return str(client.get("/status").json()["state"])


def _observe_hydration(agent: Agent, client: httpx.Client, run: ProbedRun) -> None:
    deadline = time.monotonic() + 20
    first_seen: float | None = None
    while time.monotonic() < deadline:
        before = _state(client)
        if before in ("READY", "EXECUTING"):
            break
        if before != "HYDRATING":
            time.sleep(0.01)
            continue
        first_seen = first_seen or time.monotonic()
        answers = (get(client, "/healthz"), get(client, "/readyz"))
        if _state(client) == "HYDRATING":  # both answers were given in HYDRATING
            run.hydrating.append(answers)
        time.sleep(0.05)
    run.hydrating_seconds = time.monotonic() - first_seen if first_seen else 0.0


def _observe_executing(agent: Agent, client: httpx.Client, run: ProbedRun) -> None:
    agent.wait_marker("at-0")  # step 0 waits at its gate: the state cannot change under us
    run.executing = {
        "healthz": get(client, "/healthz"),
        "readyz": get(client, "/readyz"),
        "status": client.get("/status").json(),
    }
    agent.release(0)


def _observe_block(agent: Agent, client: httpx.Client, run: ProbedRun) -> None:
    started = agent.wait_marker("at-1")  # touched right before time.sleep
    first_503: tuple[float, str, bool] | None = None
    while time.monotonic() - started < BLOCK_THRESHOLD + 1.5:
        code, body = get(client, "/healthz")
        if code == 503:
            # The marker after time.sleep is still missing *after* the answer: the block was going on.
            first_503 = (time.monotonic() - started, body, agent.marker("after-1").exists())
            break
        time.sleep(0.02)
    run.blocked["first_503"] = first_503
    run.blocked["during"] = {"readyz": get(client, "/readyz"), "status": client.get("/status").json()}
    recovered: tuple[int, str] | None = None
    deadline = time.monotonic() + BLOCK_SECONDS + 5
    while time.monotonic() < deadline:
        recovered = get(client, "/healthz")
        if recovered[0] == 200:
            break
        time.sleep(0.02)
    run.blocked["recovered"] = recovered
    run.blocked["unblocked_before_recovery"] = agent.marker("after-1").exists()
    # The watchdog logs the end of the block, and the sampler's drift is back to normal on its next tick.
    deadline = time.monotonic() + 5
    while not any("event loop recovered after" in line for line in agent.stdout):
        assert time.monotonic() < deadline, agent.output()
        time.sleep(0.01)
    while client.get("/status").json()["loop_lag_seconds"] >= BLOCK_THRESHOLD:
        assert time.monotonic() < deadline, agent.output()
        time.sleep(0.01)


def _observe_drain(agent: Agent, client: httpx.Client, run: ProbedRun) -> None:
    agent.wait_marker("at-2")  # step 2 waits at its gate, a tool call in flight
    agent.signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while _state(client) != "DRAINING":
        assert time.monotonic() < deadline, agent.output()
        time.sleep(0.01)
    run.draining = {
        "healthz": get(client, "/healthz"),
        "readyz": get(client, "/readyz"),
        "status": client.get("/status").json(),
        "metrics": client.get("/metrics").text,
        "state_after": _state(client),
    }
    agent.release(2)


def test_hydrating_is_alive_and_not_ready(probed_run: ProbedRun) -> None:
    assert probed_run.hydrating, "never caught the agent in HYDRATING"
    assert set(probed_run.hydrating) == {((200, "ok"), (503, "HYDRATING"))}
    # The memory step waited for its scaled timeout, not the qdrant client's own 5 s.
    assert MEMORY_TIMEOUT * 0.5 < probed_run.hydrating_seconds < MEMORY_TIMEOUT + 3.0
    warnings = [orjson.loads(line)["msg"] for line in probed_run.stdout]
    assert any(msg.startswith("memory fetch failed") for msg in warnings)


def test_executing_is_alive_and_ready_and_status_describes_the_process(probed_run: ProbedRun) -> None:
    executing = probed_run.executing
    assert executing["healthz"] == (200, "ok")
    assert executing["readyz"] == (200, "ok")
    status = executing["status"]
    assert status["state"] == "EXECUTING" and status["step"] == 0
    assert status["job_id"] == "obs-probes" and status["agent_id"] == AGENT_ID
    assert status["attempt"] == 1 and status["pod_name"] == POD
    assert status["probe_port"] == probed_run.port
    assert status["uptime_seconds"] > 0
    assert 0 <= status["loop_lag_seconds"] < BLOCK_THRESHOLD
    assert status["heartbeats"]["job"]["ok"] is True  # the job heartbeat ran once at start


def test_healthz_is_503_while_the_loop_is_blocked_and_200_after(probed_run: ProbedRun) -> None:
    first_503 = probed_run.blocked["first_503"]
    assert first_503 is not None, f"no 503 within {BLOCK_THRESHOLD + 1.5}s of the block starting"
    seconds, body, block_had_ended = first_503
    assert not block_had_ended, "the 503 came only after the block was over"
    assert body.startswith("event loop blocked for ")
    assert seconds < BLOCK_THRESHOLD + 1.5
    during = probed_run.blocked["during"]
    assert during["readyz"] == (200, "ok")  # readiness follows the state, liveness the loop
    assert during["status"]["state"] == "EXECUTING" and during["status"]["step"] == 1
    assert during["status"]["loop_silence_seconds"] >= BLOCK_THRESHOLD
    assert probed_run.blocked["recovered"] == (200, "ok")
    assert probed_run.blocked["unblocked_before_recovery"]
    messages = [orjson.loads(line)["msg"] for line in probed_run.stdout]
    assert any(m.startswith("event loop blocked for") for m in messages)
    assert any(m.startswith("event loop recovered after") for m in messages)


def test_draining_is_alive_and_not_ready(probed_run: ProbedRun) -> None:
    draining = probed_run.draining
    assert draining["healthz"] == (200, "ok")  # a liveness failure now would kill the pod mid-save
    assert draining["readyz"] == (503, "DRAINING")
    assert draining["status"]["state"] == "DRAINING" and draining["status"]["step"] == 2
    assert draining["state_after"] == "DRAINING"
    assert probed_run.exit_code == 143


def test_metrics_of_a_running_agent_hold_every_instrument(probed_run: ProbedRun) -> None:
    parsed = families(probed_run.draining["metrics"])
    for instrument, (name, kind) in INSTRUMENT_FAMILIES.items():
        assert name in parsed, f"{instrument} missing from /metrics"
        assert parsed[name].type == kind, instrument
    assert sample(parsed["agent_lifecycle_state"], state="DRAINING") == 1
    assert sample(parsed["agent_lifecycle_state"], state="EXECUTING") == 0
    assert sample(parsed["agent_steps_completed"], "_total") == 2
    assert sample(parsed["agent_llm_calls"], "_total", outcome="ok") == 1
    assert sample(parsed["agent_tool_calls"], "_total", tool="effect", outcome="ok") == 1
    assert sample(parsed["agent_tool_calls"], "_total", tool="gate", outcome="ok") == 1
    assert 0 <= sample(parsed["agent_event_loop_lag_seconds"]) < BLOCK_THRESHOLD
    assert sample(parsed["agent_step_duration_seconds"], "_count") == 2
    assert sample(parsed["agent_step_duration_seconds"], "_sum") >= BLOCK_SECONDS
    assert sample(parsed["agent_hydration_duration_seconds"], "_count", phase="memory") == 1
    assert sample(parsed["agent_hydration_duration_seconds"], "_sum", phase="memory") >= MEMORY_TIMEOUT * 0.5
    for phase in ("claim", "checkpoint", "journal_scan"):
        assert sample(parsed["agent_hydration_duration_seconds"], "_count", phase=phase) == 1
    # cold or warm depends on where the test runs (see `bootstrap_kind`): one first tool dispatch either way.
    boots = [s for s in parsed["agent_bootstrap_seconds"].samples if s.name.endswith("_count")]
    assert [(s.labels["start"] in ("cold", "warm"), s.value) for s in boots] == [(True, 1)]
    # EXECUTING -> DRAINING happened: the execution phase of the phase budget is on record.
    assert sample(parsed["agent_execution_seconds"], "_count") == 1
    assert sample(parsed["agent_execution_seconds"], "_sum") >= BLOCK_SECONDS
    # Drains are counted when the drain ends (see the TERMINATED test): declared, no sample yet.
    assert not parsed["agent_drains"].samples


def test_every_stdout_line_is_one_json_object_with_the_context(probed_run: ProbedRun) -> None:
    assert len(probed_run.stdout) > 10
    for line in probed_run.stdout:
        entry = orjson.loads(line)
        assert isinstance(entry, dict), line
        assert {"ts", "level", "logger", "msg", "job_id", "agent_id", "state", "step"} <= entry.keys(), line
        assert entry["job_id"] == "obs-probes", line
        assert entry["agent_id"] == AGENT_ID, line
        assert entry["state"] in STATES, line
        assert entry["step"] is None or isinstance(entry["step"], int), line
    # Even the probe thread's line, written before the settings are read, names the job (checked above).
    assert any(orjson.loads(line).get("event") == "probe_listening" for line in probed_run.stdout)
    errors = [line for line in probed_run.stdout if orjson.loads(line)["level"] in ("ERROR", "CRITICAL")]
    assert errors == []  # a clean run and drain log nothing alarming (the probe server's stop included)
    steps = {orjson.loads(line)["step"] for line in probed_run.stdout}
    assert {1, 2} <= steps <= {None, 0, 1, 2}  # step 0 logs nothing of its own
    assert probed_run.stderr == []


# -- 1b. in-process: exhausted store pool, TERMINATED ------------------------------------------------------


@tool(side_effects=True)
async def record(step: int) -> int:
    return step


# -- 2. heartbeats of a real process ----------------------------------------------------------------------

INTERVAL = 0.25
TOKEN = "cp-token-" + secrets.token_hex(12)
HEARTBEAT_KEYS = {
    "type",
    "timestamp",
    "agentId",
    "jobId",
    "podName",
    "lifecycleState",
    "currentStep",
    "metrics",
}
METRIC_KEYS = {"rssMb", "uptimeSeconds", "stepsCompleted", "llmCallsTotal", "toolCallsTotal"}


def _heartbeat_env(tmp_path: Path, job_id: str, url: str, **extra: str) -> dict[str, str]:
    return _env(
        tmp_path,
        job_id,
        AGENTLIFE_CONTROL_PLANE_URL=url,
        AGENTLIFE_CONTROL_PLANE_TOKEN=TOKEN,
        AGENTLIFE_HEARTBEAT_SSE_INTERVAL_SECONDS=str(INTERVAL),
        AGENTLIFE_HEARTBEAT_UNHEALTHY_AFTER_SECONDS=str(3 * INTERVAL),
        **extra,
    )


@pytest.mark.anyio
async def test_heartbeats_lifecycle_and_reconnect_from_a_real_process(tmp_path: Path) -> None:
    monitor = HeartbeatMonitor(interval=INTERVAL, unhealthy_after=3 * INTERVAL)
    stub = ControlPlaneStub(token=TOKEN, monitor=monitor)
    await stub.start()
    try:
        env = _heartbeat_env(tmp_path, "obs-hb", stub.url, OBS_PLAN="llm+tool,gate,sleep:0")
        with running(Agent(env)) as agent:
            await agent.await_marker("at-1")
            with anyio.fail_after(10):
                while len(_heartbeats(stub, connection_id=1)) < 6:
                    await anyio.sleep(0.02)
            beats = _heartbeats(stub, connection_id=1)
            gaps = [b.received_at - a.received_at for a, b in itertools.pairwise(beats[1:])]
            assert 0.6 * INTERVAL < statistics.median(gaps) < 1.6 * INTERVAL, gaps
            assert max(gaps) < 4 * INTERVAL, gaps
            for beat in beats:
                assert beat.data.keys() == HEARTBEAT_KEYS
                assert beat.data["metrics"].keys() == METRIC_KEYS
                assert beat.data["type"] == "heartbeat" and beat.agent_id == AGENT_ID
                assert (beat.data["agentId"], beat.data["jobId"], beat.data["podName"]) == (
                    AGENT_ID,
                    "obs-hb",
                    POD,
                )
                datetime.fromisoformat(beat.data["timestamp"])
            last = beats[-1].data
            assert last["lifecycleState"] == "EXECUTING" and last["currentStep"] == 1
            assert last["metrics"]["stepsCompleted"] == 1
            assert last["metrics"]["llmCallsTotal"] == 1 and last["metrics"]["toolCallsTotal"] == 1
            assert last["metrics"]["rssMb"] > 0 and last["metrics"]["uptimeSeconds"] > 0
            assert monitor.status(AGENT_ID) is HeartbeatStatus.OK

            # The control plane goes away and comes back where the agent expects it.
            await stub.stop()
            await anyio.sleep(3.5 * INTERVAL)
            assert monitor.status(AGENT_ID) is HeartbeatStatus.UNHEALTHY
            await stub.start()
            await stub.wait_for_streams(2, timeout=10)
            await stub.wait_for(lambda e: e.connection_id == 2, event="heartbeat", timeout=5)
            assert monitor.status(AGENT_ID) is HeartbeatStatus.OK

            agent.signal(signal.SIGTERM)
            draining = await stub.wait_for(lambda e: e.data["to"] == "DRAINING", event="lifecycle", timeout=5)
            assert agent.poll_exit() is None, "DRAINING must arrive at once, not after the drain"
            assert draining.data["reason"] == "SIGTERM"
            agent.release(1)
            assert await agent.await_exit() == 143
            await stub.wait_for(lambda e: e.data["to"] == "TERMINATED", event="lifecycle", timeout=5)
    finally:
        await stub.stop()
    unique = {e.event_id: e.data for e in stub.events_of("lifecycle")}
    assert [(d["from"], d["to"]) for d in unique.values()] == [
        ("BOOTING", "HYDRATING"),
        ("HYDRATING", "READY"),
        ("READY", "EXECUTING"),
        ("EXECUTING", "DRAINING"),
        ("DRAINING", "TERMINATED"),
    ]
    assert stub.rejected == 0
    assert monitor.status(AGENT_ID) is HeartbeatStatus.TERMINATED


def _heartbeats(stub: ControlPlaneStub, connection_id: int) -> list[Any]:
    return [e for e in stub.events_of("heartbeat") if e.connection_id == connection_id]


def test_a_dead_control_plane_never_slows_a_step_or_the_drain(tmp_path: Path) -> None:
    plan = ",".join(["sleep:0.02"] * 5000)
    with black_hole() as hole:
        urls = {
            "none": None,
            "closed": f"http://127.0.0.1:{closed_port()}",
            "black_hole": f"http://127.0.0.1:{hole}",
        }
        agents: dict[str, Agent] = {}
        try:
            for name, url in urls.items():
                base = tmp_path / name
                base.mkdir()
                env = (
                    _heartbeat_env(base, f"obs-{name}", url, OBS_PLAN=plan)
                    if url
                    else _env(base, f"obs-{name}", OBS_PLAN=plan)
                )
                agents[name] = Agent(env)
            for agent in agents.values():
                agent.wait_marker("done-15")
            with probe_client(agents["closed"].probe_port()) as client:
                sse = client.get("/status").json()["heartbeats"]["sse"]
            assert sse["ok"] is False and sse["failures"] >= 1
            assert TOKEN not in orjson.dumps(sse).decode()
            sent = {name: agent.signal(signal.SIGTERM) for name, agent in agents.items()}
            deadline = time.monotonic() + 20
            while any(agent.poll_exit() is None for agent in agents.values()):
                assert time.monotonic() < deadline
                time.sleep(0.002)
        finally:
            for agent in agents.values():
                agent.kill()
    drain = {}
    step = {}
    for name, agent in agents.items():
        assert agent.proc.returncode == 143, agent.output()
        assert agent.exited_at is not None
        drain[name] = agent.exited_at - sent[name]
        step[name] = statistics.median(_step_seconds(tmp_path / name / "data", f"obs-{name}"))
    for name in ("closed", "black_hole"):
        assert step[name] < step["none"] + 0.05, (step, drain)
        assert drain[name] < drain["none"] + 0.7, (step, drain)  # a dead plane once added 1 s


def _step_seconds(data_dir: Path, job_id: str) -> list[float]:
    started: dict[int, float] = {}
    durations = []
    for event in journal_events(data_dir, job_id):
        if event["type"] == "STEP_STARTED":
            started[event["step"]] = event["ts"]
        elif event["type"] == "CHECKPOINT_WRITTEN" and event["step"] in started:
            durations.append(event["ts"] - started[event["step"]])
    assert len(durations) >= 15
    return durations


# -- 4. secrets ---------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_planted_secrets_appear_nowhere(
    tmp_path: Path, postgres_server: PostgresServer, postgres_url: str
) -> None:
    api_key = "sk-ant-api03-" + secrets.token_urlsafe(32)
    password = postgres_server.password
    assert f":{password}@" in postgres_url
    planted = {"ANTHROPIC_API_KEY": api_key, "AGENTLIFE_CONTROL_PLANE_TOKEN": TOKEN, "password": password}
    store = PostgresStore(postgres_url, create_schema=True)
    await store.open()
    await store.close()

    stub = ControlPlaneStub(token=TOKEN)
    await stub.start()
    try:
        env = _heartbeat_env(
            tmp_path,
            "obs-secrets",
            stub.url,
            OBS_PLAN="fail+gate,crash",
            AGENTLIFE_DATABASE_URL=postgres_url,
            ANTHROPIC_API_KEY=api_key,
        )
        with running(Agent(env, "--create-job")) as agent:
            await agent.await_marker("at-0")
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{agent.probe_port()}") as client:
                status = (await client.get("/status")).text
            agent.release(0)
            assert await agent.await_exit() == 1, agent.output()
        await stub.wait_for(lambda e: e.data["to"] == "TERMINATED", event="lifecycle", timeout=5)
    finally:
        await stub.stop()

    row = await _job_row(postgres_url, "obs-secrets")
    journal = journal_events(tmp_path / "data", "obs-secrets")
    journal_files = list((tmp_path / "data").rglob("*.jsonl"))
    places = {
        "stdout": "\n".join(agent.stdout),
        "stderr": "\n".join(agent.stderr),
        "journal": "\n".join(path.read_text(errors="replace") for path in journal_files),
        "job row": "\n".join(row.values()),
        "/status": status,
        "heartbeats": "\n".join(orjson.dumps(e.data).decode() for e in stub.events),
    }
    for place, text in places.items():
        for name, secret in planted.items():
            assert secret not in text, f"{name} leaked into {place}"
    # Each place really saw the secret-bearing text, masked: the checks above are not vacuous.
    assert any(e["type"] == "TOOL_FAILED" and "***" in e["error"] for e in journal), journal
    crash = orjson.loads(row["error"])[-1]
    assert crash["error_class"] == "RuntimeError" and "step 1 crashed: cannot reach" in crash["message"]
    assert "***" in crash["message"] and "***" in crash["traceback"]
    assert any("step 1 crashed" in line and "***" in line for line in agent.stdout)
    terminated = [e.data for e in stub.events_of("lifecycle") if e.data["to"] == "TERMINATED"]
    assert "step 1 crashed" in terminated[0]["reason"] and "***" in terminated[0]["reason"]
    for line in agent.stdout:
        entry = orjson.loads(line)
        assert entry["job_id"] == "obs-secrets" and entry["agent_id"] == AGENT_ID, line
        assert {"state", "step"} <= entry.keys(), line


async def _job_row(url: str, job_id: str) -> dict[str, str]:
    """Every column of the job row as text (bytes decoded, so a secret inside the checkpoint shows)."""
    import asyncpg  # type: ignore[import-untyped]

    conn = await asyncpg.connect(url)
    try:
        record = await conn.fetchrow("SELECT * FROM job WHERE id = $1", job_id)
    finally:
        await conn.close()
    assert record is not None
    return {
        key: value.decode(errors="replace") if isinstance(value, bytes) else str(value)
        for key, value in record.items()
    }
