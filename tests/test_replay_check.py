"""Replay checks what it replays, and a replayed value equals the live one (real processes, SIGKILL)."""

from __future__ import annotations

import json
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from agentlife import NOT_DONE, Done, ReplayMismatch, ScriptedLLM, StepContext, UnreplayableValue, tool
from agentlife._config import MAX_PAYLOAD_DEPTH
from agentlife._journal._recovery import ReplayMap, build_replay, read_events
from agentlife._journal._writer import Journal
from agentlife._redact import Redactor
from agentlife._replay import MAX_DEPTH, check_replayable, llm_request_digest, nesting, tool_call_digest
from procs import agent_env
from stepctx import journal_events, step_contexts


def _env(tmp_path: Path, attempt: int, **extra: str) -> dict[str, str]:
    log = tmp_path / "log"
    log.mkdir(exist_ok=True)
    return agent_env(
        tmp_path / "data",
        AGENTLIFE_JOB_ID="job-r",
        AGENTLIFE_ATTEMPT=str(attempt),
        REPLAY_LOG=str(log),
        **extra,
    )


# ---------------------------------------------------------------------------------------- in process


def test_digests_are_stable_short_and_differ_by_name_and_arguments() -> None:
    d = tool_call_digest("send_invoice", {"amount": 100, "to": "a"})
    assert d == tool_call_digest("send_invoice", {"to": "a", "amount": 100})  # key order does not count
    assert len(d) == 16
    assert d != tool_call_digest("send_refund", {"amount": 100, "to": "a"})
    assert d != tool_call_digest("send_invoice", {"amount": 101, "to": "a"})
    msgs = [{"role": "user", "content": "hi"}]
    base = llm_request_digest("m", msgs, 10, {})
    assert base == llm_request_digest("m", [{"content": "hi", "role": "user"}], 10, {})
    assert base != llm_request_digest("m2", msgs, 10, {})
    assert base != llm_request_digest("m", msgs, 11, {})
    assert base != llm_request_digest("m", msgs, 10, {"system": "be brief"})


def test_a_rerun_decision_in_the_journal_voids_later_records_on_the_next_resume() -> None:
    events = [
        {"type": "TOOL_STARTED", "step": 0, "call": 0, "tool": "a", "digest": "1"},
        {"type": "TOOL_COMPLETED", "step": 0, "call": 0, "tool": "a", "result": 1, "digest": "1"},
        {"type": "LLM_COMPLETED", "step": 0, "call": 1, "response": {"text": "x"}, "digest": "2"},
        {"type": "REPLAY_DISCARDED", "step": 0, "call": 0},
        {"type": "TOOL_STARTED", "step": 0, "call": 0, "tool": "b", "digest": "3"},
    ]
    replay: ReplayMap = build_replay(events, 0)
    record = replay.tool(0)
    assert record is not None and record.tool == "b" and record.status == "pending"
    assert replay.llm_result(1) is None and 1 in replay.discarded


def test_a_different_call_started_after_a_completion_supersedes_it() -> None:
    events = [
        {"type": "TOOL_COMPLETED", "step": 0, "call": 0, "tool": "a", "result": 1, "digest": "1"},
        {"type": "TOOL_STARTED", "step": 0, "call": 0, "tool": "b", "digest": "3"},
        {"type": "TOOL_COMPLETED", "step": 0, "call": 0, "tool": "b", "result": 2, "digest": "3"},
    ]
    record = build_replay(events, 0).tool(0)
    assert record is not None and record.result == 2 and record.digest == "3"


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ((1, 2), "tuple"),
        ({1, 2}, "set"),
        (b"x", "bytes"),
        (float("nan"), "NaN"),
        (float("inf"), "inf"),
        (2**64, "64-bit"),
        (-(2**63) - 1, "64-bit"),
        ({"a": [1, {"b": __import__("decimal").Decimal("1.5")}]}, "decimal.Decimal"),
        ({1: "x"}, "keys must be str"),
        (__import__("datetime").datetime(2026, 1, 1), "datetime"),
        ((x for x in []), "generator"),
    ],
)
def test_values_the_journal_would_change_are_refused_with_owner_path_and_type(
    value: Any, fragment: str
) -> None:
    with pytest.raises(UnreplayableValue) as info:
        check_replayable({"v": value}, "tool fetch's result")
    assert isinstance(info.value, TypeError)
    assert "tool fetch's result" in str(info.value) and "['v']" in str(info.value)
    assert fragment in str(info.value)


