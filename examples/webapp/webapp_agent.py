"""The agent behind the example web app: it researches a topic, writes a draft, asks one question.

One step, every call in it journaled: a resumed attempt replays what it did (the model's reply included)
and goes on from the wait. What a follower of the job sees, in order:

* ``progress`` events (``ctx.publish``): the phase it is in and a percentage;
* the model's text while it streams (deltas, not durable: the reply itself is journaled);
* a ``question`` event, then the job waits (``ctx.wait_for_event("answer")``) for the person's answer;
* its end, with the draft and the answer as the result.

It runs offline: ``make_llm`` returns a `ScriptedLLM` that streams a fixed reply in small pieces. Set
``WEBAPP_USE_ANTHROPIC=1`` (and ``ANTHROPIC_API_KEY``) to ask a real model instead.
"""

from __future__ import annotations

import os
from typing import Any

from agentlife import AgentProcess, Done, ScriptedLLM, ScriptedTurn, StepContext

#: How long the person has to answer (``WEBAPP_ANSWER_SECONDS`` overrides: one hour).
ANSWER_SECONDS = float(os.environ.get("WEBAPP_ANSWER_SECONDS", 3600))
#: The scripted reply, streamed in ``WEBAPP_CHUNKS`` pieces ``WEBAPP_CHUNK_DELAY`` seconds apart.
DRAFT = (
    "Tides rise and fall twice a day because the Moon's gravity pulls the ocean into two bulges, one "
    "facing the Moon and one on the far side, and the Earth turns beneath them. The Sun adds a smaller "
    "pull: when both line up the tides are highest (spring tides), at right angles lowest (neap tides)."
)


class Researcher(AgentProcess):
    """Researches ``payload["topic"]``: progress, a streamed draft, one question, the result."""

    agent_id = "webapp-researcher"

    def make_llm(self) -> Any:
        if os.environ.get("WEBAPP_USE_ANTHROPIC") == "1":
            return super().make_llm()
        chunks = int(os.environ.get("WEBAPP_CHUNKS", "24"))
        delay = float(os.environ.get("WEBAPP_CHUNK_DELAY", "0.1"))
        return ScriptedLLM([ScriptedTurn.text(DRAFT, chunks=chunks, delay=delay)], cycle=True)

    async def step(self, ctx: StepContext) -> Done | None:
        payload = ctx.job.payload if isinstance(ctx.job.payload, dict) else {}
        topic = str(payload.get("topic") or "tides")
        await ctx.publish("progress", {"phase": "reading sources", "percent": 25})
        await ctx.publish("progress", {"phase": "writing a draft", "percent": 50})
        reply = await ctx.llm.complete(
            model=os.environ.get("WEBAPP_MODEL", "claude-sonnet-4-5"),
            messages=[{"role": "user", "content": f"Explain in three sentences: {topic}"}],
            max_tokens=400,
        )
        await ctx.publish("progress", {"phase": "waiting for you", "percent": 75})
        await ctx.publish("question", {"text": "Who is the draft for? (a class, a blog, a report ...)"})
        answer = await ctx.wait_for_event("answer", timeout=ANSWER_SECONDS)
        if answer is None:
            return Done({"topic": topic, "draft": reply.text}, status="FAILED", reason="no answer in time")
        audience = str(answer.get("text", "")) if isinstance(answer, dict) else str(answer)
        await ctx.publish("progress", {"phase": "done", "percent": 100})
        return Done({"topic": topic, "draft": reply.text, "audience": audience[:200]})
