"""An example agent to copy: it drafts release notes for a repository change list.

Run it on the embedded defaults (SQLite, local Qdrant, a scripted LLM when no ANTHROPIC_API_KEY is set)::

    python -m agentlife run release_notes_agent:ReleaseNotesAgent --job-id notes-1 \
        --payload '{"changes": "examples/changes.txt", "outbox": ".agentlife/outbox"}'

What it shows:

* state carried across steps in ``ctx.state`` (checkpointed after every step);
* a read-only tool (``read_changes``) and a side-effecting one (``publish_draft``) whose ``verify``
  makes it exactly-once across crashes, keyed by the stable ``invocation_id``;
* an LLM call through ``ctx.llm`` (journaled: a resumed step does not pay for it twice);
* ``deliver`` (at most once per job, before housekeeping) and ``housekeeping`` (best effort);
* memories written back at the end and hydrated by the next job.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from agentlife import NOT_DONE, AgentProcess, Done, LLMClient, StepContext, tool
from agentlife.testing import ScriptedLLM, ScriptedTurn


@tool(name="file_read", side_effects=False)
def read_changes(path: str) -> list[str]:
    """A sync tool: it runs on a worker thread, under the file_read timeout (10 s)."""
    return [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]


async def _draft_exists(invocation_id: str) -> Any:
    """``verify`` for publish_draft: the draft file named by the invocation id is proof it was published."""
    path = _draft_path(invocation_id)
    return str(path) if path.exists() else NOT_DONE


def _draft_path(invocation_id: str) -> Path:
    outbox = Path(os.environ.get("RELEASE_NOTES_OUTBOX", ".agentlife/outbox"))
    return outbox / (invocation_id.replace("/", "_") + ".md")


@tool(verify=_draft_exists)
async def publish_draft(text: str, invocation_id: str) -> str:
    """A side-effecting tool: journaled write-ahead; the invocation id is its idempotency key."""
    path = _draft_path(invocation_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # atomic: verify never sees half a draft
    return str(path)


def _append_delivery(result: Any) -> None:
    outbox = Path(os.environ.get("RELEASE_NOTES_OUTBOX", ".agentlife/outbox"))
    outbox.mkdir(parents=True, exist_ok=True)
    with (outbox / "deliveries.jsonl").open("a") as f:
        f.write(json.dumps(result) + "\n")


class ReleaseNotesAgent(AgentProcess):
    """Four steps: read the changes, draft with the LLM, publish the draft, finish."""

    agent_id = "release-notes"

    def make_llm(self) -> LLMClient:
        if os.environ.get("ANTHROPIC_API_KEY"):
            return super().make_llm()
        # Addressed by (step, call): the draft is step 1's first call, so a resumed job gets it there too.
        return ScriptedLLM(
            {
                (1, 0): ScriptedTurn.text(
                    "## Release notes\n\n- Faster start-up: heavy clients load in the background.\n"
                    "- Drains finish the current step, then exit 143.\n",
                    chunks=6,
                    delay=0.02,
                )
            }
        )

    async def step(self, ctx: StepContext) -> Done | None:
        payload = ctx.job.payload or {}
        if ctx.step == 0:
            ctx.state["changes"] = await ctx.call_tool(
                read_changes, path=payload.get("changes", "examples/changes.txt")
            )
            return None
        if ctx.step == 1:
            context = "\n".join(f"- {m.text}" for m in ctx.memories[:3])
            reply = await ctx.llm.complete(
                model=payload.get("model", "claude-sonnet-4-5"),
                max_tokens=800,
                messages=[
                    {
                        "role": "user",
                        "content": "Write release notes for:\n"
                        + "\n".join(ctx.state["changes"])
                        + (f"\n\nEarlier notes:\n{context}" if context else ""),
                    }
                ],
            )
            ctx.state["draft"] = reply.text
            return None
        if ctx.step == 2:
            ctx.state["published"] = await ctx.call_tool(publish_draft, text=ctx.state["draft"])
            return None
        return Done(result={"draft": ctx.state["published"], "changes": len(ctx.state["changes"])})

    async def deliver(self, result: Any) -> None:
        # Blocking file I/O goes to a worker thread: the event loop keeps answering heartbeats meanwhile.
        await anyio.to_thread.run_sync(_append_delivery, result)

    async def housekeeping(self, result: Any) -> None:
        Path(result["draft"]).with_suffix(".archived").touch()

    def memories_to_store(self, result: Any, state: Any) -> list[str]:
        return [
            f"release notes covered {len(state.get('changes', []))} changes: {state.get('draft', '')[:200]}"
        ]


if __name__ == "__main__":
    ReleaseNotesAgent.main()
