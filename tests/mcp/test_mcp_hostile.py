"""MCP servers that lie: hostile schemas, names and listings, garbage on stdout (``mcp_hostile_server.py``).

The agent runs in this process (`AgentHarness`); each server is a real process speaking plain JSON-RPC to
the real SDK client.
"""

from __future__ import annotations

import json
import re
import socket
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentlife import (
    AgentProcess,
    ConfigError,
    Done,
    LLMClient,
    LLMReply,
    MCPServer,
    ScriptedLLM,
    ScriptedTurn,
    StepContext,
    ToolAgent,
    ToolArgumentsInvalid,
)
from agentlife._mcp._schema import (
    MAX_STEPS,
    PatternRefused,
    checker,
    compile_pattern,
    json_key,
    validator_for,
)
from agentlife._mcp._server import MAX_TOOLS, live_tool_specs
from agentlife.testing import AgentHarness

pytestmark = pytest.mark.anyio

HOSTILE = str(Path(__file__).resolve().parent.parent / "mcp_hostile_server.py")


def hostile(mode: str, *more: str, env: dict[str, str] | None = None, **options: Any) -> MCPServer:
    return MCPServer.stdio(sys.executable, [HOSTILE, mode, *more], env=env, **options)


def errors_and_warnings(run: Any) -> tuple[list[str], list[str]]:
    levels = [(line.get("level"), str(line.get("msg"))) for line in run.logs]
    return [m for lv, m in levels if lv == "ERROR"], [m for lv, m in levels if lv == "WARNING"]


def results_sent(llm: ScriptedLLM) -> list[dict[str, Any]]:
    return [
        block
        for message in llm.requests[-1].messages
        if message["role"] == "user" and isinstance(message["content"], list)
        for block in message["content"]
    ]


# -- regular expressions from the server -----------------------------------------------------------------


async def test_a_catastrophic_pattern_is_checked_in_linear_time_and_bad_values_never_reach_the_server(
    tmp_path: Path,
) -> None:
    # With re, "^(a+)+$" on 5 000 a's and a "!" would not finish in this universe, nor "\d*\d*\d*x" on
    # 3 000 digits within hours: the run finishing at all is the assertion. The tools that cannot be
    # bounded are left out with one line each, and a $ref elsewhere is never fetched.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        remote = f"http://127.0.0.1:{listener.getsockname()[1]}/schema.json"
        calls = tmp_path / "calls.txt"
        server = hostile("patterns", env={"MCP_REMOTE_REF": remote, "MCP_CALLS": str(calls)})

        class Agent(ToolAgent):
            agent_id = "mcp-patterns"
            tools: ClassVar[Any] = (server,)

            def make_llm(self) -> LLMClient:
                return llm

        llm = ScriptedLLM(
            {
                (0, 0): ScriptedTurn.tool_use("evil", {"v": "a" * 5_000 + "!"}),
                (1, 0): ScriptedTurn.tool_use("polynomial", {"v": "1" * 3_000}),
                (2, 0): ScriptedTurn.tool_use("remote", {"v": 1}),
                (3, 0): ScriptedTurn.tool_use("evil", {"v": "aaaa"}),
                (4, 0): "done",
            }
        )
        run = await AgentHarness(tmp_path / "data").run(Agent(), payload="x")
        listener.settimeout(0)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected: the remote $ref was not fetched
    assert run.exit_code == 0 and run.job is not None and run.job.status == "COMPLETED"
    evil, polynomial, unresolvable, fine = results_sent(llm)
    assert evil["is_error"] and "does not match '^(a+)+$'" in evil["content"]
    assert polynomial["is_error"] and "does not match" in polynomial["content"]
    assert unresolvable["is_error"] and "the tool's schema could not be applied" in unresolvable["content"]
    assert not fine.get("is_error") and fine["content"] == "called evil"
    assert calls.read_text().splitlines() == ["evil"]  # only the valid call reached the server
    errors, _ = errors_and_warnings(run)
    assert len(errors) == 2
    assert "tool backref left out" in errors[0] and "back references are not supported" in errors[0]
    assert "tool propnames left out" in errors[1] and "patternProperties" in errors[1]


def test_a_search_has_a_step_budget_and_refuses_what_it_cannot_bound() -> None:
    # 400 live states at every one of 20 000 different characters: no two steps alike, 8 million steps.
    distinct = "".join(chr(0x4E00 + i) for i in range(20_000))
    with pytest.raises(PatternRefused, match="would take too long"):
        compile_pattern(".{0,200}x").search(distinct)
    assert MAX_STEPS < 8_000_000
    for source, why in [
        ("(a)\\1", "back references"),
        ("(?=a)", "look-arounds"),
        ("(?<!a)b", "look-arounds"),
        ("(?>a)", "atomic groups"),
        ("a++", "possessive repeats"),
        ("(?i)a", "inline flags"),
        ("a{100000}", "a repeat of more than"),
        ("(", "not a valid regular expression"),
    ]:
        with pytest.raises(PatternRefused, match=re.escape(why)):
            compile_pattern(source)