def test_cycles_and_deep_values_are_refused_without_recursing_forever() -> None:
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    with pytest.raises(UnreplayableValue, match="cycle"):
        check_replayable(cyclic, "ctx.state")
    deep: list[Any] = []
    for _ in range(10_000):
        deep = [deep]
    with pytest.raises(UnreplayableValue, match="deeper"):
        check_replayable(deep, "ctx.state")


def test_values_that_round_trip_are_accepted() -> None:
    value = {"a": [1, 2.5, "x", None, True, {"b": 2**64 - 1, "c": -(2**63)}], "": []}
    check_replayable(value, "ctx.state")
    assert orjson.loads(orjson.dumps(value)) == value


def test_done_with_a_set_result_names_done_result_not_ctx_state() -> None:
    with pytest.raises(UnreplayableValue, match=r"Done\.result holds a set"):
        Done(result={1, 2})


def test_replay_mismatch_is_an_agentlife_error_with_both_calls() -> None:
    exc = ReplayMismatch("j/0/1", "tool a (1)", "tool b (2)")
    assert exc.invocation_id == "j/0/1" and "tool a (1)" in str(exc) and "tool b (2)" in str(exc)


# ------------------------------------------------------------- what the journal holds, and what it refuses


def _nested(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("caf\ud800", "a string with a lone surrogate"),
        (["ok", "\udfff"], "a string with a lone surrogate"),
        ({"\ud83d": 1}, "a dict key with a lone surrogate"),
        (_nested(MAX_DEPTH), f"nested deeper than {MAX_DEPTH} levels"),  # 1 + MAX_DEPTH levels
    ],
)
def test_what_orjson_cannot_write_is_refused_with_a_short_line(value: Any, fragment: str) -> None:
    with pytest.raises(UnreplayableValue, match=fragment) as info:
        check_replayable({"v": value}, "tool fetch's result")
    message = str(info.value)
    assert "\n" not in message and len(message) < 300  # 128 levels of path are shortened
    message.encode("utf-8")  # the refusal itself can be journaled and logged


def test_the_depth_limit_is_the_payload_limit_and_leaves_room_for_every_holder() -> None:
    assert MAX_DEPTH == MAX_PAYLOAD_DEPTH
    deepest = _nested(MAX_DEPTH - 1)  # with the {"v": ...} around it: MAX_DEPTH levels
    check_replayable({"v": deepest}, "ctx.state")
    # An LLM response nests blocks four levels down in its journal line; a tool result one.
    line = {"response": {"content": [{"input": {"v": deepest}}]}}
    assert orjson.loads(orjson.dumps(line)) == line
    check_replayable(json.loads('"\\ud83d\\ude00: JSON joins an escaped pair"'), "ctx.state")


# Text with lone surrogates mixed in; JSON-like values nested up to past the limit, with the odd tuple.
_text = st.text(st.characters() | st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=8)
_scalars = st.none() | st.booleans() | st.integers() | st.floats() | _text
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3) | st.tuples(inner),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(value=_values, extra_levels=st.sampled_from([0, MAX_DEPTH - 8, MAX_DEPTH + 1, 254, 300]))
def test_every_value_is_refused_or_journaled_and_replayed_exactly(value: Any, extra_levels: int) -> None:
    for _ in range(extra_levels):
        value = [value]
    try:
        check_replayable(value, "tool t's result")
    except UnreplayableValue as exc:
        str(exc).encode("utf-8")  # the refusal itself can be journaled
        event("refused")
        return
    event("journaled")
    with tempfile.TemporaryDirectory() as tmp:
        journal = Journal.create(Path(tmp), 1, redactor=Redactor())
        journal.append("TOOL_STARTED", step=0, call=0, invocation_id="j/0/0", tool="t", digest="d")
        journal.append(
            "TOOL_COMPLETED", step=0, call=0, invocation_id="j/0/0", tool="t", result=value, digest="d"
        )
        anyio.run(journal.aclose)
        events = [e for e in read_events(journal.path)]
    record = build_replay(events, 0).tool(0)
    assert record is not None and record.status == "completed" and not record.refused
    assert record.result == value and type(record.result) is type(value)


