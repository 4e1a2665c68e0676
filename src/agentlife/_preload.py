"""Importing the heavy clients on a background thread during boot.

``anthropic`` alone costs about two seconds of imports, httpx about 0.1 s. Started in BOOTING, this thread
overlaps those imports with store connection and hydration, so neither READY nor the first LLM call waits
for the whole sum. A module that fails to import is remembered and re-raised where it is really used. After
the imports it runs the warm-up calls it was given (a model client's TLS context); one that fails costs
nothing but a debug line, and the client builds the same thing at its first call.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable, Sequence

__all__ = ["Preloader"]

log = logging.getLogger("agentlife.preload")


class Preloader:
    """Imports ``modules`` in order on a daemon thread, then calls ``then``; `wait` blocks until one is in."""

    def __init__(self, modules: Sequence[str], then: Sequence[Callable[[], object]] = ()) -> None:
        self.modules = tuple(dict.fromkeys(modules))
        self.then = tuple(then)
        self.durations: dict[str, float] = {}
        self.errors: dict[str, str] = {}
        self._done: dict[str, threading.Event] = {m: threading.Event() for m in self.modules}
        self._thread = threading.Thread(target=self._run, name="agentlife-preload", daemon=True)

    def start(self) -> Preloader:
        """Start importing; returns at once."""
        if self.modules or self.then:
            self._thread.start()
        return self

    def _run(self) -> None:
        for module in self.modules:
            started = time.perf_counter()
            try:
                importlib.import_module(module)
            except Exception as exc:  # an optional extra missing is not fatal here
                self.errors[module] = f"{type(exc).__name__}: {exc}"
            finally:
                self.durations[module] = time.perf_counter() - started
                self._done[module].set()
        for call in self.then:
            try:
                call()
            except Exception as exc:  # the client does the same at its first call, and reports it there
                log.debug("preload warm-up failed: %s", type(exc).__name__)

    def wait(self, module: str, timeout: float | None = None) -> bool:
        """Block until ``module`` was imported (or failed); False on timeout. Unknown modules return True."""
        event = self._done.get(module)
        return True if event is None else event.wait(timeout)
