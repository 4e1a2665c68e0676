"""The six lifecycle states and the only transitions allowed between them."""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from agentlife._exceptions import InvalidTransition

__all__ = ["TRANSITIONS", "State", "StateMachine", "Transition"]


class State(enum.Enum):
    """A lifecycle state of the agent process."""

    BOOTING = "BOOTING"
    """The process started: configuration, the store, the probe server (alive, not ready)."""
    HYDRATING = "HYDRATING"
    """Claiming the job and loading its checkpoint, the journal's pending calls and its memories."""
    READY = "READY"
    """Hydrated; the first step is about to run (``/readyz`` answers 200)."""
    EXECUTING = "EXECUTING"
    """Running steps, one checkpoint after each."""
    DRAINING = "DRAINING"
    """SIGTERM arrived: the current step finishes or is cancelled at the step deadline, then the checkpoint is
    saved."""
    TERMINATED = "TERMINATED"
    """Done, drained or failed; the exit code says which."""

    def __str__(self) -> str:
        return self.value


TRANSITIONS: frozenset[tuple[State, State]] = frozenset(
    {
        (State.BOOTING, State.HYDRATING),
        (State.BOOTING, State.TERMINATED),
        (State.BOOTING, State.DRAINING),
        (State.HYDRATING, State.READY),
        (State.HYDRATING, State.TERMINATED),
        (State.HYDRATING, State.DRAINING),
        (State.READY, State.EXECUTING),
        (State.READY, State.DRAINING),
        (State.EXECUTING, State.DRAINING),
        (State.EXECUTING, State.TERMINATED),
        (State.DRAINING, State.TERMINATED),
    }
)


@dataclass(frozen=True, slots=True)
class Transition:
    """One transition as listeners see it."""

    source: State
    target: State
    reason: str
    at: float


Listener = Callable[[Transition], None]


class StateMachine:
    """Holds the current state and tells listeners about every transition.

    Listeners (journal, metrics, heartbeats, logs) are called synchronously, in registration order, so a
    transition is journaled before anything else can observe the new state. A listener that raises is not
    allowed to break the lifecycle: its error is passed to ``on_listener_error``.
    """

    def __init__(self, on_listener_error: Callable[[Listener, BaseException], None] | None = None) -> None:
        self._state = State.BOOTING
        self._listeners: list[Listener] = []
        self._on_listener_error = on_listener_error
        # The probe thread reads the state; the lock keeps (state, since) consistent for it.
        self._lock = threading.Lock()
        self._since = time.monotonic()

    @property
    def state(self) -> State:
        """The current state."""
        return self._state

    @property
    def since(self) -> float:
        """`time.monotonic()` of the last transition."""
        return self._since

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener`` after every future transition."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        """Stop calling ``listener``; unknown listeners are ignored."""
        if listener in self._listeners:
            self._listeners.remove(listener)

    def can_move(self, target: State) -> bool:
        """Whether the table allows the current state to move to ``target``."""
        return (self._state, target) in TRANSITIONS

    def move(self, target: State, reason: str = "") -> Transition:
        """Move to ``target`` or raise `InvalidTransition`."""
        with self._lock:
            source = self._state
            if (source, target) not in TRANSITIONS:
                raise InvalidTransition(source, target)
            self._state = target
            self._since = time.monotonic()
        transition = Transition(source, target, reason, time.time())
        for listener in list(self._listeners):
            try:
                listener(transition)
            except Exception as exc:
                if self._on_listener_error is not None:
                    self._on_listener_error(listener, exc)
        return transition