_json = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=0, max_value=9) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(value=_json, extra_levels=st.integers(min_value=0, max_value=MAX_DEPTH + 4))
def test_nesting_counts_the_levels_check_replayable_counts(value: Any, extra_levels: int) -> None:
    # A tool call's input is refused by its nesting (`bounded_tool_inputs`) exactly when the journal's own
    # check would refuse it: more than MAX_DEPTH levels of lists and dicts.
    for _ in range(extra_levels):
        value = {"k": value}
    levels = nesting(value, MAX_DEPTH + 1)
    try:
        check_replayable(value, "x")
    except UnreplayableValue:
        assert levels > MAX_DEPTH
    else:
        assert levels <= MAX_DEPTH
    assert nesting(value, 1000) == _levels(value)


def _levels(value: Any) -> int:
    if isinstance(value, dict | list):
        children = value.values() if isinstance(value, dict) else value
        return 1 + max((_levels(child) for child in children), default=0)
    return 0


def test_nesting_stops_at_its_cap_on_deep_shared_and_cyclic_values() -> None:
    deep: Any = 1
    for _ in range(10_000):
        deep = {"k": deep}
    assert nesting(deep, 126) == 126  # no recursion, and only 126 levels walked
    shared: list[Any] = []
    for _ in range(200):
        shared = [shared, shared]  # 2**200 paths, 201 objects: each walked once on its level
    assert nesting(shared, 500) == 201
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    assert nesting(cyclic, 50) == 50
    assert (nesting("text", 5), nesting({}, 5), nesting([[], {"a": (1,)}], 5)) == (0, 1, 3)


def test_a_refused_completion_and_the_start_it_follows_make_one_record() -> None:
    events = [
        {"type": "TOOL_STARTED", "step": 0, "call": 0, "tool": "pay", "digest": "1", "side_effects": True},
        {
            "type": "TOOL_COMPLETED",
            "step": 0,
            "call": 0,
            "tool": "pay",
            "digest": "1",
            "result": None,
            "error_class": "UnreplayableValue",
            "error": "tool pay's result holds a cycle",
        },
    ]
    record = build_replay(events, 0).tool(0)
    assert record is not None and record.refused and record.side_effects is True
    assert (record.error_class, record.error) == ("UnreplayableValue", "tool pay's result holds a cycle")
    ok = build_replay([*events[:1], {**events[1], "error_class": None, "result": 3}], 0).tool(0)
    assert ok is not None and not ok.refused and ok.result == 3


# -------------------------------------------------------- replay in a step (a real StepContext and journal)

_runs: list[str] = []


@tool(side_effects=True)
async def pay(amount: int) -> Any:
    _runs.append(f"pay {amount}")
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    return cyclic


@tool(side_effects=False)
async def read_clock(now: float) -> Any:
    _runs.append(f"read {now}")
    return {"set": {1}} if now < 0 else now


@tool(side_effects=True, verify=lambda invocation_id: _verified(invocation_id))
async def ship(now: float) -> str:
    _runs.append(f"ship {now}")
    return "shipped"


async def _verified(invocation_id: str) -> Any:
    _runs.append("verify")
    return NOT_DONE


def _started(tool_name: str, args: dict[str, Any], side_effects: bool | None) -> dict[str, Any]:
    event = {
        "type": "TOOL_STARTED",
        "step": 0,
        "call": 0,
        "invocation_id": "job-s/0/0",
        "tool": tool_name,
        "digest": tool_call_digest(tool_name, args),
    }
    return event if side_effects is None else {**event, "side_effects": side_effects}


@pytest.fixture
async def replaying(tmp_path: Path) -> AsyncIterator[Any]:
    """``ctx_for(events)``: step 0's context resuming with ``events`` in its journal."""
    _runs.clear()
    async with step_contexts(tmp_path) as make:

        async def ctx_for(events: list[dict[str, Any]]) -> tuple[StepContext, Journal]:
            ctx, journal = await make(ScriptedLLM([]))
            ctx._env.replay = build_replay(events, 0)
            return ctx, journal

        yield ctx_for


