"""An agent module whose import takes long (``SLOW_IMPORT=sleep``), spins (``SLOW_IMPORT=spin``) or
swallows the first interruption of its long sleep (``SLOW_IMPORT=swallow``), as a retry loop catching
``BaseException`` would."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from agentlife import AgentProcess, Done, StepContext

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
