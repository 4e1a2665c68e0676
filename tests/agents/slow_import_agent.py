"""An agent module whose import takes long (``SLOW_IMPORT=sleep``) or spins (``SLOW_IMPORT=spin``)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from agentlife import AgentProcess, Done, StepContext

Path(os.environ["SLOW_IMPORT_MARKER"]).touch()
if os.environ.get("SLOW_IMPORT") == "spin":
    while True:
        pass
time.sleep(25)


class SlowImportAgent(AgentProcess):
    agent_id = "slow-import"

    async def step(self, ctx: StepContext) -> Done | None:
        return Done()
