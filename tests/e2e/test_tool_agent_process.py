"""`ToolAgent`: one model turn plus its tool calls per step, a durable conversation, exactly-once effects."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

import anyio
import pytest
from pydantic import BaseModel

from agentlife import (
    NOT_DONE,
    LLMClient,
    LLMReply,
    ScriptedLLM,
    ScriptedTurn,
    ToolAgent,
    tool,
)
from agentlife.testing import AgentHarness, DrainAt
from procs import agent_env, run_cli

pytestmark = pytest.mark.anyio


class Labels:
    """The outside world the side-effecting tool writes to (one per test)."""

    def __init__(self) -> None:
        self.applied: list[tuple[str, str]] = []
        self.by_invocation: dict[str, str] = {}


def triage_agent(world: Labels, llm: ScriptedLLM, *, slow_label: bool = False) -> type[ToolAgent]:
    @tool(side_effects=False)
    async def search_docs(query: str, limit: int = 3) -> list[str]:
        """Search the docs.

        Args:
            query: what to look for.
            limit: how many hits at most.
        """
        return [f"doc about {query}"][:limit]

    async def verify_label(invocation_id: str) -> Any:
        return world.by_invocation.get(invocation_id, NOT_DONE)

    @tool(side_effects=True, verify=verify_label, timeout=100)
    async def label_issue(issue: int, label: str, invocation_id: str) -> str:
        """Put a label on an issue."""
        world.applied.append((str(issue), label))
        result = world.by_invocation[invocation_id] = f"labelled #{issue} {label}"
        if slow_label:
            await anyio.sleep(0.05)
        return result

    class Triage(ToolAgent):
        agent_id = "triage"
        system = "You label issues."
        tools: ClassVar[Any] = (search_docs, label_issue)
        max_turns = 5

        def make_llm(self) -> LLMClient:
            return llm

    return Triage


def script() -> dict[tuple[int, int], ScriptedTurn | str]:
    return {
        (0, 0): ScriptedTurn.tool_use("search_docs", {"query": "crash on start"}),
        (1, 0): ScriptedTurn.tool_use("label_issue", {"issue": 7, "label": "bug"}),
        (2, 0): "Labelled #7 as bug.",
    }


async def test_runs_the_loop_to_the_final_text(tmp_path: Path) -> None:
    world, llm = Labels(), ScriptedLLM(script())
    run = await AgentHarness(tmp_path).run(triage_agent(world, llm)(), payload="Issue #7: it crashes")
    assert run.exit_code == 0
    assert run.job is not None and run.job.status == "COMPLETED"
    assert run.job.result == "Labelled #7 as bug."
    assert world.applied == [("7", "bug")]
    first, last = llm.requests[0], llm.requests[-1]
    assert first.messages == ({"role": "user", "content": "Issue #7: it crashes"},)
    assert first.params["system"] == "You label issues."
    assert [t["name"] for t in first.params["tools"]] == ["search_docs", "label_issue"]
    assert "invocation_id" not in str(first.params["tools"][1]["input_schema"])
    roles = [m["role"] for m in last.messages]
    assert roles == ["user", "assistant", "user", "assistant", "user"]
    assert last.messages[2]["content"][0]["content"] == '["doc about crash on start"]'
    assert last.messages[4]["content"][0]["content"] == "labelled #7 bug"


async def test_sigterm_during_the_side_effect_resumes_without_repeating_it(tmp_path: Path) -> None:
    world = Labels()
    uninterrupted_world, uninterrupted = Labels(), ScriptedLLM(script())
    await AgentHarness(tmp_path / "a").run(
        triage_agent(uninterrupted_world, uninterrupted)(), payload="Issue #7"
    )

    llm = ScriptedLLM(script())
    harness = AgentHarness(tmp_path / "b")
    agent_class = triage_agent(world, llm, slow_label=True)
    run = await harness.run(agent_class(), payload="Issue #7", drain=DrainAt.during_tool("label_issue"))
    assert run.exit_code == 143
    run = await harness.run(agent_class(), payload="Issue #7")
    assert run.exit_code == 0
    assert world.applied == [("7", "bug")]  # exactly once
    # The drained step finished its tool and was checkpointed: the resumed process starts with the next
    # model turn and sends exactly the conversation an uninterrupted run sent.
    assert [r.messages for r in llm.requests] == [r.messages for r in uninterrupted.requests]


async def test_invalid_arguments_go_back_to_the_model_and_never_reach_the_tool(tmp_path: Path) -> None:
    world = Labels()
    llm = ScriptedLLM(
        {
            (0, 0): ScriptedTurn.tool_use("label_issue", {"issue": "seven", "label": "bug"}),
            (1, 0): ScriptedTurn.tool_use("label_issue", {"label": "bug"}),
            (2, 0): ScriptedTurn.tool_use("label_issue", {"issue": 7, "label": "bug", "colour": "red"}),
            (3, 0): "I give up.",
        }
    )
    run = await AgentHarness(tmp_path).run(triage_agent(world, llm)(), payload="Issue #7")
    assert run.exit_code == 0
    assert world.applied == []
    results = [m["content"][0] for m in llm.requests[-1].messages if m["role"] == "user"][1:]
    assert all(r["is_error"] for r in results)
    assert "issue" in results[0]["content"] and "integer" in results[0]["content"]
    assert "missing" in results[1]["content"]
    assert "colour" in results[2]["content"]


async def test_fails_after_max_turns(tmp_path: Path) -> None:
    world = Labels()
    llm = ScriptedLLM([ScriptedTurn.tool_use("search_docs", {"query": "again"})] * 5)
    run = await AgentHarness(tmp_path).run(triage_agent(world, llm)(), payload="loop")
    assert run.exit_code == 0
    assert run.job is not None and run.job.status == "FAILED"
    assert llm.calls == 5
    assert "no final answer after 5 model turns" in str(run.job.error)


class Report(BaseModel):
    number: int
    label: Literal["bug", "feature"]


def reporting_agent(llm: ScriptedLLM) -> type[ToolAgent]:
    world = Labels()

    class Reporter(triage_agent(world, llm)):  # type: ignore[misc]
        output_type = Report

    return Reporter


async def test_output_type_ends_with_the_validated_result(tmp_path: Path) -> None:
    llm = ScriptedLLM(
        {
            (0, 0): ScriptedTurn.tool_use("search_docs", {"query": "x"}),
            (1, 0): ScriptedTurn.tool_use("final_result", {"number": "7", "label": "bug"}),
        }
    )
    run = await AgentHarness(tmp_path).run(reporting_agent(llm)(), payload="Issue #7")
    assert run.job is not None and run.job.status == "COMPLETED"
    assert run.job.result == {"number": 7, "label": "bug"}
    request = llm.requests[0]
    assert request.params["tool_choice"] == {"type": "any"}
    final = request.params["tools"][-1]
    assert final["name"] == "final_result"
    assert final["input_schema"]["properties"]["label"]["enum"] == ["bug", "feature"]


async def test_an_invalid_final_answer_goes_back_to_the_model(tmp_path: Path) -> None:
    llm = ScriptedLLM(
        {
            (0, 0): ScriptedTurn.tool_use("final_result", {"number": 7, "label": "wontfix"}),
            (1, 0): ScriptedTurn.tool_use("final_result", {"number": 7, "label": "feature"}),
        }
    )
    run = await AgentHarness(tmp_path).run(reporting_agent(llm)(), payload="Issue #7")
    assert run.job is not None and run.job.result == {"number": 7, "label": "feature"}
    sent_back = llm.requests[1].messages[-1]["content"]
    assert sent_back[0]["is_error"] is True and sent_back[0]["tool_use_id"] == "toolu_scripted_final_result"
    assert "label" in sent_back[0]["content"]


async def test_a_text_answer_is_asked_to_use_the_output_tool(tmp_path: Path) -> None:
    llm = ScriptedLLM(
        {
            (0, 0): "It is a bug.",
            (1, 0): ScriptedTurn.tool_use("final_result", {"number": 7, "label": "bug"}),
        }
    )
    run = await AgentHarness(tmp_path).run(reporting_agent(llm)(), payload="Issue #7")
    assert run.job is not None and run.job.result == {"number": 7, "label": "bug"}
    assert llm.requests[1].messages[-1] == {
        "role": "user",
        "content": "Answer by calling the final_result tool.",
    }


# ----------------------------------------------------------------- calls the model did not send whole
#
# Through the real ``anthropic`` SDK and real httpx against the fake servers: what the adapters read off the
# wire, what the agent does with it, and what goes back to the API.


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


async def test_refusals_are_journaled_and_shown_by_journal_show(tmp_path: Path) -> None:
    disk = Disk()
    llm = ScriptedLLM(
        {
            (0, 0): ScriptedTurn.reply(
                [
                    {"type": "tool_use", "id": "t1", "name": "rm_rf", "input": {}},
                    {"type": "tool_use", "id": "t2", "name": "label_issue", "input": {"issue": "seven"}},
                    {"type": "tool_use", "id": "t3", "name": "final_result", "input": {"number": 7}},
                ]
            ),
            (1, 0): ScriptedTurn.tool_use("final_result", {"number": 7, "label": "bug"}),
        }
    )
    run = await AgentHarness(tmp_path).run(cleanup_agent(disk, llm, output_type=Report)(), payload="x")
    assert run.job is not None and run.job.result == {"number": 7, "label": "bug"}
    refused = {e["tool"]: e for e in run.journal if e["type"] == "TOOL_REFUSED"}
    assert {name: e["reason"] for name, e in refused.items()} == {
        "rm_rf": "unknown_tool",
        "label_issue": "invalid_arguments",
        "final_result": "invalid_final_result",
    }
    # Every offered tool is listed, the output tool too.
    assert "tools offered: cleanup, final_result, label_issue" in refused["rm_rf"]["error"]
    warned = [line["msg"] for line in run.logs if line["level"] == "WARNING" and "refused" in line["msg"]]
    assert len(warned) == 3
    [session] = (tmp_path / "sessions" / "job-1").glob("session_*.jsonl")
    shown = run_cli("journal", "show", str(session), env=agent_env(tmp_path))
    assert shown.returncode == 0, shown.stderr
    assert (
        "tool call refused: rm_rf [t1], unknown_tool: \"unknown tool 'rm_rf' (tools offered: cleanup, "
        'final_result, label_issue)"' in shown.stdout
    )
    assert "tool call refused: label_issue [t2], invalid_arguments:" in shown.stdout
    assert "tool call refused: final_result [t3], invalid_final_result:" in shown.stdout
    assert disk.labels == []


def nested(levels: int) -> Any:
    """A value of ``levels`` levels of dicts, built without recursion (a model can send 10 000)."""
    value: Any = "leaf"
    for _ in range(levels - 1):
        value = {"k": value}
    return {"query": value}


class DeepArgumentsModel:
    """A model client that asks for a tool with arguments ``levels`` deep, then gives up in text.

    A `ScriptedLLM` cannot carry them: it streams a tool input as JSON, which orjson writes only 254 levels
    deep. A client of any other provider hands its parsed arguments on as they came.
    """

    streams_events = False

    def __init__(self, levels: int) -> None:
        self.levels = levels
        self.requests: list[list[Any]] = []

    async def complete(self, *, model: str, messages: Any, max_tokens: int, **params: Any) -> LLMReply:
        self.requests.append(list(messages))
        if len(self.requests) > 1:
            return LLMReply(text="Gave up.", content=({"type": "text", "text": "Gave up."},))
        block = {"type": "tool_use", "id": "toolu_deep", "name": "search_docs", "input": nested(self.levels)}
        return LLMReply(text="", content=(block,), stop_reason="tool_use")

    async def aclose(self) -> None:
        return None


async def test_arguments_nested_10_000_deep_go_back_to_the_model_and_never_crash_the_job(
    tmp_path: Path,
) -> None:
    world, llm = Labels(), DeepArgumentsModel(10_000)
    agent_class = triage_agent(world, ScriptedLLM([]))
    agent_class.make_llm = lambda self: llm  # type: ignore[method-assign]
    harness = AgentHarness(tmp_path)
    run = await harness.run(agent_class(), payload="Issue #7")
    assert run.exit_code == 0, [line["msg"] for line in run.logs if line["level"] != "INFO"]
    assert run.job is not None and (run.job.status, run.job.result) == ("COMPLETED", "Gave up.")
    assert "TOOL_STARTED" not in run.journal_types()
    [refused] = [e for e in run.journal if e["type"] == "TOOL_REFUSED"]
    assert (refused["tool"], refused["reason"]) == ("search_docs", "unusable_arguments")
    assistant, results = llm.requests[1][1:]
    assert assistant["content"] == [
        {"type": "tool_use", "id": "toolu_deep", "name": "search_docs", "input": {}}
    ]
    [result] = results["content"]
    assert result["is_error"] is True and result["tool_use_id"] == "toolu_deep"
    assert "its arguments nest deeper than 125 levels, more than the journal keeps" in result["content"]
    # The journal holds the reply as the step used it, so a replay decides the same way.
    [completed, _] = [e for e in run.journal if e["type"] == "LLM_COMPLETED"]
    assert completed["response"]["content"][0]["input"] == {}
    assert "toolu_deep" in completed["response"]["tool_input_errors"]


async def test_a_job_that_crashed_on_deep_arguments_before_this_fix_resumes_and_refuses_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Until 0.3 the reply was journaled as the model sent it and the step crashed on it: the next attempt
    # replays that reply from the journal, and must refuse the call rather than crash again.
    from agentlife._step import _context

    world, llm = Labels(), DeepArgumentsModel(10_000)
    agent_class = triage_agent(world, ScriptedLLM([]))
    agent_class.make_llm = lambda self: llm  # type: ignore[method-assign]
    harness = AgentHarness(tmp_path)
    with monkeypatch.context() as old:
        old.setattr(_context, "bounded_tool_inputs", lambda reply: reply)
        crashed = await harness.run(agent_class(), payload="Issue #7")
    assert crashed.exit_code == 1
    run = await harness.run(agent_class(), payload="Issue #7")
    assert run.exit_code == 0, [line["msg"] for line in run.logs if line["level"] != "INFO"]
    assert run.job is not None and run.job.result == "Gave up."
    assert len(llm.requests) == 2  # the deep reply was replayed from the journal, not asked again
    assert "nest deeper than 125 levels" in llm.requests[1][-1]["content"][0]["content"]


def deploying_agent(world: Labels, llm: ScriptedLLM) -> type[ToolAgent]:
    @tool(side_effects=True, restricted=True)
    async def deploy(target: str) -> str:
        """Deploy to ``target``."""
        world.applied.append(("deploy", target))
        return f"deployed {target}"

    base = triage_agent(world, llm)

    class Deploying(base):  # type: ignore[misc, valid-type]
        tools: ClassVar[Any] = (*base.tools, deploy)

    return Deploying


async def test_a_rejected_call_ends_the_job_failed_and_never_goes_back_to_the_model(tmp_path: Path) -> None:
    from test_calls import _when_row_status

    from agentlife.stores import SQLiteStore

    world = Labels()
    both = ScriptedTurn.reply(
        [
            {"type": "tool_use", "id": "tu_1", "name": "deploy", "input": {"target": "prod"}},
            {"type": "tool_use", "id": "tu_2", "name": "label_issue", "input": {"issue": 7, "label": "bug"}},
        ]
    )
    llm = ScriptedLLM({(0, 0): both, (1, 0): "Deploy refused; I labelled it instead. Done."})
    harness = AgentHarness(tmp_path, env={"AGENTLIFE_APPROVAL_POLL_SECONDS": "5"})  # polls every 0.05 s

    async def reject() -> None:
        await _when_row_status(harness.data_dir / "agentlife.db", "job-1", "WAITING_FOR_APPROVAL")
        store = SQLiteStore(harness.data_dir / "agentlife.db")
        await store.open()
        try:
            await store.reject("job-1", "not in prod")
        finally:
            await store.close()

    async with anyio.create_task_group() as tg:
        tg.start_soon(reject)
        run = await harness.run(deploying_agent(world, llm)(), payload="Deploy #7")
    assert run.exit_code == 0
    assert run.job is not None and run.job.status == "FAILED"
    assert [e["error_class"] for e in run.job.error] == ["ApprovalRejected"]
    assert llm.calls == 1  # the refusal is not a tool error for the model to work around
    assert world.applied == []  # neither the refused call nor the one after it in the reply ran
    assert "APPROVAL_REJECTED" in run.journal_types()
