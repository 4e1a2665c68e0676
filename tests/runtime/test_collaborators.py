"""The engine's collaborators built on their own, without a Runtime: Hydrator, Approvals and StepContext.

Real parts throughout: a SQLite store in a temporary directory, a real session journal, a scripted LLM.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from agentlife import AgentProcess, Done, Footprint, Job, ScriptedLLM, StepContext, tool
from agentlife._budget import Budget
from agentlife._checkpoint import CheckpointDoc
from agentlife._config import Settings
from agentlife._exceptions import ApprovalRejected, ParkRequested
from agentlife._journal._steprecords import StepJournal
from agentlife._journal._writer import Journal
from agentlife._llm._protocol import LLMReply
from agentlife._observe._telemetry_facade import TelemetryFacade
from agentlife._redact import Redactor
from agentlife._runtime._hydration import Hydrator
from agentlife._step._approvals import Approvals
from agentlife._step._context import CallEnv
from agentlife._step._host import Booted, RuntimeStats
from agentlife.constants import Constants
from agentlife.stores import JobStatus, SQLiteStore

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def booted(tmp_path: Path) -> AsyncIterator[Booted]:
    constants = Constants().scaled(0.01)
    settings = Settings.from_env(
        {"AGENTLIFE_DATA_DIR": str(tmp_path)}, job_id="job-c", agent_id="unit", constants=constants
    )
    store = SQLiteStore(tmp_path / "agentlife.db")
    await store.open()
    journal = Journal.create(settings.session_dir, settings.attempt)
    try:
        yield Booted(settings, store, journal)
    finally:
        await journal.aclose()
        await store.close()


def _events(journal: Journal) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in journal.path.read_bytes().splitlines()]


class _Agent(AgentProcess):
    agent_id = "unit"

    async def step(self, ctx: StepContext) -> Done | None:
        return Done()

    def memory_query(self, job: Job, checkpoint: Any) -> str | None:
        return None


async def test_a_hydrator_claims_loads_and_scans_on_its_own(booted: Booted) -> None:
    hydrator = Hydrator(booted, redactor=Redactor(), telemetry=TelemetryFacade())
    row = await hydrator.claim_job(payload={"pr": 7})
    assert row.status == JobStatus.RUNNING and row.payload == {"pr": 7} and row.attempt == 1
    doc, checkpoint_id = await hydrator.load_checkpoint()
    assert doc == CheckpointDoc() and checkpoint_id is None  # a fresh job
    assert await hydrator.scan_journal(None, doc) is None
    await booted.journal.flush()
    marker = _events(booted.journal)[-1]
    assert marker["type"] == "CHECKPOINT_WRITTEN" and marker["resumed"] is True

    async def no_memory() -> Any:
        raise AssertionError("a job with no memory query opens no memory store")

    job = Job(row.id, row.agent_id, 1, row.payload)
    assert await hydrator.fetch_memories(doc, job=job, agent=_Agent(), open_memory=no_memory) == []


@dataclass
class _Drain:
    draining: bool = False
    drain_event: anyio.Event | None = field(default_factory=anyio.Event)


async def _parked(booted: Booted) -> tuple[Approvals, _Drain]:
    s = booted.settings
    await booted.store.create_job(s.job_id, s.agent_id, {}, {})
    await booted.store.claim(s.job_id, s.attempt)
    drain = _Drain()
    return Approvals(booted, Job(s.job_id, s.agent_id, s.attempt, {}), drain, lambda: 3), drain


async def test_approvals_park_the_job_and_return_once_the_control_plane_approves(booted: Booted) -> None:
    approvals, drain = await _parked(booted)
    s = booted.settings

    async def approve_when_parked() -> None:
        while (row := await booted.store.get_job(s.job_id)) is None or row.status != "WAITING_FOR_APPROVAL":
            await anyio.sleep(0.005)
        await booted.store.approve(s.job_id, invocation_id="job-c/3/0", digest="d-1")

    async with anyio.create_task_group() as tg:
        tg.start_soon(approve_when_parked)
        with anyio.fail_after(5):
            await approvals.require_approval("deploy", "job-c/3/0", "d-1")
    assert (await booted.store.get_job(s.job_id)).status == "RUNNING"  # type: ignore[union-attr]
    await approvals.require_approval("deploy", "job-c/3/0", "d-1")  # granted: no second park
    await booted.journal.flush()
    requested = [e for e in _events(booted.journal) if e["type"] == "APPROVAL_REQUESTED"]
    assert requested == [requested[0]] and requested[0]["tool"] == "deploy" and requested[0]["step"] == 3
    assert (requested[0]["invocation_id"], requested[0]["digest"]) == ("job-c/3/0", "d-1")
    # The same call with other arguments is not covered by that approval: it parks (and stops at once, as
    # a drain has begun), naming its own digest on the row.
    drain.draining = True
    with anyio.fail_after(5), pytest.raises(ParkRequested):
        await approvals.require_approval("deploy", "job-c/3/0", "d-2")
    state = await booted.store.get_approval(s.job_id)
    assert state is not None and state.request is not None and state.request["digest"] == "d-2"


async def test_approvals_refuse_when_the_control_plane_fails_the_parked_job(booted: Booted) -> None:
    approvals, _ = await _parked(booted)
    s = booted.settings

    async def refuse_when_parked() -> None:
        while (row := await booted.store.get_job(s.job_id)) is None or row.status != "WAITING_FOR_APPROVAL":
            await anyio.sleep(0.005)
        await booted.store.reject(s.job_id, "too risky")

    async with anyio.create_task_group() as tg:
        tg.start_soon(refuse_when_parked)
        with anyio.fail_after(5), pytest.raises(ApprovalRejected, match="refused, rejected: too risky"):
            await approvals.require_approval("deploy", "job-c/3/0", "d-1")
    assert approvals.rejection is not None
    with pytest.raises(ApprovalRejected):  # final: any later call of the job is refused at once
        await approvals.require_approval("other", "job-c/3/1", "d-9")
    with pytest.raises(ApprovalRejected):
        approvals.check()


async def test_approvals_stop_waiting_when_a_drain_begins(booted: Booted) -> None:
    approvals, drain = await _parked(booted)
    drain.draining = True
    with anyio.fail_after(5), pytest.raises(ParkRequested):
        await approvals.require_approval("deploy", "job-c/3/0", "d-1")
    state = await booted.store.get_approval(booted.settings.job_id)
    assert state is not None and state.status == "WAITING_FOR_APPROVAL"
    assert state.request is not None and state.request["invocation_id"] == "job-c/3/0"  # durable at once


@dataclass
class _Host:
    """A StepHost stand-in: what a step's calls need, and nothing of a Runtime."""

    agent: AgentProcess = field(default_factory=_Agent)
    constants: Constants = field(default_factory=lambda: Constants().scaled(0.01))
    draining: bool = False
    drain_event: anyio.Event | None = None
    drain_deadline: float | None = None
    redactor: Redactor = field(default_factory=Redactor)
    stats: RuntimeStats = field(default_factory=RuntimeStats)
    telemetry: TelemetryFacade = field(default_factory=TelemetryFacade)
    events: list[str] = field(default_factory=list)

    def notify(self, event: str, **info: Any) -> None:
        self.events.append(event)


