"""The issue-triage example, tested the way a user tests their agent: with the ``agent_harness`` fixture."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from issue_triage_agent import IssueTriage

from agentlife.testing import AgentHarness, DrainAt

pytestmark = pytest.mark.anyio

EXPECTED = {"number": 7, "label": "bug", "priority": "high", "summary": "Empty config file crashes start-up."}


@pytest.fixture(autouse=True)
def outbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TRIAGE_OUTBOX", str(tmp_path / "outbox"))
    for name in ("ANTHROPIC_API_KEY", "AGENTLIFE_LLM_PROVIDER"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "outbox"


def labels(outbox: Path) -> list[dict[str, object]]:
    path = outbox / "labels.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_triage_ends_with_the_structured_report(agent_harness: AgentHarness, outbox: Path) -> None:
    run = await agent_harness.run(IssueTriage(), payload={"prompt": "Triage issue #7."})
    assert run.exit_code == 0
    assert run.job is not None and run.job.status == "COMPLETED"
    assert run.job.result == EXPECTED
    assert [(entry["number"], entry["label"]) for entry in labels(outbox)] == [(7, "bug")]


async def test_a_drain_during_the_label_call_labels_once(
    agent_harness: AgentHarness, outbox: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRIAGE_TOOL_DELAY", "0.02")
    run = await agent_harness.run(
        IssueTriage(), payload={"prompt": "Triage issue #7."}, drain=DrainAt.during_tool("label_issue")
    )
    assert run.exit_code == 143
    assert len(labels(outbox)) == 1
    run = await agent_harness.run(IssueTriage(), payload={"prompt": "Triage issue #7."})
    assert run.exit_code == 0
    assert run.job is not None and run.job.result == EXPECTED
    assert len(labels(outbox)) == 1


async def test_a_crash_after_the_label_is_verified_not_repeated(
    agent_harness: AgentHarness, outbox: Path
) -> None:
    class CrashAfterLabel(IssueTriage):
        async def step(self, ctx):  # type: ignore[no-untyped-def]
            outcome = await super().step(ctx)
            if ctx.step == 2 and not getattr(type(self), "crashed", False):
                type(self).crashed = True  # type: ignore[attr-defined]
                raise RuntimeError("crash after the label, before the checkpoint")
            return outcome

    run = await agent_harness.run(CrashAfterLabel(), payload={"prompt": "Triage issue #7."})
    assert run.exit_code != 0
    run = await agent_harness.run(CrashAfterLabel(), payload={"prompt": "Triage issue #7."})
    assert run.exit_code == 0
    assert run.job is not None and run.job.result == EXPECTED
    assert len(labels(outbox)) == 1  # replayed from the journal, not applied again
