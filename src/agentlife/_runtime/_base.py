"""The fields every part of the engine shares, and the few things all of them call.

`RuntimeBase` holds the process's state (settings, store, journal, the drain, counters) as the boot and
hydration fill it in; the parts below build on it, one concern per module:
``_services`` (journal, probes, heartbeats, telemetry, memory, cleanup) -> ``_steps`` (running a step,
checkpoints, store retries, usage, parking) -> ``_finish`` (delivery, terminal status, crash records) ->
``_lifecycle`` (`Runtime`: the road from boot to exit).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.abc
import anyio.to_thread

from agentlife._agent import AgentProcess, Job
from agentlife._budget import Budget
from agentlife._checkpoint import CheckpointDoc
from agentlife._config import Settings
from agentlife._exceptions import (
    AttemptFenced,
)
from agentlife._journal._conversation import ConversationLog
from agentlife._journal._writer import Journal
from agentlife._logging import log_fields
from agentlife._observe._status import StatusBoard
from agentlife._observe._telemetry_facade import TelemetryFacade
from agentlife._preload import Preloader
from agentlife._redact import Redactor
from agentlife._runtime._signals import EarlySignal, HardExit
from agentlife._state import State, StateMachine, Transition
from agentlife._step._approvals import Approvals
from agentlife._step._host import RuntimeStats
from agentlife.constants import Constants
from agentlife.stores import JobStatus

if TYPE_CHECKING:
    from agentlife._journal._recovery import ReplayMap
    from agentlife._llm._protocol import LLMClient
    from agentlife._memory import MemoryRecord, QdrantMemory
    from agentlife._runtime._mcp_tools import MCPTools
    from agentlife.stores import CheckpointStore


EXIT_DONE = 0
EXIT_CRASH = 1
EXIT_USAGE = 2
EXIT_DRAINED = 143

log = logging.getLogger("agentlife.runtime")
PHASE_NAMES = {
    State.BOOTING: "boot",
    State.HYDRATING: "hydration",
    State.READY: "the wait for the first step",
}
TERMINAL_STATUSES = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.DEAD_LETTER)
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How this process runs; the CLI and the test harness differ only here.

    Attributes:
        job_id: overrides ``AGENTLIFE_JOB_ID``.
        payload: the job payload for a job row this process creates.
        create_job: create a missing job row on PostgreSQL too (SQLite always creates it).
        handle_signals: install the SIGTERM/SIGINT receiver (main thread only).
        json_logs: route logging through the JSON handler on stdout.
        hard_exit: after the drain budget, ``os._exit`` even if code ignoring cancellation still runs.
        probes: start the probe server.
        constants: use these instead of reading them from the environment.
        log_stream: where JSON logs go (default stdout).
        early_signal: a signal caught before the runtime started (see `EarlySignal`).
    """

    job_id: str | None = None
    payload: Any = None
    create_job: bool = False
    handle_signals: bool = True
    json_logs: bool = True
    hard_exit: bool = True
    probes: bool = True
    constants: Constants | None = None
    log_stream: Any = None
    early_signal: EarlySignal | None = None


@dataclass(slots=True)
class Outcome:
    exit_code: int
    reason: str
    status: str | None = None


@dataclass(slots=True)
class Resume:
    doc: CheckpointDoc
    checkpoint_id: str | None
    replay: ReplayMap | None = None
    memories: list[MemoryRecord] = field(default_factory=list)
    conversation: ConversationLog = field(default_factory=ConversationLog)


@dataclass(frozen=True, slots=True)
class Hydrated:
    """What hydration found: the claimed job, its budget, its approval state and where to resume."""

    job: Job
    budget: Budget
    approvals: Approvals
    resume: Resume


Observer = Callable[[str, dict[str, Any]], None]


