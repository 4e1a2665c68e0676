"""Faults the chaos runs found, each kept in process: a retried side effect asks ``verify``, a
transient failure during the drain exits 143, a PostgreSQL blip while usage is recorded, the
signal handlers restored after the runtime, SIGTERM during an uncancellable memory call.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import pytest

from _pg import PostgresServer
from agentlife import (
    NOT_DONE,
    AgentProcess,
    Done,
    LLMClient,
    LLMReply,
    State,
    StepContext,
    TransientError,
    Usage,
    tool,
)
from agentlife._runtime._lifecycle import RunOptions, Runtime, ShellOptions
from agentlife.constants import Constants
from agentlife.stores import PostgresStore
from agentlife.testing import AgentHarness, DrainAt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "benchmarks"))


# -- the bug the first full chaos run found: a timed-out side effect was done again by the retry ---------

EFFECTS: list[str] = []


async def _verify(invocation_id: str) -> Any:
    return f"done:{invocation_id}" if invocation_id in EFFECTS else NOT_DONE


@tool(timeout=20, verify=_verify)  # 20 s scaled by the harness: 0.2 s
async def effect_then_hang(invocation_id: str) -> str:
    EFFECTS.append(invocation_id)
    if EFFECTS.count(invocation_id) == 1:
        await anyio.sleep(30)  # the effect happened; the answer never comes back
    return f"done:{invocation_id}"


class HangAfterEffect(AgentProcess):
    agent_id = "hang-after-effect"

    async def step(self, ctx: StepContext) -> Done | None:
        return Done(result=await ctx.call_tool(effect_then_hang))


@pytest.mark.anyio
async def test_a_retried_side_effect_asks_verify_before_running_again(agent_harness: AgentHarness) -> None:
    EFFECTS.clear()
    run = await agent_harness.run(HangAfterEffect())
    assert run.exit_code == 0, run.log_messages()
    assert len(EFFECTS) == 1  # the timeout was retried, but verify found the effect: not done twice
    completed = [e for e in run.journal if e["type"] == "TOOL_COMPLETED"]
    assert len(completed) == 1 and completed[0].get("verified") is True
    assert run.job is not None and run.job.result == f"done:{EFFECTS[0]}"
    assert [e["type"] for e in run.journal if e["type"] in ("TOOL_STARTED", "TOOL_FAILED")] == [
        "TOOL_STARTED",
        "TOOL_FAILED",
    ]


# -- the second: a transient failure the drain left no time to retry was recorded as a crash (exit 1) -----


@tool(side_effects=False)
async def flaky_read() -> str:
    raise TransientError("the upstream is overloaded (503)")


class AlwaysFlaky(AgentProcess):
    agent_id = "always-flaky"

    async def step(self, ctx: StepContext) -> Done | None:
        return Done(result=await ctx.call_tool(flaky_read))


@pytest.mark.anyio
async def test_a_transient_failure_during_the_drain_exits_143_not_as_a_crash(
    agent_harness: AgentHarness,
) -> None:
    drained = await agent_harness.run(AlwaysFlaky(), drain=DrainAt.during_tool("flaky_read"))
    assert drained.exit_code == 143, drained.log_messages()
    assert drained.job is not None and drained.job.status == "RUNNING" and drained.job.error == []
    # Without a drain the same step is a crash once the step budget is spent: that is not changed.
    # (A short LLM total timeout keeps the step's retry budget at the 0.45 s step deadline.)
    crashed = await agent_harness.run(
        AlwaysFlaky(), job_id="flaky-2", env={"AGENTLIFE_LLM_TOTAL_TIMEOUT_SECONDS": "10"}
    )
    assert crashed.exit_code == 1
    assert crashed.job is not None and crashed.job.error[-1]["error_class"] == "TransientError"


# -- the third: a PostgreSQL blip while a step's LLM usage was recorded crashed the step (exit 1) ---------


class BlipLLM:
    """Answers at once; on the second call PostgreSQL goes down just before the answer is returned."""

    def __init__(self, server: PostgresServer, restarted: threading.Thread) -> None:
        self.calls = 0
        self.server = server
        self.restarted = restarted

    async def complete(
        self, *, model: str, messages: Any, max_tokens: int, timeouts: Any = None, **params: Any
    ) -> LLMReply:
        self.calls += 1
        if self.calls == 2:
            await anyio.to_thread.run_sync(self.server.stop)
            self.restarted.start()  # back in 0.5 s: well inside the (scaled) 4.5 s step budget
        return LLMReply(text="ok", usage=Usage(input_tokens=10, output_tokens=5), model=model)

    async def aclose(self) -> None:
        pass


class UsesTheLLM(AgentProcess):
    agent_id = "blip"

    def __init__(self, llm: BlipLLM) -> None:
        self.llm = llm

    def make_llm(self) -> LLMClient:
        return self.llm

    async def step(self, ctx: StepContext) -> Done | None:
        await ctx.llm.complete(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
        return Done(result="done") if ctx.step == 2 else None


@pytest.mark.anyio
async def test_a_postgres_blip_while_usage_is_recorded_is_ridden_through(
    postgres_server: PostgresServer, postgres_url: str, tmp_path: Path
) -> None:
    store = PostgresStore(postgres_url)
    await store.open()
    try:
        await store.init_schema()
    finally:
        await store.close()

    def restart() -> None:
        time.sleep(0.5)
        postgres_server.start()

    restarted = threading.Thread(target=restart)
    env = {
        "AGENTLIFE_JOB_ID": "blip-1",
        "AGENTLIFE_DATABASE_URL": postgres_url,
        "AGENTLIFE_HEALTH_PORT": "off",
    }
    env["AGENTLIFE_DATA_DIR"] = str(tmp_path)
    options = RunOptions(
        create_job=True,
        shell=ShellOptions(handle_signals=False, hard_exit=False, probes=False, json_logs=False),
        constants=Constants.from_env({}).scaled(0.1),  # 4.5 s step budget; retries 0.1 s, 0.2 s, 0.4 s ...
    )
    llm = BlipLLM(postgres_server, restarted)
    try:
        code = await Runtime(UsesTheLLM(llm), env=env, options=options).run()
    finally:
        if restarted.is_alive() or restarted.ident is not None:
            restarted.join()
        postgres_server.start()
    assert code == 0
    assert llm.calls == 3  # no crash, so no re-issued call either
    store = PostgresStore(postgres_url)
    await store.open()
    try:
        job = await store.get_job("blip-1")
    finally:
        await store.close()
    assert job is not None and job.status == "COMPLETED"
    assert job.tokens_consumed["input"] >= 30  # the blipped call's usage was recorded too


# -- the fourth: a second SIGTERM in the last milliseconds before exit killed the process (-15, not 143) ---


class OneStep(AgentProcess):
    agent_id = "one-step"

    async def step(self, ctx: StepContext) -> Done | None:
        return Done(result="done")


@pytest.mark.anyio
async def test_the_signal_handlers_from_before_the_runtime_are_back_after_it(tmp_path: Path) -> None:
    seen: list[int] = []

    def remember(signum: int, frame: object) -> None:  # what the CLI's EarlySignal does
        seen.append(signum)

    before = {s: signal.signal(s, remember) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        env = {
            "AGENTLIFE_JOB_ID": "sig-1",
            "AGENTLIFE_DATA_DIR": str(tmp_path),
            "AGENTLIFE_HEALTH_PORT": "off",
        }
        options = RunOptions(
            shell=ShellOptions(handle_signals=True, hard_exit=False, probes=False, json_logs=False),
            constants=Constants.from_env({}).scaled(0.01),
        )
        assert await Runtime(OneStep(), env=env, options=options).run() == 0
        # Not SIG_DFL, which a signal arriving between here and os._exit would die of.
        assert signal.getsignal(signal.SIGTERM) is remember and signal.getsignal(signal.SIGINT) is remember
        os.kill(os.getpid(), signal.SIGTERM)
        assert seen == [signal.SIGTERM]
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


# -- the fifth: SIGTERM during the hydration memory fetch crashed on DRAINING -> READY (exit 1) -------------


class DrainingEmbedder:
    """Embeds on the worker thread of a memory search: the drain is requested meanwhile, then Qdrant fails."""

    dimension = 8

    def __init__(self) -> None:
        self.runtime: Runtime | None = None

    def embed(self, texts: Any) -> list[list[float]]:
        assert self.runtime is not None
        anyio.from_thread.run_sync(self.runtime.request_drain, "SIGTERM")  # lands while the task waits
        raise ConnectionError("qdrant: timed out")  # handled by the fetch: memories are optional


class RemembersThings(AgentProcess):
    agent_id = "remembers"

    def __init__(self, embedder: DrainingEmbedder) -> None:
        self.embedder = embedder

    def make_embedder(self) -> Any:
        return self.embedder

    async def step(self, ctx: StepContext) -> Done | None:
        raise AssertionError("a drained hydration must not run a step")


@pytest.mark.anyio
async def test_sigterm_during_an_uncancellable_memory_call_drains_with_143(tmp_path: Path) -> None:
    import qdrant_client  # noqa: F401  # imported here, not against the (scaled) memory budget

    harness = AgentHarness(tmp_path / "agentlife", time_scale=0.1)  # the 10 s memory budget lasts 1 s
    (harness.data_dir / "qdrant").mkdir(parents=True)  # local memory exists: the fetch runs
    embedder = DrainingEmbedder()

    def keep_runtime(runtime: Runtime, event: str, info: dict[str, Any]) -> None:
        embedder.runtime = runtime

    run = await harness.run(RemembersThings(embedder), payload="deploy staging", on_event=keep_runtime)
    assert run.exit_code == 143, run.log_messages()
    assert (State.DRAINING, State.READY) not in run.transitions
    assert run.transitions[-1] == (State.DRAINING, State.TERMINATED)
    assert any("memory fetch failed" in message for message in run.log_messages())  # the path under test


# -- SIGTERM while the store opened on a worker thread crashed on DRAINING -> HYDRATING (exit 1) ------------


@pytest.mark.anyio
async def test_sigterm_while_the_store_opens_drains_with_143_and_never_hydrates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentlife._runtime._services import JobServices

    runtime: list[Runtime] = []
    opened = JobServices.open_store

    async def open_then_signalled(self: JobServices, settings: Any) -> Any:
        store = await opened(self, settings)
        runtime[0].request_drain("SIGTERM")  # as the signal lands while the open ran on its thread
        return store

    monkeypatch.setattr(JobServices, "open_store", open_then_signalled)

    def keep_runtime(found: Runtime, event: str, info: dict[str, Any]) -> None:
        runtime[:] = [found]

    run = await AgentHarness(tmp_path / "agentlife").run(OneStep(), payload="x", on_event=keep_runtime)
    assert run.exit_code == 143, run.log_messages()
    assert (State.DRAINING, State.HYDRATING) not in run.transitions
    assert run.transitions[-1] == (State.DRAINING, State.TERMINATED)
