"""The journal's write side: buffering, write-ahead durability, group commit, periodic flush, closing."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from agentlife._exceptions import ConfigError
from agentlife._journal._recovery import read_events
from agentlife._journal._writer import (
    EventType,
    Journal,
    args_digest,
    job_session_dir,
    list_sessions,
    session_path,
)
from agentlife._redact import Redactor


def lines_on_disk(path: Path) -> list[dict[str, Any]]:
    """Read the file through a separate handle, as another process would."""
    with open(path, "rb") as f:
        return [orjson.loads(line) for line in f.read().splitlines()]


async def wait_until(predicate: Any, timeout: float = 15.0) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.01)


# -- paths -------------------------------------------------------------------------------------------------


def test_session_path_format(tmp_path: Path) -> None:
    assert session_path(tmp_path, 3, 1700000000123) == tmp_path / "session_0003_1700000000123.jsonl"
    assert session_path(tmp_path, 12345, 7).name == "session_12345_7.jsonl"


def test_list_sessions_orders_by_attempt_then_time_and_ignores_other_files(tmp_path: Path) -> None:
    names = [
        "session_0002_100.jsonl",
        "session_0001_900.jsonl",
        "session_10000_5.jsonl",  # attempt 10000 sorts after 0002 even though "1" < "0" is false as text
        "session_0002_99.jsonl",
        "notes.txt",
        "session_0001_abc.jsonl",
        "session_01_5.jsonl",
        "session_0003_1.jsonl.tmp",
    ]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "session_0004_1.jsonl").mkdir()
    got = [p.name for p in list_sessions(tmp_path)]
    assert got == [
        "session_0001_900.jsonl",
        "session_0002_99.jsonl",
        "session_0002_100.jsonl",
        "session_10000_5.jsonl",
    ]
    assert list_sessions(tmp_path / "missing") == []


def test_job_session_dir_refuses_paths_that_leave_the_data_dir(tmp_path: Path) -> None:
    assert job_session_dir(tmp_path, "job-1") == tmp_path / "sessions" / "job-1"
    for bad in ("../etc", "a/b", "", ".."):
        with pytest.raises(ConfigError):
            job_session_dir(tmp_path, bad)


def test_create_makes_the_directory_and_never_reuses_a_name(tmp_path: Path) -> None:
    session_dir = tmp_path / "sessions" / "job-1"
    first = Journal.create(session_dir, 1, unix_ms=1000)
    second = Journal.create(session_dir, 1, unix_ms=1000)
    try:
        assert first.path.name == "session_0001_1000.jsonl"
        assert second.path.name == "session_0001_1001.jsonl"
        assert (first.path.stat().st_mode & 0o777) == 0o600
    finally:
        for journal in (first, second):
            anyio.run(journal.aclose)


# -- appending ---------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_round_trip_with_version_time_and_seq(tmp_path: Path) -> None:
    before = time.time()
    journal = Journal.create(tmp_path, 2)
    seqs = [
        journal.append(EventType.SESSION_STARTED, job_id="j", agent_id="a", attempt=2, pid=os.getpid()),
        journal.append(EventType.LIFECYCLE, **{"from": "BOOTING", "to": "HYDRATING"}),
        journal.append(EventType.STEP_STARTED, step=0),
        journal.append(
            EventType.LLM_COMPLETED, step=0, call=0, response={"text": "hé ✓"}, usage={"input_tokens": 3}
        ),
    ]
    await journal.aclose()
    events = list(read_events(journal.path))
    assert seqs == [0, 1, 2, 3]
    assert [e["seq"] for e in events] == [0, 1, 2, 3]
    assert all(e["v"] == 1 and isinstance(e["ts"], float) for e in events)
    assert all(before <= e["ts"] <= time.time() for e in events)
    assert events[1]["from"] == "BOOTING"
    assert events[1]["to"] == "HYDRATING"
    assert events[3]["response"] == {"text": "hé ✓"}
    assert journal.events_written == 4


@pytest.mark.anyio
async def test_seq_counts_per_file(tmp_path: Path) -> None:
    one, two = Journal.create(tmp_path, 1), Journal.create(tmp_path, 2)
    for _ in range(3):
        one.append(EventType.STEP_STARTED, step=0)
    assert two.append(EventType.STEP_STARTED, step=0) == 0
    await one.aclose()
    await two.aclose()
    assert [e["seq"] for e in lines_on_disk(one.path)] == [0, 1, 2]
    assert [e["seq"] for e in lines_on_disk(two.path)] == [0]


@pytest.mark.anyio
async def test_append_only_buffers(tmp_path: Path) -> None:
    journal = Journal.create(tmp_path, 1)
    for step in range(5):
        journal.append(EventType.STEP_STARTED, step=step)
    assert journal.path.stat().st_size == 0
    assert journal.events_buffered == 5
    assert journal.fsync_count == 0
    await journal.flush(fsync=False)
    assert len(lines_on_disk(journal.path)) == 5
    assert journal.events_buffered == 0
    assert journal.fsync_count == 0
    await journal.aclose()


@pytest.mark.anyio
async def test_reserved_field_names_are_refused(tmp_path: Path) -> None:
    journal = Journal.create(tmp_path, 1)
    with pytest.raises(ValueError, match="seq"):
        journal.append(EventType.STEP_STARTED, seq=4)
    with pytest.raises(ValueError, match="ts"):
        journal.append(EventType.STEP_STARTED, ts=1.0)
    await journal.aclose()
    assert journal.events_written == 0


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no")


@pytest.mark.anyio
async def test_values_orjson_cannot_serialise_never_crash(tmp_path: Path) -> None:
    journal = Journal.create(tmp_path, 1)
    cyclic: list[Any] = [1]
    cyclic.append(cyclic)
    journal.append(EventType.TOOL_COMPLETED, step=0, call=0, invocation_id="j/0/0", result=Path("/x/y"))
    journal.append(EventType.TOOL_COMPLETED, step=0, call=1, invocation_id="j/0/1", result=2**100)
    journal.append(EventType.TOOL_COMPLETED, step=0, call=2, invocation_id="j/0/2", result=cyclic)
    journal.append(EventType.TOOL_COMPLETED, step=0, call=3, invocation_id="j/0/3", result={1: Unprintable()})
    journal.append(EventType.TOOL_COMPLETED, step=0, call=4, invocation_id="j/0/4", result=math.nan)
    await journal.aclose()
    results = [e["result"] for e in lines_on_disk(journal.path)]
    assert results[0] == "/x/y"
    assert results[1] == str(2**100)
    assert results[2][0] == 1
    assert isinstance(results[2][1], list)
    assert results[3] == {"1": "<unprintable Unprintable>"}
    assert results[4] is None


@pytest.mark.anyio
async def test_redactor_masks_secrets_before_they_reach_the_file(tmp_path: Path) -> None:
    secret = "sk-ant-api03-abcdefghijklmnop"
    journal = Journal.create(tmp_path, 1, redactor=Redactor([secret]))
    journal.append(
        EventType.TOOL_COMPLETED, step=0, call=0, invocation_id="j/0/0", result={"echo": f"key {secret}"}
    )
    await journal.aclose()
    text = journal.path.read_text()
    assert secret not in text
    assert lines_on_disk(journal.path)[0]["result"] == {"echo": "key ***"}


def test_args_digest_is_key_order_independent_and_sensitive_to_values() -> None:
    a = args_digest({"path": "README.md", "mode": "r"})
    assert a == args_digest({"mode": "r", "path": "README.md"})
    assert a != args_digest({"mode": "w", "path": "README.md"})
    assert len(a) == 64
    assert int(a, 16) >= 0
    assert len(args_digest({"odd": object(), 3: 2**80})) == 64


# -- write-ahead and group commit ----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_append_durable_is_on_disk_when_it_returns(tmp_path: Path) -> None:
    journal = Journal.create(tmp_path, 1)
    journal.append(EventType.STEP_STARTED, step=0)  # buffered before: must go out with the durable one
    seq = await journal.append_durable(
        EventType.TOOL_STARTED, step=0, call=0, invocation_id="j/0/0", tool="kubectl_apply", args_digest="d"
    )
    on_disk = lines_on_disk(journal.path)
    assert [e["seq"] for e in on_disk] == [0, seq]
    assert on_disk[1]["type"] == "TOOL_STARTED"
    assert journal.fsync_count == 1
    await journal.append_durable(EventType.TOOL_COMPLETED, step=0, call=0, invocation_id="j/0/0", result="ok")
    assert journal.fsync_count == 2
    assert lines_on_disk(journal.path)[-1]["result"] == "ok"
    await journal.aclose()


@pytest.mark.anyio
async def test_concurrent_durable_appends_share_fsyncs(tmp_path: Path) -> None:
    journal = Journal.create(tmp_path, 1)
    seqs: list[int] = []

    async def tool_started(call: int) -> None:
        seqs.append(await journal.append_durable(EventType.TOOL_STARTED, step=0, call=call, tool="t"))

    async with anyio.create_task_group() as tg:
        for call in range(16):
            tg.start_soon(tool_started, call)
    assert sorted(seqs) == list(range(16))
    assert journal.fsync_count <= 4, journal.fsync_count
    assert sorted(e["call"] for e in lines_on_disk(journal.path)) == list(range(16))
    await journal.aclose()


@pytest.mark.anyio
async def test_flush_fsyncs_only_when_asked_and_only_when_needed(tmp_path: Path) -> None:
    journal = Journal.create(tmp_path, 1)
    await journal.flush()
    assert journal.fsync_count == 0  # nothing to sync
    journal.append(EventType.STEP_STARTED, step=0)
    await journal.flush(fsync=False)
    assert journal.fsync_count == 0
    await journal.flush()  # written but not yet synced: one fsync
    assert journal.fsync_count == 1
    await journal.flush()
    assert journal.fsync_count == 1
    await journal.aclose()


@pytest.mark.anyio
async def test_durable_append_of_a_cancelled_caller_is_not_lost(tmp_path: Path) -> None:
    journal = Journal.create(tmp_path, 1)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await journal.append_durable(EventType.TOOL_STARTED, step=0, call=0, tool="t")
    await journal.flush()
    assert [e["type"] for e in lines_on_disk(journal.path)] == ["TOOL_STARTED"]
    await journal.aclose()


# -- periodic flush ------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_periodic_flush_writes_buffered_events_without_fsync(tmp_path: Path) -> None:
    journal = Journal.create(tmp_path, 1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(journal.run_periodic_flush, 0.05)
        for step in range(3):
            journal.append(EventType.STEP_STARTED, step=step)
        await wait_until(lambda: journal.path.stat().st_size > 0 and len(lines_on_disk(journal.path)) == 3)
        assert journal.fsync_count == 0
        journal.append(EventType.STEP_STARTED, step=3)
        await wait_until(lambda: len(lines_on_disk(journal.path)) == 4)
        tg.cancel_scope.cancel()
    await journal.aclose()


@pytest.mark.anyio
async def test_periodic_flush_wakes_early_when_the_buffer_is_large(tmp_path: Path) -> None:
    journal = Journal.create(tmp_path, 1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(journal.run_periodic_flush, 3600.0)
        await anyio.sleep(0)
        blob = "x" * 1024
        for call in range(300):  # ~300 KiB, past the 256 KiB wake threshold
            journal.append(EventType.TOOL_COMPLETED, step=0, call=call, result=blob)
        await wait_until(lambda: journal.events_written >= 250)
        tg.cancel_scope.cancel()
    await journal.aclose()


@pytest.mark.anyio
async def test_periodic_flush_stops_when_the_journal_closes(tmp_path: Path) -> None:
    journal = Journal.create(tmp_path, 1)
    with anyio.fail_after(3):
        async with anyio.create_task_group() as tg:
            tg.start_soon(journal.run_periodic_flush, 3600.0)
            await anyio.sleep(0.01)
            await journal.aclose()  # the flusher returns by itself; the task group then ends


@pytest.mark.anyio
async def test_write_errors_are_raised_to_durable_callers_and_logged_by_the_flusher(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fd = os.open("/dev/full", os.O_WRONLY | os.O_APPEND)  # every write fails with ENOSPC
    journal = Journal(tmp_path / "session_0001_1.jsonl", fd)
    with pytest.raises(OSError, match="No space"):
        await journal.append_durable(EventType.TOOL_STARTED, step=0, call=0, tool="t")
    assert journal.fsync_count == 0
    assert journal.events_written == 0
    async with anyio.create_task_group() as tg:
        tg.start_soon(journal.run_periodic_flush, 0.02)
        await wait_until(lambda: "journal flush" in caplog.text)
        await anyio.sleep(0.1)  # several more failing ticks: logged once, never raised
        tg.cancel_scope.cancel()
    assert caplog.text.count("journal flush") == 1
    with pytest.raises(OSError):
        await journal.aclose()
    assert journal.closed
    await journal.aclose()  # idempotent even after a failed close


@pytest.mark.anyio
@pytest.mark.parametrize("target", ["/dev/full", "file"])
async def test_a_flush_cancelled_as_it_hands_its_lines_to_the_thread_keeps_them(
    tmp_path: Path, target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drain cancels the periodic flusher at any await: the lines it took from the buffer stay its own.

    Here the cancellation lands where the flush hands the buffer to its thread (the thread call's own
    checkpoint), as it did in a loaded run of the flusher test above.
    """
    path = tmp_path / "session_0001_1.jsonl"
    fd = os.open(target if target != "file" else path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    journal = Journal(path, fd)
    journal.append(EventType.LIFECYCLE, **{"from": "BOOTING", "to": "HYDRATING"})
    thread_call = anyio.to_thread.run_sync

    async def cancelled_on_entry(*args: Any, **kwargs: Any) -> Any:
        scope.cancel()
        return await thread_call(*args, **kwargs)

    monkeypatch.setattr(anyio.to_thread, "run_sync", cancelled_on_entry)
    with anyio.CancelScope() as scope:
        if target == "/dev/full":
            with pytest.raises(OSError, match="No space"):
                await journal.flush(fsync=False)
        else:
            await journal.flush(fsync=False)
    monkeypatch.undo()
    if target == "/dev/full":  # the write failed: the line is kept, and closing says so
        with pytest.raises(OSError, match="No space"):
            await journal.aclose()
    else:  # the write went through, and closing fsyncs it
        await journal.aclose()
        assert journal.events_written == 1 and journal.fsync_count == 1
        assert [e["type"] for e in lines_on_disk(path)] == ["LIFECYCLE"]


# -- closing -------------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_aclose_flushes_is_idempotent_and_drops_late_events(tmp_path: Path) -> None:
    journal = Journal.create(tmp_path, 1)
    journal.append(EventType.SESSION_ENDED, exit_code=0)
    await journal.aclose()
    assert journal.closed
    assert journal.fsync_count == 1
    await journal.aclose()
    assert journal.append(EventType.LIFECYCLE, **{"from": "DRAINING", "to": "TERMINATED"}) == -1
    assert journal.events_dropped == 1
    with pytest.raises(RuntimeError, match="closed"):
        await journal.append_durable(EventType.TOOL_STARTED, step=0, call=0, tool="t")
    assert [e["type"] for e in lines_on_disk(journal.path)] == ["SESSION_ENDED"]


@pytest.mark.anyio
async def test_aclose_completes_in_a_shielded_scope_under_cancellation(tmp_path: Path) -> None:
    journal = Journal.create(tmp_path, 1)
    journal.append(EventType.DRAIN_STARTED, reason="SIGTERM")
    with anyio.CancelScope() as outer:
        outer.cancel()
        with anyio.CancelScope(shield=True), anyio.fail_after(2):
            await journal.aclose()
    assert journal.closed
    assert lines_on_disk(journal.path)[0]["reason"] == "SIGTERM"


@pytest.mark.anyio
async def test_a_durable_append_queued_behind_aclose_is_synced_by_it(tmp_path: Path) -> None:
    journal = Journal.create(tmp_path, 1)
    seqs: list[int] = []

    async def durable(call: int) -> None:
        seqs.append(await journal.append_durable(EventType.TOOL_STARTED, step=0, call=call, tool="t"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(durable, 0)  # holds the I/O lock first
        await anyio.sleep(0)
        tg.start_soon(journal.aclose)  # queues for the lock
        await anyio.sleep(0)
        tg.start_soon(durable, 1)  # queues behind aclose, which writes and syncs its line
    assert sorted(seqs) == [0, 1]
    assert journal.closed
    assert [e["call"] for e in lines_on_disk(journal.path)] == [0, 1]


@pytest.mark.anyio
async def test_async_context_manager_closes(tmp_path: Path) -> None:
    async with Journal.create(tmp_path, 1) as journal:
        journal.append(EventType.STEP_STARTED, step=0)
    assert journal.closed
    assert len(lines_on_disk(journal.path)) == 1


@pytest.mark.anyio
async def test_carry_forward_keeps_fields_and_original_time(tmp_path: Path) -> None:
    journal = Journal.create(tmp_path, 2)
    old = [
        {"v": 1, "ts": 100.5, "seq": 7, "type": "STEP_STARTED", "step": 3},
        {
            "v": 1,
            "ts": 101.0,
            "seq": 8,
            "type": "LLM_COMPLETED",
            "step": 3,
            "call": 0,
            "response": {"text": "x"},
        },
        {
            "v": 1,
            "ts": 102.0,
            "seq": 9,
            "type": "TOOL_STARTED",
            "step": 3,
            "call": 1,
            "carried": True,
            "carried_ts": 50.0,
        },
        {"no": "type"},
    ]
    assert journal.carry_forward(old) == 3
    await journal.aclose()
    new = lines_on_disk(journal.path)
    assert [e["seq"] for e in new] == [0, 1, 2]
    assert all(e["carried"] is True for e in new)
    assert [e["carried_ts"] for e in new] == [100.5, 101.0, 50.0]
    assert new[1]["response"] == {"text": "x"}
    assert new[1]["call"] == 0


@pytest.mark.anyio
async def test_lone_surrogates_in_fields_nothing_replays_are_escaped_never_raised(tmp_path: Path) -> None:
    # An exception message, an argument, a key: the line is written with the escape; replayed results
    # never get here (check_replayable refuses them first).
    journal = Journal.create(tmp_path, 1, redactor=Redactor(["sk-secret-value"]))
    journal.append(EventType.TOOL_FAILED, step=0, call=0, error="bad byte \udcff from sk-secret-value")
    journal.append(EventType.RETRY, step=0, call=1, **{"odd\ud800key": ["\ud83d", 1]})
    await journal.append_durable(EventType.TOOL_STARTED, step=0, call=2, tool="t\udfff")
    await journal.aclose()
    first, second, third = lines_on_disk(journal.path)
    assert first["error"] == "bad byte \\udcff from ***"
    assert second["odd\\ud800key"] == ["\\ud83d", 1]
    assert third["tool"] == "t\\udfff"
    assert len(args_digest({"text": "\ud800"})) == 64
    assert args_digest({"text": "\ud800"}) != args_digest({"text": "\ud801"})


@pytest.mark.anyio
async def test_a_secret_inside_a_dataclass_a_set_or_an_objects_str_never_reaches_the_file(
    tmp_path: Path,
) -> None:
    """orjson writes a dataclass itself and anything else it cannot write as its str(): both are masked."""
    import dataclasses

    secret = "sk-secret-in-an-object-0123456789"

    @dataclasses.dataclass
    class Reply:
        text: str
        nested: dict[str, Any]

    class Opaque:
        def __str__(self) -> str:
            return f"Opaque(token={secret})"

    journal = Journal.create(tmp_path, 1, redactor=Redactor([secret]))
    journal.append("TOOL_COMPLETED", step=0, result=Reply(f"key {secret}", {"k": [secret]}))
    journal.append("TOOL_COMPLETED", step=1, result=Opaque(), seen={secret})
    journal.append("TOOL_COMPLETED", step=2, result={2**70: Opaque()})  # the sanitising path too
    await journal.aclose()
    assert secret not in journal.path.read_text()
    first, second, third = lines_on_disk(journal.path)
    assert first["result"] == {"text": "key ***", "nested": {"k": ["***"]}}  # still the fields' object
    assert second["result"].startswith("Opaque(token=***") and "***" in second["seen"]
    assert third["result"][str(2**70)].startswith("Opaque(token=***")


@pytest.mark.anyio
async def test_a_refused_tool_call_is_shown_even_when_its_fields_are_odd(tmp_path: Path) -> None:
    from agentlife._journal._show import format_timeline

    journal = Journal.create(tmp_path, 1, redactor=Redactor(["sk-secret-123"]))
    journal.append("STEP_STARTED", step=0)
    journal.append(
        EventType.TOOL_REFUSED,
        step=0,
        tool="cleanup",
        tool_use_id="toolu_1",
        reason="unusable_arguments",
        error="tool cleanup was not run: the reply was cut off at max_tokens (key sk-secret-123)",
    )
    journal.append("TOOL_REFUSED", step=0, tool=["not", "a", "name"], reason=None, error="x" * 5000)
    journal.append("TOOL_REFUSED")  # written by hand, or by another version: no fields at all
    await journal.aclose()
    shown = format_timeline(journal.path).splitlines()
    refused = [line.strip() for line in shown if "tool call refused" in line]
    assert refused[0].endswith(
        "tool call refused: cleanup [toolu_1], unusable_arguments: 'tool cleanup was not run: the reply "
        "was cut off at max_tokens (key ***)'"
    )
    assert "['not', 'a', 'name'], None: 'xxx" in refused[1] and len(refused[1]) < 300
    assert refused[2].endswith("tool call refused: None, None: None")
    # Inside the step, like the other calls of a step.
    assert all("s      tool call refused" in line for line in shown if "tool call refused" in line)