class RuntimeBase:
    """The state of one agent process, shared by every part of the engine."""

    def __init__(
        self,
        agent: AgentProcess,
        *,
        env: Mapping[str, str] | None = None,
        options: RunOptions | None = None,
    ) -> None:
        self.agent = agent
        self.env: Mapping[str, str] = dict(os.environ if env is None else env)
        self.options = options or RunOptions()
        self.redactor = Redactor.from_env(self.env)
        self.machine = StateMachine(on_listener_error=self._listener_failed)
        self.stats = RuntimeStats()
        self.telemetry = TelemetryFacade()
        self.constants: Constants = self.options.constants or Constants()
        self.settings: Settings | None = None
        self.board = StatusBoard(job_id="", agent_id=agent.agent_id, attempt=0)
        self.journal: Journal | None = None
        self.store: CheckpointStore | None = None
        self.memory: QdrantMemory | None = None
        self.mcp_tools: MCPTools | None = None
        self.approvals: Approvals | None = None
        self.budget: Budget | None = None
        self.job: Job | None = None
        self._draining = False
        self.drain_event: anyio.Event | None = None
        self.drain_reason: str | None = None
        self.drain_deadline: float | None = None
        self.observers: list[Observer] = []
        self.exit_code: int | None = None
        #: Why the lifecycle ended (the exit line's reason).
        self.exit_reason: str | None = None
        #: What lives as long as `Runtime.run`: the job's telemetry attributes, bound once it is known.
        self._job_scope = contextlib.ExitStack()
        self.checkpoint_id: str | None = None
        self._llm_client: LLMClient | None = None
        self._drain_started: float | None = None
        self._phase_scope: anyio.CancelScope | None = None
        self._step_scope: anyio.CancelScope | None = None
        self._preloader: Preloader | None = None
        self._probe_server: Any = None
        self._heartbeat: Any = None
        self.hard_exit = HardExit(enabled=self.options.hard_exit)
        self._current_step: int | None = None
        self._executing_since: float | None = None
        self._fenced: AttemptFenced | None = None
        self._drained_in = State.BOOTING  # the state a drain interrupted, for the exit line
        self._drained_in_step: int | None = None  # the step a drain interrupted, if it came during one
        self._first_tool_seen = False
        self._rng = random.Random()
        #: False for a job a worker runs: the store, telemetry and probe server are the worker's to close.
        self.owns_process = True
        self.machine.add_listener(self._on_transition)

    @property
    def state(self) -> State:
        """The current lifecycle state."""
        return self.machine.state

    @property
    def draining(self) -> bool:
        """True once a drain was requested (by a signal or `request_drain`)."""
        return self._draining

    def _drain_pending(self) -> bool:
        return self._draining

    def notify(self, event: str, **info: Any) -> None:
        """Tell observers (the test harness) that ``event`` happened; never lets one break the run."""
        if event == "tool_started" and not self._first_tool_seen:
            self._first_tool_seen = True
            if self.settings is not None:
                self.telemetry.bootstrap_done(str(self.settings.data_dir), self.settings.job_id)
        for observer in list(self.observers):
            try:
                observer(event, info)
            except Exception:
                log.exception("runtime observer failed on %s", event)

    def _arm_hard_exit(self, seconds: float, code: int) -> None:
        """Exit with ``code`` if the process is still here after ``seconds`` plus half the SIGKILL buffer."""
        margin = min(self.constants.drain.sigkill_buffer_seconds / 2, 2.0)
        self.hard_exit.arm(seconds + margin, code)

    def _on_transition(self, transition: Transition) -> None:
        self.board.update(state=transition.target)
        if transition.target is State.EXECUTING:
            self._executing_since = time.monotonic()
        elif transition.source is State.EXECUTING and self._executing_since is not None:
            # The execution half of the phase budget: EXECUTING until DRAINING (or a crash).
            self.telemetry.execution(time.monotonic() - self._executing_since)
        if self.journal is not None:
            self.journal.append(
                "LIFECYCLE",
                **{"from": transition.source.value, "to": transition.target.value},
                reason=self.redactor.redact(transition.reason),
            )
        log.info(
            "%s -> %s%s",
            transition.source,
            transition.target,
            f" ({transition.reason})" if transition.reason else "",
            extra=log_fields(transition_from=transition.source.value, transition_to=transition.target.value),
        )
        self.telemetry.record_transition(transition)
        if self._heartbeat is not None:
            self._heartbeat.push_lifecycle(transition)
        self.notify("transition", source=transition.source, target=transition.target)

    def _listener_failed(self, listener: Callable[[Transition], None], exc: BaseException) -> None:
        log.error("lifecycle listener %s failed: %s", getattr(listener, "__qualname__", listener), exc)
