"""Tool schemas derived from the function, and the model's tool calls run for real (or refused).

The last test drives the real ``anthropic`` SDK against `FakeAnthropicServer`: the definitions reach the
wire, the model's ``tool_use`` runs through the journal, and its result goes back.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import orjson
import pytest
from pydantic import BaseModel
from typing_extensions import TypedDict

from agentlife import (
    AgentProcess,
    AnthropicLLM,
    Done,
    LLMClient,
    LLMReply,
    ScriptedLLM,
    ScriptedTurn,
    StepContext,
    ToolArgumentsInvalid,
    tool,
)
from agentlife._journal._writer import Journal
from agentlife._schema import openai_tool, validate_arguments
from agentlife.testing import FakeAnthropicServer
from stepctx import journal_events, step_contexts

pytestmark = pytest.mark.anyio


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Point(TypedDict):
    x: int
    y: int


@dataclasses.dataclass
class Box:
    w: float
    h: float = 1.0


class Label(BaseModel):
    name: str
    color: Color


CALLS: list[dict[str, Any]] = []


@tool(side_effects=False)
async def search_docs(
    query: str,
    limit: int = 5,
    ratio: float = 0.5,
    exact: bool = False,
    mode: Literal["fast", "deep"] = "fast",
    color: Color | None = None,
    tags: list[str] | None = None,
    weights: dict[str, int] | None = None,
    where: Point | None = None,
    box: Box | None = None,
    label: Label | None = None,
    invocation_id: str = "",
) -> str:
    """Search the documentation index.

    Everything after the first paragraph stays out of the description.

    Args:
        query: what to look for; plain words
            work best.
        limit: how many hits at most.
        mode: fast or deep.
    """
    CALLS.append({"query": query, "limit": limit, "color": color, "box": box, "label": label})
    return f"{limit} hits for {query}"


def test_the_definition_comes_from_the_docstring_and_the_type_hints() -> None:
    d = search_docs.definition
    assert d["name"] == "search_docs" and d["description"] == "Search the documentation index."
    schema = d["input_schema"]
    props = schema["properties"]
    assert "invocation_id" not in props  # filled in by the runtime, never by the model
    assert schema["required"] == ["query"] and schema["additionalProperties"] is False
    assert props["query"] == {
        "type": "string",
        "title": "Query",
        "description": "what to look for; plain words work best.",
    }
    assert props["limit"]["type"] == "integer" and props["limit"]["default"] == 5
    assert props["limit"]["description"] == "how many hits at most."
    assert props["ratio"]["type"] == "number" and props["exact"]["type"] == "boolean"
    assert props["mode"]["enum"] == ["fast", "deep"]
    defs = schema["$defs"]
    assert defs["Color"]["enum"] == ["red", "blue"]
    assert {"type": "array", "items": {"type": "string"}} in props["tags"]["anyOf"]
    assert {"type": "object", "additionalProperties": {"type": "integer"}} in props["weights"]["anyOf"]
    assert defs["Point"]["required"] == ["x", "y"]  # TypedDict
    assert defs["Box"]["required"] == ["w"]  # dataclass, with a default
    assert set(defs["Label"]["properties"]) == {"name", "color"}  # pydantic model
    assert openai_tool(search_docs)["function"]["parameters"] is schema


def test_the_definition_is_derived_once() -> None:
    assert search_docs.definition is search_docs.definition


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"query": 5}, "query: Input should be a valid string"),
        ({"query": "x", "limit": "5"}, "limit: Input should be a valid integer"),  # JSON, strictly
        ({"limit": 3}, "query: missing (required)"),
        ({"query": "x", "bogus": 1}, "bogus: not a parameter of this tool"),
        ({"query": "x", "mode": "slow"}, "mode: Input should be 'fast' or 'deep'"),
        ({"query": "x", "invocation_id": "spoofed"}, "invocation_id: not a parameter of this tool"),
    ],
)
def test_invalid_arguments_are_refused_with_what_is_wrong(arguments: dict[str, Any], problem: str) -> None:
    with pytest.raises(ToolArgumentsInvalid) as caught:
        validate_arguments(search_docs, arguments)
    assert problem in caught.value.problems


def test_valid_arguments_become_the_declared_types() -> None:
    args = validate_arguments(
        search_docs,
        {
            "query": "q",
            "color": "red",
            "box": {"w": 2},
            "label": {"name": "a", "color": "blue"},
            "where": {"x": 1, "y": 2},
        },
    )
    assert (
        args["color"] is Color.RED
        and args["box"] == Box(w=2.0)
        and args["label"] == Label(name="a", color=Color.BLUE)
    )
    assert args["where"] == {"x": 1, "y": 2} and args["limit"] == 5


# ---------------------------------------------------------------------------------------- ctx.run_tool_calls


@tool(side_effects=False)
async def broken(reason: str) -> str:
    """Always fails."""
    raise RuntimeError(f"broken: {reason}")


@pytest.fixture
async def ctx(tmp_path: Path) -> AsyncIterator[tuple[StepContext, Journal]]:
    async with step_contexts(tmp_path) as make:
        yield await make(ScriptedLLM([]))


def _reply(*uses: tuple[str, str, Any]) -> LLMReply:
    content = [{"type": "tool_use", "id": uid, "name": name, "input": args} for uid, name, args in uses]
    return LLMReply(text="", content=content, stop_reason="tool_use")


async def test_run_tool_calls_runs_valid_calls_and_sends_every_problem_back(
    ctx: tuple[StepContext, Journal],
) -> None:
    step, journal = ctx
    CALLS.clear()
    reply = _reply(
        ("u1", "search_docs", {"query": "drains", "limit": 2}),
        ("u2", "search_docs", {"query": 5}),
        ("u3", "search_docs", {"limit": 1}),
        ("u4", "search_docs", {"query": "x", "extra": True}),
        ("u5", "no_such_tool", {}),
        ("u6", "broken", {"reason": "disk"}),
    )
    results = await step.run_tool_calls(reply, tools=[search_docs, broken])
    assert [r["tool_use_id"] for r in results] == ["u1", "u2", "u3", "u4", "u5", "u6"]
    assert results[0] == {"type": "tool_result", "tool_use_id": "u1", "content": "2 hits for drains"}
    assert all(r.get("is_error") for r in results[1:])
    assert "query: Input should be a valid string" in results[1]["content"]
    assert "query: missing (required)" in results[2]["content"]
    assert "extra: not a parameter of this tool" in results[3]["content"]
    assert "unknown tool 'no_such_tool'" in results[4]["content"] and "search_docs" in results[4]["content"]
    assert "broken: disk" in results[5]["content"]
    assert CALLS == [
        {"query": "drains", "limit": 2, "color": None, "box": None, "label": None}
    ]  # invalid ones never ran
    await journal.flush()
    started = [
        e for e in map(orjson.loads, journal.path.read_bytes().splitlines()) if e["type"] == "TOOL_STARTED"
    ]
    assert [e["tool"] for e in started] == ["search_docs", "broken"]  # only calls that reached a tool


class Searcher(AgentProcess):
    agent_id = "searcher"

    def __init__(self, llm: LLMClient) -> None:
        self.llm = llm

    def make_llm(self) -> LLMClient:
        return self.llm

    async def step(self, ctx: StepContext) -> Done | None:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "find drains"}]
        reply = await ctx.llm.complete(
            model="claude-test", max_tokens=100, messages=messages, tools=[search_docs]
        )
        messages += [{"role": "assistant", "content": list(reply.content)}]
        messages += [{"role": "user", "content": await ctx.run_tool_calls(reply)}]
        final = await ctx.llm.complete(
            model="claude-test", max_tokens=100, messages=messages, tools=[search_docs]
        )
        return Done(result=final.text)


async def test_a_tool_loop_through_the_real_sdk_sends_definitions_and_results(agent_harness: Any) -> None:
    CALLS.clear()
    script = [
        ScriptedTurn.tool_use("search_docs", {"query": "drains", "limit": 3}, id="toolu_1"),
        "Found them.",
    ]
    async with FakeAnthropicServer(script, api_key="k") as server:
        run = await agent_harness.run(Searcher(AnthropicLLM(api_key="k", base_url=server.base_url)))
    assert run.exit_code == 0 and run.job is not None and run.job.result == "Found them."
    first, second = server.requests[0].body, server.requests[1].body
    assert first["tools"][0]["name"] == "search_docs"
    assert first["tools"][0]["input_schema"]["properties"]["limit"]["type"] == "integer"
    result = second["messages"][-1]["content"][0]
    assert result == {"type": "tool_result", "tool_use_id": "toolu_1", "content": "3 hits for drains"}
    assert CALLS[0]["query"] == "drains"


# ------------------------------------------------------------------- calls that never reach a function


async def test_unusable_input_is_refused_journaled_and_logged_never_run(
    ctx: tuple[StepContext, Journal], caplog: pytest.LogCaptureFixture
) -> None:
    step, journal = ctx
    CALLS.clear()
    reply = LLMReply(
        text="",
        content=[
            {"type": "tool_use", "id": "u1", "name": "search_docs", "input": {"query": "drains"}},
            {"type": "tool_use", "id": "u2", "name": "search_docs", "input": {}},
        ],
        stop_reason="tool_use",
        tool_input_errors={"u2": "its input is not valid JSON (unexpected end of data, 12 characters)"},
    )
    with caplog.at_level("WARNING", logger="agentlife.calls"):
        results = await step.run_tool_calls(reply, tools=[search_docs])
    assert results[0]["content"] == "5 hits for drains"
    assert results[1]["is_error"] is True
    assert results[1]["content"].startswith("tool search_docs was not run: its input is not valid JSON")
    assert [c["query"] for c in CALLS] == ["drains"]  # u2 never ran, though {} is not even valid for it
    events = await journal_events(journal)
    [refused] = [e for e in events if e["type"] == "TOOL_REFUSED"]
    assert refused["reason"] == "unusable_arguments" and refused["tool_use_id"] == "u2"
    assert refused["step"] == 0 and refused["error"] == results[1]["content"]
    assert [e["tool"] for e in events if e["type"] == "TOOL_STARTED"] == ["search_docs"]
    assert any(
        r.levelname == "WARNING" and "refused, unusable_arguments" in r.getMessage() for r in caplog.records
    )


async def test_a_reply_cut_at_max_tokens_from_any_client_never_runs_its_last_call(
    ctx: tuple[StepContext, Journal],
) -> None:
    step, _ = ctx
    CALLS.clear()
    # A hand-built reply (a custom LLMClient) that flagged nothing: the cut-off rule still applies.
    reply = LLMReply(
        text="",
        content=[
            {"type": "tool_use", "id": "u1", "name": "search_docs", "input": {"query": "whole"}},
            {"type": "tool_use", "id": "u2", "name": "search_docs", "input": {"query": "cut"}},
        ],
        stop_reason="max_tokens",
    )
    results = await step.run_tool_calls(reply, tools=[search_docs])
    assert [c["query"] for c in CALLS] == ["whole"]  # sent whole before the cut: it runs
    assert "cut off at max_tokens" in results[1]["content"] and results[1]["is_error"]


async def test_unknown_tools_list_every_tool_offered_and_definitions_only_say_so(
    ctx: tuple[StepContext, Journal],
) -> None:
    step, journal = ctx
    definition = {"name": "web_search", "description": "Search.", "input_schema": {"type": "object"}}
    openai_form = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    huge = "x" * 10_000
    reply = _reply(("u1", "nope", {}), ("u2", "web_search", {}), ("u3", huge, {}))
    results = await step.run_tool_calls(reply, tools=[search_docs, definition, openai_form])
    assert results[0]["content"] == "unknown tool 'nope' (tools offered: lookup, search_docs, web_search)"
    assert results[1]["content"] == (
        "tool 'web_search' was offered as a definition only: no function here runs it "
        "(tools that run: search_docs)"
    )
    assert len(results[2]["content"]) < 300 and results[2]["tool_use_id"] == "u3"  # a 10 KB name, shortened
    events = await journal_events(journal)
    assert [e["reason"] for e in events if e["type"] == "TOOL_REFUSED"] == ["unknown_tool"] * 3
    assert max(len(orjson.dumps(e)) for e in events) < 1000