@tool(side_effects=True)
async def _record(text: str, invocation_id: str) -> str:
    return f"{invocation_id}: {text}"


async def test_a_step_context_runs_journaled_calls_against_a_small_host(booted: Booted) -> None:
    host = _Host()
    s = booted.settings
    job = Job(s.job_id, s.agent_id, s.attempt, {})
    approvals = Approvals(booted, job, host, lambda: 0)
    budget = Budget.build(host.constants.budget, None, None)
    usage: list[LLMReply] = []

    async def add_usage(reply: LLMReply) -> None:
        usage.append(reply)

    await booted.store.create_job(s.job_id, s.agent_id, {})
    await booted.store.claim(s.job_id, s.attempt)  # a side effect's record goes to the store first
    env = CallEnv(
        host,
        approvals,
        add_usage,
        StepJournal(booted.journal, booted.store, "job-c", 1),
        None,
        budget,
        ScriptedLLM(["hello"]),
        random.Random(1),
    )
    ctx = StepContext(step=0, state={}, job=job, memories=[], footprint=Footprint(), env=env)
    assert await ctx.call_tool(_record, text="x") == "job-c/0/0: x"
    reply = await ctx.llm.complete(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    assert reply.text == "hello"
    assert host.stats.tool_calls == 1 and host.stats.llm_calls == 1
    assert host.events == ["tool_started"] and len(usage) == 1
    await booted.journal.flush()
    types = [e["type"] for e in _events(booted.journal)]
    assert types[-4:] == ["TOOL_STARTED", "TOOL_COMPLETED", "LLM_STARTED", "LLM_COMPLETED"]
