"""Progress-aware calls *through the runtime*: ``ctx.llm``, ``ctx.call_tool``, the drain and the job row.

The pieces (the stream guard, `AnthropicLLM`, `ScriptedTurn`, `retry_call`, `FakeAnthropicServer`) have
their own unit tests; here they run together. LLM calls go through the real ``anthropic`` SDK to a
`FakeAnthropicServer` on 127.0.0.1. Most tests use the in-process `AgentHarness` (time scaled by 0.01: the
45 s step deadline lasts 0.45 s); the ones whose point is the real process (exit codes, signals, a blocked
event loop, ``ANTHROPIC_BASE_URL`` read from the environment) run ``python -m agentlife run``.
"""

from __future__ import annotations

import itertools
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from agentlife import (
    AgentProcess,
    Done,
    LLMClient,
    LLMReply,
    PolicyUnavailable,
    StepContext,
    Usage,
    tool,
)
from agentlife._llm._anthropic import AnthropicLLM
from agentlife._llm._scripted import ScriptedTurn
from agentlife._runtime._lifecycle import Runtime
from agentlife.testing import AgentHarness
from agentlife.testing._anthropic_server import FakeAnthropicServer

pytestmark = pytest.mark.anyio

KEY = "sk-ant-api03-calls-e2e-secret-0123456789"
# A name the SDK never lists as deprecated; the default price table prices it as a sonnet ($3 / $15 per MTok).
MODEL = "claude-sonnet-agentlife-test"
# Step budget of 2 s (scaled) for LLM tests: the first call builds the SDK client on a thread, and retries
# must not lose to that one-off cost on a busy machine. Grace grows so the drain invariant still holds.
WIDE_STEP = {
    "AGENTLIFE_DRAIN_STEP_DEADLINE_SECONDS": "200",
    "AGENTLIFE_DRAIN_TERMINATION_GRACE_SECONDS": "230",
}


@pytest.fixture(scope="module")
def _anthropic_imported() -> None:
    """Import the SDK once, outside any measured step (it takes ~2 s of CPU the first time)."""
    import anthropic  # noqa: F401


@pytest.fixture
async def server(_anthropic_imported: None) -> AsyncIterator[FakeAnthropicServer]:
    async with FakeAnthropicServer(api_key=KEY) as fake:
        yield fake


def _harness(tmp_path: Path, **env: str) -> AgentHarness:
    return AgentHarness(tmp_path / "agentlife", env=env)


def _events(run_journal: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in run_journal if e["type"] == kind]


def _job_row(db: Path, job_id: str) -> dict[str, Any]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        row = conn.execute("SELECT * FROM job WHERE id = ?", (job_id,)).fetchone()
    finally:
        conn.close()
    assert row is not None
    json_columns = ("payload", "tokens_consumed", "token_budget", "error", "result")
    record = dict(zip(row.keys(), tuple(row), strict=True))
    return {k: (orjson.loads(v) if k in json_columns and v else v) for k, v in record.items()}


def _set_row_status(db: Path, job_id: str, status: str) -> None:
    """A status written by hand (a control plane's SQL): FAILED refuses a parked call, RUNNING grants none."""
    conn = sqlite3.connect(db, timeout=10)
    try:
        conn.execute("UPDATE job SET status = ? WHERE id = ?", (status, job_id))
        conn.commit()
    finally:
        conn.close()


def _row_status(db: Path, job_id: str) -> str | None:
    if not db.exists():
        return None
    conn = sqlite3.connect(db, timeout=10)
    try:
        row = conn.execute("SELECT status FROM job WHERE id = ?", (job_id,)).fetchone()
    except sqlite3.OperationalError:  # the schema is not created yet
        return None
    finally:
        conn.close()
    return None if row is None else str(row[0])


async def _approve(db: Path, job_id: str) -> None:
    """What ``job approve`` does: grant the call the row is parked on."""
    from agentlife.stores import SQLiteStore

    store = SQLiteStore(db)
    await store.open()
    try:
        await store.approve(job_id)
    finally:
        await store.close()


async def _when_row_status(db: Path, job_id: str, status: str, timeout: float = 10.0) -> None:
    with anyio.fail_after(timeout):
        while await anyio.to_thread.run_sync(_row_status, db, job_id) != status:
            await anyio.sleep(0.01)


