"""A step's durable record in the store: what a resumed step replays, whichever pod resumes it.

In-process, on real SQLite stores and real session journals: `replay_events` puts a pod's journal and
the store's records together in the order they were written, `StepJournal` writes what it must before a
side effect and groups the rest, and jobs run by the harness resume on an empty data dir (another pod)
exactly as on their own. The same paths through real processes, kills and PostgreSQL are in
test_crash_resume.py, test_wait_processes.py, test_events.py and the fan-out tests.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from agentlife import NOT_DONE, AgentProcess, AttemptFenced, Done, LLMReply, StepContext, Usage, tool
from agentlife._journal._recovery import ScanResult, build_replay
from agentlife._journal._steprecords import StepJournal, replay_events
from agentlife._journal._writer import Journal
from agentlife.stores import HISTORY_KEEP, SQLiteStore, StepRecord
from agentlife.testing import AgentHarness

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# -- putting a pod's journal and the store together ---------------------------------------------------------


def _event(type_: str, seq: int, call: int, **fields: Any) -> dict[str, Any]:
    return {"v": 1, "ts": 1000.0 + seq, "seq": seq, "type": type_, "step": 3, "call": call, **fields}


def _stored(event: dict[str, Any], attempt: int, session: int) -> StepRecord:
    return StepRecord(3, attempt, session, event["seq"], orjson.dumps(event))


def _scan(path: str, events: list[dict[str, Any]]) -> ScanResult:
    return ScanResult(found=True, reason="found", path=Path(path), events=events)


def test_a_stale_journal_and_the_stores_newer_records_replay_in_the_order_they_were_written() -> None:
    # Attempt 1 ran on this pod: its model call, then a side-effecting call started. Attempt 2 ran on
    # another pod: it replayed the model call, finished the call, made a second model call. This pod now
    # resumes attempt 3 with attempt 1's journal.
    reply_1 = _event("LLM_COMPLETED", 4, 0, response={"text": "one"}, digest="d0")
    started = _event("TOOL_STARTED", 5, 1, tool="pay", digest="d1", side_effects=True)
    done = _event("TOOL_COMPLETED", 2, 1, tool="pay", digest="d1", result="paid")
    reply_2 = _event("LLM_COMPLETED", 3, 2, response={"text": "two"}, digest="d2")
    records = [
        _stored(reply_1, 1, 100),
        _stored(started, 1, 100),
        _stored(done, 2, 200),
        _stored(reply_2, 2, 200),
    ]

    events, _ = replay_events(_scan("session_0001_100.jsonl", [reply_1, started]), records, 3)
    replay = build_replay(events, 3)

    assert [e["type"] for e in events] == ["LLM_COMPLETED", "TOOL_STARTED", "TOOL_COMPLETED", "LLM_COMPLETED"]
    assert [e["carried_from"] for e in events] == [[1, 100, 4], [1, 100, 5], [2, 200, 2], [2, 200, 3]]
    assert replay.tools[1].status == "completed" and replay.tools[1].result == "paid"
    assert replay.llm == {0: {"text": "one"}, 2: {"text": "two"}}


def test_events_carried_forward_count_once_and_keep_their_place() -> None:
    # Attempt 2's file starts with attempt 1's events carried forward (from the store, after a hop),
    # then a void and a new call: the store holds attempt 1's originals and attempt 2's own.
    invoice = _event("TOOL_STARTED", 6, 0, tool="invoice", digest="a", side_effects=True)
    invoice_done = _event("TOOL_COMPLETED", 7, 0, tool="invoice", digest="a", result=1)
    carried = [
        {**e, "seq": n, "carried": True, "carried_from": [1, 100, e["seq"]]}
        for n, e in ((3, invoice), (4, invoice_done))
    ]
    discarded = _event("REPLAY_DISCARDED", 9, 0)
    refund = _event("TOOL_STARTED", 10, 0, tool="refund", digest="b", side_effects=True)
    refund_done = _event("TOOL_COMPLETED", 11, 0, tool="refund", digest="b", result=2)
    records = [_stored(invoice, 1, 100), _stored(discarded, 2, 200), _stored(refund, 2, 200)]

    local = [*carried, discarded, refund, refund_done]
    events, _ = replay_events(_scan("session_0002_200.jsonl", local), records, 3)

    assert [(e["type"], e.get("tool")) for e in events] == [
        ("TOOL_STARTED", "invoice"),
        ("TOOL_COMPLETED", "invoice"),
        ("REPLAY_DISCARDED", None),
        ("TOOL_STARTED", "refund"),
        ("TOOL_COMPLETED", "refund"),
    ]
    assert build_replay(events, 3).tools[0].tool == "refund"


def test_without_a_journal_the_store_alone_is_replayed_and_bad_records_are_passed_over(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reply = _event("LLM_COMPLETED", 1, 0, response={"text": "hi"})
    records = [
        _stored(reply, 1, 100),
        StepRecord(3, 1, 100, 2, b"not json {"),
        StepRecord(3, 1, 100, 3, b'["a list"]'),
        StepRecord(4, 1, 100, 4, orjson.dumps(_event("LLM_COMPLETED", 4, 0))),  # another step's
    ]
    with caplog.at_level(logging.WARNING, "agentlife.journal"):
        events, _ = replay_events(ScanResult(found=False, reason="no session files"), records, 3)
    assert [e["seq"] for e in events] == [1]
    assert "2 step records of step 3 are not journal events" in caplog.text
    assert replay_events(None, [], 3) == ([], "nothing recorded")


# -- what the step's journal writes, and when ---------------------------------------------------------------


@pytest.fixture
async def held(tmp_path: Path) -> Any:
    store = SQLiteStore(tmp_path / "agentlife.db")
    await store.open()
    await store.create_job("job-1", "a", None)
    await store.claim("job-1", 1)
    journal = Journal.create(tmp_path / "sessions", 1)
    try:
        yield store, journal
    finally:
        await journal.aclose()
        await store.close()


async def test_a_durable_event_takes_everything_before_it_to_the_store_and_the_rest_waits(held: Any) -> None:
    store, journal = held
    steps = StepJournal(journal, store, "job-1", 1)
    steps.append("LLM_STARTED", step=0, call=0)  # not replayed: the journal only
    steps.append("LLM_COMPLETED", step=0, call=0, response={"text": "x"})
    await steps.append_durable("TOOL_STARTED", step=0, call=1, tool="pay")
    steps.append("TOOL_COMPLETED", step=0, call=1, result="paid")
    assert [orjson.loads(r.data)["type"] for r in await store.load_step_records("job-1")] == [
        "LLM_COMPLETED",
        "TOOL_STARTED",
    ]
    assert steps.store_writes == 1
    await steps.append_durable("WAIT_COMPLETED", step=0, call=2, outcome=None, to_store=False)
    assert len(await store.load_step_records("job-1")) == 2  # fsynced to the journal, not yet stored
    await steps.store_all()
    assert len(await store.load_step_records("job-1")) == 4 and steps.store_writes == 2


async def test_concurrent_side_effects_share_store_writes(held: Any) -> None:
    store, journal = held
    steps = StepJournal(journal, store, "job-1", 1)
    async with anyio.create_task_group() as tasks:
        for call in range(8):
            tasks.start_soon(lambda c=call: steps.append_durable("TOOL_STARTED", step=0, call=c))
    assert len(await store.load_step_records("job-1")) == 8
    assert steps.store_writes < 8


async def test_a_fenced_store_write_stops_the_step_and_keeps_the_records(held: Any) -> None:
    store, journal = held
    fenced: list[AttemptFenced] = []
    steps = StepJournal(journal, store, "job-1", 1, on_fenced=fenced.append)
    successor = SQLiteStore(store.path)
    await successor.open()
    try:
        await successor.claim("job-1", 2)
        with pytest.raises(AttemptFenced):
            await steps.append_durable("TOOL_STARTED", step=0, call=0, tool="pay")
    finally:
        await successor.close()
    assert len(fenced) == 1 and await store.load_step_records("job-1") == []
    assert len(steps.take_unsent()) == 1  # nothing lost on this side: the records wait, unstored


async def test_the_store_keeps_only_the_records_of_the_checkpoints_history(held: Any) -> None:
    store, journal = held
    steps = StepJournal(journal, store, "job-1", 1)
    for step in range(HISTORY_KEEP + 3):
        await steps.append_durable("TOOL_STARTED", step=step, call=0)
        keep_from = steps.prune_before(step)
        await store.write_checkpoint("job-1", 1, f"cp-{step}", step, b"{}", prune_before=keep_from)
        steps.drop_unsent()
        if keep_from is not None:
            steps.pruned(keep_from)
    kept = sorted({r.step for r in await store.load_step_records("job-1")})
    assert kept == list(range(3, HISTORY_KEEP + 3))
    assert steps.prune_before(HISTORY_KEEP + 2) is None  # nothing older left: no statement for it


# -- jobs resumed on another pod, in process ----------------------------------------------------------------


class CountingLLM:
    """Replies ``answer to <prompt>`` and counts the calls it really makes."""

    def __init__(self) -> None:
        self.calls = 0

    async def complete(
        self, *, model: str, messages: Sequence[Mapping[str, Any]], max_tokens: int, **_: Any
    ) -> LLMReply:
        self.calls += 1
        return LLMReply(
            text=f"answer to {messages[-1]['content']}", usage=Usage(input_tokens=3, output_tokens=2)
        )

    async def aclose(self) -> None:
        pass


EFFECTS: list[str] = []


async def _done_already(invocation_id: str) -> Any:
    return "paid" if invocation_id in EFFECTS else NOT_DONE


async def _pay(invocation_id: str) -> str:
    EFFECTS.append(invocation_id)
    return "paid"


pay = tool(name="pay")(_pay)
pay_verified = tool(name="pay", verify=_done_already)(_pay)


class Payer(AgentProcess):
    """Step 0: a model call, a payment, then (first run) a crash before the step ends."""

    agent_id = "payer"

    def __init__(self, llm: CountingLLM, *, verify: bool, crash: bool) -> None:
        super().__init__()
        self.llm, self.verify, self.crash = llm, verify, crash

    def make_llm(self) -> Any:
        return self.llm

    async def step(self, ctx: StepContext) -> Done | None:
        reply = await ctx.llm.complete(model="m", max_tokens=5, messages=[{"role": "user", "content": "go"}])
        paid = await ctx.call_tool(pay_verified if self.verify else pay)
        if self.crash:
            raise RuntimeError("crashed after the payment")
        return Done({"reply": reply.text, "paid": paid})


@pytest.mark.parametrize("verify", [True, False])
async def test_a_step_resumed_on_an_empty_data_dir_replays_what_the_crashed_pod_did(
    tmp_path: Path, verify: bool
) -> None:
    EFFECTS.clear()
    harness = AgentHarness(tmp_path / "pod-a")
    first, second = CountingLLM(), CountingLLM()
    crashed = await harness.run(Payer(first, verify=verify, crash=True))
    assert crashed.exit_code == 1 and first.calls == 1 and EFFECTS == ["job-1/0/1"]
    other_pod = {
        "AGENTLIFE_DATA_DIR": str(tmp_path / "pod-b"),
        "AGENTLIFE_DATABASE_URL": harness.database_url,
    }
    resumed = await harness.run(Payer(second, verify=verify, crash=False), env=other_pod)
    assert resumed.exit_code == 0, resumed.log_messages()[-5:]
    assert resumed.job is not None and resumed.job.result == {"reply": "answer to go", "paid": "paid"}
    assert second.calls == 0 and EFFECTS == ["job-1/0/1"]  # nothing asked or paid again
    assert list((tmp_path / "pod-b" / "sessions").rglob("session_*.jsonl"))  # it ran on the other disk


@pytest.mark.parametrize(("verify", "writes"), [(True, 1), (False, 2)])
async def test_a_side_effect_costs_one_store_write_with_verify_and_two_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verify: bool, writes: int
) -> None:
    # With verify the result goes with the checkpoint (verify answers for the moment between); without
    # it, before the step goes on, since nothing else could tell another pod that the payment happened.
    EFFECTS.clear()
    counted: list[int] = []
    real = SQLiteStore.append_step_records

    async def counting(self: SQLiteStore, job_id: str, attempt: int, records: Any) -> None:
        counted.append(len(records))
        await real(self, job_id, attempt, records)

    monkeypatch.setattr(SQLiteStore, "append_step_records", counting)
    done = await AgentHarness(tmp_path).run(Payer(CountingLLM(), verify=verify, crash=False))
    assert done.exit_code == 0
    assert len(counted) == writes
    assert counted[0] == 2  # the payment's start carried the model call's reply with it


class Leaky(AgentProcess):
    """A side effect whose arguments and result hold the process's secret."""

    agent_id = "leaky"

    async def step(self, ctx: StepContext) -> Done | None:
        await ctx.call_tool(echo_secret, text=f"key={SECRET} and token {SECRET}")
        raise RuntimeError("stop before the checkpoint, so the result is a stored record")


