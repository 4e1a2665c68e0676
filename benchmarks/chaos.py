"""Fault injection over real ``python -m agentlife run`` processes and a real PostgreSQL (``nox -s chaos``).

The runner plays the control plane: it creates jobs (``--create-job``), runs each one as a sequence of
attempts (``AGENTLIFE_ATTEMPT`` = 1, 2, ... with ``AGENTLIFE_PREVIOUS_EXIT_CODE``) until its row says
COMPLETED, and injects one fault (sometimes two) into most attempts:

* SIGTERM at every lifecycle point: during boot, during hydration, at READY, between steps, during a
  side-effecting tool, during an LLM stream, during delivery, during cleanup, twice in a row, while the
  event loop is blocked, and at random moments while Qdrant or the control plane is unreachable;
* SIGKILL at seeded random moments;
* PostgreSQL stopped and restarted mid-run (``pg_ctl stop -m fast``: every session is cut);
* Qdrant unreachable (``AGENTLIFE_QDRANT_URL`` at a closed port, or at a server that accepts and never
  answers), the control plane unreachable (``AGENTLIFE_CONTROL_PLANE_URL`` likewise);
* LLM streams that stall (scripted in the agent, or over HTTP from a `FakeAnthropicServer` in this process
  through the real ``anthropic`` SDK, including a server that never answers);
* tools that hang (before or after their side effect), a sync tool that ignores cancellation, and an event
  loop blocked by ``time.sleep``.

Constants are scaled through ``AGENTLIFE_*`` variables (`SCALED_ENV`) so each run is short. Verdicts come
from external evidence only: the files the agent appends to with fsync (`chaos_agents`), the job rows, the
session journals, and the exit codes and timings the runner observes:

* lost steps: a step whose checkpoint was committed (journal marker) but that a later attempt ran again, a
  row whose ``next_step`` went backwards, or a final result that does not list each step exactly once;
* duplicated side effects: an invocation id whose effect really ran twice (every effect tool has a
  ``verify``), or a second delivery not excused by a SIGKILL between announcing and recording it;
* missing effects: a completed step whose effect never happened;
* drains over budget: SIGTERM → exit longer than step_deadline + cleanup_budget, or an exit code other
  than 143/0 (1 is accepted only when PostgreSQL was down during the drain: no checkpoint could be saved);
* hangs: a run still alive after ``RUN_TIMEOUT`` (killed), and jobs not completed after ``MAX_ATTEMPTS``.

The result is a Markdown table on stdout and in ``bench-results/chaos.md``; the exit status is 1 unless
every bad column is 0. ``--faults N`` (default 300) and ``--seed S`` choose the run.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import orjson

REPO = Path(__file__).resolve().parent.parent
for _path in (REPO / "tests", REPO / "benchmarks", REPO / "src"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from _common import child_env  # noqa: E402

from _pg import PostgresServer, running_postgres  # noqa: E402
from agentlife._journal._recovery import read_events  # noqa: E402

#: Scaled constants for every agent process (the invariants still hold).
SCALED_ENV = {
    "AGENTLIFE_DRAIN_PRE_STOP_SECONDS": "0.5",
    "AGENTLIFE_DRAIN_STEP_DEADLINE_SECONDS": "2.0",
    "AGENTLIFE_DRAIN_CLEANUP_BUDGET_SECONDS": "1.5",
    "AGENTLIFE_DRAIN_SIGKILL_BUFFER_SECONDS": "0.5",
    "AGENTLIFE_DRAIN_TERMINATION_GRACE_SECONDS": "4.5",
    "AGENTLIFE_HEARTBEAT_SSE_INTERVAL_SECONDS": "0.5",
    "AGENTLIFE_HEARTBEAT_UNHEALTHY_AFTER_SECONDS": "1.5",
    "AGENTLIFE_HEARTBEAT_JOB_INTERVAL_SECONDS": "0.5",
    "AGENTLIFE_HEARTBEAT_ZOMBIE_AFTER_SECONDS": "2",
    "AGENTLIFE_PROBE_BLOCKED_THRESHOLD_SECONDS": "0.5",
    "AGENTLIFE_PROBE_LAG_INTERVAL_SECONDS": "0.1",
    "AGENTLIFE_LLM_CONNECT_TIMEOUT_SECONDS": "1.0",
    "AGENTLIFE_LLM_INTER_CHUNK_TIMEOUT_SECONDS": "0.4",
    "AGENTLIFE_LLM_TOTAL_TIMEOUT_SECONDS": "8",
    "AGENTLIFE_TOOL_DEFAULT_TIMEOUT_SECONDS": "0.6",
    "AGENTLIFE_HYDRATION_BUFFER_SCAN_TIMEOUT_SECONDS": "1",
    "AGENTLIFE_HYDRATION_MEMORY_TIMEOUT_SECONDS": "1",
}
STEP_DEADLINE = float(SCALED_ENV["AGENTLIFE_DRAIN_STEP_DEADLINE_SECONDS"])
CLEANUP_BUDGET = float(SCALED_ENV["AGENTLIFE_DRAIN_CLEANUP_BUDGET_SECONDS"])
DRAIN_BUDGET = STEP_DEADLINE + CLEANUP_BUDGET
RUN_TIMEOUT = 45.0  # a run alive this long is a hang (a PostgreSQL outage at boot costs ~15 s of retries)
MAX_ATTEMPTS = 40
TERMINATED = -signal.SIGTERM  # what Popen reports for death by the default SIGTERM handler (k8s: 143)
LOST_EXIT_CODE = 255  # what asyncio reports when it could not reap the child itself

#: Fault kinds and their weights when a job's plan is drawn.
WEIGHTS: dict[str, float] = {
    "sigterm_boot": 3,
    "sigterm_hydration": 2,
    "sigterm_ready": 2,
    "sigterm_between_steps": 3,
    "sigterm_tool": 3,
    "sigterm_llm": 3,
    "sigterm_delivery": 1.5,
    "sigterm_cleanup": 1.5,
    "sigterm_twice": 2,
    "sigkill": 5,
    "pg_restart": 3,
    "qdrant_closed": 0.7,
    "qdrant_blackhole": 0.7,
    "control_plane_closed": 1,
    "control_plane_blackhole": 1,
    "llm_stall": 2,
    "llm_stall_http": 1,
    "tool_hang_before": 1.5,
    "tool_hang_after": 1.5,
    "sync_tool_hang": 1,
    "loop_block": 2,
}
#: Kinds that can only land at the end of a job: they go last in its plan.
JOB_ENDING = ("sigterm_delivery", "sigterm_cleanup")
#: Kinds added on top of a primary fault (counted as faults of their own when they land).
SECONDARY = ("sigterm_mid_run", "sigterm_blocked_loop", "sigterm_after_fault", "sigterm_pg_down")
#: Faults the agent recovers from by itself: a SIGTERM is often sent once they hit, during the recovery.
AFTER_FAULT = (
    "llm_stall",
    "llm_stall_http",
    "tool_hang_before",
    "tool_hang_after",
    "sync_tool_hang",
    "loop_block",
)
SIGTERM_KINDS = frozenset(k for k in (*WEIGHTS, *SECONDARY) if k.startswith("sigterm"))


# ----------------------------------------------------------------------------------------------- records


@dataclass(slots=True)
class Fault:
    """One planned fault: its kind, the relative step it aims at and its parameters."""

    kind: str
    rel: int = 0
    seconds: float = 0.0
    delay: float = 0.0
    variant: str = ""
    secondary: str = ""  # a SIGTERM added on top (one of `SECONDARY`)
    signal_at: float = 0.0  # for "sigterm_pg_down": seconds into the outage


@dataclass(slots=True)
class Line:
    at: float
    msg: str
    state: str | None


@dataclass(slots=True)
class RunRecord:
    """What the runner saw of one process."""

    job_id: str
    attempt: int
    fault: Fault | None
    started: float = 0.0
    exit_at: float = 0.0
    exit_code: int | None = None
    landed: list[str] = field(default_factory=list)
    sigterms: list[float] = field(default_factory=list)
    killed: bool = False
    hung: bool = False
    drain_state: str | None = None  # the lifecycle state the first SIGTERM found (from the drain log line)
    logged_before_signal: bool = True
    delivery_unrecorded: bool = False  # the registry could not record a delivery this attempt announced
    crash: str | None = None
    log_path: Path | None = None

    @property
    def drain_seconds(self) -> float | None:
        return self.exit_at - self.sigterms[0] if self.sigterms else None


@dataclass(slots=True)
class JobPlan:
    job_id: str
    steps: int
    plan: list[Fault]
    root: Path
    runs: list[RunRecord] = field(default_factory=list)
    next_steps: list[int] = field(default_factory=list)  # the row's next_step after each run
    completed: bool = False


@dataclass(slots=True)
class Outage:
    start: float
    end: float = math.inf


@dataclass(slots=True)
class JobVerdict:
    """What the evidence of one job says (see `analyse_job`)."""

    lost_steps: set[int] = field(default_factory=set)
    duplicated_effects: int = 0
    duplicate_deliveries: int = 0
    excused_deliveries: int = 0
    missing_effects: int = 0
    llm_calls: int = 0
    llm_reissued: int = 0
    notes: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------------------- process output


class Output:
    """The lines a process printed, as they arrive, for injectors to wait on."""

    def __init__(self, log_path: Path) -> None:
        self.lines: list[Line] = []
        self.eof = False
        self._changed = anyio.Event()
        self._log_path = log_path

    async def pump(self, stream: anyio.abc.ByteReceiveStream) -> None:
        pending = b""
        with self._log_path.open("wb") as log:
            async for chunk in stream:
                log.write(chunk)
                pending += chunk
                *complete, pending = pending.split(b"\n")
                now = time.monotonic()
                for raw in complete:
                    self._add(raw, now)
                self._notify()
            if pending:
                self._add(pending, time.monotonic())
        self.eof = True
        self._notify()

    def _add(self, raw: bytes, now: float) -> None:
        msg, state = raw.decode(errors="replace"), None
        if raw.startswith(b"{"):
            try:
                obj = orjson.loads(raw)
                msg, state = str(obj.get("msg", "")), obj.get("state")
            except orjson.JSONDecodeError:
                pass
        self.lines.append(Line(now, msg, state))

    def _notify(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    async def wait_for(self, predicate: Callable[[str], bool]) -> Line | None:
        """The first line whose message matches, waiting for it; None once the process closed its output."""
        seen = 0
        while True:
            for line in self.lines[seen:]:
                if predicate(line.msg):
                    return line
            seen = len(self.lines)
            if self.eof:
                return None
            await self._changed.wait()

    def find(self, predicate: Callable[[str], bool]) -> Line | None:
        return next((line for line in self.lines if predicate(line.msg)), None)


def starts(prefix: str) -> Callable[[str], bool]:
    return lambda msg: msg.startswith(prefix)


def chaos_point(name: str, rel: int | None = None, tool: str | None = None) -> Callable[[str], bool]:
    head = f"chaos:{name} " + (f"rel={rel} " if rel is not None else "")

    def match(msg: str) -> bool:
        return msg.startswith(head) and (tool is None or msg.endswith(f"tool={tool}"))

    return match


# ----------------------------------------------------------------------------------------------- servers


async def _black_hole(conn: anyio.abc.SocketStream) -> None:
    """Accept and never answer: read and drop whatever comes until the client leaves."""
    with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, OSError):
        async with conn:
            while True:
                await conn.receive()


def closed_port() -> int:
    """A port nothing listens on (bound once, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ------------------------------------------------------------------------------------------------ planning


def plan_job(rng: random.Random, faults: int) -> list[Fault]:
    """``faults`` faults for one job, drawn by weight; job-ending kinds go last (at most one of them)."""
    kinds = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()), k=faults)
    ending = [k for k in kinds if k in JOB_ENDING][:1]
    kinds = [k for k in kinds if k not in JOB_ENDING] + ending
    return [make_fault(rng, kind) for kind in kinds]