class LLMAgent(AgentProcess):
    """Each step makes ``calls`` LLM calls through ``ctx.llm`` with the real `AnthropicLLM`."""

    agent_id = "llm-e2e"

    def __init__(
        self, base_url: str, *, calls: int = 1, steps: int = 1, prompt: str = "Review the diff."
    ) -> None:
        self.base_url = base_url
        self.calls = calls
        self.steps = steps
        self.prompt = prompt
        self.replies: list[LLMReply] = []

    def make_llm(self) -> LLMClient:
        return AnthropicLLM(api_key=KEY, base_url=self.base_url)

    async def step(self, ctx: StepContext) -> Done | None:
        for _ in range(self.calls):
            reply = await ctx.llm.complete(
                model=MODEL, max_tokens=64, messages=[{"role": "user", "content": self.prompt}]
            )
            self.replies.append(reply)
            ctx.state.setdefault("texts", []).append(reply.text)
        if ctx.step + 1 >= self.steps:
            return Done(result={"texts": ctx.state["texts"]})
        return None


# --- 1. token budget -------------------------------------------------------------------------------------


async def test_input_token_budget_refuses_a_call_whose_estimate_would_exceed_it(
    tmp_path: Path, server: FakeAnthropicServer
) -> None:
    # 1000 input tokens used of 1500; the next request alone is estimated at ~600 tokens (4 bytes each).
    server.enqueue(ScriptedTurn.text("first", usage=Usage(input_tokens=1000, output_tokens=10)), "second")
    agent = LLMAgent(server.base_url, calls=2, prompt="x" * 2400)
    run = await _harness(tmp_path, AGENTLIFE_BUDGET_MAX_INPUT_TOKENS="1500", **WIDE_STEP).run(agent)
    assert run.exit_code == 0
    assert len(server.requests) == 1 and server.pending == 1
    assert run.job is not None and run.job.status == "FAILED"
    assert run.job.token_budget == {"max_input_tokens": 1500, "max_cost_usd": 5.0}
    assert run.job.tokens_consumed["input"] == 1000 and run.job.tokens_consumed["output"] == 10
    # The reason names the limit that stopped it: input tokens, not dollars.
    reason = run.job.result["reason"]
    assert reason.startswith("token budget exhausted (1000 input tokens used + about ")
    assert reason.endswith(" in the next request > 1500 input tokens max)")
    assert [r.text for r in agent.replies] == ["first"]
    assert len(_events(run.journal, "LLM_COMPLETED")) == 1


# --- 2. stalls, pings and retries ------------------------------------------------------------------------


async def test_a_stalled_stream_is_aborted_and_retried_but_a_pinging_think_is_not(
    tmp_path: Path, server: FakeAnthropicServer
) -> None:
    # Inter-chunk timeout 10 s scaled to 0.1 s; step budget 2 s. Call 0 stalls after two chunks and is
    # retried; call 1 thinks for 0.4 s of silence filled with pings every 20 ms and must not be aborted.
    server.enqueue(
        ScriptedTurn.stall(after_chunks=2),
        ScriptedTurn.text("recovered", usage=Usage(input_tokens=20, output_tokens=5)),
        ScriptedTurn.thinking("Let me think.", "thought it through", pause=0.4, ping_every=0.02),
    )
    agent = LLMAgent(server.base_url, calls=2)
    h = _harness(tmp_path, AGENTLIFE_LLM_INTER_CHUNK_TIMEOUT_SECONDS="10", **WIDE_STEP)
    run = await h.run(agent)
    assert run.exit_code == 0
    assert run.job is not None and run.job.result == {"texts": ["recovered", "thought it through"]}
    assert len(server.requests) == 3
    await server.wait_for_disconnects(1)
    assert server.disconnected_requests == (0,)  # the stalled response only: the client hung up on it

    [retry] = _events(run.journal, "RETRY")
    assert (retry["kind"], retry["step"], retry["call"], retry["name"]) == ("llm", 0, 0, MODEL)
    assert retry["error_class"] == "LLMTimeout" and retry["classified_as"] == "timeout"
    assert retry["error"] == "LLM stream chunk timeout after 0.1 s"
    assert 0 < retry["remaining_budget"] <= 3.0  # left of the step budget (300 s LLM total x 0.01)
    assert retry["attempt"] == 1
    [started] = _events(run.journal, "STEP_STARTED")
    assert retry["ts"] - started["ts"] >= 0.1  # the guard never fires before the inter-chunk timeout

    completed = _events(run.journal, "LLM_COMPLETED")
    assert [e["call"] for e in completed] == [0, 1]
    assert completed[1]["response"]["content"][0]["type"] == "thinking"
    assert completed[1]["duration"] >= 0.4  # the whole pause was waited out
    assert run.job.tokens_consumed["input"] >= 20


