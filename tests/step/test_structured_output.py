"""Structured output: ``ctx.llm.complete(..., output_type=T)`` returns a validated ``T`` (a forced tool).

The model is a `ScriptedLLM` behind a real `StepContext` and journal (tests/stepctx.py); the
crash-and-resume test runs the whole step under `AgentHarness`.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from typing_extensions import TypedDict

from agentlife import (
    AgentProcess,
    AnthropicLLM,
    Done,
    LLMClient,
    OutputValidationError,
    PermanentError,
    ScriptedLLM,
    ScriptedTurn,
    StepContext,
    StructuredReply,
    tool,
)
from agentlife._step._structured import OUTPUT_TOOL, _cached_adapter, output_tool
from agentlife.testing import AgentHarness, FakeAnthropicServer
from stepctx import MakeCtx, journal_events, step_contexts

pytestmark = pytest.mark.anyio

MODEL = "claude-sonnet-agentlife-test"
MESSAGES = [{"role": "user", "content": "Triage issue 7."}]


@pytest.fixture
async def make_ctx(tmp_path: Path) -> AsyncIterator[MakeCtx]:
    async with step_contexts(tmp_path) as make:
        yield make


class Priority(enum.Enum):
    LOW = "low"
    HIGH = "high"


class Triage(BaseModel):
    """The triage of one issue."""

    label: str
    priority: Priority
    score: int


@dataclasses.dataclass
class Verdict:
    accepted: bool
    reasons: list[str]


class Point(TypedDict):
    x: int
    y: int


def _answer(value: Any, *, id: str = "toolu_1") -> ScriptedTurn:
    return ScriptedTurn.tool_use(OUTPUT_TOOL, value, id=id)


@pytest.mark.parametrize(
    ("output_type", "sent", "expected"),
    [
        (
            Triage,
            {"label": "bug", "priority": "high", "score": 3},
            Triage(label="bug", priority=Priority.HIGH, score=3),
        ),
        (Verdict, {"accepted": True, "reasons": ["tested"]}, Verdict(accepted=True, reasons=["tested"])),
        (Point, {"x": 1, "y": 2}, {"x": 1, "y": 2}),
        (int, {"result": 42}, 42),
        (list[str], {"result": ["a", "b"]}, ["a", "b"]),
    ],
    ids=["pydantic", "dataclass", "typeddict", "int", "list"],
)
async def test_the_answer_comes_back_as_the_type_asked_for(
    make_ctx: MakeCtx, output_type: Any, sent: Any, expected: Any
) -> None:
    llm = ScriptedLLM([_answer(sent)])
    ctx, journal = await make_ctx(llm)
    value = await ctx.llm.complete(model=MODEL, messages=MESSAGES, max_tokens=100, output_type=output_type)
    assert value == expected and type(value) is type(expected)
    [request] = llm.requests
    [offered] = request.params["tools"]
    assert offered["name"] == OUTPUT_TOOL
    assert request.params["tool_choice"] == {"type": "tool", "name": OUTPUT_TOOL}
    schema = offered["input_schema"]
    assert schema["type"] == "object"  # a tool's input is always an object
    if output_type in (int, list[str]):
        assert schema["required"] == ["result"] and "result" in schema["properties"]
    else:
        assert set(schema["required"]) == set(sent)
    assert "output_type" not in request.params and "output_retries" not in request.params
    events = await journal_events(journal)
    assert [e["type"] for e in events].count("LLM_COMPLETED") == 1


def test_the_definition_names_the_type_and_its_docstring() -> None:
    definition, parse = output_tool(Triage)
    hits = _cached_adapter.cache_info().hits
    assert output_tool(Triage)[0] == definition
    assert _cached_adapter.cache_info().hits == hits + 1  # one TypeAdapter per type
    assert definition["description"] == (
        "Give the final answer (Triage) by calling this tool: The triage of one issue."
    )
    assert definition["input_schema"]["properties"]["priority"]["$ref"] == "#/$defs/Priority"
    assert parse({"label": "x", "priority": "low", "score": "7"}) == Triage(
        label="x", priority=Priority.LOW, score=7
    )
    assert output_tool(int)[0]["description"] == "Give the final answer (int) by calling this tool."
    assert (
        output_tool(list[str])[0]["description"] == "Give the final answer (list[str]) by calling this tool."
    )
    assert output_tool(int | None)[0]["input_schema"]["properties"]["result"]["anyOf"][1] == {"type": "null"}
    assert output_tool(Verdict)[0]["description"] == "Give the final answer (Verdict) by calling this tool."
    with pytest.raises(OutputValidationError) as raised:
        parse({"label": "x", "priority": "urgent"})
    assert raised.value.type_name == "Triage"
    assert raised.value.problems[0].startswith("priority: Input should be 'low' or 'high'")
    assert raised.value.problems[1] == "score: missing (required)"
    with pytest.raises(OutputValidationError, match="result: missing"):
        output_tool(int)[1]({"value": 3})


async def test_an_invalid_answer_is_sent_back_with_what_is_wrong_and_the_next_one_is_used(
    make_ctx: MakeCtx,
) -> None:
    llm = ScriptedLLM(
        [
            _answer({"label": "bug", "priority": "urgent", "score": 3}, id="toolu_bad"),
            _answer({"label": "bug", "priority": "high", "score": 3}, id="toolu_good"),
        ]
    )
    ctx, journal = await make_ctx(llm)
    answer = await ctx.llm.complete_structured(
        model=MODEL, messages=MESSAGES, max_tokens=100, output_type=Triage
    )
    assert isinstance(answer, StructuredReply)
    assert answer.output == Triage(label="bug", priority=Priority.HIGH, score=3) and answer.attempts == 2
    assert answer.reply.content[-1]["id"] == "toolu_good"
    retry = llm.requests[1]
    assert list(retry.messages[:1]) == MESSAGES
    assistant, user = retry.messages[1], retry.messages[2]
    assert assistant == {
        "role": "assistant",
        "content": [
            {
                "type": "tool_use",
                "id": "toolu_bad",
                "name": OUTPUT_TOOL,
                "input": {"label": "bug", "priority": "urgent", "score": 3},
            }
        ],
    }
    [result] = user["content"]
    assert result["type"] == "tool_result" and result["tool_use_id"] == "toolu_bad" and result["is_error"]
    assert "priority: Input should be 'low' or 'high'" in result["content"]
    assert "Triage" in result["content"]
    events = await journal_events(journal)
    assert [e["call"] for e in events if e["type"] == "LLM_COMPLETED"] == [0, 1]  # each try is a call


async def test_after_the_retries_the_error_names_the_type_and_the_last_problem(make_ctx: MakeCtx) -> None:
    llm = ScriptedLLM([_answer({"result": "many"}), _answer({"result": "lots"}), _answer({"result": 2.5})])
    ctx, _ = await make_ctx(llm)
    with pytest.raises(OutputValidationError) as raised:
        await ctx.llm.complete(model=MODEL, messages=MESSAGES, max_tokens=100, output_type=int)
    assert isinstance(raised.value, PermanentError)
    assert llm.calls == 3  # the first answer and output_retries=2 more
    assert raised.value.attempts == 3 and raised.value.type_name == "int"
    assert str(raised.value).startswith("the answer does not fit int after 3 attempts: result: ")
    assert "fractional part" in str(raised.value)  # the last answer's problem

    llm.add(_answer({"result": "x"}))
    with pytest.raises(OutputValidationError):
        await ctx.llm.complete(
            model=MODEL, messages=MESSAGES, max_tokens=100, output_type=int, output_retries=0
        )
    assert llm.calls == 4


async def test_a_reply_without_the_answer_is_asked_again_and_other_tool_calls_are_refused(
    make_ctx: MakeCtx,
) -> None:
    @tool(side_effects=False)
    async def lookup(word: str) -> str:
        """Look a word up."""
        return word

    llm = ScriptedLLM([ScriptedTurn.tool_use("lookup", {"word": "x"}, id="toolu_l"), _answer({"result": 5})])
    ctx, _ = await make_ctx(llm)
    value = await ctx.llm.complete(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=100,
        output_type=int,
        tools=[lookup],
        tool_choice={"type": "any"},
    )
    assert value == 5
    first = llm.requests[0].params
    assert [t["name"] for t in first["tools"]] == ["lookup", OUTPUT_TOOL]
    assert first["tool_choice"] == {"type": "any"}  # the caller's choice is kept
    [result] = llm.requests[1].messages[-1]["content"]
    assert result["tool_use_id"] == "toolu_l" and result["is_error"]
    assert result["content"] == f"not run: answer with {OUTPUT_TOOL}"


class Structured(AgentProcess):
    """One structured call; ``crash`` fails the step after it."""

    agent_id = "structured"

    def __init__(self, llm: LLMClient, *, crash: bool = False) -> None:
        self.llm = llm
        self.crash = crash

    def make_llm(self) -> LLMClient:
        return self.llm

    async def step(self, ctx: StepContext) -> Done | None:
        triage = await ctx.llm.complete(model=MODEL, max_tokens=100, messages=MESSAGES, output_type=Triage)
        if self.crash:
            raise RuntimeError("the process dies after the call")
        return Done(result={"label": triage.label, "priority": triage.priority.value})


async def test_a_resumed_step_gets_the_same_value_without_asking_the_model(
    agent_harness: AgentHarness,
) -> None:
    first = ScriptedLLM(
        [
            _answer({"label": "bug", "priority": "urgent", "score": 1}),
            _answer({"label": "bug", "priority": "low", "score": 1}),
        ]
    )
    crashed = await agent_harness.run(Structured(first, crash=True))
    assert crashed.exit_code == 1 and first.calls == 2

    again = ScriptedLLM([])  # any request would raise ScriptExhausted
    resumed = await agent_harness.run(Structured(again))
    assert resumed.exit_code == 0 and again.calls == 0
    assert resumed.job is not None and resumed.job.result == {"label": "bug", "priority": "low"}


async def test_a_tool_of_the_caller_may_not_take_the_output_tools_name(make_ctx: MakeCtx) -> None:
    ctx, _ = await make_ctx(ScriptedLLM([]))
    clash = {"name": OUTPUT_TOOL, "description": "mine", "input_schema": {"type": "object"}}
    with pytest.raises(ValueError, match="already named"):
        await ctx.llm.complete(model=MODEL, messages=MESSAGES, max_tokens=10, output_type=int, tools=[clash])


# ------------------------------------------------------------ answers the model did not give whole

KEY = "sk-ant-test-structured-0123456789"


@asynccontextmanager
async def anthropic(script: list[ScriptedTurn]) -> AsyncIterator[tuple[FakeAnthropicServer, AnthropicLLM]]:
    """The real SDK against a fake server playing ``script``."""
    async with FakeAnthropicServer(script, api_key=KEY) as server:
        llm = AnthropicLLM(api_key=KEY, base_url=server.base_url)
        try:
            yield server, llm
        finally:
            await llm.aclose()


class Sweep(BaseModel):
    """What to delete; every field has a default, so {} would fit."""

    pattern: str = "*"
    dry_run: bool = False


async def test_an_answer_cut_off_at_max_tokens_is_never_taken_and_is_asked_again(make_ctx: MakeCtx) -> None:
    script = [
        ScriptedTurn.malformed_tool_use(OUTPUT_TOOL, "", id="toolu_cut", stop_reason="max_tokens"),
        _answer({"pattern": "*.tmp", "dry_run": True}, id="toolu_whole"),
    ]
    async with anthropic(script) as (server, llm):
        ctx, journal = await make_ctx(llm)
        value = await ctx.llm.complete(model=MODEL, messages=MESSAGES, max_tokens=100, output_type=Sweep)
    assert value == Sweep(pattern="*.tmp", dry_run=True)  # not Sweep() from the {} of the cut call
    assistant, user = server.requests[1].body["messages"][1:]
    assert assistant["content"] == [{"type": "tool_use", "id": "toolu_cut", "name": OUTPUT_TOOL, "input": {}}]
    [result] = user["content"]
    assert result["tool_use_id"] == "toolu_cut" and result["is_error"] is True
    assert "cut off at max_tokens" in result["content"]
    [refused] = [e for e in await journal_events(journal) if e["type"] == "TOOL_REFUSED"]
    assert refused["reason"] == "invalid_final_result" and refused["tool_use_id"] == "toolu_cut"


async def test_another_tool_call_beside_a_valid_answer_is_journaled_as_not_run(
    make_ctx: MakeCtx, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[str] = []

    @tool
    async def delete(pattern: str) -> str:
        """Delete files."""
        ran.append(pattern)
        return "deleted"

    llm = ScriptedLLM(
        [
            ScriptedTurn.reply(
                [
                    {"type": "tool_use", "id": "toolu_d", "name": "delete", "input": {"pattern": "*"}},
                    {"type": "tool_use", "id": "toolu_a", "name": OUTPUT_TOOL, "input": {"pattern": "*"}},
                ]
            )
        ]
    )
    ctx, journal = await make_ctx(llm)
    with caplog.at_level("WARNING", logger="agentlife.calls"):
        value = await ctx.llm.complete(
            model=MODEL, messages=MESSAGES, max_tokens=100, output_type=Sweep, tools=[delete]
        )
    assert value == Sweep(pattern="*") and ran == []  # structured output runs no tools ...
    [refused] = [e for e in await journal_events(journal) if e["type"] == "TOOL_REFUSED"]
    assert refused["tool"] == "delete" and refused["reason"] == "not_run"  # ... and says so
    assert any("delete" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)


async def test_an_empty_reply_is_asked_again_without_an_empty_assistant_turn(make_ctx: MakeCtx) -> None:
    script = [ScriptedTurn.reply([], stop_reason="end_turn"), _answer({"pattern": "a"})]
    async with anthropic(script) as (server, llm):
        ctx, _ = await make_ctx(llm)
        value = await ctx.llm.complete(model=MODEL, messages=MESSAGES, max_tokens=100, output_type=Sweep)
    assert value == Sweep(pattern="a")
    sent = server.requests[1].body["messages"]
    assert [m["role"] for m in sent] == ["user", "user"]
    assert sent[1]["content"][0]["text"].endswith(f"no answer: call the {OUTPUT_TOOL} tool with it")


async def test_an_answer_given_twice_in_one_reply_is_asked_again(make_ctx: MakeCtx) -> None:
    twice = ScriptedTurn.reply(
        [
            {"type": "tool_use", "id": "a1", "name": OUTPUT_TOOL, "input": {"pattern": "a"}},
            {"type": "tool_use", "id": "a2", "name": OUTPUT_TOOL, "input": {"pattern": "b"}},
        ]
    )
    llm = ScriptedLLM([twice, _answer({"pattern": "b"})])
    ctx, _ = await make_ctx(llm)
    assert await ctx.llm.complete(model=MODEL, messages=MESSAGES, max_tokens=10, output_type=Sweep) == Sweep(
        pattern="b"
    )
    results = llm.requests[1].messages[-1]["content"]
    assert [r["tool_use_id"] for r in results] == ["a1", "a2"]
    assert all("called 2 times in one reply: call it once" in r["content"] for r in results)
