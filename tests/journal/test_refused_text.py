"""What the journal refuses, and what it left pending, across real ``python -m agentlife run`` processes.

- A side-effecting tool whose result the journal cannot hold exactly (a cycle, nesting past the limit, a
  lone surrogate) did its effect: the call is recorded as completed with the refusal, so a resume or a
  rerun gets the same error back and the effect never runs twice.
- A read-only call that started and never finished has nothing recorded: the next attempt runs it with
  its own arguments. A pending side-effecting call with other arguments is still a replay mismatch.

- Text that is only shown (an exception's message) with a lone surrogate is written with its escape:
  the crash record, the log line, the journal and the model's ``tool_result`` stay JSON.

The agents are in ``tests/agents/journal_agents.py``; every effect is a line in a marker file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentlife import LLMReply, ScriptedLLM
from agents.journal_agents import garbled
from stepctx import step_contexts

# -- a lone surrogate in what is only shown ----------------------------------------------------------------


@pytest.mark.anyio
async def test_a_tool_error_with_a_lone_surrogate_goes_back_to_the_model_as_json(tmp_path: Path) -> None:
    reply = LLMReply(text="", content=[{"type": "tool_use", "id": "t1", "name": "garbled", "input": {}}])
    async with step_contexts(tmp_path) as make:
        ctx, _ = await make(ScriptedLLM([]))
        (result,) = await ctx.run_tool_calls(reply, tools=[garbled])
    assert result["is_error"] is True and "bad byte \\udcff here" in result["content"]
    ctx.conversation.append({"role": "user", "content": [result]})  # storable as it is
