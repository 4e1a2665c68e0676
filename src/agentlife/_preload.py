"""Importing the heavy clients on a background thread during boot.

``anthropic`` alone costs about two seconds of imports. Started in BOOTING, this thread overlaps those
imports with store connection and hydration, so neither READY nor the first LLM call waits for the whole
sum. A module that fails to import is remembered and re-raised where it is really used.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Sequence

from agentlife._exceptions import describe_error

__all__ = ["Preloader"]

log = logging.getLogger("agentlife.preload")


class Preloader:
    """Imports ``modules`` in order on one daemon thread; `wait` blocks (off the loop) until one is in."""

    def __init__(self, modules: Sequence[str]) -> None:
        self.modules = tuple(dict.fromkeys(modules))
        self.durations: dict[str, float] = {}
        self.errors: dict[str, str] = {}
        self._done: dict[str, threading.Event] = {m: threading.Event() for m in self.modules}
        self._thread = threading.Thread(target=self._run, name="agentlife-preload", daemon=True)

    def start(self) -> Preloader:
        """Start importing; returns at once."""
        if self.modules:
            self._thread.start()
        return self

    def _run(self) -> None:
        for module in self.modules:
            started = time.perf_counter()
            try:
                importlib.import_module(module)
            except Exception as exc:  # an optional extra missing is not fatal here
                self.errors[module] = describe_error(exc)
            finally:
                self.durations[module] = time.perf_counter() - started
                self._done[module].set()

    def wait(self, module: str, timeout: float | None = None) -> bool:
        """Block until ``module`` was imported (or failed); False on timeout. Unknown modules return True."""
        event = self._done.get(module)
        return True if event is None else event.wait(timeout)
