"""`ToolAgent`: one model turn plus its tool calls per step, a durable conversation, exactly-once effects."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar, Literal

import orjson
import pytest
from pydantic import BaseModel

from agentlife import (
    AnthropicLLM,
    LLMClient,
    OpenAICompatibleLLM,
    ScriptedLLM,
    ScriptedTurn,
    ToolAgent,
    tool,
)
from agentlife.testing import AgentHarness, DrainAt, FakeAnthropicServer, FakeOpenAIServer
from agentlife.testing._fake_server import FakeModelServer

pytestmark = pytest.mark.anyio


def script() -> dict[tuple[int, int], ScriptedTurn | str]:
    return {
        (0, 0): ScriptedTurn.tool_use("search_docs", {"query": "crash on start"}),
        (1, 0): ScriptedTurn.tool_use("label_issue", {"issue": 7, "label": "bug"}),
        (2, 0): "Labelled #7 as bug.",
    }


def test_the_prompt_comes_from_the_payload() -> None:
    from agentlife import Job

    agent = ToolAgent()
    assert agent.prompt(Job("j", "a", 1, {"prompt": "hi", "x": 1})) == "hi"
    assert agent.prompt(Job("j", "a", 1, "text")) == "text"
    assert agent.prompt(Job("j", "a", 1, {"b": 1, "a": 2})) == '{"a":2,"b":1}'


class Report(BaseModel):
    number: int
    label: Literal["bug", "feature"]


# ----------------------------------------------------------------- calls the model did not send whole
#
# Through the real ``anthropic`` SDK and real httpx against the fake servers: what the adapters read off the
# wire, what the agent does with it, and what goes back to the API.

KEY = "sk-test-toolargs-0123456789"
PROVIDERS = ("anthropic", "openai")


@asynccontextmanager
async def model_server(provider: str, script: Any) -> AsyncIterator[tuple[FakeModelServer, LLMClient]]:
    """A fake server of ``provider`` playing ``script``, and the real adapter pointed at it."""
    if provider == "anthropic":
        async with FakeAnthropicServer(script, api_key=KEY) as anthropic_server:
            yield anthropic_server, AnthropicLLM(api_key=KEY, base_url=anthropic_server.base_url)
    else:
        async with FakeOpenAIServer(script, api_key=KEY) as openai_server:
            yield openai_server, OpenAICompatibleLLM(openai_server.base_url, api_key=KEY)


class Disk:
    """What the side-effecting tool deleted, and what it saw."""

    def __init__(self) -> None:
        self.deleted: list[str] = []
        self.labels: list[tuple[int, str]] = []


def cleanup_agent(disk: Disk, llm: LLMClient, output_type: Any = None) -> type[ToolAgent]:
    @tool(side_effects=True)
    async def cleanup(pattern: str = "*", dry_run: bool = False) -> str:
        """Delete the files that match a pattern; every parameter has a default."""
        disk.deleted.append(pattern)
        return f"deleted {pattern}"

    @tool(side_effects=True, timeout=100)
    async def label_issue(issue: int, label: str) -> str:
        """Put a label on an issue."""
        disk.labels.append((issue, label))
        return f"labelled #{issue} {label}"

    class Janitor(ToolAgent):
        agent_id = "janitor"
        model = "claude-sonnet-agentlife-test"  # the SDK warns (an error here) on models it deprecates
        tools: ClassVar[Any] = (cleanup, label_issue)
        max_turns = 4

        def make_llm(self) -> LLMClient:
            return llm

    Janitor.output_type = output_type
    return Janitor


BROKEN_CALLS = {
    # max_tokens inside the JSON: Anthropic stop_reason max_tokens, OpenAI finish_reason length.
    "cut off mid-JSON": ScriptedTurn.malformed_tool_use(
        "cleanup", '{"pattern": "*.tm', stop_reason="max_tokens"
    ),
    # Cut off before the first argument: "" parses as {}, which every default would accept.
    "cut off before any argument": ScriptedTurn.malformed_tool_use("cleanup", "", stop_reason="max_tokens"),
    # partial_json / function.arguments sent as an object instead of a JSON string.
    "an object, not a string": ScriptedTurn.malformed_tool_use("cleanup", {"pattern": "*"}),
    "JSON, not an object": ScriptedTurn.malformed_tool_use("cleanup", '"*"'),
    # Valid JSON the adapters parse (up to orjson's 1024 levels), deeper than the journal keeps.
    "nested 500 deep": ScriptedTurn.malformed_tool_use(
        "cleanup", '{"pattern": ' + "[" * 499 + "]" * 499 + "}"
    ),
}


def _api_blocks_only(messages: list[dict[str, Any]]) -> None:
    allowed = {
        "tool_use": {"type", "id", "name", "input"},
        "tool_result": {"type", "tool_use_id", "content", "is_error"},
        "text": {"type", "text"},
    }
    for message in messages:
        content = message.get("content")
        for block in content if isinstance(content, list) else ():
            assert set(block) <= allowed[block["type"]], block


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("case", BROKEN_CALLS)
async def test_a_tool_never_runs_on_arguments_the_model_did_not_send(
    tmp_path: Path, provider: str, case: str
) -> None:
    disk = Disk()
    script = {(0, 0): BROKEN_CALLS[case], (1, 0): "Nothing deleted."}
    async with model_server(provider, script) as (server, llm):
        run = await AgentHarness(tmp_path).run(cleanup_agent(disk, llm)(), payload="Clean up.")
    assert run.exit_code == 0, [line for line in run.logs if line["level"] != "INFO"]
    assert run.job is not None and run.job.result == "Nothing deleted."
    assert disk.deleted == []  # cleanup(pattern="*") never ran
    assert "TOOL_STARTED" not in run.journal_types()
    [refused] = [e for e in run.journal if e["type"] == "TOOL_REFUSED"]
    assert refused["tool"] == "cleanup" and refused["reason"] == "unusable_arguments"
    assert any(
        line["level"] == "WARNING" and "refused" in line["msg"] and "cleanup" in line["msg"]
        for line in run.logs
    )
    sent = server.requests[1].body
    assert b"partial_json" not in orjson.dumps(sent)
    if provider == "anthropic":
        _api_blocks_only(sent["messages"])
        assistant, results = sent["messages"][1:]
        assert assistant["content"] == [
            {"type": "tool_use", "id": "toolu_scripted_cleanup", "name": "cleanup", "input": {}}
        ]
        [result] = results["content"]
        assert result["is_error"] is True and result["tool_use_id"] == "toolu_scripted_cleanup"
        told = result["content"]
    else:
        assistant, result = sent["messages"][1:]
        assert assistant["tool_calls"][0]["function"] == {"name": "cleanup", "arguments": "{}"}
        assert set(assistant["tool_calls"][0]) == {"id", "type", "function"}
        assert result["role"] == "tool" and result["tool_call_id"] == "toolu_scripted_cleanup"
        told = result["content"]
        assert told.startswith("Error: ")  # the format's is_error
    assert "tool cleanup was not run" in told
    expected = {
        "cut off mid-JSON": "cut off at max_tokens",
        "cut off before any argument": "cut off at max_tokens",
        "an object, not a string": "as JSON an object, not as the JSON",
        "JSON, not an object": "JSON a string, not an object",
        "nested 500 deep": "its arguments nest deeper than 125 levels, more than the journal keeps",
    }[case]
    assert expected in told


async def test_a_side_effect_with_the_final_answer_runs_once_and_the_answer_is_asked_again(
    tmp_path: Path,
) -> None:
    """The answer was given before the effect's result was seen: the effect runs, the answer is refused."""
    disk = Disk()
    both = ScriptedTurn.reply(
        [
            {
                "type": "tool_use",
                "id": "toolu_label",
                "name": "label_issue",
                "input": {"issue": 7, "label": "bug"},
            },
            {
                "type": "tool_use",
                "id": "toolu_final",
                "name": "final_result",
                "input": {"number": 7, "label": "bug"},
            },
        ]
    )
    again = ScriptedTurn.tool_use("final_result", {"number": 7, "label": "bug"}, id="toolu_final_2")
    async with model_server("anthropic", {(0, 0): both, (1, 0): again}) as (server, llm):
        harness = AgentHarness(tmp_path)
        agent_class = cleanup_agent(disk, llm, output_type=Report)
        run = await harness.run(agent_class(), payload="Label #7.")
    assert run.exit_code == 0 and run.job is not None and run.job.status == "COMPLETED"
    assert run.job.result == {"number": 7, "label": "bug"}
    assert disk.labels == [(7, "bug")]  # exactly once, before the job finished
    results = server.requests[1].body["messages"][-1]["content"]
    assert [r["tool_use_id"] for r in results] == ["toolu_label", "toolu_final"]  # the reply's order
    assert results[0] == {"type": "tool_result", "tool_use_id": "toolu_label", "content": "labelled #7 bug"}
    assert results[1]["is_error"] is True
    assert "it came with other tool calls (label_issue), which ran first" in results[1]["content"]
    [refused] = [e for e in run.journal if e["type"] == "TOOL_REFUSED"]
    assert refused["tool"] == "final_result" and refused["reason"] == "final_result_refused"


