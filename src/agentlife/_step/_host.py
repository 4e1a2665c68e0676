"""What the engine's collaborators are given, instead of the `Runtime` itself.

* `Booted`: what boot opened for the job (settings, store, journal), frozen once boot is done.
* `StepHost`: the little a step's calls need from the process around them: constants, the drain, the
  redactor, counters, telemetry and notifications. The `Runtime` is one; a unit test
  can pass a small stand-in.
* `DrainState`: what the approval loop watches to stop parking when a drain begins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import anyio

    from agentlife._agent import AgentProcess
    from agentlife._config import Settings
    from agentlife._journal._writer import Journal
    from agentlife._observe._telemetry_facade import TelemetryFacade
    from agentlife._redact import Redactor
    from agentlife.constants import Constants
    from agentlife.stores import JobStore

__all__ = ["Booted", "DrainState", "RuntimeStats", "StepHost"]


@dataclass(slots=True)
class RuntimeStats:
    """Counters for heartbeats, ``/status`` and the harness."""

    steps_completed: int = 0
    llm_calls: int = 0
    tool_calls: int = 0
    checkpoints_written: int = 0


@dataclass(frozen=True, slots=True)
class Booted:
    """What boot opened for the job: its settings, its store and this process's session journal."""

    settings: Settings
    store: JobStore
    journal: Journal


class DrainState(Protocol):
    """Whether a drain began, and the event set when it does."""

    @property
    def draining(self) -> bool:
        """True once a drain was requested."""
        ...

    @property
    def drain_event(self) -> anyio.Event | None:
        """Set when a drain begins (None before the run started)."""
        ...


class StepHost(DrainState, Protocol):
    """What a step's calls need from the process that runs them."""

    @property
    def agent(self) -> AgentProcess:
        """The agent: its policy check and its replay-mismatch choice."""
        ...

    @property
    def constants(self) -> Constants:
        """The process's constants (time-scaled in tests)."""
        ...

    @property
    def drain_deadline(self) -> float | None:
        """The anyio clock time at which a drain cancels the step; None while not draining."""
        ...

    @property
    def redactor(self) -> Redactor:
        """Masks secrets in what calls record."""
        ...

    @property
    def stats(self) -> RuntimeStats:
        """Counters the calls increment."""
        ...

    @property
    def telemetry(self) -> TelemetryFacade:
        """Spans and metrics of the calls."""
        ...

    def notify(self, event: str, **info: Any) -> None:
        """Tell observers that ``event`` happened."""
        ...
