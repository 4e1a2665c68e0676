"""One job's record of itself: its state machine, its observers, its counters and its ``/status`` entry.

`JobEvents` is built by the lifecycle before boot and handed to the parts that report (the step path, the
services); `JobBoard` writes the job's state and step to its own entry in the process's `StatusBoard`
and to the job's log fields (see `agentlife._logging.job_log_context`), so two jobs of one worker never
overwrite each other's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentlife._config import Settings
from agentlife._logging import log_fields
from agentlife._observe._status import StatusBoard
from agentlife._observe._telemetry_facade import TelemetryFacade
from agentlife._state import State, StateMachine, Transition
from agentlife._step._host import RuntimeStats

__all__ = ["JobBoard", "JobEvents", "Observer", "board_log_context"]

log = logging.getLogger("agentlife.runtime")

Observer = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True, slots=True)
class JobBoard:
    """One job's entry on the process's status board, and its log fields.

    Attributes:
        board: the process's board.
        job_id: the job's id (the entry's key).
        log_fields: the job's log context, updated in place.
        mirror: also write the board's one-job fields (``job_id``, ``state``, ``step`` ...): a process that
            runs one job at a time keeps them as they always were.
    """

    board: StatusBoard
    job_id: str
    log_fields: dict[str, Any]
    mirror: bool

    @classmethod
    def for_job(cls, board: StatusBoard, job_id: str, agent_id: str, *, mirror: bool) -> JobBoard:
        """The entry of ``job_id``, its log fields naming the job before its settings are read."""
        fields = {"job_id": job_id or None, "agent_id": agent_id or None, "attempt": None}
        return cls(board, job_id, fields, mirror)

    def update(self, **changes: Any) -> None:
        """Record ``state=``, ``step=``, ``attempt=`` ... of this job."""
        shown = {k: (v.value if isinstance(v, State) else v) for k, v in changes.items()}
        self.board.update_job(self.job_id, **shown)
        self.log_fields.update(shown)
        if self.mirror:
            self.board.update(**changes)

    def close(self) -> None:
        """The job ended: its entry leaves the table."""
        self.board.remove_job(self.job_id)


class JobEvents:
    """The job's state machine, the observers told of each event, and the counters of its calls."""

    def __init__(self, board: JobBoard, telemetry: TelemetryFacade) -> None:
        self.board = board
        self.telemetry = telemetry
        self.stats = RuntimeStats()
        self.observers: list[Observer] = []
        self.machine = StateMachine(on_listener_error=self._listener_failed)
        self._executing_since: float | None = None
        self._sinks: list[Callable[[Transition], None]] = []
        self.machine.add_listener(self._on_transition)

    def add_sink(self, sink: Callable[[Transition], None]) -> None:
        """Also record each transition there (the journal, the heartbeat stream), before observers hear."""
        self._sinks.append(sink)

    @property
    def state(self) -> State:
        """The job's lifecycle state."""
        return self.machine.state

    def notify(self, event: str, **info: Any) -> None:
        """Tell observers (the test harness) that ``event`` happened; never lets one break the run."""
        self._show_rate_limit_wait(event, info)
        for observer in list(self.observers):
            try:
                observer(event, info)
            except Exception:
                log.exception("runtime observer failed on %s", event)

    def _show_rate_limit_wait(self, event: str, info: dict[str, Any]) -> None:
        """The job's ``/status`` entry says ``waiting: rate limit BUCKET`` while a call waits for capacity."""
        entry = self.board
        if event == "rate_limit_wait":
            entry.board.update_job(entry.job_id, waiting=f"rate limit {info.get('bucket')}")
        elif event == "rate_limit_waited":
            entry.board.update_job(entry.job_id, waiting=None)

    def end_bootstrap_at_first_tool(self, settings: Settings) -> None:
        """End the bootstrap phase at the job's first tool dispatch (its metric's other half is EXECUTING)."""
        seen: list[bool] = []

        def observe(event: str, info: dict[str, Any]) -> None:
            if event == "tool_started" and not seen:
                seen.append(True)
                self.telemetry.bootstrap_done(str(settings.data_dir), settings.job_id)

        self.observers.insert(0, observe)

    def _on_transition(self, transition: Transition) -> None:
        self.board.update(state=transition.target)
        if transition.target is State.EXECUTING:
            self._executing_since = time.monotonic()
        elif transition.source is State.EXECUTING and self._executing_since is not None:
            # The execution half of the phase budget: EXECUTING until DRAINING (or a crash).
            self.telemetry.execution(time.monotonic() - self._executing_since)
        for sink in self._sinks:
            sink(transition)
        log.info(
            "%s -> %s%s",
            transition.source,
            transition.target,
            f" ({transition.reason})" if transition.reason else "",
            extra=log_fields(transition_from=transition.source.value, transition_to=transition.target.value),
        )
        self.telemetry.record_transition(transition)
        self.notify("transition", source=transition.source, target=transition.target)

    def _listener_failed(self, listener: Callable[[Transition], None], exc: BaseException) -> None:
        log.error("lifecycle listener %s failed: %s", getattr(listener, "__qualname__", listener), exc)


def board_log_context(board: StatusBoard, job_id: str) -> dict[str, Any]:
    """A one-job process's own log fields, from its board (a job's task adds its own over them)."""
    snap = board.snapshot()
    return {
        # Lines logged before the settings are read (the probe server's first) still name the job.
        "job_id": snap.job_id or job_id or None,
        "agent_id": snap.agent_id or None,
        "attempt": snap.attempt or None,
        "state": snap.state.value,
        "step": snap.step,
    }
