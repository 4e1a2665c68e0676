"""An agent whose first step writes the names of the modules the process has imported, then finishes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from agentlife import AgentProcess, Done, StepContext


class ModulesAgent(AgentProcess):
    agent_id = "modules"

    async def step(self, ctx: StepContext) -> Done | None:
        Path(os.environ["TEST_MODULES_FILE"]).write_text("\n".join(sorted(sys.modules)), encoding="utf-8")
        return Done()