# --- 3. drain during a stalled stream --------------------------------------------------------------------


async def test_drain_deadline_cancels_a_stalled_stream_and_closes_the_connection(
    tmp_path: Path, server: FakeAnthropicServer
) -> None:
    # The guard's own clocks are far away (inter-chunk 600 s -> 6 s): only the drain deadline (0.45 s)
    # can end this call.
    server.enqueue(ScriptedTurn.stall(after_chunks=2))
    agent = LLMAgent(server.base_url)
    h = _harness(
        tmp_path,
        AGENTLIFE_LLM_INTER_CHUNK_TIMEOUT_SECONDS="600",
        AGENTLIFE_LLM_TOTAL_TIMEOUT_SECONDS="6000",
    )
    runtimes: list[Runtime] = []
    drained_at: list[float] = []

    def keep(runtime: Runtime, event: str, info: dict[str, Any]) -> None:
        if not runtimes:
            runtimes.append(runtime)

    async def sigterm_during_the_stream() -> None:
        await server.wait_for_requests(1, timeout=10)
        await anyio.sleep(0.05)  # the first chunks are on their way; then silence
        drained_at.append(time.monotonic())
        runtimes[0].request_drain("SIGTERM")

    async with anyio.create_task_group() as tg:
        tg.start_soon(sigterm_during_the_stream)
        run = await h.run(agent, on_event=keep)
    ended = time.monotonic()

    assert run.exit_code == 143
    await server.wait_for_disconnects(1, timeout=2)  # the HTTP connection was closed by the client
    assert server.disconnected_requests == (0,) and len(server.requests) == 1
    assert ended - drained_at[0] >= 0.4  # the step had its (scaled 0.45 s) deadline, not less
    assert agent.replies == []
    assert run.job is not None and run.job.status == "RUNNING"  # resumable
    assert run.checkpoint is None or run.checkpoint.next_step == 0  # nothing checkpointed for the step
    types = run.journal_types()
    assert "DRAIN_STARTED" in types and "LLM_COMPLETED" not in types and "RETRY" not in types
    assert _events(run.journal, "CHECKPOINT_WRITTEN")[-1].get("resumed") is True  # only the resume marker
    assert run.journal[-1]["type"] == "SESSION_ENDED" and run.journal[-1]["exit_code"] == 143


# --- 4. HTTP errors through ctx.llm ----------------------------------------------------------------------


async def test_429_with_retry_after_and_529_are_retried_and_succeed(
    tmp_path: Path, server: FakeAnthropicServer
) -> None:
    server.enqueue(
        ScriptedTurn.http_error(429, retry_after=0.05),
        ScriptedTurn.http_error(529),
        ScriptedTurn.text("third time lucky", usage=Usage(input_tokens=30, output_tokens=4)),
    )
    agent = LLMAgent(server.base_url)
    run = await _harness(tmp_path, **WIDE_STEP).run(agent)
    assert run.exit_code == 0
    assert run.job is not None and run.job.status == "COMPLETED"
    assert run.job.result == {"texts": ["third time lucky"]}
    assert len(server.requests) == 3
    retries = _events(run.journal, "RETRY")
    assert [r["attempt"] for r in retries] == [1, 2]
    assert {r["classified_as"] for r in retries} == {"transient"}
    assert "429" in retries[0]["error"] and "529" in retries[1]["error"]
    assert retries[0]["delay"] >= 0.05  # the server's retry-after is a lower bound on the backoff
    assert all(0 < r["remaining_budget"] <= 3.0 for r in retries)
    assert run.job.tokens_consumed == {"input": 30, "output": 4, "cost_usd": pytest.approx(90e-6 + 60e-6)}
    assert KEY not in orjson.dumps(run.journal).decode()


