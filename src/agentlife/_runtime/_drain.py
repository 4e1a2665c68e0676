"""A drain: its flag, its reason, the event it sets, the step deadline and the cancel scopes it reaches.

One `Drain` per job, and one per worker process. A request is taken once (a second is logged and ignored)
and then, in order: the flag and the event are set, the deadline is fixed at ``now + step_deadline``, every
scope registered with `bounded` has its deadline brought forward to it, every scope registered with
`cancelled` is cancelled, and the listeners run (the lifecycle journals and moves to DRAINING there; a
worker's process drain fans out to the drain of each job it runs). It satisfies `DrainState`, so the
approval loop and a step's calls read it directly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import anyio

from agentlife._logging import log_fields

__all__ = ["Drain"]

log = logging.getLogger("agentlife.runtime")


class Drain:
    """Whether and why a drain began, and what it reaches.

    Args:
        step_deadline: seconds a running step (or delivery) may still take once the drain begins.
    """

    def __init__(self, step_deadline: float) -> None:
        self.step_deadline = step_deadline
        #: Why the drain began (``SIGTERM``, ``SIGINT``, ...); None while not draining.
        self.reason: str | None = None
        #: The anyio clock time at which bounded scopes are cancelled; None while not draining.
        self.deadline: float | None = None
        #: ``time.monotonic()`` when the drain began, for the drain's duration metric.
        self.started: float | None = None
        self._draining = False
        self._event: anyio.Event | None = None
        self._bounded: list[anyio.CancelScope] = []
        self._cancelled: list[anyio.CancelScope] = []
        self._listeners: list[Callable[[str], None]] = []

    @property
    def draining(self) -> bool:
        """True once a drain was requested."""
        return self._draining

    @property
    def drain_event(self) -> anyio.Event | None:
        """Set when the drain begins; None until `open` ran inside the event loop."""
        return self._event

    @property
    def drain_deadline(self) -> float | None:
        """The anyio clock time at which the step is cancelled; None while not draining."""
        return self.deadline

    def open(self) -> None:
        """Create the event (it needs the running loop); already set if the drain came first."""
        if self._event is None:
            self._event = anyio.Event()
            if self._draining:
                self._event.set()

    def add_listener(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(reason)`` when the drain begins (at once if it already has)."""
        self._listeners.append(listener)
        if self._draining and self.reason is not None:
            listener(self.reason)

    def remove_listener(self, listener: Callable[[str], None]) -> None:
        """Stop calling ``listener`` (a job that ended leaves its worker's drain)."""
        if listener in self._listeners:
            self._listeners.remove(listener)

    def request(self, reason: str) -> bool:
        """Begin the drain; False (and a warning) when it had already begun."""
        if self._draining:
            log.warning("%s received during drain: ignored until cleanup is over", reason)
            return False
        self._draining, self.reason, self.started = True, reason, time.monotonic()
        try:
            self.deadline = anyio.current_time() + self.step_deadline
        except RuntimeError:  # before the loop runs (a signal during imports): fixed when a scope registers
            self.deadline = None
        if self._event is not None:
            self._event.set()
        log.info("drain requested by %s", reason, extra=log_fields(reason=reason))
        for scope in self._bounded:
            self._bound(scope)
        for scope in self._cancelled:
            scope.cancel()
        for listener in list(self._listeners):
            listener(reason)
        return True

    @contextmanager
    def bounded(self, scope: anyio.CancelScope) -> Iterator[anyio.CancelScope]:
        """While the block runs, a drain brings ``scope``'s deadline forward to the drain deadline."""
        self._bounded.append(scope)
        if self._draining:
            self._bound(scope)
        try:
            yield scope
        finally:
            self._bounded.remove(scope)

    @contextmanager
    def cancelled(self, scope: anyio.CancelScope) -> Iterator[anyio.CancelScope]:
        """While the block runs, a drain cancels ``scope`` at once (boot and hydration give way)."""
        self._cancelled.append(scope)
        if self._draining:
            scope.cancel()
        try:
            yield scope
        finally:
            self._cancelled.remove(scope)

    def _bound(self, scope: anyio.CancelScope) -> None:
        if self.deadline is None:
            self.deadline = anyio.current_time() + self.step_deadline
        scope.deadline = min(scope.deadline, self.deadline)
