"""Run an agent in-process on a temporary data dir, with scaled time and simulated signals."""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from agentlife._agent import AgentProcess
from agentlife._checkpoint import CheckpointDoc
from agentlife._exceptions import CheckpointCorrupt
from agentlife._journal._recovery import read_events
from agentlife._runtime._lifecycle import RunOptions, Runtime, ShellOptions
from agentlife._state import State
from agentlife.constants import Constants
from agentlife.stores import JobRecord, SQLiteStore

__all__ = ["AgentHarness", "AgentRun", "DrainAt"]


@dataclass(frozen=True, slots=True)
class DrainAt:
    """When the harness sends the simulated SIGTERM.

    Build with `DrainAt.during_boot`, `DrainAt.during_hydration`, `DrainAt.when_ready`,
    `DrainAt.at_step_start`, `DrainAt.during_tool` or `DrainAt.between_steps`.
    """

    event: str
    """The runtime event that triggers the signal (``booting``, ``hydration_started``, ``ready``,
    ``step_started``, ``tool_started``, ``step_completed``)."""
    step: int | None = None
    """Only in this step (None: the first time the event happens)."""
    tool: str | None = None
    """For ``tool_started``: the tool's name."""
    signal: str = "SIGTERM"
    """The signal's name, as the drain's reason (``"SIGINT"`` drains as ``"SIGTERM"`` does)."""
    twice: bool = False
    """Send it a second time right after the first (an impatient operator)."""

    @classmethod
    def between_steps(cls, after_step: int, *, twice: bool = False) -> DrainAt:
        """Right after step ``after_step`` was checkpointed, before the next one starts."""
        return cls("step_completed", step=after_step, twice=twice)

    @classmethod
    def during_tool(cls, tool: str, *, step: int | None = None, twice: bool = False) -> DrainAt:
        """Once the tool called ``tool`` has started (in ``step``, or in any step)."""
        return cls("tool_started", step=step, tool=tool, twice=twice)

    @classmethod
    def during_hydration(cls, *, twice: bool = False) -> DrainAt:
        """As hydration begins."""
        return cls("hydration_started", twice=twice)

    @classmethod
    def during_boot(cls, *, twice: bool = False) -> DrainAt:
        """As boot begins, before the store is open."""
        return cls("booting", twice=twice)

    @classmethod
    def when_ready(cls, *, twice: bool = False) -> DrainAt:
        """In READY, after hydration and before the first step."""
        return cls("ready", twice=twice)

    @classmethod
    def at_step_start(cls, step: int, *, twice: bool = False) -> DrainAt:
        """As step ``step`` starts."""
        return cls("step_started", step=step, twice=twice)

    def matches(self, event: str, info: Mapping[str, Any]) -> bool:
        """Whether runtime event ``event`` is the moment to signal."""
        if event != self.event:
            return False
        if self.step is not None and info.get("step") != self.step:
            return False
        return self.tool is None or info.get("tool") == self.tool


@dataclass(frozen=True, slots=True)
class AgentRun:
    """The outcome of one harness run."""

    exit_code: int
    """What ``python -m agentlife run`` would have exited with (0, 1, 2, 143 ...)."""
    final_state: State
    """The lifecycle state at the end (`State.TERMINATED` unless the run was cut short)."""
    job: JobRecord | None
    """The job row after the run, or None when it was never created."""
    checkpoint: CheckpointDoc | None
    """The job's last checkpoint, decoded, or None."""
    journal: list[dict[str, Any]]
    """Every journal record of the job (all attempts), in order."""
    transitions: list[tuple[State, State]]
    """The lifecycle transitions, in order, as (from, to) pairs."""
    logs: list[dict[str, Any]]
    """The JSON log lines the run wrote, decoded."""
    duration: float
    """Seconds from the start of the run to its end (on the real clock, not scaled)."""
    drained_at: float | None = None
    """Seconds from the start to the drain signal, or None when none was sent."""
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """Every runtime event with its details (what `DrainAt` matches on), in order."""

    def journal_types(self) -> list[str]:
        """The journal's event types, in order."""
        return [str(e["type"]) for e in self.journal]

    def log_messages(self) -> list[str]:
        """The log lines' messages, in order."""
        return [str(line.get("msg", "")) for line in self.logs]