def make_fault(rng: random.Random, kind: str) -> Fault:
    rel = rng.randint(0, 2)
    f = Fault(kind, rel=rel)
    if kind == "sigterm_boot":
        # From spawn (often before Python reached agentlife's handler), or once the session journal exists
        # (inside BOOTING: the store is being opened).
        f.variant = rng.choice(["after_spawn", "journal_open"])
        f.delay = rng.uniform(0.0, 0.3) if f.variant == "after_spawn" else rng.uniform(0.0, 0.03)
    elif kind == "sigterm_hydration":
        f.delay = rng.uniform(0.0, 0.3)
    elif kind == "sigterm_tool":
        f.variant = rng.choice(["in_time", "outlives_deadline"])
        f.seconds = 0.4 if f.variant == "in_time" else 6.0
    elif kind == "sigterm_llm":
        f.variant = rng.choice(["in_time", "outlives_deadline"])
        f.seconds = 0.5 if f.variant == "in_time" else 5.0
        f.delay = rng.uniform(0.02, 0.15)
    elif kind == "sigterm_delivery":
        f.variant = rng.choice(["in_time", "outlives_deadline"])
        f.seconds = 0.4 if f.variant == "in_time" else 6.0
    elif kind == "sigterm_twice":
        f.delay = rng.uniform(0.0, 0.05)
        f.seconds = rng.uniform(0.01, 0.3)
    elif kind == "sigkill":
        f.delay = rng.uniform(0.0, 1.2)
    elif kind == "pg_restart":
        f.delay = rng.uniform(0.0, 0.3)
        # Down for this long after `pg_ctl stop` returns, plus the restart itself (~0.3-1 s here): a blip the
        # scaled 2 s step budget can ride through, or not, with its 1 s then 2 s retry backoff.
        f.seconds = rng.uniform(0.05, 0.8)
        if rng.random() < 0.5:
            f.secondary = "sigterm_pg_down"  # the drain meets a store that is down
            f.signal_at = rng.uniform(0.0, f.seconds)
    elif kind in ("qdrant_closed", "qdrant_blackhole", "control_plane_closed", "control_plane_blackhole"):
        if rng.random() < 0.8:
            f.secondary = "sigterm_mid_run"
            f.delay = rng.uniform(0.0, 0.5)
    elif kind == "llm_stall":
        f.seconds = float(rng.randint(0, 2))  # chunks sent before the stall
    elif kind == "llm_stall_http":
        f.variant = rng.choice(["stall", "stall", "never_answer"])
        f.seconds = float(rng.randint(0, 2))
    elif kind == "loop_block":
        f.seconds = rng.uniform(0.3, 1.2)
        if rng.random() < 0.5:
            f.secondary = "sigterm_blocked_loop"
            f.delay = rng.uniform(0.0, 0.2)
    if kind in AFTER_FAULT and not f.secondary and rng.random() < 0.8:
        # Otherwise the attempt would recover and complete the job, and the rest of its plan never lands.
        f.secondary = "sigterm_after_fault"
        f.delay = rng.uniform(0.0, 0.8)
    return f


