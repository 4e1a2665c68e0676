"""A tool-using agent for the console tests: a conversation with a tool call, hostile text and a secret.

`Chatty` asks its scripted model once; the model calls ``lookup`` with a query holding HTML and a script,
and an ``api_key`` argument holding ``CONSOLE_TEST_VALUE`` (a value the console's environment names as a
secret and the agent's does not, so only the console's own masking stands between it and the page); the
second turn answers with text that holds an ``<img onerror>``.
"""

from __future__ import annotations

import os
from typing import ClassVar

from agentlife import LLMClient, ScriptedLLM, ScriptedTurn, ToolAgent, tool


@tool(side_effects=False)
async def lookup(query: str, api_key: str) -> str:
    """Look ``query`` up.

    Args:
        query: what to look up.
        api_key: the key of the service.
    """
    return f"found 3 results for {query}; used key {api_key}"


class Chatty(ToolAgent):
    """One tool call, then a final text answer."""

    agent_id = "chatty"
    tools: ClassVar = (lookup,)
    max_turns = 4

    def make_llm(self) -> LLMClient:
        secret = os.environ.get("CONSOLE_TEST_VALUE", "none")
        call = ScriptedTurn.reply(
            [
                {"type": "text", "text": "Let me look that up."},
                {
                    "type": "tool_use",
                    "id": "tu_1",
                    "name": "lookup",
                    "input": {"query": f"<script>window.pwned=1</script> {secret}", "api_key": secret},
                },
            ],
            stop_reason="tool_use",
        )
        answer = "All done <img src=x onerror=window.pwned=1> and nothing else."
        return ScriptedLLM({(0, 0): call, (1, 0): answer})