SECRET = "sk-test-9f8e7d6c5b4a39281706"


@tool(name="echo_secret")
async def echo_secret(text: str) -> str:
    return f"the server echoed: {text}"


async def test_step_records_in_the_store_never_hold_a_secret(tmp_path: Path) -> None:
    harness = AgentHarness(tmp_path, env={"ANTHROPIC_API_KEY": SECRET})
    crashed = await harness.run(Leaky())
    assert crashed.exit_code == 1
    store = SQLiteStore(tmp_path / "agentlife.db")
    await store.open()
    try:
        records = await store.load_step_records("job-1")
    finally:
        await store.close()
    kinds = [orjson.loads(r.data)["type"] for r in records]
    assert kinds == ["TOOL_STARTED", "TOOL_COMPLETED"]
    assert all(SECRET.encode() not in r.data for r in records)
    assert b"the server echoed" in records[1].data  # the result is there, masked


@pytest.mark.parametrize(
    "forged",
    [
        {"result": "forged"},  # no digest: not what agentlife writes
        {"result": "forged", "digest": "d1", "tool": "send_refund"},
        {"result": "forged", "digest": "d1", "invocation_id": "j/9/9"},
        {"result": "forged", "digest": "other"},
    ],
)
def test_an_outcome_written_by_someone_else_never_completes_the_call(forged: dict[str, Any]) -> None:
    started = _event("TOOL_STARTED", 1, 0, tool="pay", digest="d1", invocation_id="j/3/0", side_effects=True)
    events, _ = replay_events(
        None, [_stored(started, 1, 100), _stored(_event("TOOL_COMPLETED", 2, 0, **forged), 1, 100)], 3
    )
    record = build_replay(events, 3).tools[0]
    assert (record.status, record.result) == ("pending", None)  # verify decides, as after a crash


def test_a_secret_mounted_from_a_file_is_masked_without_its_newline() -> None:
    from agentlife._redact import Redactor

    redactor = Redactor.from_env({"SERVICE_API_KEY": "Zq8Xv2Lm4Np6Rt8B5c\n"})
    assert "Zq8Xv2Lm4Np6Rt8B5c" not in redactor.redact("Authorization: Key Zq8Xv2Lm4Np6Rt8B5c")
