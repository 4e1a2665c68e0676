"""An agent that publishes its progress and streams a model reply, and SIGKILLs itself around a publish.

Step ``n`` publishes ``("s<n>", {"step": n, "token": OUT_API_TOKEN})``; on attempt ``n + 1`` it kills its own
process at one point around that publish, so each attempt dies at the next point and the one after resumes
it (the test runs some attempts on another pod's empty disk):

* step 0, ``before``: SIGKILL right before the publish (nothing written);
* step 1, ``inside``: SIGKILL once the store committed the row, before the call returned (nothing journaled);
* step 2, ``after``: SIGKILL right after the publish returned (journaled, the step not checkpointed).

Step 3 (``OUT_LLM_URL`` set) waits for ``OUT_GO`` to exist, then asks the model (a real `AnthropicLLM`
against the test's `FakeAnthropicServer`, streaming slowly) with ``ctx.llm.complete``; its text reaches the
followers as deltas. The result is the reply's text.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import anyio

from agentlife import AgentProcess, AnthropicLLM, Done, StepContext

KILLS = {0: "before", 1: "inside", 2: "after"}


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class Publisher(AgentProcess):
    agent_id = "publisher"

    def make_llm(self) -> Any:
        return AnthropicLLM(api_key="test-key", base_url=os.environ.get("OUT_LLM_URL", "http://127.0.0.1:9"))

    async def step(self, ctx: StepContext) -> Done | None:
        attempt = int(os.environ["AGENTLIFE_ATTEMPT"])
        kill = KILLS.get(ctx.step) if attempt == ctx.step + 1 else None
        if ctx.step in KILLS:
            if kill == "inside":
                store: Any = ctx._env.approvals.booted.store
                publish = store.publish_output

                async def publish_then_die(*args: Any, **kwargs: Any) -> int:
                    await publish(*args, **kwargs)
                    _die()
                    raise AssertionError("killed")

                store.publish_output = publish_then_die
            if kill == "before":
                _die()
            await ctx.publish(
                f"s{ctx.step}", {"step": ctx.step, "token": os.environ.get("OUT_API_TOKEN", "")}
            )
            if kill == "after":
                _die()
            return None
        go = Path(os.environ["OUT_GO"])
        while not go.exists():
            await anyio.sleep(0.02)
        reply = await ctx.llm.complete(
            model="claude-test", messages=[{"role": "user", "content": "write"}], max_tokens=64
        )
        return Done(result={"text": reply.text})