async def test_a_side_effect_with_the_final_answer_is_not_repeated_after_a_drain(tmp_path: Path) -> None:
    disk = Disk()
    llm = ScriptedLLM(
        {
            (0, 0): ScriptedTurn.reply(
                [
                    {
                        "type": "tool_use",
                        "id": "t1",
                        "name": "label_issue",
                        "input": {"issue": 7, "label": "bug"},
                    },
                    {
                        "type": "tool_use",
                        "id": "t2",
                        "name": "final_result",
                        "input": {"number": 7, "label": "bug"},
                    },
                ]
            ),
            (1, 0): ScriptedTurn.tool_use("final_result", {"number": 7, "label": "bug"}),
        }
    )
    harness = AgentHarness(tmp_path)
    agent_class = cleanup_agent(disk, llm, output_type=Report)
    run = await harness.run(agent_class(), payload="Label #7.", drain=DrainAt.during_tool("label_issue"))
    assert run.exit_code == 143
    run = await harness.run(agent_class(), payload="Label #7.")
    assert run.job is not None and run.job.result == {"number": 7, "label": "bug"}
    assert disk.labels == [(7, "bug")]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_an_empty_reply_or_a_tool_stop_without_a_call_is_not_a_final_answer(
    tmp_path: Path, provider: str
) -> None:
    disk = Disk()
    script = {
        (0, 0): ScriptedTurn.reply([], stop_reason="end_turn"),  # nothing at all
        (1, 0): ScriptedTurn.text("I will clean up now.", stop_reason="tool_use"),  # says it calls, does not
        (2, 0): ScriptedTurn.text("   ", stop_reason="end_turn"),  # whitespace only
        (3, 0): "All clean.",
    }
    async with model_server(provider, script) as (server, llm):
        run = await AgentHarness(tmp_path).run(cleanup_agent(disk, llm)(), payload="Clean up.")
    assert run.job is not None and run.job.status == "COMPLETED" and run.job.result == "All clean."
    last = server.requests[3].body["messages"]
    if provider == "anthropic":
        # No empty assistant turn was sent back (the API refuses one): the model was told instead.
        assert [m["role"] for m in last] == ["user", "user", "assistant", "user", "user"]
        assert all(m["content"] for m in last)
        assert last[1]["content"] == "Your reply was empty. Go on: call a tool, or give your final answer."
        assert last[2]["content"] == [{"type": "text", "text": "I will clean up now."}]
        assert "stop_reason tool_use" in last[3]["content"]
    else:
        assert [m["role"] for m in last] == ["user", "user", "assistant", "user", "user"]
        assert last[2] == {"role": "assistant", "content": "I will clean up now."}
    assert any("not a final answer" in line["msg"] and line["level"] == "WARNING" for line in run.logs)


