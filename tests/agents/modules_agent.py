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


class ScrapingModulesAgent(AgentProcess):
    """Step 0 writes the loaded modules; step 1 writes its own ``/metrics`` (``TEST_METRICS_FILE``)."""

    agent_id = "modules"

    async def step(self, ctx: StepContext) -> Done | None:
        if ctx.step == 0:
            Path(os.environ["TEST_MODULES_FILE"]).write_text("\n".join(sorted(sys.modules)), encoding="utf-8")
            return None
        import urllib.request

        import anyio.to_thread

        url = f"http://127.0.0.1:{os.environ['AGENTLIFE_HEALTH_PORT']}/metrics"

        def scrape() -> str:
            with urllib.request.urlopen(url, timeout=30) as answer:
                return str(answer.read().decode("utf-8"))

        text = await anyio.to_thread.run_sync(scrape)
        Path(os.environ["TEST_METRICS_FILE"]).write_text(text, encoding="utf-8")
        return Done()