async def test_400_is_not_retried_and_crashes_the_step(tmp_path: Path, server: FakeAnthropicServer) -> None:
    server.enqueue(ScriptedTurn.http_error(400, message="messages: field required"), "never sent")
    run = await _harness(tmp_path, **WIDE_STEP).run(LLMAgent(server.base_url))
    assert run.exit_code == 1
    assert len(server.requests) == 1 and server.pending == 1
    assert "RETRY" not in run.journal_types()
    assert run.job is not None and run.job.status == "RUNNING"  # a crash: the control plane retries it
    [crash] = run.job.error
    assert crash["error_class"] == "PermanentError" and crash["exit_code"] == 1 and crash["step"] == 0
    assert "Anthropic API error 400" in crash["message"] and "field required" in crash["message"]
    assert KEY not in str(crash)


async def test_a_200_html_page_fails_the_step_at_once_naming_text_html(
    tmp_path: Path, server: FakeAnthropicServer
) -> None:
    """A proxy's login page is not a dropped stream: one request, no retries, a line that says what came."""
    server.enqueue(ScriptedTurn.raw("<html><title>Sign in</title></html>"), "never sent")
    run = await _harness(tmp_path, **WIDE_STEP).run(LLMAgent(server.base_url))
    assert run.exit_code == 1
    assert len(server.requests) == 1 and "RETRY" not in run.journal_types()
    assert run.job is not None
    [crash] = run.job.error
    assert crash["error_class"] == "PermanentError"
    assert "answered 200 with text/html; charset=utf-8, not a stream of SSE" in crash["message"]
    assert any("text/html" in line.get("msg", "") for line in run.logs if line.get("level") == "ERROR")


# --- 7. approvals and policy -----------------------------------------------------------------------------

EFFECTS: list[str] = []
PLANS: list[str] = []


@tool(side_effects=True)
async def plan(invocation_id: str) -> str:
    PLANS.append(invocation_id)
    return "planned"


@tool(side_effects=True, restricted=True)
async def deploy(target: str, invocation_id: str) -> str:
    EFFECTS.append(invocation_id)
    return f"deployed {target}"


class Deployer(AgentProcess):
    """Calls the restricted ``deploy`` tool in step 0; ``policy`` says how ``check_policy`` behaves.

    With ``plan_first`` the step first calls the side-effecting (unrestricted) ``plan`` tool.
    """

    agent_id = "deployer"

    def __init__(self, policy: str = "allow", *, plan_first: bool = False) -> None:
        self.policy = policy
        self.plan_first = plan_first
        self.policy_calls = 0

    async def check_policy(self, tool_name: str, args: Any) -> bool:
        self.policy_calls += 1
        if self.policy == "hang":
            await anyio.sleep(60)
        if self.policy == "error":
            raise ConnectionError("policy service unreachable")
        return True

    async def step(self, ctx: StepContext) -> Done | None:
        if self.plan_first:
            await ctx.call_tool(plan)
        try:
            result = await ctx.call_tool(deploy, target="prod")
        except PolicyUnavailable as exc:
            return Done(result={"refused": str(exc)}, status="FAILED", reason=str(exc))
        return Done(result={"deployed": result})


@pytest.fixture(autouse=True)
def _clear_effects() -> None:
    EFFECTS.clear()
    PLANS.clear()


# Idle timeout 30 s -> 0.3 s, approval poll 5 s -> 0.05 s.
PARKING = {"AGENTLIFE_IDLE_TIMEOUT_SECONDS": "30", "AGENTLIFE_APPROVAL_POLL_SECONDS": "5"}


def _recording_polls(polls: list[tuple[float, str | None]]) -> Callable[[Runtime, str, dict[str, Any]], None]:
    """Wrap the runtime's store so each approval poll (a read of the row's approval) is recorded."""

    def on_event(runtime: Runtime, event: str, info: dict[str, Any]) -> None:
        if event != "ready" or runtime.store is None:
            return
        store: Any = runtime.store
        read = store.get_approval

        async def get_approval(job_id: str) -> Any:
            state = await read(job_id)
            polls.append((anyio.current_time(), state.status if state is not None else None))
            return state

        store.get_approval = get_approval

    return on_event