def agent_fault_env(f: Fault | None) -> dict[str, str]:
    """How the agent learns about the faults it plays itself (`chaos_agents`)."""
    if f is None:
        return {}
    agent_kind = {
        "sigterm_tool": "slow_tool",
        "sigterm_llm": "slow_llm",
        "sigterm_delivery": "slow_delivery",
        "llm_stall": "llm_stall",
        "tool_hang_before": "hang_before",
        "tool_hang_after": "hang_after",
        "sync_tool_hang": "sync_hang",
        "loop_block": "block",
    }.get(f.kind)
    if agent_kind is None:
        return {}
    return {"CHAOS_FAULT": agent_kind, "CHAOS_STEP": str(f.rel), "CHAOS_SECONDS": f"{f.seconds:.3f}"}


# -------------------------------------------------------------------------------------------------- runner


@dataclass(slots=True)
class ChaosSettings:
    faults: int = 300
    seed: int = 1
    parallel: int = 3
    kinds: Sequence[str] | None = None  # restrict the plan to these kinds (smoke test)
    faults_per_job: tuple[int, int] = (3, 6)
    steps: tuple[int, int] = (25, 45)
    quiet: bool = False


class Chaos:
    """Runs jobs through faulted attempts against one PostgreSQL server and collects the evidence."""

    def __init__(self, settings: ChaosSettings, pg: PostgresServer, database_url: str, work: Path) -> None:
        self.s = settings
        self.pg = pg
        self.url = database_url
        self.work = work
        self.jobs: list[JobPlan] = []
        self.landed = 0
        self.outages: list[Outage] = []
        self._pg_lock = anyio.Lock()
        self._servers: dict[int, Any] = {}  # id(RunRecord) -> its FakeAnthropicServer
        self._next_job = 0
        self.lost_exit_codes = 0
        self._black_hole_port = 0
        self._progress_at = 0.0
        self.started = time.monotonic()

    # -- orchestration ------------------------------------------------------------------------------

    async def run(self) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        self._black_hole_port = int(listener.extra(anyio.abc.SocketAttribute.local_port))
        async with anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, _black_hole)
            async with anyio.create_task_group() as workers:
                for _ in range(self.s.parallel):
                    workers.start_soon(self._worker)
            tg.cancel_scope.cancel()
        await listener.aclose()

    async def _worker(self) -> None:
        while self.landed < self.s.faults:
            index = self._next_job
            self._next_job += 1
            rng = random.Random(f"{self.s.seed}/{index}")
            kinds = self.s.kinds
            count = rng.randint(*self.s.faults_per_job)
            plan = (
                [make_fault(rng, kinds[(index + i) % len(kinds)]) for i in range(count)]
                if kinds
                else plan_job(rng, count)
            )
            plan.sort(key=lambda f: f.kind in JOB_ENDING)
            job = JobPlan(f"chaos-{self.s.seed}-{index:04d}", rng.randint(*self.s.steps), plan, self.work)
            (self.work / job.job_id / "evidence").mkdir(parents=True)
            self.jobs.append(job)
            await self._run_job(job, rng)

    async def _run_job(self, job: JobPlan, rng: random.Random) -> None:
        previous_exit: int | None = None
        for attempt in range(1, MAX_ATTEMPTS + 1):
            fault = job.plan.pop(0) if job.plan and self.landed < self.s.faults else None
            record = await self._run_attempt(job, attempt, previous_exit, fault)
            job.runs.append(record)
            self.landed += len(record.landed)
            code = record.exit_code
            previous_exit = 137 if code == -signal.SIGKILL else 143 if code == TERMINATED else code
            row = await self.read_row(job.job_id)
            if row is not None:
                job.next_steps.append(row["next_step"])
                if row["status"] == "COMPLETED":
                    job.completed = True
                    break
            self._progress()

    def _progress(self) -> None:
        now = time.monotonic()
        if self.s.quiet or now - self._progress_at < 10:
            return
        self._progress_at = now
        runs = sum(len(j.runs) for j in self.jobs)
        sys.stderr.write(
            f"[chaos {now - self.started:5.0f}s] runs {runs}, faults {self.landed}/{self.s.faults}, "
            f"jobs {sum(j.completed for j in self.jobs)}/{len(self.jobs)}\n"
        )

    # -- one attempt --------------------------------------------------------------------------------

    def _env(
        self, job: JobPlan, attempt: int, previous_exit: int | None, fault: Fault | None
    ) -> dict[str, str]:
        env = child_env(
            **SCALED_ENV,
            AGENTLIFE_JOB_ID=job.job_id,
            AGENTLIFE_ATTEMPT=str(attempt),
            AGENTLIFE_DATA_DIR=str(self.work / job.job_id / "data"),
            AGENTLIFE_DATABASE_URL=self.url,
            AGENTLIFE_HEALTH_HOST="127.0.0.1",
            AGENTLIFE_HEALTH_PORT="0",
            CHAOS_DIR=str(self.work / job.job_id / "evidence"),
            PYTHONUNBUFFERED="1",
            **agent_fault_env(fault),
        )
        if previous_exit is not None:
            env["AGENTLIFE_PREVIOUS_EXIT_CODE"] = str(previous_exit)
        kind = fault.kind if fault else ""
        if kind in ("sigterm_hydration", "qdrant_blackhole"):
            env["AGENTLIFE_QDRANT_URL"] = f"http://127.0.0.1:{self._black_hole_port}"
        elif kind == "qdrant_closed":
            env["AGENTLIFE_QDRANT_URL"] = f"http://127.0.0.1:{closed_port()}"
        elif kind == "control_plane_blackhole":
            env["AGENTLIFE_CONTROL_PLANE_URL"] = f"http://127.0.0.1:{self._black_hole_port}"
            env["AGENTLIFE_CONTROL_PLANE_TOKEN"] = "chaos-token"
        elif kind == "control_plane_closed":
            env["AGENTLIFE_CONTROL_PLANE_URL"] = f"http://127.0.0.1:{closed_port()}"
            env["AGENTLIFE_CONTROL_PLANE_TOKEN"] = "chaos-token"
        return env

    async def _run_attempt(
        self, job: JobPlan, attempt: int, previous_exit: int | None, fault: Fault | None
    ) -> RunRecord:
        record = RunRecord(job.job_id, attempt, fault)
        record.log_path = self.work / job.job_id / f"run_{attempt:02d}.log"
        env = self._env(job, attempt, previous_exit, fault)
        async with contextlib.AsyncExitStack() as stack:
            server = None
            if fault is not None and fault.kind == "llm_stall_http":
                server = await stack.enter_async_context(self._anthropic_server(job, fault))
                self._servers[id(record)] = server
                stack.callback(self._servers.pop, id(record), None)
                env.update(
                    CHAOS_LLM="anthropic", ANTHROPIC_API_KEY="chaos-key", ANTHROPIC_BASE_URL=server.base_url
                )
            command = [
                sys.executable, "-m", "agentlife", "run", "chaos_agents:ChaosAgent",
                "--create-job", "--payload", orjson.dumps({"steps": job.steps}).decode(),
            ]  # fmt: skip
            record.started = time.monotonic()
            process = await anyio.open_process(
                command, env=env, cwd=REPO, stdin=subprocess.DEVNULL, stderr=subprocess.STDOUT
            )
            output = Output(record.log_path)
            async with process, anyio.create_task_group() as tg:
                assert process.stdout is not None
                tg.start_soon(output.pump, process.stdout)
                if fault is not None:
                    tg.start_soon(self._inject, fault, process, output, record)
                with anyio.move_on_after(RUN_TIMEOUT):
                    await process.wait()
                if process.returncode is None:
                    record.hung = True
                    process.kill()
                    await process.wait()
                record.exit_at = time.monotonic()
                record.exit_code = process.returncode
                with anyio.move_on_after(5):
                    while not output.eof:
                        await anyio.sleep(0.01)
                tg.cancel_scope.cancel()
            self._after_run(record, output, fault, server)
        return record

    def _after_run(self, record: RunRecord, output: Output, fault: Fault | None, server: Any) -> None:
        if record.exit_code == LOST_EXIT_CODE:
            # asyncio reports 255 when another waitpid() reaped the child first (a subprocess.Popen
            # cleanup racing its child watcher): the process's own last line says how it exited.
            last = output.find(lambda m: m.startswith("exit ") and m[5:].split(":")[0].isdigit())
            if last is not None:
                record.exit_code = int(last.msg[5:].split(":")[0])
                self.lost_exit_codes += 1
        record.delivery_unrecorded = output.find(
            lambda m: "recording the delivery failed" in m
        ) is not None and (
            output.find(lambda m: m.startswith("delivery:") and m.endswith(" delivered")) is None
        )
        drain = output.find(starts("drain requested by SIG"))
        if drain is not None:
            record.drain_state = drain.state
        crash = output.find(lambda m: m.startswith(("crash in step", "exit 1:")))
        if crash is not None:
            record.crash = crash.msg[:300]
        if record.sigterms:
            first = record.sigterms[0]
            record.logged_before_signal = any(line.at < first for line in output.lines)
        if fault is None:
            return
        environmental = (
            "qdrant_closed",
            "qdrant_blackhole",
            "control_plane_closed",
            "control_plane_blackhole",
        )
        if fault.kind in environmental:
            # The process met the dead service if it got as far as hydration (memory fetch, heartbeats).
            if output.find(starts("BOOTING -> HYDRATING")) is not None:
                record.landed.insert(0, fault.kind)
        elif fault.kind == "llm_stall_http":
            if server is not None and len(server.requests) > int(fault.rel):
                record.landed.insert(0, fault.kind)
        elif fault.kind in AFTER_FAULT and output.find(starts("chaos:fault_hit")) is not None:
            record.landed.insert(0, fault.kind)

    @contextlib.asynccontextmanager
    async def _anthropic_server(self, job: JobPlan, fault: Fault) -> Any:
        from agentlife.testing import FakeAnthropicServer, ScriptedTurn

        turns: list[Any] = [
            ScriptedTurn.text("a streamed answer", chunks=3, delay=0.005) for _ in range(job.steps)
        ]
        bad = (
            ScriptedTurn.never_answer()
            if fault.variant == "never_answer"
            else ScriptedTurn.stall(after_chunks=int(fault.seconds))
        )
        turns.insert(fault.rel, bad)
        async with FakeAnthropicServer(turns) as server:
            yield server

    # -- injection ----------------------------------------------------------------------------------

    def _signal(self, process: anyio.abc.Process, record: RunRecord, sig: signal.Signals, kind: str) -> bool:
        if process.returncode is not None:
            return False
        try:
            process.send_signal(sig)
        except ProcessLookupError:
            return False
        if sig == signal.SIGKILL:
            record.killed = True
        else:
            record.sigterms.append(time.monotonic())
        if kind and kind not in record.landed:
            record.landed.append(kind)
        return True

    async def _inject(self, f: Fault, process: anyio.abc.Process, output: Output, record: RunRecord) -> None:
        term, kind = signal.SIGTERM, f.kind
        if kind == "sigterm_boot":
            if f.variant == "journal_open":
                await self._wait_for_new_session(record, process)
            await anyio.sleep(f.delay)
            self._signal(process, record, term, kind)
        elif kind == "sigterm_hydration":
            if await output.wait_for(starts("BOOTING -> HYDRATING")):
                await anyio.sleep(f.delay)
                self._signal(process, record, term, kind)
        elif kind == "sigterm_ready":
            if await output.wait_for(starts("HYDRATING -> READY")):
                self._signal(process, record, term, kind)
        elif kind == "sigterm_between_steps":
            if await output.wait_for(chaos_point("step_done", f.rel)):
                self._signal(process, record, term, kind)
        elif kind == "sigterm_tool":
            if await output.wait_for(chaos_point("tool_started", f.rel, tool="slow")):
                await anyio.sleep(0.05)
                self._signal(process, record, term, kind)
        elif kind == "sigterm_llm":
            if await output.wait_for(chaos_point("llm_started", f.rel)):
                await anyio.sleep(f.delay)
                self._signal(process, record, term, kind)
        elif kind == "sigterm_delivery":
            if await output.wait_for(chaos_point("delivering")):
                await anyio.sleep(0.05)
                self._signal(process, record, term, kind)
        elif kind == "sigterm_cleanup":
            if await output.wait_for(starts("EXECUTING -> DRAINING (job")):
                self._signal(process, record, term, kind)
        elif kind == "sigterm_twice":
            if await output.wait_for(chaos_point("step_started", f.rel)):
                await anyio.sleep(f.delay)
                if self._signal(process, record, term, kind):
                    await anyio.sleep(f.seconds)
                    self._signal(process, record, term, "")
        elif kind == "sigkill":
            await anyio.sleep(f.delay)
            self._signal(process, record, signal.SIGKILL, kind)
        elif kind == "pg_restart":
            await output.wait_for(starts("HYDRATING -> READY"))
            await anyio.sleep(f.delay)
            if process.returncode is None:
                record.landed.append(kind)
                on_down = None
                if f.secondary == "sigterm_pg_down":
                    on_down = lambda: self._signal(process, record, term, f.secondary)  # noqa: E731
                await self._restart_postgres(f.seconds, on_down, f.signal_at)
        elif f.secondary:
            if kind == "llm_stall_http" and f.secondary == "sigterm_after_fault":
                server = self._servers.get(id(record))
                while server is not None and len(server.requests) <= f.rel and process.returncode is None:
                    await anyio.sleep(0.01)
                hit: Line | None = Line(0.0, "", None)
            else:
                trigger = {
                    "sigterm_mid_run": starts("HYDRATING -> READY"),
                    "sigterm_blocked_loop": chaos_point("block_started", f.rel),
                    "sigterm_after_fault": starts("chaos:fault_hit"),
                }[f.secondary]
                hit = await output.wait_for(trigger)
            if hit is not None:
                await anyio.sleep(f.delay)
                self._signal(process, record, term, f.secondary)

    async def _wait_for_new_session(self, record: RunRecord, process: anyio.abc.Process) -> None:
        """Until this attempt's session journal exists: the runtime is inside BOOTING then."""
        sessions = self.work / record.job_id / "data" / "sessions" / record.job_id
        prefix = f"session_{record.attempt:04d}_"
        deadline = time.monotonic() + 10
        while process.returncode is None and time.monotonic() < deadline:
            if sessions.is_dir() and any(p.name.startswith(prefix) for p in sessions.iterdir()):
                return
            await anyio.sleep(0.002)

    async def _restart_postgres(
        self, down_seconds: float, on_down: Callable[[], object] | None = None, at: float = 0.0
    ) -> None:
        async with self._pg_lock:
            outage = Outage(time.monotonic())
            self.outages.append(outage)
            try:
                await anyio.to_thread.run_sync(self.pg.stop)
                if on_down is not None:
                    await anyio.sleep(at)
                    on_down()
                await anyio.sleep(max(0.0, down_seconds - (at if on_down is not None else 0.0)))
            finally:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(self.pg.start)
                    outage.end = time.monotonic()

    # -- rows -----------------------------------------------------------------------------------------

    async def read_row(self, job_id: str) -> dict[str, Any] | None:
        """The job row (status, next_step of its checkpoint, result), waiting out a PostgreSQL outage."""
        import asyncpg

        deadline = time.monotonic() + 60
        while True:
            try:
                conn = await asyncpg.connect(self.url, timeout=5)
                try:
                    row = await conn.fetchrow(
                        "SELECT status, checkpoint, result FROM job WHERE id = $1", job_id
                    )
                finally:
                    await conn.close()
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
                if time.monotonic() > deadline:
                    raise
                await anyio.sleep(0.2)
                continue
            if row is None:
                return None
            checkpoint = orjson.loads(row["checkpoint"]) if row["checkpoint"] else {}
            result = orjson.loads(row["result"]) if isinstance(row["result"], str) else row["result"]
            return {
                "status": row["status"],
                "next_step": int(checkpoint.get("next_step", 0)),
                "result": result,
            }

    def overlaps_outage(self, start: float, end: float) -> bool:
        # A drain that began up to a second after PostgreSQL came back may still be paying for the outage.
        return any(o.start <= end and start <= o.end + 1.0 for o in self.outages)