async def test_empty_replies_count_as_turns(tmp_path: Path) -> None:
    llm = ScriptedLLM([ScriptedTurn.reply([], stop_reason="end_turn")] * 4)
    run = await AgentHarness(tmp_path).run(cleanup_agent(Disk(), llm)(), payload="Clean up.")
    assert run.job is not None and run.job.status == "FAILED"
    assert llm.calls == 4 and "no final answer after 4 model turns" in str(run.job.error)


async def test_a_text_cut_off_at_max_tokens_is_not_a_final_answer(tmp_path: Path) -> None:
    llm = ScriptedLLM(
        {(0, 0): ScriptedTurn.text("The files to delete are", stop_reason="max_tokens"), (1, 0): "None."}
    )
    run = await AgentHarness(tmp_path).run(cleanup_agent(Disk(), llm)(), payload="Clean up.")
    assert run.job is not None and run.job.result == "None."
    assert "cut off at max_tokens (4096 tokens)" in llm.requests[1].messages[-1]["content"]


async def test_an_oversized_tool_result_fails_the_job_naming_the_input_token_limit(tmp_path: Path) -> None:
    @tool(side_effects=False)
    async def dump_logs() -> str:
        """Return every log line."""
        return "2024-05-01 12:00:00 INFO worker ok\n" * (3 * 1024 * 1024 // 35)  # 3 MB: 786 000 tokens

    class Dumper(ToolAgent):
        agent_id = "dumper"
        tools: ClassVar[Any] = (dump_logs,)

        def make_llm(self) -> LLMClient:
            return llm

    llm = ScriptedLLM({(0, 0): ScriptedTurn.tool_use("dump_logs", {}), (1, 0): "never asked"})
    run = await AgentHarness(tmp_path).run(Dumper(), payload="Why did it crash?")
    assert run.exit_code == 0 and run.job is not None and run.job.status == "FAILED"
    assert llm.calls == 1  # the 3 MB request was never sent
    reason = run.job.result["reason"]
    assert reason.startswith("token budget exhausted (")
    assert "> 500000 input tokens max; that request alone is over the limit" in reason
    assert re.search(r"its largest message, #2 \(user, tool_result\), holds about \d{6} tokens\)$", reason)
    assert "$" not in reason  # not the cost limit, which was never near


def nested(levels: int) -> Any:
    """A value of ``levels`` levels of dicts, built without recursion (a model can send 10 000)."""
    value: Any = "leaf"
    for _ in range(levels - 1):
        value = {"k": value}
    return {"query": value}


@pytest.mark.parametrize(("levels", "runs"), [(125, True), (126, False)])
async def test_arguments_run_up_to_the_depth_the_conversation_keeps_and_not_one_level_more(
    tmp_path: Path, levels: int, runs: bool
) -> None:
    seen: list[Any] = []

    @tool(side_effects=False)
    async def search_docs(query: Any) -> str:
        """Search the docs."""
        seen.append(query)
        return "nothing"

    class Searcher(ToolAgent):
        agent_id = "searcher"
        tools: ClassVar[Any] = (search_docs,)

        def make_llm(self) -> LLMClient:
            return llm

    llm = ScriptedLLM({(0, 0): ScriptedTurn.tool_use("search_docs", nested(levels)), (1, 0): "Done."})
    run = await AgentHarness(tmp_path).run(Searcher(), payload="Find it.")
    assert run.exit_code == 0 and run.job is not None and run.job.result == "Done."
    assert (seen == [nested(levels)["query"]]) is runs
    refusals = [e["reason"] for e in run.journal if e["type"] == "TOOL_REFUSED"]
    assert refusals == ([] if runs else ["unusable_arguments"])