async def test_restricted_tool_parks_until_the_control_plane_approves(tmp_path: Path) -> None:
    h = _harness(tmp_path, **PARKING)
    db = h.data_dir / "agentlife.db"
    polls: list[tuple[float, str | None]] = []
    parked = await h.run(Deployer(plan_first=True), on_event=_recording_polls(polls))
    assert parked.exit_code == 0
    assert parked.job is not None and parked.job.status == "WAITING_FOR_APPROVAL"
    assert parked.checkpoint is not None and parked.checkpoint.phase == "awaiting_approval"
    assert parked.checkpoint.next_step == 0 and EFFECTS == [] and PLANS == ["job-1/0/0"]
    assert "APPROVAL_REQUESTED" in parked.journal_types()
    assert parked.journal[-1]["type"] == "SESSION_ENDED" and parked.journal[-1]["exit_code"] == 0
    # Polled every 0.05 s (never faster) until the 0.3 s idle timeout, always seeing the parked status.
    assert {status for _, status in polls} == {"WAITING_FOR_APPROVAL"}
    assert 2 <= len(polls) <= 8
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(polls)]
    assert min(gaps[:-1]) >= 0.045  # the last wait is only what was left of the idle timeout

    # Another attempt before anyone approved parks again without running the tool; the completed call
    # before it in the same step is replayed from the journal, not run again.
    again = await h.run(Deployer(plan_first=True))
    assert again.exit_code == 0 and EFFECTS == [] and PLANS == ["job-1/0/0"]
    assert again.job is not None and again.job.status == "WAITING_FOR_APPROVAL"

    # A status set by hand approves nothing: the call is not granted, so the next attempt parks again.
    await anyio.to_thread.run_sync(_set_row_status, db, "job-1", "RUNNING")
    unapproved = await h.run(Deployer(plan_first=True))
    assert unapproved.job is not None and unapproved.job.status == "WAITING_FOR_APPROVAL" and EFFECTS == []

    await _approve(db, "job-1")  # the control plane approves the call the row is parked on
    resumed = await h.run(Deployer(plan_first=True))
    assert resumed.exit_code == 0
    assert resumed.job is not None and resumed.job.status == "COMPLETED"
    assert resumed.job.result == {"deployed": "deployed prod"}
    assert EFFECTS == ["job-1/0/1"] and PLANS == ["job-1/0/0"]
    assert "APPROVAL_REQUESTED" not in resumed.journal_types()
    assert [e["invocation_id"] for e in _events(resumed.journal, "APPROVAL_GRANTED")] == ["job-1/0/1"]


async def test_an_approval_that_lands_while_the_process_parks_is_not_left_running(tmp_path: Path) -> None:
    # The operator approves in the last moment of the idle timeout: the process is still the row's live
    # owner, so the approval makes the row RUNNING for it, but it is on its way out. It hands the row back
    # as PENDING rather than leave a RUNNING row nobody runs (the reaper would count a crash).
    h = _harness(tmp_path, **PARKING)
    db = h.data_dir / "agentlife.db"

    def approve_while_parking(runtime: Runtime, event: str, info: dict[str, Any]) -> None:
        if event != "ready" or runtime.store is None:
            return
        store: Any = runtime.store
        drop_claim = store.drop_claim

        async def approve_then_drop(job_id: str) -> None:
            approved = await store.approve(job_id)
            assert approved.status == "RUNNING"  # it saw this process alive
            await drop_claim(job_id)

        store.drop_claim = approve_then_drop

    parked = await h.run(Deployer(), on_event=approve_while_parking)
    assert parked.exit_code == 0 and EFFECTS == []
    assert parked.job is not None and parked.job.status == "PENDING"
    assert _job_row(db, "job-1")["owner"] is None
    resumed = await h.run(Deployer())
    assert resumed.job is not None and resumed.job.status == "COMPLETED"
    assert EFFECTS == ["job-1/0/0"] and "APPROVAL_REQUESTED" not in resumed.journal_types()