class AgentHarness:
    """Runs agents in this process on ``data_dir`` with every duration multiplied by ``time_scale``.

    Each `run` of the same job id is the next attempt, as a control plane would start it. With the default
    ``time_scale=0.01`` the 45 s step deadline lasts 0.45 s and the 10 s cleanup budget 0.1 s.

    Example:
        >>> harness = AgentHarness(tmp_path)
        >>> result = await harness.run(MyAgent(), drain=DrainAt.during_tool("publish"))
        >>> assert result.exit_code == 143
    """

    def __init__(
        self, data_dir: Path, *, time_scale: float = 0.01, env: Mapping[str, str] | None = None
    ) -> None:
        self.data_dir = Path(data_dir)
        self.time_scale = time_scale
        self.base_env = dict(env or {})
        self._attempts: dict[str, int] = {}

    @property
    def database_url(self) -> str:
        """The SQLite store every run shares (unless ``env`` names another)."""
        return f"sqlite:///{self.data_dir / 'agentlife.db'}"

    def constants(self, env: Mapping[str, str]) -> Constants:
        """The constants a run uses: defaults and ``env`` overrides, scaled."""
        return Constants.from_env(env).scaled(self.time_scale)

    async def run(
        self,
        agent: AgentProcess,
        *,
        job_id: str = "job-1",
        attempt: int | None = None,
        payload: Any = None,
        drain: DrainAt | None = None,
        env: Mapping[str, str] | None = None,
        probes: bool = False,
        on_event: Callable[[Runtime, str, dict[str, Any]], None] | None = None,
    ) -> AgentRun:
        """Run ``agent`` as the next attempt of ``job_id`` and return what happened."""
        attempt = attempt if attempt is not None else self._attempts.get(job_id, 0) + 1
        self._attempts[job_id] = max(attempt, self._attempts.get(job_id, 0))
        run_env = {
            "AGENTLIFE_DATA_DIR": str(self.data_dir),
            "AGENTLIFE_DATABASE_URL": self.database_url,
            "AGENTLIFE_HEALTH_HOST": "127.0.0.1",
            "AGENTLIFE_HEALTH_PORT": "0" if probes else "off",
            **self.base_env,
            **(env or {}),
            "AGENTLIFE_JOB_ID": job_id,
            "AGENTLIFE_ATTEMPT": str(attempt),
        }
        logs = io.StringIO()
        runtime = Runtime(
            agent,
            env=run_env,
            options=RunOptions(
                payload=payload,
                constants=self.constants(run_env),
                shell=ShellOptions(handle_signals=False, hard_exit=False, probes=probes, log_stream=logs),
            ),
        )
        transitions: list[tuple[State, State]] = []
        events: list[tuple[str, dict[str, Any]]] = []
        drained_at: list[float] = []

        def observe(event: str, info: dict[str, Any]) -> None:
            events.append((event, dict(info)))
            if event == "transition":
                transitions.append((info["source"], info["target"]))
            if drain is not None and not drained_at and drain.matches(event, info):
                drained_at.append(time.monotonic())
                runtime.request_drain(drain.signal)
                if drain.twice:
                    runtime.request_drain(drain.signal)
            if on_event is not None:
                on_event(runtime, event, info)

        runtime.observers.append(observe)
        started = time.monotonic()
        exit_code = await runtime.run()
        duration = time.monotonic() - started
        job, checkpoint = await self._read_job(job_id)
        journal_events = _read_journal(runtime)
        return AgentRun(
            exit_code=exit_code,
            final_state=runtime.state,
            job=job,
            checkpoint=checkpoint,
            journal=journal_events,
            transitions=transitions,
            logs=[orjson.loads(line) for line in logs.getvalue().splitlines() if line.strip()],
            duration=duration,
            drained_at=(drained_at[0] - started) if drained_at else None,
            events=events,
        )

    async def _read_job(self, job_id: str) -> tuple[JobRecord | None, CheckpointDoc | None]:
        store = SQLiteStore(self.data_dir / "agentlife.db")
        await store.open()
        try:
            job = await store.get_job(job_id)
            if job is None:
                return None, None
            try:
                loaded = await store.load_checkpoint(job_id)
            except CheckpointCorrupt:
                return job, None
            return job, (CheckpointDoc.decode(loaded.data, job_id) if loaded else None)
        finally:
            await store.close()


def _read_journal(runtime: Runtime) -> list[dict[str, Any]]:
    if runtime.journal is None:
        return []

    return [e for e in read_events(runtime.journal.path) if isinstance(e, dict)]