@pytest.mark.anyio
async def test_a_refused_side_effect_result_is_recorded_completed_and_replayed_as_the_same_error(
    replaying: Any,
) -> None:
    ctx, journal = await replaying([])
    with pytest.raises(UnreplayableValue, match="a cycle") as live:
        await ctx.call_tool(pay, amount=5)
    events = await journal_events(journal)
    completed = [e for e in events if e["type"] == "TOOL_COMPLETED"]
    assert len(completed) == 1 and completed[0]["error"] == str(live.value)
    assert _runs == ["pay 5"]

    resumed, _ = await replaying(events)
    with pytest.raises(UnreplayableValue) as replayed:
        await resumed.call_tool(pay, amount=5)
    assert str(replayed.value) == str(live.value) and _runs == ["pay 5"]  # no second effect
    other, _ = await replaying(events)
    with pytest.raises(ReplayMismatch):  # the recorded error is for this very call only
        await other.call_tool(pay, amount=6)


@tool(side_effects=True, verify=lambda invocation_id: _verified_cycle(invocation_id))
async def refund(amount: int) -> str:
    _runs.append(f"refund {amount}")
    return "refunded"


async def _verified_cycle(invocation_id: str) -> Any:
    _runs.append("verify")
    found: dict[str, Any] = {}
    found["again"] = found
    return found


@pytest.mark.anyio
async def test_a_refused_verify_result_is_recorded_completed_too(replaying: Any) -> None:
    ctx, journal = await replaying([_started("refund", {"amount": 3}, True)])
    with pytest.raises(UnreplayableValue, match="verified result holds a cycle") as live:
        await ctx.call_tool(refund, amount=3)
    (completed,) = [e for e in await journal_events(journal) if e["type"] == "TOOL_COMPLETED"]
    assert completed["verified"] is True and completed["error"] == str(live.value)
    resumed, _ = await replaying([_started("refund", {"amount": 3}, True), completed])
    with pytest.raises(UnreplayableValue):
        await resumed.call_tool(refund, amount=3)
    assert _runs == ["verify"]  # neither the refund nor a second verify


@pytest.mark.anyio
async def test_a_refused_read_only_result_is_a_failure_that_runs_again(replaying: Any) -> None:
    ctx, journal = await replaying([])
    with pytest.raises(UnreplayableValue, match="a set"):
        await ctx.call_tool(read_clock, now=-1.0)
    events = await journal_events(journal)
    assert [e["type"] for e in events if e["type"].startswith("TOOL_")] == ["TOOL_STARTED", "TOOL_FAILED"]
    resumed, _ = await replaying(events)
    assert await resumed.call_tool(read_clock, now=2.0) == 2.0
    assert _runs == ["read -1.0", "read 2.0"]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("recorded", "outcome"),
    [
        (_started("read_clock", {"now": 1.0}, False), "runs"),  # read-only, now with other arguments
        (_started("read_clock", {"now": 1.0}, None), "runs"),  # an older journal, the same read-only tool
        (_started("pay", {"amount": 1}, None), "mismatch"),  # an older journal, another tool: unknown
        (_started("pay", {"amount": 1}, True), "mismatch"),  # a side effect that may have happened
    ],
)
async def test_a_pending_read_only_call_runs_with_the_new_arguments_a_pending_effect_is_checked(
    replaying: Any, recorded: dict[str, Any], outcome: str
) -> None:
    ctx, _ = await replaying([recorded])
    if outcome == "mismatch":
        with pytest.raises(ReplayMismatch):
            await ctx.call_tool(read_clock, now=2.0)
        assert _runs == []
        return
    assert await ctx.call_tool(read_clock, now=2.0) == 2.0
    assert _runs == ["read 2.0"]


@pytest.mark.anyio
async def test_an_effect_after_a_pending_read_is_a_first_run_not_a_verify(replaying: Any) -> None:
    ctx, _ = await replaying([_started("read_clock", {"now": 1.0}, False)])
    assert await ctx.call_tool(ship, now=2.0) == "shipped"
    assert _runs == ["ship 2.0"]  # nothing of it started before: verify is not asked
    same, _ = await replaying([_started("ship", {"now": 2.0}, True)])
    assert await same.call_tool(ship, now=2.0) == "shipped"
    assert _runs == ["ship 2.0", "verify", "ship 2.0"]  # a pending effect still goes through verify