async def test_approval_granted_while_polling_lets_the_call_proceed(tmp_path: Path) -> None:
    h = _harness(tmp_path, AGENTLIFE_APPROVAL_POLL_SECONDS="5")  # idle timeout stays 1800 s -> 18 s
    db = h.data_dir / "agentlife.db"

    async def approve() -> None:
        await _when_row_status(db, "job-1", "WAITING_FOR_APPROVAL")
        await _approve(db, "job-1")

    async with anyio.create_task_group() as tg:
        tg.start_soon(approve)
        run = await h.run(Deployer())
    assert run.exit_code == 0
    assert run.duration < 10  # well inside the idle timeout: it did not park
    assert run.job is not None and run.job.status == "COMPLETED"
    assert EFFECTS == ["job-1/0/0"]
    types = run.journal_types()
    assert types.index("APPROVAL_REQUESTED") < types.index("TOOL_STARTED") < types.index("TOOL_COMPLETED")


async def test_a_job_failed_while_parked_refuses_the_call(tmp_path: Path) -> None:
    h = _harness(tmp_path, AGENTLIFE_APPROVAL_POLL_SECONDS="5")
    db = h.data_dir / "agentlife.db"

    async def refuse() -> None:
        await _when_row_status(db, "job-1", "WAITING_FOR_APPROVAL")
        await anyio.to_thread.run_sync(_set_row_status, db, "job-1", "FAILED")

    async with anyio.create_task_group() as tg:
        tg.start_soon(refuse)
        run = await h.run(Deployer())
    assert run.exit_code == 0  # the job reached the status the control plane set: not a crash
    assert EFFECTS == [] and "TOOL_STARTED" not in run.journal_types()
    assert run.job is not None
    assert run.job.status == "FAILED" and run.job.error == []  # the terminal row is left as it was set
    [refused] = _events(run.journal, "APPROVAL_REJECTED")
    assert refused["invocation_id"] == "job-1/0/0"


@pytest.mark.parametrize("policy", ["hang", "error"])
async def test_policy_check_that_times_out_or_fails_refuses_the_call(tmp_path: Path, policy: str) -> None:
    # Policy timeout 2 s -> 0.02 s, retried every 5 s -> 0.05 s while the 0.45 s step budget allows.
    agent = Deployer(policy=policy)
    run = await _harness(tmp_path).run(agent, payload={"approved": True})
    assert run.exit_code == 0
    assert EFFECTS == [] and "TOOL_STARTED" not in run.journal_types()  # never run, fail closed
    assert run.job is not None and run.job.status == "FAILED"
    reason = "timed out" if policy == "hang" else "failed: ConnectionError"
    assert run.job.result["refused"] == f"policy check for deploy {reason}; refused (fail closed)"
    refusals = [e for e in _events(run.journal, "TOOL_FAILED") if e["error_class"] == "PolicyUnavailable"]
    assert len(refusals) == agent.policy_calls >= 2  # every try journaled; retried within the step budget
    assert all(e["tool"] == "deploy" and e["invocation_id"] == "job-1/0/0" for e in refusals)
    assert "APPROVAL_REQUESTED" not in run.journal_types()  # approved by the payload


# --- 8. run budget ---------------------------------------------------------------------------------------


class Looper(AgentProcess):
    agent_id = "looper"

    async def step(self, ctx: StepContext) -> Done | None:
        ctx.state["steps"] = ctx.state.get("steps", 0) + 1
        await anyio.sleep(0.02)
        return None


async def test_run_budget_fails_the_job_with_a_run_time_reason(tmp_path: Path) -> None:
    run = await _harness(tmp_path, AGENTLIFE_RUN_MAX_SECONDS="30").run(Looper())  # 30 s -> 0.3 s
    assert run.exit_code == 0
    assert run.job is not None and run.job.status == "FAILED"
    assert run.job.result == {"reason": "run time budget exhausted (0.3 s max)"}
    assert run.job.error[-1]["error_class"] == "BudgetExhausted"
    assert run.checkpoint is not None and 1 <= run.checkpoint.state["steps"] <= 15
    assert run.duration < 5
