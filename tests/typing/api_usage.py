"""Type-checked (mypy --strict) the way users write agents: a regression test for the public API's types."""

from __future__ import annotations

import datetime
from typing import Any, TypedDict

import agentlife
from agentlife import (
    NOT_DONE,
    AgentProcess,
    AnthropicLLM,
    Conversation,
    Done,
    JobHandle,
    JobOutcome,
    LLMReply,
    StepContext,
    StepLLM,
    StructuredReply,
    ToolAgent,
    tool,
)
from agentlife.testing import AgentHarness, DrainAt, ScriptedLLM, ScriptedTurn


@tool(timeout=10, side_effects=False)
async def read_file(path: str) -> str:
    return path


async def _already_sent(invocation_id: str) -> Any:
    return NOT_DONE


@tool(verify=_already_sent)
async def send(text: str, invocation_id: str) -> str:
    return invocation_id


class Reviewer(AgentProcess):
    agent_id = "reviewer"

    def make_llm(self) -> ScriptedLLM:
        return ScriptedLLM([ScriptedTurn.text("looks good")])

    async def step(self, ctx: StepContext) -> Done | None:
        text: str = await ctx.call_tool(read_file, path="README.md")
        await ctx.sleep(1.5)
        await ctx.sleep_until(datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC))
        ctx.state["answer"] = await ctx.wait_for_event("answer", timeout=60)
        await ctx.publish("phase", {"name": "reviewing", "parts": 3})
        children: list[JobHandle] = [
            await ctx.start_job("reviewer-part", payload={"part": n}) for n in range(3)
        ]
        audit: JobHandle = await ctx.start_job("auditor", job_id="audit-1", detached=True)
        outcomes: list[JobOutcome] = await ctx.wait_for_jobs(children, timeout=3600)
        ctx.state["parts"] = [o.result for o in outcomes if o.ok and not o.timed_out]
        ctx.state["audit"] = audit.job_id
        reply: LLMReply = await ctx.llm.complete(
            model="m", max_tokens=10, messages=[{"role": "user", "content": text}]
        )
        ctx.state["summary"] = reply.text
        score: int = await ctx.llm.complete(
            model="m", max_tokens=10, messages=[{"role": "user", "content": text}], output_type=int
        )
        structured: StructuredReply[int] = await ctx.llm.complete_structured(
            model="m", max_tokens=10, messages=[], output_type=int, output_retries=1
        )
        ctx.state["score"] = score + structured.output
        async with ctx.llm.stream(model="m", max_tokens=10, messages=[]) as stream:
            async for delta in stream.text_stream:
                ctx.state["last"] = delta.upper()
            async for event in stream:
                ctx.state["kind"] = event.kind
            final: LLMReply = await stream.get_final_reply()
        ctx.state["final"] = final.text
        sent: str = await ctx.call_tool(send, text=reply.text)
        budget_left: float = ctx.budget.cost_usd_remaining
        return Done(result={"sent": sent, "left": budget_left}) if ctx.step > 0 else None


async def ask(llm: StepLLM, question: str) -> str:
    """A helper that takes ``ctx.llm`` by its public type."""
    reply: LLMReply = await llm.complete(
        model="m", max_tokens=10, messages=[{"role": "user", "content": question}]
    )
    return reply.text


async def use_harness(harness: AgentHarness) -> int:
    run = await harness.run(Reviewer(), drain=DrainAt.during_tool("send"))
    return run.exit_code


class Verdict(TypedDict):
    label: str
    confident: bool


class Triage(ToolAgent):
    """A tool-using agent as users write it: class attributes only."""

    agent_id = "triage"
    model = "claude-sonnet-4-5"
    system = "You triage issues."
    tools = (read_file, send)
    output_type = Verdict
    max_turns = 6


async def hand_written_loop(ctx: StepContext) -> Done | None:
    if not ctx.conversation:
        ctx.conversation.append({"role": "user", "content": "hi"})
    reply = await ctx.llm.complete(
        model="claude-sonnet-4-5", max_tokens=100, messages=list(ctx.conversation), tools=[read_file]
    )
    ctx.conversation.append({"role": "assistant", "content": list(reply.content)})
    results: list[dict[str, Any]] = await ctx.run_tool_calls(reply)
    ctx.conversation.append({"role": "user", "content": results})
    messages: Conversation = ctx.conversation
    return Done(result=len(messages))


def scripted_by_call() -> ScriptedLLM:
    return ScriptedLLM({(0, 0): ScriptedTurn.tool_use("read_file", {"path": "x"}), (1, 0): "done"})


def own_sdk_client(client: Any) -> AnthropicLLM:
    """An `anthropic.AsyncAnthropic` the user built is used as it is (the SDK path)."""
    return AnthropicLLM(client=client)


async def an_application(url: str) -> object:
    """A web backend drives jobs through the client, as users write it."""
    async with await agentlife.Client.connect(url) as client:
        job: agentlife.JobHandle = await client.start("researcher", {"topic": "tides"}, job_id="r-1")
        snapshot: agentlife.JobSnapshot = await client.get(job.job_id)
        page: agentlife.JobPage = await client.list(status="RUNNING", limit=10, after=None)
        summaries: tuple[agentlife.JobSummary, ...] = page.jobs
        await client.send(job.job_id, "answer", {"yes": True})
        await client.approve(job.job_id, call=None)
        try:
            return await client.result(job.job_id, timeout=30.0)
        except agentlife.JobFailed as exc:
            return (exc.status, exc.last_error, snapshot.status, len(summaries))
        except agentlife.ResultTimeout:
            return (await client.cancel(job.job_id, "too slow")).status


def a_sync_view(client: agentlife.BlockingClient, job_id: str) -> object:
    """A Flask or Django view, on a worker thread."""
    return client.result(job_id, timeout=5)