_ATOMS = st.sampled_from(
    ["a", "b", "1", ".", "[ab]", "[^a]", "[a-z]", "\\d", "\\w", "\\s", "\\W", "\\b", "_"]
)
_QUANTIFIERS = st.sampled_from(["", "", "*", "+", "?", "{2}", "{1,2}", "{0,3}", "*?", "+?", "{2,}"])


def _patterns() -> st.SearchStrategy[str]:
    pieces = st.recursive(
        st.tuples(_ATOMS, _QUANTIFIERS).map("".join),
        lambda inner: st.one_of(
            st.lists(inner, min_size=1, max_size=3).map("".join),
            st.tuples(inner, inner).map(lambda ab: f"{ab[0]}|{ab[1]}"),
            st.tuples(inner, _QUANTIFIERS).map(lambda g: f"({g[0]}){g[1]}"),
            st.tuples(inner, _QUANTIFIERS).map(lambda g: f"(?:{g[0]}){g[1]}"),
        ),
        max_leaves=6,
    )
    anchors = st.tuples(st.sampled_from(["", "^", "\\A"]), pieces, st.sampled_from(["", "$", "\\Z"]))
    return anchors.map("".join)


@settings(max_examples=400, deadline=None)
@given(_patterns(), st.text(alphabet="ab1 _\nZ", max_size=8))
def test_the_linear_matcher_says_what_re_search_says(source: str, text: str) -> None:
    try:
        re.compile(source)
    except re.error:
        with pytest.raises(PatternRefused):
            compile_pattern(source)
        return
    assert compile_pattern(source).search(text) == (re.search(source, text) is not None), (source, text)


# -- names -----------------------------------------------------------------------------------------------


async def test_hostile_tool_names_are_offered_unique_and_valid_and_each_reaches_its_own_tool(
    tmp_path: Path,
) -> None:
    # Spaces, 200 characters, unicode, a name equal to another once made safe ("look up", "look_up") or
    # prefixed ("srv__echo" beside tool "echo" of server "srv"), no name, a name listed twice, a huge one.
    calls = tmp_path / "calls.txt"
    env = {"MCP_CALLS": str(calls)}
    names_server, echo_server = hostile("names", env=env), hostile("echo", env=env, name="other")

    class Agent(AgentProcess):
        agent_id = "mcp-names"
        mcp_servers: ClassVar[Any] = (names_server, echo_server)

        async def step(self, ctx: StepContext) -> Done | None:
            specs = [*live_tool_specs(names_server), *live_tool_specs(echo_server)]  # type: ignore[misc]
            uses = [
                {"type": "tool_use", "id": f"u{i}", "name": spec.name, "input": {}}
                for i, spec in enumerate(specs)
            ]
            results = await ctx.run_tool_calls(
                LLMReply(text="", content=uses), tools=[names_server, echo_server]
            )
            return Done(
                result=[[s.name, s.mcp_name, r["content"]] for s, r in zip(specs, results, strict=True)]
            )

    run = await AgentHarness(tmp_path / "data").run(Agent())
    assert run.exit_code == 0 and run.job is not None and run.job.status == "COMPLETED", run.log_messages()
    offered = run.job.result
    names = [name for name, _, _ in offered]
    assert len(names) == len(set(names)) == 11  # 12 listed by "srv", 2 left out, and "echo" of "other"
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name) for name in names)
    assert all(content == f"called {raw}" for _, raw, content in offered)  # each name reached its own tool
    assert sorted(calls.read_text().splitlines()) == sorted(raw for _, raw, _ in offered)
    assert ["other__echo", "echo", "called echo"] in offered  # "echo" of two servers: prefixed
    assert ["___", "日本語", "called 日本語"] in offered
    # Equal once made safe or prefixed: each of the pair gets a hash of its server's and its own name.
    pairs = [("look up", "look_up"), ("café", "caf_"), ("srv__echo", "echo"), ("x" * 200, "x" * 199 + "y")]
    names_of = {(raw, name.startswith("other")): name for name, raw, _ in offered}
    for one, other in pairs:
        first, second = names_of[(one, False)], names_of[(other, False)]
        assert first[:-9] == second[:-9] and first != second, (first, second)
    errors, _ = errors_and_warnings(run)
    assert any("tool '' left out" in e or "it has no name" in e for e in errors)
    assert any("tool twice left out: its server lists it twice" in e for e in errors)
    assert any("tool huge left out: its listing is 200" in e and "over 100000" in e for e in errors)
    tools_events = [e for e in run.journal if e["type"] == "MCP_TOOLS"]
    assert {e["server"] for e in tools_events} == {"srv", "other"}


# -- a huge listing --------------------------------------------------------------------------------------


