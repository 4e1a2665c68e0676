"""An agent for the console's proxy test (tests/e2e/test_console_proxy_browser.py): a `ToolAgent` whose
scripted model says why, then asks for the restricted ``deploy`` with an argument holding the value of
``OPS_DEPLOY_TOKEN`` (a secret: the worker stores it masked), and answers once it sees the result."""

from __future__ import annotations

import os
from typing import Any, ClassVar

from agentlife import LLMClient, ScriptedLLM, ScriptedTurn, ToolAgent
from agents.approval_agent import deploy


class ExplainingDeployer(ToolAgent):
    """Explains itself, then deploys to prod (restricted) with a token in its arguments."""

    agent_id = "ops-deployer"
    tools: ClassVar[Any] = (deploy,)
    max_turns = 3

    def make_llm(self) -> LLMClient:
        secret = os.environ["OPS_DEPLOY_TOKEN"]
        ask = ScriptedTurn.reply(
            [
                {"type": "text", "text": f"The build is green; deploying to prod with token {secret}."},
                {
                    "type": "tool_use",
                    "id": "tu_1",
                    "name": "deploy",
                    "input": {"target": f"prod?key={secret}"},
                },
            ],
            stop_reason="tool_use",
        )
        return ScriptedLLM({(0, 0): ask, (1, 0): "Deployed."})
