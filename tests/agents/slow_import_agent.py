"""An agent module whose import takes long (``SLOW_IMPORT=sleep``), spins (``SLOW_IMPORT=spin``),
swallows the first interruption of its long sleep (``SLOW_IMPORT=swallow``), as a retry loop catching
``BaseException`` would, or never lets Python see a drain signal (``SLOW_IMPORT=masked``), as native code
that does not return to the interpreter."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from agentlife import AgentProcess, Done, StepContext

# Masked before the marker says "importing": a signal sent at the marker must find it masked.
if os.environ.get("SLOW_IMPORT") == "masked":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
Path(os.environ["SLOW_IMPORT_MARKER"]).touch()
if os.environ.get("SLOW_IMPORT") == "spin":
    while True:
        pass
if os.environ.get("SLOW_IMPORT") == "swallow":
    with contextlib.suppress(BaseException):  # the first interruption is lost, as in a retry loop
        time.sleep(25)
time.sleep(25)


class SlowImportAgent(AgentProcess):
    agent_id = "slow-import"

    async def step(self, ctx: StepContext) -> Done | None:
        return Done()
