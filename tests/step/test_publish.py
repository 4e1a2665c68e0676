"""``ctx.publish`` on a real journal and SQLite store: what it writes, what it refuses, what it masks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from agentlife import ConfigError, StepContext
from agentlife._journal._writer import Journal
from agentlife._output._follow import follow_job
from agentlife._redact import Redactor
from agentlife.stores import SQLiteStore
from agentlife.testing import ScriptedLLM
from stepctx import journal_events, step_contexts

pytestmark = pytest.mark.anyio

NEST = 10_000


def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


BAD: list[tuple[object, Any, str]] = [
    ("", 1, "non-empty string"),
    ("  ", 1, "blank"),
    ("\u00a0", 1, "blank"),
    ("x" * 201, 1, "at most 200 characters"),
    (None, 1, "non-empty string"),
    (["phase"], 1, "non-empty string"),
    ("pha\nse", 1, "control characters"),
    ("phase\x00", 1, "control characters"),
    ("ph\x1bse", 1, "control characters"),
    ("ph\u2028se", 1, "control characters"),
    ("\udcff", 1, "control characters"),  # a lone surrogate is no character
    ("ok", object(), "not JSON"),
    ("ok", {"when": float("nan")}, "^ctx.publish: the value is not JSON: the value holds nan"),
    ("ok", float("inf"), "ctx.publish: the value"),
    ("ok", {1: "int key"}, "ctx.publish: the value"),
    ("ok", "\udcff", "not JSON"),
    ("ok", "nul\x00inside", "U\\+0000"),
    ("ok", "x" * (64 * 1024), "more than 65536"),
    ("ok", _deep(NEST), "nests deeper"),
    ("ok", 2**64, "ctx.publish: the value"),
]


async def _output(ctx: StepContext) -> list[Any]:
    store: Any = ctx._env.approvals.booted.store
    async with follow_job(store, "job-s", live=False) as events:
        return [event async for event in events]


async def _published_calls(journal: Journal) -> list[dict[str, Any]]:
    return [e for e in await journal_events(journal) if e.get("tool") == "agentlife.publish"]


@pytest.mark.parametrize(("name", "value", "message"), BAD, ids=range(len(BAD)))
async def test_bad_input_is_one_line_and_nothing_is_journaled_or_written(
    tmp_path: Path, name: object, value: Any, message: str
) -> None:
    async with step_contexts(tmp_path) as make:
        ctx, journal = await make(ScriptedLLM([]))
        with pytest.raises(ConfigError, match=message) as caught:
            await ctx.publish(name, value)  # type: ignore[arg-type]
        assert "\n" not in str(caught.value) and len(str(caught.value)) < 300
        assert ctx._calls.next == 0  # no call number taken: a resumed step numbers its calls alike
        assert await _published_calls(journal) == []
        assert [e.kind for e in await _output(ctx)] == ["status"]  # the claim's RUNNING, nothing more


async def test_a_publish_is_journaled_written_masked_and_kept_once_per_call(tmp_path: Path) -> None:
    secret = "sk-live-0123456789abcdef"
    async with step_contexts(tmp_path) as make:
        ctx, journal = await make(ScriptedLLM([]))
        ctx._env.host.redactor = Redactor([secret])  # type: ignore[misc]
        await ctx.publish("phase", {"key": secret, "note": f"uses {secret}", secret: 1})
        await ctx.publish("phase", None)
        events = await _output(ctx)
        phase = ("published", "phase")
        assert [(e.kind, e.name) for e in events] == [("status", "RUNNING"), phase, phase]
        assert secret not in repr(events) and events[1].value == {"key": "***", "note": "uses ***", "***": 1}
        assert events[2].value is None
        started = [e for e in await _published_calls(journal) if e["type"] == "TOOL_STARTED"]
        assert [e["invocation_id"] for e in started] == ["job-s/0/0", "job-s/0/1"]
        assert secret not in journal.path.read_text()
        # The same call of the next attempt (resumed without this pod's journal): the same row, no second.
        ctx2, _ = await make(ScriptedLLM([]))
        await ctx2.publish("phase", {"other": "value"})
        assert [(e.kind, e.name) for e in await _output(ctx2)] == [(e.kind, e.name) for e in events]


async def test_past_the_events_a_job_may_keep_publish_is_refused_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("agentlife.constants.MAX_OUTPUT_EVENTS_PER_JOB", 3)
    async with step_contexts(tmp_path) as make:
        ctx, _ = await make(ScriptedLLM([]))
        await ctx.publish("a", 1)
        await ctx.publish("b", 2)
        with pytest.raises(ConfigError, match=r"already holds 3 output events \(at most 3\)"):
            await ctx.publish("c", 3)
        assert [e.name for e in await _output(ctx)] == ["RUNNING", "a", "b"]


async def test_a_resumed_step_publishing_another_value_under_the_same_call_keeps_the_first(
    tmp_path: Path,
) -> None:
    from agentlife import AgentProcess, Done, tool
    from agentlife.testing import AgentHarness, DrainAt

    @tool(side_effects=False)
    async def slow() -> str:
        """A call the first attempt is cut in, at its drain deadline."""
        await anyio.sleep(0 if (tmp_path / "data" / "second").exists() else 60)
        return "ok"

    class Publisher(AgentProcess):
        agent_id = "publisher"

        async def step(self, ctx: StepContext) -> Done:
            await ctx.publish("progress", {"attempt": ctx.job.attempt})  # differs on every attempt
            await ctx.call_tool(slow)
            return Done(result="done")

    harness = AgentHarness(tmp_path / "data")
    first = await harness.run(Publisher(), drain=DrainAt.during_tool("slow"))
    assert first.exit_code == 143
    (tmp_path / "data" / "second").touch()
    second = await harness.run(Publisher())  # the same pod: its journal has the first attempt's publish
    assert second.exit_code == 0, second.log_messages()
    store: Any = SQLiteStore(tmp_path / "data" / "agentlife.db")
    await store.open()
    try:
        async with follow_job(store, second.job.id if second.job else "", live=False) as events:
            published = [e.value async for e in events if e.kind == "published"]
    finally:
        await store.close()
    assert published == [{"attempt": 1}]  # the first stays; the job finished
