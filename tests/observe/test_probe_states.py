"""Observability through the runtime: probes, heartbeats, /metrics, secrets, JSON logs of real processes.

The unit tests of `_probes`, `_lag`, `_heartbeat` and `_telemetry` prove each part alone; these prove them
wired together: real ``python -m agentlife run`` processes (`agents.obs_agent.ObsAgent`, paced by marker
files) with real signals and real HTTP, real PostgreSQL, and the `ControlPlaneStub` receiving real SSE. Two
cases run in-process (`AgentHarness` with ``probes=True``) because they need a hand inside the runtime: the
exhausted store pool and the answers at TERMINATED.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentlife import AgentProcess, Done, LLMClient, ScriptedLLM, ScriptedTurn, State, StepContext, tool
from agentlife.stores import PostgresStore
from agentlife.testing import AgentHarness, DrainAt
from procs import agent_env, spawn

AGENT = "agents.obs_agent:ObsAgent"
POD = "obs-pod-7"

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


# -- 1b. in-process: exhausted store pool, TERMINATED ------------------------------------------------------


def _blocking_get(port: int, path: str) -> tuple[int, str]:
    response = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5.0)
    return response.status_code, response.text.strip()


class PoolHog(AgentProcess):
    """Holds every connection of the runtime's PostgreSQL pool and asks the probes meanwhile."""

    agent_id = "pool-hog"

    def __init__(self) -> None:
        self.runtime: Any = None
        self.answers: dict[str, tuple[int, str]] = {}

    async def step(self, ctx: StepContext) -> Done | None:
        store = self.runtime.store
        pool = store._db._pool
        port = self.runtime.board.snapshot().probe_port
        self.answers["before"] = await anyio.to_thread.run_sync(_blocking_get, port, "/healthz")
        held = [await pool.acquire() for _ in range(pool.get_max_size())]
        try:
            assert not store.has_free_connection()
            for path in ("/healthz", "/readyz"):
                self.answers[path] = await anyio.to_thread.run_sync(_blocking_get, port, path)
        finally:
            for conn in held:
                await pool.release(conn)
        self.answers["after"] = await anyio.to_thread.run_sync(_blocking_get, port, "/healthz")
        return Done(result="ok")


@pytest.mark.anyio
async def test_healthz_is_503_while_every_store_connection_is_taken(
    tmp_path: Path, postgres_url: str
) -> None:
    store = PostgresStore(postgres_url, create_schema=True)
    await store.open()
    try:
        await store.create_job("obs-pool", PoolHog.agent_id, None)
    finally:
        await store.close()
    agent = PoolHog()

    def on_event(runtime: Any, event: str, info: dict[str, Any]) -> None:
        agent.runtime = runtime

    harness = AgentHarness(tmp_path, time_scale=0.1)
    result = await harness.run(
        agent, job_id="obs-pool", probes=True, env={"AGENTLIFE_DATABASE_URL": postgres_url}, on_event=on_event
    )
    assert result.exit_code == 0, result.log_messages()
    assert agent.answers["before"] == (200, "ok")
    assert agent.answers["/healthz"] == (503, "store pool has no free connection")
    assert agent.answers["/readyz"] == (200, "ok")
    assert agent.answers["after"] == (200, "ok")


@tool(side_effects=True)
async def record(step: int) -> int:
    return step


class Stepper(AgentProcess):
    agent_id = "stepper"

    def make_llm(self) -> LLMClient:
        return ScriptedLLM([ScriptedTurn.text("ok")], cycle=True)

    async def step(self, ctx: StepContext) -> Done | None:
        await ctx.llm.complete(
            model="claude-sonnet-4-5", max_tokens=8, messages=[{"role": "user", "content": "x"}]
        )
        await ctx.call_tool(record, step=ctx.step)
        return Done() if ctx.step >= 5 else None


@pytest.mark.anyio
async def test_terminated_answers_503_and_metrics_hold_the_drain(tmp_path: Path) -> None:
    answers: dict[str, tuple[int, str]] = {}

    def on_event(runtime: Any, event: str, info: dict[str, Any]) -> None:
        if event == "transition" and info["target"] is State.TERMINATED:
            # Blocking requests from the agent's own loop thread: the probe thread answers regardless.
            port = runtime.board.snapshot().probe_port
            for path in ("/healthz", "/readyz", "/status", "/metrics"):
                answers[path] = _blocking_get(port, path)

    harness = AgentHarness(tmp_path, time_scale=0.1)
    result = await harness.run(
        Stepper(), job_id="obs-term", probes=True, drain=DrainAt.between_steps(1), on_event=on_event
    )
    assert result.exit_code == 143
    assert answers["/healthz"] == (503, "TERMINATED")
    assert answers["/readyz"] == (503, "TERMINATED")
    assert answers["/status"][0] == 200 and orjson.loads(answers["/status"][1])["state"] == "TERMINATED"
    parsed = families(answers["/metrics"][1])
    assert sample(parsed["agent_lifecycle_state"], state="TERMINATED") == 1
    assert sample(parsed["agent_drains"], "_total", reason="SIGTERM") == 1
    assert sample(parsed["agent_drain_duration_seconds"], "_count", reason="SIGTERM") == 1
    assert sample(parsed["agent_execution_seconds"], "_count") == 1
    assert sample(parsed["agent_steps_completed"], "_total") == 2
    assert sample(parsed["agent_llm_calls"], "_total", outcome="ok") == 2