async def test_a_server_listing_thousands_of_tools_offers_the_first_thousand_and_says_so_once(
    tmp_path: Path,
) -> None:
    server = hostile("many", "5000")

    class Agent(AgentProcess):
        agent_id = "mcp-many"
        mcp_servers: ClassVar[Any] = (server,)

        async def step(self, ctx: StepContext) -> Done | None:
            last = await ctx.call_tool(server.tool(f"t{MAX_TOOLS - 1}"))
            try:
                await ctx.call_tool(server.tool(f"t{MAX_TOOLS}"))
            except ConfigError as exc:
                return Done(result=[last, str(exc), len(live_tool_specs(server) or [])])
            return Done(result="called a tool over the limit")

    run = await AgentHarness(tmp_path / "data").run(Agent())
    assert run.exit_code == 0 and run.job is not None
    last, refused, offered = run.job.result
    assert last == f"called t{MAX_TOOLS - 1}" and offered == MAX_TOOLS
    assert f"t{MAX_TOOLS}" in refused and f"lists more than {MAX_TOOLS} tools" in refused
    errors, _ = errors_and_warnings(run)
    assert len(errors) == 1 and f"4000 tools left out: its server lists more than {MAX_TOOLS}" in errors[0]
    event = next(e for e in run.journal if e["type"] == "MCP_TOOLS")
    assert len(event["tools"]) == MAX_TOOLS and event["skipped_total"] == 4000 and len(event["skipped"]) == 20
    assert max(len(json.dumps(e)) for e in run.journal) < 200_000


# -- garbage on stdout -----------------------------------------------------------------------------------


async def test_garbage_on_stdout_before_the_handshake_is_skipped_with_one_warning_a_line(
    tmp_path: Path,
) -> None:
    # A banner, a JSON line that is not JSON-RPC, undecodable bytes: then a proper server.
    server = hostile("garbage", name="noisy")

    class Agent(AgentProcess):
        agent_id = "mcp-garbage"
        mcp_servers: ClassVar[Any] = (server,)

        async def step(self, ctx: StepContext) -> Done | None:
            return Done(result=await ctx.call_tool(server.tool("echo"), v="x"))

    run = await AgentHarness(tmp_path / "data").run(Agent())
    assert run.exit_code == 0 and run.job is not None and run.job.result == "called echo"
    errors, warnings = errors_and_warnings(run)
    noise = [w for w in warnings if "wrote a line on stdout that is not JSON-RPC" in w]
    assert errors == [] and len(noise) == 3 and all("noisy" in w for w in noise)
    assert not any("traceback" in line for line in run.logs)


async def test_messages_after_the_start_name_the_server_by_the_name_it_gave_itself(tmp_path: Path) -> None:
    server = hostile("late-garbage")  # no name=: the server calls itself "srv"

    class Agent(AgentProcess):
        agent_id = "mcp-named"
        mcp_servers: ClassVar[Any] = (server,)

        async def step(self, ctx: StepContext) -> Done | None:
            called = await ctx.call_tool(server.tool("echo"), v="x")
            with pytest.raises(ConfigError) as unknown:
                await ctx.call_tool(server.tool("nope"))
            return Done(result=[called, str(unknown.value)])

    run = await AgentHarness(tmp_path / "data").run(Agent())
    assert run.exit_code == 0 and run.job is not None
    called, unknown = run.job.result
    named = f"srv (stdio: {sys.executable})"
    assert called == "called echo" and f"MCP server {named} has no tool 'nope'" in unknown
    _, warnings = errors_and_warnings(run)
    assert warnings == [f"MCP server {named} wrote a line on stdout that is not JSON-RPC: ignored"]


async def test_a_server_that_only_writes_garbage_fails_the_start_with_one_line(tmp_path: Path) -> None:
    server = hostile("only-garbage", name="liar", start_timeout=1)

    class Agent(AgentProcess):
        agent_id = "mcp-liar"
        mcp_servers: ClassVar[Any] = (server,)

        async def step(self, ctx: StepContext) -> Done | None:
            return Done(result="never")

    run = await AgentHarness(tmp_path / "data").run(Agent())
    assert run.exit_code == 1 and run.job is not None and run.job.status == "RUNNING"
    errors, warnings = errors_and_warnings(run)
    assert len(errors) == 1 and "MCP server liar" in errors[0] and "did not start: timed out" in errors[0]
    assert 1 <= len([w for w in warnings if "not JSON-RPC" in w]) <= 5  # the rest are counted, not logged


# -- arrays whose items must be unique -------------------------------------------------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from([0.0, 1.0, 2.5]) | st.sampled_from("ab"),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("xy"), inner, max_size=2),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_JSON, max_size=6))
def test_unique_items_says_what_jsonschema_says(items: list[Any]) -> None:
    from jsonschema._utils import uniq

    assert (len({json_key(item) for item in items}) == len(items)) == uniq(items), items


def test_unique_items_of_thousands_of_objects_are_checked_in_linear_time() -> None:
    # jsonschema's own check compares objects two by two: a minute for these 20 000.
    validator = validator_for({"type": "object", "properties": {"v": {"type": "array", "uniqueItems": True}}})
    check = checker("bulk", validator)
    items = [{"id": i, "tags": ["a", i % 7]} for i in range(20_000)]
    assert check({"v": items})["v"] == items
    with pytest.raises(ToolArgumentsInvalid, match="has non-unique elements"):
        check({"v": [*items, {"tags": ["a", 19_999 % 7], "id": 19_999.0}]})  # the last one again, as 1.0
