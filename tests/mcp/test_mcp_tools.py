"""Tools from MCP servers: real servers on the official SDK, started as real processes (stdio and HTTP).

The agent runs in this process (`AgentHarness`); the servers are ``tests/mcp_test_server.py``. Tests that only
read from a server, or write under their own job id, share one Streamable HTTP server process (``shared``);
those about a server's own process (its start, crash, restart, variants) start their own over stdio.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest

from agentlife import (
    NOT_DONE,
    AgentProcess,
    ConfigError,
    Done,
    LLMClient,
    MCPServer,
    MCPServerUnavailable,
    MCPToolError,
    ScriptedLLM,
    ScriptedTurn,
    StepContext,
    ToolAgent,
    UnreplayableValue,
    should_retry_after_crash,
)
from agentlife._mcp._client import INVOCATION_META_KEY
from agentlife._mcp._server import build_specs, offered_name, result_value
from agentlife.stores import SQLiteStore
from agentlife.testing import AgentHarness, DrainAt

pytestmark = pytest.mark.anyio

SERVER = str(Path(__file__).resolve().parent.parent / "mcp_test_server.py")


def tracker(state: Path, *extra: str, name: str | None = None) -> MCPServer:
    return MCPServer.stdio(sys.executable, [SERVER, str(state), *extra], name=name)


def tool_agent(llm: ScriptedLLM, *servers: Any) -> ToolAgent:
    class Agent(ToolAgent):
        agent_id = "mcp-tool-agent"
        tools: ClassVar[Any] = servers
        max_turns = 8

        def make_llm(self) -> LLMClient:
            return llm

    return Agent()


def effects(state: Path, job_id: str | None = None) -> list[dict[str, Any]]:
    """The effects the server did (of one job's calls: a shared server holds those of other tests too)."""
    path = state / "effects.jsonl"
    found = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [e for e in found if job_id is None or str(e["key"]).startswith(f"{job_id}/")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Shared:
    url: str
    state: Path


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    """One Streamable HTTP server process for the module's tests that do not need a server of their own."""
    port = free_port()
    state = tmp_path_factory.mktemp("shared-mcp")
    proc = subprocess.Popen([sys.executable, SERVER, str(state), "--http", str(port)])
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
        yield Shared(f"http://127.0.0.1:{port}/mcp", state)
    finally:
        proc.kill()
        proc.wait()


def results_sent(llm: ScriptedLLM) -> list[dict[str, Any]]:
    """The tool_result blocks the model got back, in order."""
    return [
        block
        for message in llm.requests[-1].messages
        if message["role"] == "user" and isinstance(message["content"], list)
        for block in message["content"]
    ]


async def test_the_servers_schema_is_offered_and_invalid_arguments_never_reach_it(
    tmp_path: Path, shared: Shared
) -> None:
    llm = ScriptedLLM(
        {
            (0, 0): ScriptedTurn.tool_use("create_issue", {"body": "no title"}),
            (1, 0): ScriptedTurn.tool_use("create_issue", {"title": ""}),
            (2, 0): ScriptedTurn.tool_use("create_issue", {"title": "disk full", "extra": 1}),
            (3, 0): ScriptedTurn.tool_use("create_issue", {"title": "disk full"}),
            (4, 0): ScriptedTurn.tool_use("lookup", {"key": "schema/3/1"}),
            (5, 0): "Filed.",
        }
    )
    agent = tool_agent(llm, MCPServer.http(shared.url))
    run = await AgentHarness(tmp_path / "data").run(agent, job_id="schema", payload="file it")
    assert run.exit_code == 0 and run.job is not None and run.job.status == "COMPLETED"
    offered = {t["name"]: t for t in llm.requests[0].params["tools"]}
    assert offered["create_issue"]["input_schema"]["required"] == ["title"]
    assert offered["create_issue"]["description"] == "Create an issue."
    sent = results_sent(llm)
    assert [bool(r.get("is_error")) for r in sent] == [True, True, True, False, False]
    assert "title" in sent[0]["content"] and "required" in sent[0]["content"]
    assert "extra" in sent[2]["content"]
    # Only the valid call reached the server, with the invocation id as its idempotency key.
    done = effects(shared.state, "schema")
    assert done == [{"key": "schema/3/1", "title": "disk full", "pid": done[0]["pid"]}]
    assert json.loads(sent[4]["content"])["title"] == "disk full"
    tools_event = next(e for e in run.journal if e["type"] == "MCP_TOOLS")
    assert tools_event["server"] == "tracker" and "create_issue" in tools_event["tools"]
    started = [e for e in run.journal if e["type"] == "TOOL_STARTED"]
    assert [e["tool"] for e in started] == ["create_issue", "lookup"]


def test_side_effects_come_from_the_annotations_and_the_user_overrides_them() -> None:
    listing = [
        {"name": "lookup", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}},
        {"name": "create", "inputSchema": {"type": "object"}, "annotations": {"destructiveHint": True}},
        {"name": "put", "inputSchema": {"type": "object"}, "annotations": {"idempotentHint": True}},
        {"name": "plain", "inputSchema": {"type": "object"}},
        {"name": "bad", "inputSchema": {"type": "object", "properties": {"x": {"type": 12}}}},
    ]

    async def verify(invocation_id: str) -> Any:
        return "done"

    server = MCPServer.stdio("srv").with_tool("plain", side_effects=False).with_tool("create", verify=verify)
    names = {str(t["name"]): str(t["name"]) for t in listing}
    specs, skipped = build_specs(server, "srv", listing, names, connection=None)  # type: ignore[arg-type]
    by_name = {s.name: s for s in specs}
    assert by_name["lookup"].side_effects is False  # re-run on resume
    assert by_name["create"].side_effects is True and by_name["create"].verify is verify
    assert by_name["create"].max_tries is None  # verify is asked before any retry
    assert by_name["put"].side_effects is True and by_name["put"].max_tries is None  # idempotent
    assert by_name["plain"].side_effects is False  # overridden
    assert [name for name, _ in skipped] == ["bad"] and "not valid JSON Schema" in skipped[0][1]
    assert MCPServer.stdio("srv").with_tool("x").tool_options["x"].verify is None


def test_offered_names_are_prefixed_only_where_two_servers_collide_and_stay_valid() -> None:
    assert offered_name("github", "search", False) == "search"
    assert offered_name("github", "search", True) == "github__search"
    assert offered_name("a.b", "x/y z", True) == "a_b__x_y_z"
    long = offered_name("s" * 40, "t" * 40, True)
    assert len(long) == 64 and long != offered_name("s" * 40, "t" * 41, True)


async def test_two_servers_offering_one_name_are_prefixed_by_their_names(
    tmp_path: Path, shared: Shared
) -> None:
    llm = ScriptedLLM({(0, 0): ScriptedTurn.tool_use("work__lookup", {"key": "k"}), (1, 0): "none found"})
    agent = tool_agent(llm, tracker(tmp_path / "home", name="home"), MCPServer.http(shared.url, name="work"))
    run = await AgentHarness(tmp_path / "data").run(agent, job_id="two-servers", payload="look")
    assert run.exit_code == 0
    names = [t["name"] for t in llm.requests[0].params["tools"]]
    assert "home__lookup" in names and "work__lookup" in names and "lookup" not in names
    assert results_sent(llm)[0]["content"] == "none"
    calls = [json.loads(line) for line in (shared.state / "calls.jsonl").read_text().splitlines()]
    mine = [c for c in calls if c["meta"].get(INVOCATION_META_KEY, "").startswith("two-servers/")]
    assert [(c["tool"], c["args"], c["meta"][INVOCATION_META_KEY]) for c in mine] == [
        ("lookup", {"key": "k"}, "two-servers/0/1")
    ]
    assert not (tmp_path / "home" / "calls.jsonl").exists()


async def test_a_crashing_server_is_restarted_once_then_its_calls_fail_at_once(tmp_path: Path) -> None:
    # The last lookup is read-only and may be retried: a transient error there would retry a server that
    # cannot come back for the whole step budget.
    state = tmp_path / "server"
    llm = ScriptedLLM(
        {
            (0, 0): ScriptedTurn.tool_use("crash", {}),
            (1, 0): ScriptedTurn.tool_use("lookup", {"key": "k"}),
            (2, 0): ScriptedTurn.tool_use("crash", {}),
            (3, 0): ScriptedTurn.tool_use("lookup", {"key": "k"}),
            (4, 0): "gave up",
        }
    )
    server = tracker(state).with_tool("lookup", timeout=500)  # 5 s at the harness's 0.01 scale
    run = await AgentHarness(tmp_path / "data").run(tool_agent(llm, server), payload="x")
    assert run.exit_code == 0 and run.job is not None and run.job.status == "COMPLETED"
    sent = results_sent(llm)
    assert sent[0]["is_error"] and "MCPServerUnavailable" in sent[0]["content"]
    assert "went away during crash: it exited with code 3" in sent[0]["content"]
    assert not sent[1].get("is_error") and sent[1]["content"] == "none"  # restarted
    assert sent[2]["is_error"]
    assert sent[3]["is_error"] and "MCPToolError" in sent[3]["content"]
    assert "already restarted once" in sent[3]["content"]
    failed = [e for e in run.journal if e["type"] == "TOOL_FAILED" and e["tool"] == "lookup"]
    assert len(failed) == 1  # not retried
    assert len((state / "pid").read_text().splitlines()) == 2


async def test_a_server_whose_restart_fails_fails_its_calls_at_once(tmp_path: Path) -> None:
    state = tmp_path / "server"
    server = tracker(state)

    class Agent(AgentProcess):
        agent_id = "mcp-no-restart"
        mcp_servers: ClassVar[Any] = (server,)

        async def step(self, ctx: StepContext) -> Done | None:
            errors = []
            with pytest.raises(MCPServerUnavailable) as crashed:
                await ctx.call_tool(server.tool("crash"))
            (state / "refuse_start").write_text("1")  # the one restart will fail
            for _ in range(2):
                try:
                    await ctx.call_tool(server.tool("lookup"), key="k")  # read-only: retried if transient
                except MCPToolError as exc:
                    errors.append(str(exc))
            return Done(result=[str(crashed.value), *errors])

    run = await AgentHarness(tmp_path / "data").run(Agent())
    assert run.exit_code == 0 and run.job is not None, run.log_messages()
    crashed, restart_failed, gone = run.job.result
    assert "went away during crash" in crashed
    assert "did not start" in restart_failed and "fail for the rest of this attempt" in restart_failed
    assert "already restarted once" in gone
    failed = [e["error_class"] for e in run.journal if e["type"] == "TOOL_FAILED" and e["tool"] == "lookup"]
    assert failed == ["MCPToolError", "MCPToolError"]  # one try each


async def test_a_server_that_exited_while_idle_is_restarted_before_the_call(tmp_path: Path) -> None:
    state = tmp_path / "server"
    server = tracker(state).with_tool("lookup", retries=0)

    class Agent(AgentProcess):
        agent_id = "mcp-idle-exit"
        mcp_servers: ClassVar[Any] = (server,)

        async def step(self, ctx: StepContext) -> Done | None:
            await ctx.call_tool(server.tool("quit"))  # it answers, then exits
            pid = int((state / "pid").read_text().split()[0])
            while Path(f"/proc/{pid}").exists():
                await anyio.sleep(0.01)
            await anyio.sleep(0.05)  # the event loop hears of it
            return Done(result=await ctx.call_tool(server.tool("lookup"), key="k"))

    run = await AgentHarness(tmp_path / "data").run(Agent())
    assert run.exit_code == 0 and run.job is not None and run.job.result == "none", run.log_messages()
    assert not [e for e in run.journal if e["type"] == "TOOL_FAILED"]  # no call was lost to it
    restarted = [m for m in run.log_messages() if "restarting it once" in m]
    assert restarted == [
        f"MCP server tracker (stdio: {sys.executable}) is gone (it exited with code 0 before the call): "
        "restarting it once"
    ]


async def test_an_answer_the_sdk_cannot_parse_fails_its_call_at_once_not_at_its_timeout(
    tmp_path: Path,
) -> None:
    # A lone surrogate escape in the text is valid JSON the SDK's parser refuses: the answer would be
    # dropped and the call would wait for its timeout (30 s here), its effect done. It is read as it is,
    # and the journal refuses the lone surrogate as it does for any tool; a result that is not an object
    # fails its call as not JSON-RPC.
    state = tmp_path / "server"
    server = tracker(state).with_tool("mangled", timeout=3000).with_tool("shapeless", timeout=3000, retries=0)

    class Agent(AgentProcess):
        agent_id = "mcp-unparsable"
        mcp_servers: ClassVar[Any] = (server,)

        async def step(self, ctx: StepContext) -> Done | None:
            with pytest.raises(UnreplayableValue) as refused:
                await ctx.call_tool(server.tool("mangled"), title="t")
            with pytest.raises(MCPToolError) as shapeless:
                await ctx.call_tool(server.tool("shapeless"))
            return Done(result=[str(refused.value), str(shapeless.value)])

    run = await AgentHarness(tmp_path / "data").run(Agent())
    assert run.exit_code == 0 and run.job is not None, run.log_messages()
    refused, shapeless = run.job.result
    assert "lone surrogate" in refused
    assert "not JSON-RPC" in shapeless
    assert len(effects(state)) == 1
    completed = next(e for e in run.journal if e["type"] == "TOOL_COMPLETED" and e["tool"] == "mangled")
    assert completed["error_class"] == "UnreplayableValue"  # the effect happened: never run again


async def test_a_hanging_malformed_or_oversized_result_goes_back_as_one_clear_error(
    tmp_path: Path, shared: Shared
) -> None:
    # Timeouts in scaled seconds (x0.01): the hang is cut after 0.3 s, the 2 MB answer has 10 s.
    server = (
        MCPServer.http(shared.url).with_tool("hang", timeout=30, retries=0).with_tool("big", timeout=1000)
    )
    llm = ScriptedLLM(
        {
            (0, 0): ScriptedTurn.tool_use("hang", {}),
            (1, 0): ScriptedTurn.tool_use("malformed", {}),
            (2, 0): ScriptedTurn.tool_use("big", {"mb": 2}),  # twice the default 1 MiB limit
            (3, 0): ScriptedTurn.tool_use("lookup", {"key": "k"}),
            (4, 0): "done",
        }
    )
    run = await AgentHarness(tmp_path / "data").run(tool_agent(llm, server), job_id="limits", payload="x")
    assert run.exit_code == 0 and run.job is not None and run.job.status == "COMPLETED"
    hang, malformed, big, lookup = results_sent(llm)
    assert hang["is_error"] and "ToolTimeout" in hang["content"]
    assert malformed["is_error"] and "Invalid structured content" in malformed["content"]
    assert big["is_error"] and "2.1 MB" in big["content"] and "max_result_bytes" in big["content"]
    assert "\n" not in big["content"] and len(big["content"]) < 500
    assert lookup["content"] == "none"  # the server is still usable
    failed = [e for e in run.journal if e["type"] == "TOOL_FAILED"]
    assert [e["error_class"] for e in failed] == ["ToolTimeout", "MCPToolError", "MCPToolError"]
    assert max(len(json.dumps(e)) for e in run.journal) < 10_000  # nothing of the 2 MB was journaled


async def test_a_tool_whose_schema_is_not_json_schema_is_left_out_with_one_error(tmp_path: Path) -> None:
    server = tracker(tmp_path / "server", "--invalid-schema")

    class Agent(AgentProcess):
        agent_id = "mcp-bad-schema"
        mcp_servers: ClassVar[Any] = (server,)

        async def step(self, ctx: StepContext) -> Done | None:
            try:
                await ctx.call_tool(server.tool("broken"), x=1)
            except ConfigError as exc:
                return Done(result=str(exc))
            return Done(result="called")

    run = await AgentHarness(tmp_path / "data").run(Agent())
    assert run.exit_code == 0 and run.job is not None
    assert "broken" in str(run.job.result) and "not valid JSON Schema" in str(run.job.result)
    errors = [line["msg"] for line in run.logs if line.get("level") == "ERROR"]
    assert len(errors) == 1 and "broken" in errors[0]
    event = next(e for e in run.journal if e["type"] == "MCP_TOOLS")
    assert "broken" not in event["tools"] and event["skipped"][0]["tool"] == "broken"


@pytest.mark.parametrize("kind", ["missing command", "not executable", "refused url"])
async def test_a_server_that_cannot_start_stops_hydration_with_one_line(tmp_path: Path, kind: str) -> None:
    port = free_port()
    script = tmp_path / "server.sh"
    script.write_text("#!/bin/sh\n")  # no execute permission
    servers = {
        "missing command": (MCPServer.stdio("/nonexistent/mcp-server-binary"), "command not found"),
        "not executable": (MCPServer.stdio(str(script)), "not executable"),
        "refused url": (
            MCPServer.http(f"http://127.0.0.1:{port}/mcp", {"Authorization": "Bearer hunter2 s3cr3t"}),
            f"127.0.0.1:{port}",
        ),
    }
    server, expected = servers[kind]

    class Agent(AgentProcess):
        agent_id = "mcp-no-server"
        mcp_servers: ClassVar[Any] = (server,)

        async def step(self, ctx: StepContext) -> Done | None:
            return Done(result="never")

    run = await AgentHarness(tmp_path / "data").run(Agent())
    assert run.exit_code == 1
    assert run.job is not None and run.job.status == "RUNNING"  # resumable: the next attempt tries again
    fatal = [line["msg"] for line in run.logs if line.get("level") == "ERROR"]
    assert len(fatal) == 1 and "did not start" in fatal[0] and expected in fatal[0]
    everything = json.dumps(run.logs) + json.dumps(run.journal)
    assert "hunter2" not in everything and "s3cr3t" not in everything


def _changing_agent(state: Path, variant: int, rerun: bool) -> AgentProcess:
    server = tracker(state, "--variant", str(variant))
    llm = ScriptedLLM({(0, 0): ScriptedTurn.tool_use("lookup", {"key": "k"})})

    class Agent(AgentProcess):
        agent_id = "mcp-changing"
        mcp_servers: ClassVar[Any] = (server,)
        replay_mismatch = "rerun" if rerun else "fail"

        def make_llm(self) -> LLMClient:
            return llm

        async def step(self, ctx: StepContext) -> Done | None:
            await ctx.llm.complete(
                model="m", max_tokens=100, messages=[{"role": "user", "content": "go"}], tools=[server]
            )
            await ctx.call_tool(server.tool("slow"), seconds=30)
            return Done(result="done")

    return Agent()


@pytest.mark.parametrize("rerun", [False, True])
async def test_a_tool_list_that_changed_between_attempts_is_a_replay_mismatch(
    tmp_path: Path, rerun: bool
) -> None:
    harness = AgentHarness(tmp_path / "data")
    first = await harness.run(_changing_agent(tmp_path / "s", 1, rerun), drain=DrainAt.during_tool("slow"))
    assert first.exit_code == 143
    second = await harness.run(_changing_agent(tmp_path / "s", 2, rerun), drain=DrainAt.during_tool("slow"))
    changed = next(e for e in second.journal if e["type"] == "MCP_TOOLS_CHANGED")
    assert changed["changed"] == ["create_issue"] and changed["added"] == changed["removed"] == []
    if not rerun:
        assert second.exit_code == 1
        assert any("replay mismatch" in m and "MCP server tracker" in m for m in second.log_messages())
        # A crash like any other: on the row, where `job show` and the crash policy count it.
        assert second.job is not None and second.job.status == "RUNNING"
        (crash,) = second.job.error
        assert crash["error_class"] == "ReplayMismatch" and crash["attempt"] == 2
        assert "job-1/0/0" in crash["message"]
    else:
        assert any(e["type"] == "REPLAY_DISCARDED" for e in second.journal)
        assert second.exit_code == 143  # ran afresh: the LLM call re-issued, the slow call cut again
        types = [e["type"] for e in second.journal]
        assert "LLM_COMPLETED" in types[types.index("REPLAY_DISCARDED") :]


async def test_a_tool_list_that_changed_while_the_job_moved_to_another_pod_is_a_replay_mismatch(
    tmp_path: Path,
) -> None:
    # The second attempt runs on an empty data dir: the list it compares with is the one the store kept.
    harness = AgentHarness(tmp_path / "pod-a")
    first = await harness.run(_changing_agent(tmp_path / "s", 1, False), drain=DrainAt.during_tool("slow"))
    assert first.exit_code == 143
    other_pod = {
        "AGENTLIFE_DATA_DIR": str(tmp_path / "pod-b"),
        "AGENTLIFE_DATABASE_URL": harness.database_url,
    }
    second = await harness.run(_changing_agent(tmp_path / "s", 2, False), env=other_pod)
    changed = next(e for e in second.journal if e["type"] == "MCP_TOOLS_CHANGED")
    assert changed["changed"] == ["create_issue"]
    assert second.exit_code == 1
    assert second.job is not None and [c["error_class"] for c in second.job.error] == ["ReplayMismatch"]


async def test_an_http_tool_with_side_effects_and_no_verify_is_named_at_start_up(
    tmp_path: Path, shared: Shared
) -> None:
    # An HTTP server finishes a call whose agent died, and the next attempt runs it again: said once.
    async def find(invocation_id: str) -> Any:
        return NOT_DONE

    server = MCPServer.http(shared.url).with_tool("create_issue", verify=find)
    run = await AgentHarness(tmp_path / "data").run(tool_agent(ScriptedLLM({(0, 0): "nothing"}), server))
    assert run.exit_code == 0
    warned = [line["msg"] for line in run.logs if line.get("level") == "WARNING"]
    assert len(warned) == 1 and "3 tools with side effects and no verify (crash, mangled, stamp)" in warned[0]
    assert (
        'unless the server refuses a second call with the same _meta["agentlife/invocation_id"]' in warned[0]
    )


async def test_a_result_that_echoes_the_servers_credentials_is_masked_for_the_model_and_the_records(
    tmp_path: Path, shared: Shared
) -> None:
    headers = {"Authorization": "Bearer tok-8f2e41d9c7", "X-Api-Key": "k3y-v4lue-5e6f7a8b"}
    llm = ScriptedLLM({(0, 0): ScriptedTurn.tool_use("whoami", {}), (1, 0): "ok"})
    harness = AgentHarness(tmp_path / "data")
    run = await harness.run(tool_agent(llm, MCPServer.http(shared.url, headers)), job_id="echo", payload="x")
    assert run.exit_code == 0 and run.job is not None and run.job.status == "COMPLETED"
    (echoed,) = results_sent(llm)
    assert json.loads(echoed["content"]) == {"authorization": "***", "x-api-key": "***"}
    store = SQLiteStore(tmp_path / "data" / "agentlife.db")
    await store.open()
    try:
        rows = b"".join(await store.load_conversation("echo", 100))
    finally:
        await store.close()
    everything = (
        json.dumps(run.journal) + json.dumps(run.logs) + rows.decode() + json.dumps(llm.requests[-1].messages)
    )
    assert "k3y-v4lue" not in everything and "tok-8f2e41d9c7" not in everything and "***" in rows.decode()


async def test_streamable_http_server_tools_work_and_auth_headers_never_show(
    tmp_path: Path, shared: Shared
) -> None:
    server = MCPServer.http(shared.url, {"Authorization": "Bearer tok-8f2%40x s3cr3t"})
    llm = ScriptedLLM({(0, 0): ScriptedTurn.tool_use("create_issue", {"title": "over http"}), (1, 0): "ok"})
    env = {"AGENTLIFE_LOG_LEVEL": "DEBUG"}
    harness = AgentHarness(tmp_path / "data")
    run = await harness.run(tool_agent(llm, server), job_id="http", payload="x", env=env)
    assert run.exit_code == 0 and run.job is not None and run.job.status == "COMPLETED"
    assert [e["key"] for e in effects(shared.state, "http")] == ["http/0/1"]
    everything = json.dumps(run.logs) + json.dumps(run.journal) + repr(server)
    assert "tok-8f2" not in everything and "s3cr3t" not in everything


@pytest.mark.parametrize(
    "url", ["http://u:pw-s3cr3t@tracker.local/mcp", "https://tracker.local/mcp?api_key=q-s3cr3t#frag-s3cr3t"]
)
def test_an_http_servers_repr_names_its_url_without_a_password_or_a_query(url: str) -> None:
    # A URL may carry the API key (user:pass@, ?key=): the repr (a log's %r, a traceback's locals) hides it
    # as it hides the headers, and still says where the server is.
    server = MCPServer.http(url, {"Authorization": "Bearer h-s3cr3t"}).with_tool("create_issue")
    shown = repr(server) + str(server)
    assert "s3cr3t" not in shown
    assert "url='http" in shown and "tracker.local/mcp'" in shown


def test_result_values_are_structured_content_else_text() -> None:
    import mcp.types as types

    text = types.CallToolResult(
        content=[types.TextContent(type="text", text="a"), types.TextContent(type="text", text="b")]
    )
    assert result_value(text, "s", "t", 100) == "a\nb"
    structured = types.CallToolResult(content=[], structured_content={"n": 1})
    assert result_value(structured, "s", "t", 100) == {"n": 1}
    with pytest.raises(Exception, match="over the server's max_result_bytes"):
        result_value(text, "s", "t", 2)


def test_bad_configuration_is_refused_with_one_line() -> None:
    for make in (
        lambda: MCPServer.stdio(""),
        lambda: MCPServer.stdio("x", "not-a-list-of-args"),
        lambda: MCPServer.stdio("x", env={"A": 1}),  # type: ignore[dict-item]
        lambda: MCPServer.http("ftp://host/mcp"),
        lambda: MCPServer.http("http://h/mcp", {"X": "a\r\nInjected: 1"}),
        lambda: MCPServer.stdio("x", timeout=float("nan")),
        lambda: MCPServer.stdio("x", timeout=True),
        lambda: MCPServer.stdio("x", start_timeout=0),
        lambda: MCPServer.stdio("x").with_tool("t", timeout=-0.0),
        lambda: MCPServer.stdio("x", max_result_bytes=0),
        lambda: MCPServer.stdio("x").with_tool("t", retries=-1),
    ):
        with pytest.raises(ConfigError):
            make()


def _issue_agent(state: Path, variant: int) -> AgentProcess:
    server = tracker(state, "--variant", str(variant))

    class Agent(AgentProcess):
        agent_id = "mcp-issue"
        mcp_servers: ClassVar[Any] = (server,)

        async def step(self, ctx: StepContext) -> Done | None:
            return Done(result=await ctx.call_tool(server.tool("create_issue"), title="disk full"))

    return Agent()


async def test_a_tool_list_changed_behind_attempts_that_could_not_start_the_server_is_a_recorded_mismatch(
    tmp_path: Path,
) -> None:
    # Attempt 1 is drained while create_issue (no verify) is pending; attempts 2 to 4 cannot start the
    # server, so their session files hold no tool list; attempt 5 meets a changed create_issue. The list
    # it compares with is attempt 1's, however many files lie between: the pending call is not run
    # against the changed tool, and the mismatch is a crash on the row like any other.
    state, harness = tmp_path / "s", AgentHarness(tmp_path / "data")
    state.mkdir()
    (state / "create_delay").write_text("60")  # the effect is done, the answer never comes
    first = await harness.run(_issue_agent(state, 1), drain=DrainAt.during_tool("create_issue"))
    assert first.exit_code == 143 and len(effects(state)) == 1
    (state / "refuse_start").write_text("1")
    for _ in range(3):
        assert (await harness.run(_issue_agent(state, 1))).exit_code == 1
    (state / "refuse_start").unlink()
    last = await harness.run(_issue_agent(state, 3))
    assert last.exit_code == 1, last.log_messages()
    changed = next(e for e in last.journal if e["type"] == "MCP_TOOLS_CHANGED")
    assert changed["changed"] == ["create_issue"]
    assert len(effects(state)) == 1  # the pending call did not run again
    assert last.job is not None and [c["error_class"] for c in last.job.error] == ["ReplayMismatch"]
    decision = should_retry_after_crash(last.job.error)
    assert decision.retry  # the first crash of its kind: the crash policy counts it and backs off


async def test_a_required_invocation_id_in_the_servers_schema_is_filled_in_not_asked_of_the_model(
    tmp_path: Path, shared: Shared
) -> None:
    llm = ScriptedLLM(
        {
            (0, 0): ScriptedTurn.tool_use("stamp", {"doc": "contract"}),
            (1, 0): ScriptedTurn.tool_use("stamp", {"doc": "forged", "invocation_id": "someone-else"}),
            (2, 0): "Stamped.",
        }
    )
    agent = tool_agent(llm, MCPServer.http(shared.url))
    run = await AgentHarness(tmp_path / "data").run(agent, job_id="stamps", payload="stamp it")
    assert run.exit_code == 0 and run.job is not None and run.job.status == "COMPLETED"
    offered = next(t for t in llm.requests[0].params["tools"] if t["name"] == "stamp")["input_schema"]
    assert offered["required"] == ["doc"] and "invocation_id" not in offered["properties"]
    stamped, forged = results_sent(llm)
    assert not stamped.get("is_error") and stamped["content"] == "stamped contract"
    assert forged["is_error"] and "invocation_id" in forged["content"]  # the model cannot pick the key
    assert [(e["key"], e["title"]) for e in effects(shared.state, "stamps")] == [("stamps/0/1", "contract")]


def test_a_pending_http_calls_deadline_comes_from_its_journaled_start_and_never_exceeds_its_timeout() -> None:
    # What the next attempt waits for before verify, from the journal alone (any pod, any process): the
    # recorded start (its original time when carried forward) plus the tool's timeout. A start that is
    # missing, not a number or in the future (a clock set back, a hand-written line) counts as now.
    from agentlife._journal._recovery import build_replay
    from agentlife._mcp._client import MCPConnection
    from agentlife._redact import Redactor
    from agentlife._runtime._mcp_tools import MCPTools
    from agentlife.constants import Constants

    async def verify(invocation_id: str) -> Any:
        return NOT_DONE

    server = MCPServer.http("http://127.0.0.1:9/mcp").with_tool("create", verify=verify, timeout=10)
    listing = [
        {"name": "create", "inputSchema": {"type": "object"}},
        {"name": "lookup", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}},
    ]
    connection = MCPConnection(server, None, Redactor(), 1.0)  # type: ignore[arg-type]  # never started
    specs, _ = build_specs(server, "srv", listing, {"create": "create", "lookup": "lookup"}, connection)
    tools = MCPTools([server])
    tools.add(server, connection, specs, {})
    now = time.time()

    def started(call: int, tool: str = "create", **more: Any) -> dict[str, Any]:
        fields = {"step": 0, "call": call, "invocation_id": f"j/0/{call}", "tool": tool, "digest": f"d{call}"}
        return {"type": "TOOL_STARTED", **fields, "side_effects": tool == "create", **more}

    events = [
        started(0, ts=now - 4),
        started(1, ts="yesterday"),
        started(2, ts=1e300),
        started(3, ts=now, carried=True, carried_ts=now - 8),
        started(4, ts=now - 4),
        {"type": "TOOL_COMPLETED", "step": 0, "call": 4, "invocation_id": "j/0/4", "digest": "d4"},
        started(5, tool="lookup", ts=now),
    ]
    tools.await_pending_calls(build_replay(events, 0), Constants())
    deadlines = {k: round(v - now) for k, v in connection.deadlines.items()}
    assert deadlines == {"j/0/0": 6, "j/0/1": 10, "j/0/2": 10, "j/0/3": 2}
    assert connection.clock_margin == 1.0