# ---------------------------------------------------------------------------------------------- evidence


def _lines(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    return [line.split() for line in path.read_text().splitlines() if line.strip()]


def committed_checkpoints(session_dir: Path) -> dict[int, set[int]]:
    """step -> the attempts whose journal says they committed that step's checkpoint."""
    out: dict[int, set[int]] = defaultdict(set)
    for path in sorted(session_dir.glob("session_*.jsonl")):
        attempt = int(path.name.split("_")[1])
        for event in read_events(path):
            if (
                not isinstance(event, dict)
                or event.get("type") != "CHECKPOINT_WRITTEN"
                or event.get("resumed")
            ):
                continue
            step = event.get("step")
            if isinstance(step, int):
                out[step].add(attempt)
    return out


def analyse_job(
    job_id: str,
    steps: int,
    result: Any,
    evidence: Path,
    session_dir: Path,
    next_steps: Sequence[int] = (),
    sigkilled_attempts: Sequence[int] = (),
    unrecorded_attempts: Sequence[int] = (),
) -> JobVerdict:
    """Judge one finished job from its external evidence (see the module docstring)."""
    v = JobVerdict()
    entries = result.get("steps") if isinstance(result, dict) else None
    by_step: dict[int, list[int]] = defaultdict(list)
    for entry in entries or []:
        by_step[int(entry[0])].append(int(entry[1]))
    for step in range(steps):
        if len(by_step.get(step, [])) != 1:
            v.lost_steps.add(step)
            v.notes.append(f"step {step} listed {len(by_step.get(step, []))} times in the result")
    for step, attempts in committed_checkpoints(session_dir).items():
        ran = set(by_step.get(step, []))
        if len(attempts) > 1 or (ran and not ran <= attempts):
            v.lost_steps.add(step)
            v.notes.append(
                f"step {step} committed by attempts {sorted(attempts)} but the result has {sorted(ran)}"
            )
    for before, after in itertools.pairwise(next_steps):
        if after < before:
            v.lost_steps.update(range(after, before))
            v.notes.append(f"next_step went back from {before} to {after}")
    effects = Counter(parts[0] for parts in _lines(evidence / "effects"))
    for invocation_id, count in effects.items():
        if count > 1:
            v.duplicated_effects += count - 1
            v.notes.append(f"effect {invocation_id} ran {count} times")
    for step in range(steps):
        if effects.get(f"{job_id}/{step}/1", 0) == 0 and step in by_step:
            v.missing_effects += 1
            v.notes.append(f"the effect of step {step} never happened")
    deliveries = [int(parts[1]) for parts in _lines(evidence / "deliveries")]
    for attempt in deliveries[:-1]:
        # Killed between announcing and recording the delivery, or the registry was down so it could not be
        # recorded: the documented at-least-once window.
        if attempt in sigkilled_attempts or attempt in unrecorded_attempts:
            v.excused_deliveries += 1
        else:
            v.duplicate_deliveries += 1
            v.notes.append(f"delivered again after attempt {attempt}, which recorded it or was not killed")
    llm = _lines(evidence / "llm")
    v.llm_calls = len(llm)
    v.llm_reissued = len(llm) - len({parts[0] for parts in llm})
    return v


# ------------------------------------------------------------------------------------------------- report


@dataclass(slots=True)
class Report:
    runs: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    jobs: int = 0
    jobs_completed: int = 0
    lost_steps: int = 0
    duplicated_effects: int = 0
    missing_effects: int = 0
    drains: int = 0
    drains_over_budget: int = 0
    hangs: int = 0
    excused_exit_1: int = 0
    default_handler_deaths: int = 0
    excused_deliveries: int = 0
    lost_exit_codes: int = 0
    llm_calls: int = 0
    llm_reissued: int = 0
    drain_times: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    drain_states: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    exit_codes: dict[str, Counter[int]] = field(default_factory=lambda: defaultdict(Counter))
    crashes: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def bad(self) -> int:
        return (
            self.lost_steps
            + self.duplicated_effects
            + self.missing_effects
            + self.drains_over_budget
            + self.hangs
            + (self.jobs - self.jobs_completed)
        )


def build_report(chaos: Chaos, rows: dict[str, dict[str, Any] | None]) -> Report:
    rep = Report(jobs=len(chaos.jobs), lost_exit_codes=chaos.lost_exit_codes)
    for job in chaos.jobs:
        rep.jobs_completed += job.completed
        killed = [r.attempt for r in job.runs if r.killed or r.hung]
        unrecorded = [r.attempt for r in job.runs if r.delivery_unrecorded]
        row = rows.get(job.job_id) or {}
        verdict = analyse_job(
            job.job_id,
            job.steps,
            row.get("result"),
            chaos.work / job.job_id / "evidence",
            chaos.work / job.job_id / "data" / "sessions" / job.job_id,
            job.next_steps,
            killed,
            unrecorded,
        )
        if job.completed:
            rep.lost_steps += len(verdict.lost_steps)
            rep.missing_effects += verdict.missing_effects
        elif verdict.lost_steps:
            rep.problems.append(f"{job.job_id}: not completed; {verdict.notes[:3]}")
        rep.duplicated_effects += verdict.duplicated_effects + verdict.duplicate_deliveries
        rep.excused_deliveries += verdict.excused_deliveries
        rep.llm_calls += verdict.llm_calls
        rep.llm_reissued += verdict.llm_reissued
        rep.problems.extend(f"{job.job_id}: {note}" for note in verdict.notes if job.completed)
        if not job.completed:
            rep.problems.append(f"{job.job_id}: not COMPLETED after {len(job.runs)} attempts")
        for r in job.runs:
            rep.runs += 1
            rep.faults.update(r.landed)
            label = r.fault.kind if r.fault else "none"
            rep.exit_codes[label][r.exit_code if r.exit_code is not None else -999] += 1
            if r.crash:
                rep.crashes[f"{label}: {_crash_kind(r.crash)}"] += 1
            if r.hung:
                rep.hangs += 1
                rep.problems.append(
                    f"{job.job_id} attempt {r.attempt}: hung ({label}), killed; see {r.log_path}"
                )
            _judge_drain(chaos, rep, r)
    rep.seconds = time.monotonic() - chaos.started
    return rep


def _crash_kind(line: str) -> str:
    text = line.split(": ", 2)
    return ": ".join(text[:2])[:120]


def _judge_drain(chaos: Chaos, rep: Report, r: RunRecord) -> None:
    if not r.sigterms or r.killed or r.hung:
        return
    kind = next((k for k in r.landed if k in SIGTERM_KINDS), "sigterm")
    elapsed = r.drain_seconds or 0.0
    rep.drains += 1
    rep.drain_times[kind].append(elapsed)
    # No drain line: the signal came before agentlife's handler, or after the run's own exit line (ignored).
    rep.drain_states[kind][r.drain_state or ("pre-runtime" if r.exit_code == TERMINATED else "exiting")] += 1
    code = r.exit_code
    ok_code = code in (0, 143)
    if code == TERMINATED and not r.logged_before_signal:
        # The signal came before the interpreter reached agentlife's handler: the kernel's default action,
        # which Kubernetes reports as 143 too. Nothing had been touched yet.
        ok_code = True
        rep.default_handler_deaths += 1
    if code == 1 and chaos.overlaps_outage(r.sigterms[0] - 0.5, r.exit_at):
        ok_code = True  # PostgreSQL was down: no checkpoint could be saved, so "resumable" would be a lie
        rep.excused_exit_1 += 1
    if elapsed > DRAIN_BUDGET or not ok_code:
        rep.drains_over_budget += 1
        rep.problems.append(
            f"{r.job_id} attempt {r.attempt}: {kind} drain took {elapsed:.2f}s (budget {DRAIN_BUDGET:g}s), "
            f"exit {code}, state {r.drain_state}; see {r.log_path}"
        )


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def render(rep: Report, settings: ChaosSettings) -> str:
    total = sum(rep.faults.values())
    out = [
        f"# Chaos run (seed {settings.seed}, {total} faults, parallelism {settings.parallel}, "
        f"{rep.seconds:.0f} s)",
        "",
        "| runs | faults injected | jobs completed | lost steps | duplicated side effects | "
        "drains over budget | missing effects | hangs |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {rep.runs} | {total} | {rep.jobs_completed}/{rep.jobs} | {rep.lost_steps} | "
        f"{rep.duplicated_effects} | {rep.drains_over_budget} | {rep.missing_effects} | {rep.hangs} |",
        "",
        f"Drain budget: step_deadline {STEP_DEADLINE:g} s + cleanup_budget {CLEANUP_BUDGET:g} s = "
        f"{DRAIN_BUDGET:g} s; {rep.drains} SIGTERM drains measured (signal to process exit, seen from the "
        "parent).",
        "",
        "## Faults by kind",
        "",
        "| kind | injected | drains | drain p50 (s) | drain max (s) | state the SIGTERM found | "
        "exit codes of the runs |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for kind in sorted(set(rep.faults) | set(rep.exit_codes) - {"none"}):
        times = rep.drain_times.get(kind, [])
        p50 = f"{statistics.median(times):.2f}" if times else ""
        worst = f"{max(times):.2f}" if times else ""
        states = ", ".join(f"{s} {n}" for s, n in sorted(rep.drain_states.get(kind, Counter()).items()))
        codes = ", ".join(f"{c}: {n}" for c, n in sorted(rep.exit_codes.get(kind, Counter()).items()))
        out.append(
            f"| {kind} | {rep.faults.get(kind, 0)} | {len(times)} | {p50} | {worst} | {states} | {codes} |"
        )
    clean = ", ".join(f"{c}: {n}" for c, n in sorted(rep.exit_codes.get("none", Counter()).items()))
    out += [
        "",
        f"Runs without a planned fault (reruns to completion): exit codes {clean or '-'}.",
        f"LLM calls really made (scripted client): {rep.llm_calls}, of which re-issued for the same step: "
        f"{rep.llm_reissued} (re-issue after a crash or a cancelled step is the documented worst case).",
        f"Deliveries announced again because the attempt that announced them could not record them (SIGKILL "
        f"in between, or the store down: documented at-least-once, not counted as duplicates): "
        f"{rep.excused_deliveries}.",
        f"SIGTERMs that found the interpreter before agentlife's handler (default action, 143 to "
        f"Kubernetes): "
        f"{rep.default_handler_deaths}; exit 1 accepted because PostgreSQL was down during the drain: "
        f"{rep.excused_exit_1}; exit codes asyncio could not reap, taken from the process's last log line: "
        f"{rep.lost_exit_codes}.",
    ]
    if rep.crashes:
        out += ["", "## Crash exits (exit 1) by fault and cause", "", "| fault: cause | runs |", "|---|---:|"]
        out += [f"| {cause} | {n} |" for cause, n in rep.crashes.most_common(25)]
    if rep.problems:
        out += ["", "## Problems", ""] + [f"- {p}" for p in rep.problems[:60]]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------------- main


def run_chaos(settings: ChaosSettings, pg: PostgresServer, work: Path) -> tuple[Report, Chaos]:
    """Run the whole chaos experiment against ``pg`` in ``work`` and judge it."""
    url = pg.create_database("chaos")
    init = subprocess.run(
        [sys.executable, "-m", "agentlife", "db", "init", "--database-url", url],
        env=child_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if init.returncode != 0:
        raise RuntimeError(f"db init failed: {init.stderr}")
    chaos = Chaos(settings, pg, url, work)

    async def main() -> dict[str, dict[str, Any] | None]:
        await chaos.run()
        return {job.job_id: await chaos.read_row(job.job_id) for job in chaos.jobs}

    rows = anyio.run(main)
    return build_report(chaos, rows), chaos


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--faults", type=int, default=300, help="faults to inject (default 300)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the fault plan (default 1)")
    parser.add_argument("--parallel", type=int, default=3, help="agent processes at once (default 3)")
    parser.add_argument("--kinds", help="comma-separated fault kinds to use (default: all)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--out", default=str(REPO / "bench-results" / "chaos.md"), help="report file")
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",")] if args.kinds else None
    unknown = [k for k in kinds or [] if k not in WEIGHTS]
    if unknown:
        parser.error(f"unknown fault kinds: {', '.join(unknown)} (known: {', '.join(WEIGHTS)})")
    settings = ChaosSettings(faults=args.faults, seed=args.seed, parallel=args.parallel, kinds=kinds)
    work = Path(tempfile.mkdtemp(prefix="agentlife-chaos-"))
    keep = True  # kept for a post-mortem unless the run was clean
    try:
        with running_postgres() as pg:
            report, _ = run_chaos(settings, pg, work)
        text = render(report, settings)
        keep = args.keep or report.bad > 0
    finally:
        if keep:
            sys.stderr.write(f"chaos: work directory kept at {work}\n")
        else:
            shutil.rmtree(work, ignore_errors=True)
    sys.stdout.write(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return 1 if report.bad else 0


if __name__ == "__main__":
    sys.exit(main())
