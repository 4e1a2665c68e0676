"""An agent for the real-process tests of fleet-wide rate limits (tests/e2e/test_rate_limit_processes.py).

One step: it touches ``calling`` in ``TEST_MARKER_DIR``, makes one model call through the default client
(the real `AnthropicLLM`, pointed at a `FakeAnthropicServer`), and is done with the reply's text.
"""

from __future__ import annotations

import os
from pathlib import Path

from agentlife import AgentProcess, Done, StepContext


class OneCallAgent(AgentProcess):
    """Touch ``calling``, make one call, return its text."""

    agent_id = "rate-limited"

    async def step(self, ctx: StepContext) -> Done:
        Path(os.environ["TEST_MARKER_DIR"], "calling").touch()
        reply = await ctx.llm.complete(
            model="claude-sonnet-4-5", max_tokens=32, messages=[{"role": "user", "content": "hi"}]
        )
        return Done(result={"text": reply.text})
