"""The journal's read side: tolerant readers, the recovery scan, the replay map and ``journal show``."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from agentlife._cli._journal import register as register_cli
from agentlife._exceptions import ConfigError
from agentlife._journal._recovery import (
    BadLine,
    build_replay,
    iter_lines_reverse,
    read_events,
    scan_for_resume,
)
from agentlife._journal._show import format_timeline
from agentlife._journal._writer import EventType, Journal, session_path

JOB = "job-7"


def line(seq: int, type_: str, **fields: Any) -> bytes:
    return orjson.dumps({"v": 1, "ts": 1000.0 + seq / 10, "seq": seq, "type": type_, **fields}) + b"\n"


def write_session(session_dir: Path, attempt: int, parts: Iterable[bytes], unix_ms: int = 1) -> Path:
    session_dir.mkdir(parents=True, exist_ok=True)
    path = session_path(session_dir, attempt, unix_ms)
    path.write_bytes(b"".join(parts))
    return path


def step_events(step: int, start_seq: int) -> list[bytes]:
    """A step with an LLM call (0), a completed tool (1), a failed tool (2) and a pending tool (3)."""
    s = start_seq
    inv = f"{JOB}/{step}"
    return [
        line(s, "STEP_STARTED", step=step),
        line(s + 1, "LLM_COMPLETED", step=step, call=0, response={"text": "plan"}, usage={"input_tokens": 5}),
        line(
            s + 2,
            "TOOL_STARTED",
            step=step,
            call=1,
            invocation_id=f"{inv}/1",
            tool="read_file",
            args_digest="a",
        ),
        line(s + 3, "TOOL_COMPLETED", step=step, call=1, invocation_id=f"{inv}/1", result="# README"),
        line(
            s + 4,
            "TOOL_STARTED",
            step=step,
            call=2,
            invocation_id=f"{inv}/2",
            tool="kubectl_get",
            args_digest="b",
        ),
        line(
            s + 5,
            "TOOL_FAILED",
            step=step,
            call=2,
            invocation_id=f"{inv}/2",
            tool="kubectl_get",
            error_class="PermanentError",
            error="forbidden",
        ),
        line(
            s + 6,
            "TOOL_STARTED",
            step=step,
            call=3,
            invocation_id=f"{inv}/3",
            tool="git_push",
            args_digest="c",
        ),
    ]


def marker(seq: int, checkpoint_id: str | None, step: int | None = None) -> bytes:
    return line(seq, "CHECKPOINT_WRITTEN", step=step, checkpoint_id=checkpoint_id, crc=1)


def head(seq: int = 0) -> list[bytes]:
    return [
        line(seq, "SESSION_STARTED", job_id=JOB, agent_id="a", attempt=1, pid=1),
        line(seq + 1, "LIFECYCLE", **{"from": "BOOTING", "to": "HYDRATING"}),
    ]


# -- readers -------------------------------------------------------------------------------------------------


def test_read_events_reports_bad_lines_with_numbers(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(
        line(0, "STEP_STARTED", step=0)
        + b"{broken\n"
        + b"[1, 2]\n"
        + b'{"no": "type"}\n'
        + b"\n"
        + line(1, "STEP_STARTED", step=1)
        + b'{"v":1,"ts":1.0,"se'
    )
    items = list(read_events(path))
    assert [type(i).__name__ for i in items] == [
        "dict",
        "BadLine",
        "BadLine",
        "BadLine",
        "BadLine",
        "dict",
        "BadLine",
    ]
    bad = [i for i in items if isinstance(i, BadLine)]
    assert [b.line_no for b in bad] == [2, 3, 4, 5, 7]
    assert "not JSON" in bad[0].reason
    assert "not an event object" in bad[1].reason
    assert "no type" in bad[2].reason
    assert bad[3].reason == "empty line"
    assert bad[4].reason.startswith("torn last line")
    assert bad[0].offset == len(line(0, "STEP_STARTED", step=0))


@pytest.mark.parametrize("chunk_size", [1, 2, 7, 64, 65536])
@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"\n",
        b"a",
        b"a\n",
        b"a\nb",
        b"a\nb\n",
        b"\n\nx\n\n",
        b"x" * 300 + b"\n" + b"y" * 200,
        b"a\r\nb\n",
    ],
)
def test_iter_lines_reverse_matches_a_forward_split(tmp_path: Path, content: bytes, chunk_size: int) -> None:
    path = tmp_path / "f"
    path.write_bytes(content)
    expected = content.split(b"\n")
    if content.endswith(b"\n"):
        expected.pop()
    if content == b"":
        expected = []
    assert list(iter_lines_reverse(path, chunk_size)) == expected[::-1]


# -- the recovery scan ---------------------------------------------------------------------------------------


def test_scan_returns_the_events_after_the_matching_marker(tmp_path: Path) -> None:
    events = step_events(3, 20)
    write_session(
        tmp_path, 1, [*head(), marker(2, "c1", 1), *step_events(2, 3), marker(19, "c2", 2), *events]
    )
    result = scan_for_resume(tmp_path, "c2")
    assert result.found, result.reason
    assert [e["seq"] for e in result.events] == list(range(20, 20 + len(events)))
    assert result.marker is not None
    assert result.marker["checkpoint_id"] == "c2"
    assert result.scanned_lines == len(events) + 1
    assert result.skipped_lines == 0
    assert "found marker 'c2'" in result.reason


def test_scan_never_parses_the_lines_before_the_marker(tmp_path: Path) -> None:
    garbage = [b"\x00\xff not json at all \xfe\n"] * 5000
    after = step_events(0, 1)
    write_session(tmp_path, 1, [*garbage, marker(0, None), *after])
    result = scan_for_resume(tmp_path, None)
    assert result.found, result.reason
    assert result.skipped_lines == 0  # none of the 5000 garbage lines was looked at
    assert result.scanned_lines == len(after) + 1


def test_scan_tolerates_a_torn_last_line(tmp_path: Path) -> None:
    write_session(
        tmp_path, 1, [marker(0, "c1", 0), *step_events(1, 1), b'{"v":1,"ts":1000.9,"seq":8,"type":"TOO']
    )
    result = scan_for_resume(tmp_path, "c1")
    assert result.found
    assert result.skipped_lines == 1
    assert len(result.events) == 7
    assert "1 corrupt lines skipped" in result.reason


def test_scan_skips_and_counts_corrupt_lines_after_the_marker(tmp_path: Path) -> None:
    events = step_events(1, 1)
    write_session(
        tmp_path, 1, [marker(0, "c1", 0), events[0], b"garbage\n", *events[1:4], b"\xff\xfe\n", *events[4:]]
    )
    result = scan_for_resume(tmp_path, "c1")
    assert result.found
    assert result.skipped_lines == 2
    assert [e["seq"] for e in result.events] == list(range(1, 8))


def test_scan_degrades_when_the_directory_or_files_are_missing(tmp_path: Path) -> None:
    missing = scan_for_resume(tmp_path / "nope", "c1")
    assert not missing.found
    assert "does not exist" in missing.reason
    (tmp_path / "unrelated.txt").write_text("x")
    empty = scan_for_resume(tmp_path, "c1")
    assert not empty.found
    assert "no session files" in empty.reason


def test_scan_reads_past_newer_markers_to_an_older_checkpoint(tmp_path: Path) -> None:
    # The store fell back to c1 (c2 failed its CRC): the calls of step 1 are still replayable.
    write_session(
        tmp_path, 1, [marker(0, "c1", 0), *step_events(1, 1), marker(8, "c2", 1), *step_events(2, 9)]
    )
    result = scan_for_resume(tmp_path, "c1")
    assert result.found
    assert result.events[0]["step"] == 1
    assert build_replay(result.events, 1).llm  # step 1's completed LLM call is there to replay


def test_scan_reports_a_marker_mismatch_when_no_file_has_the_marker(tmp_path: Path) -> None:
    write_session(
        tmp_path, 1, [marker(0, "c1", 0), *step_events(1, 1), marker(8, "c2", 1), *step_events(2, 9)]
    )
    result = scan_for_resume(tmp_path, "c0")
    assert not result.found
    assert result.events == []
    assert "mismatch" in result.reason
    assert "'c2'" in result.reason
    assert "'c0'" in result.reason


def test_checkpoint_step_bounds_a_mismatch_to_the_events_after_the_newest_marker(tmp_path: Path) -> None:
    # The process died between committing checkpoint c3 and journaling its marker: c3 is in no file.
    before = [line(i, "RETRY", step=0) for i in range(100, 2100)]
    after = step_events(3, 9)
    older = write_session(tmp_path, 1, [marker(0, "c1", 1), *before, marker(8, "c2", 2), *after], unix_ms=1)
    unbounded = scan_for_resume(tmp_path, "c3")
    assert not unbounded.found
    assert unbounded.scanned_lines == len(before) + len(after) + 2  # read the whole file
    bounded = scan_for_resume(tmp_path, "c3", checkpoint_step=3)
    assert not bounded.found
    assert bounded.scanned_lines == len(after) + 1  # stopped at the marker of step 2
    assert "marker mismatch" in bounded.reason
    assert "'c2'" in bounded.reason
    assert "'c3' (step 3)" in bounded.reason
    assert bounded.path == older
    # a fallback to an older checkpoint still reads past the newer marker
    fallback = scan_for_resume(tmp_path, "c1", checkpoint_step=1)
    assert fallback.found
    assert fallback.events[0]["step"] == 0


def test_checkpoint_step_stops_across_files(tmp_path: Path) -> None:
    write_session(tmp_path, 1, [marker(0, "c1", 1), *step_events(2, 1)], unix_ms=1)
    write_session(tmp_path, 2, head(), unix_ms=2)  # died during hydration: no marker
    result = scan_for_resume(tmp_path, "c5", checkpoint_step=5)
    assert not result.found
    assert result.files_scanned == 2
    assert "step 1" in result.reason


def test_scan_matches_the_null_marker_of_a_fresh_job_only_with_none(tmp_path: Path) -> None:
    write_session(tmp_path, 1, [*head(), marker(2, None), *step_events(0, 3)])
    assert scan_for_resume(tmp_path, None).found
    other = scan_for_resume(tmp_path, "c9")
    assert not other.found
    assert "mismatch" in other.reason


def test_scan_falls_back_to_an_older_file_when_the_newest_has_no_marker(tmp_path: Path) -> None:
    older = write_session(tmp_path, 1, [*head(), marker(2, "c4", 4), *step_events(5, 3)], unix_ms=10)
    write_session(tmp_path, 2, head(), unix_ms=20)  # attempt 2 died during hydration
    result = scan_for_resume(tmp_path, "c4")
    assert result.found, result.reason
    assert result.path == older
    assert result.files_scanned == 2
    assert len(result.events) == 7


def test_scan_passes_over_excluded_files(tmp_path: Path) -> None:
    older = write_session(tmp_path, 1, [marker(0, "c1", 0), *step_events(1, 1)], unix_ms=10)
    own = write_session(tmp_path, 2, [marker(0, "zzz", 0)], unix_ms=20)
    assert scan_for_resume(tmp_path, "c1").files_scanned == 2
    result = scan_for_resume(tmp_path, "c1", exclude=[own])
    assert result.found
    assert result.path == older
    assert result.files_scanned == 1


def test_scan_without_any_marker_says_so(tmp_path: Path) -> None:
    write_session(tmp_path, 1, head())
    result = scan_for_resume(tmp_path, "c1")
    assert not result.found
    assert "no checkpoint marker in 1 session file" in result.reason


def test_scan_gives_up_when_its_budget_is_spent(tmp_path: Path) -> None:
    write_session(tmp_path, 1, [marker(0, "c1", 0), *[line(i, "RETRY", step=1) for i in range(1, 20_001)]])
    result = scan_for_resume(tmp_path, "c1", budget_seconds=0.0)
    assert not result.found
    assert "budget" in result.reason
    assert result.scanned_lines < 20_001


# -- replay --------------------------------------------------------------------------------------------------


def test_build_replay_statuses() -> None:
    events = [orjson.loads(raw) for raw in step_events(4, 1)]
    events.append(orjson.loads(line(50, "LLM_COMPLETED", step=5, call=0, response={"text": "other step"})))
    replay = build_replay(events, 4)
    assert replay.llm_result(0) == {"text": "plan"}
    assert replay.llm_result(9) is None
    completed, failed, pending = replay.tool(1), replay.tool(2), replay.tool(3)
    assert completed is not None
    assert completed.status == "completed"
    assert completed.result == "# README"
    assert completed.tool == "read_file"
    assert completed.invocation_id == f"{JOB}/4/1"
    assert failed is not None
    assert failed.status == "failed"
    assert (failed.error_class, failed.error) == ("PermanentError", "forbidden")
    assert pending is not None
    assert pending.status == "pending"
    assert pending.tool == "git_push"
    assert pending.args_digest == "c"
    assert replay.tool(0) is None
    assert replay.max_call == 3
    assert [e["seq"] for e in replay.events_for_carry_forward()] == list(range(1, 8))
    assert build_replay(events, 5).llm_result(0) == {"text": "other step"}
    assert build_replay(events, 6).max_call == -1


def test_build_replay_a_completion_is_final_and_a_retry_after_failure_is_pending() -> None:
    def ev(type_: str, call: int, **fields: Any) -> dict[str, Any]:
        return {"type": type_, "step": 0, "call": call, "invocation_id": f"j/0/{call}", **fields}

    events = [
        ev("TOOL_STARTED", 0, tool="t"),
        ev("TOOL_COMPLETED", 0, result=1),
        ev("TOOL_STARTED", 0, tool="t"),  # must not undo the completion
        ev("TOOL_STARTED", 1, tool="t"),
        ev("TOOL_FAILED", 1, error_class="ToolTimeout", error="slow"),
        ev("TOOL_STARTED", 1, tool="t"),  # retried, then the process died
        ev("LLM_COMPLETED", 2, response={"text": "first"}),
        ev("LLM_COMPLETED", 2, response={"text": "second"}),
        {"type": "TOOL_COMPLETED", "step": 0, "call": "3", "result": "call is not an int"},
        {"type": "TOOL_COMPLETED", "step": True, "call": 4, "result": "step is a bool"},
    ]
    replay = build_replay(events, 0)
    first, second = replay.tool(0), replay.tool(1)
    assert first is not None
    assert first.status == "completed"
    assert first.result == 1
    assert second is not None
    assert second.status == "pending"
    assert replay.llm_result(2) == {"text": "second"}
    assert replay.max_call == 2


@pytest.mark.anyio
async def test_resume_flow_across_two_attempts(tmp_path: Path) -> None:
    """Attempt 1 dies mid-step; attempt 2 replays and carries forward; attempt 3 finds the same replay."""
    one = Journal.create(tmp_path, 1, unix_ms=100)
    one.append(EventType.CHECKPOINT_WRITTEN, step=None, checkpoint_id=None, crc=None)
    one.append(EventType.STEP_STARTED, step=0)
    one.append(EventType.LLM_COMPLETED, step=0, call=0, response={"text": "hi"}, usage={})
    await one.append_durable(
        EventType.TOOL_STARTED, step=0, call=1, invocation_id="j/0/1", tool="t", args_digest="x"
    )
    await one.aclose()  # the process "dies" here: call 1 is pending

    two = Journal.create(tmp_path, 2, unix_ms=200)
    scan = await anyio.to_thread.run_sync(lambda: scan_for_resume(tmp_path, None, exclude=[two.path]))
    assert scan.found, scan.reason
    replay = build_replay(scan.events, 0)
    record = replay.tool(1)
    assert record is not None
    assert record.status == "pending"
    two.append(EventType.CHECKPOINT_WRITTEN, step=None, checkpoint_id=None, crc=None)
    two.carry_forward(replay.events_for_carry_forward())
    await two.append_durable(EventType.TOOL_COMPLETED, step=0, call=1, invocation_id="j/0/1", result="done")
    await two.aclose()

    again = scan_for_resume(tmp_path, None)
    assert again.path == two.path
    replay2 = build_replay(again.events, 0)
    assert replay2.llm_result(0) == {"text": "hi"}
    record2 = replay2.tool(1)
    assert record2 is not None
    assert record2.status == "completed"
    assert record2.result == "done"


# -- journal show --------------------------------------------------------------------------------------------


def timeline_file(tmp_path: Path, tail: bytes = b"") -> Path:
    parts = [
        *head(),
        marker(2, "c4", 4),
        line(3, "LIFECYCLE", **{"from": "HYDRATING", "to": "READY"}),
        line(4, "STEP_STARTED", step=5),
        line(5, "LLM_STARTED", step=5, call=0, model="claude-x"),
        line(
            17,
            "LLM_COMPLETED",
            step=5,
            call=0,
            response={"text": "ok", "stop_reason": "end_turn"},
            usage={"input_tokens": 1200, "output_tokens": 30},
        ),
        line(
            18,
            "TOOL_STARTED",
            step=5,
            call=1,
            invocation_id=f"{JOB}/5/1",
            tool="kubectl_apply",
            args_digest="z",
        ),
        line(19, "RETRY", step=5, call=1, kind="tool", error_class="ToolTimeout", error="slow", delay=1.5),
        line(23, "TOOL_COMPLETED", step=5, call=1, invocation_id=f"{JOB}/5/1", result="applied"),
        marker(25, "c5", 5),
        line(26, "STEP_STARTED", step=6),
        line(
            27, "TOOL_STARTED", step=6, call=0, invocation_id=f"{JOB}/6/0", tool="git_push", args_digest="q"
        ),
        line(28, "DRAIN_STARTED", reason="SIGTERM"),
        line(29, "SESSION_ENDED", exit_code=143),
    ]
    return write_session(tmp_path, 1, [*parts, tail])


def test_format_timeline_shows_relative_times_durations_and_outcomes(tmp_path: Path) -> None:
    text = format_timeline(timeline_file(tmp_path))
    assert f"job {JOB}" in text
    assert "ended with exit code 143" in text
    assert "+0.000s" in text
    assert "state HYDRATING -> READY" in text
    assert "step 5 started (2.100 s, checkpointed)" in text  # seq 4 -> 25 at 0.1 s per seq
    assert "llm call 0 claude-x: completed, 1200 in / 30 out" in text
    assert "(1.200 s)" in text
    assert f"tool call 1 kubectl_apply [{JOB}/5/1]: completed -> 'applied' (500.0 ms)" in text
    assert "retry tool call 1 after ToolTimeout" in text
    assert "checkpoint c5 after step 5" in text
    assert "pending (no completion recorded)" in text
    assert "drain started: SIGTERM" in text
    assert "session ended, exit code 143" in text
    assert "corrupt" not in text
    # a paired completion is shown on its start line, not twice
    assert text.count("applied") == 1


def test_format_timeline_on_a_torn_and_corrupt_file(tmp_path: Path) -> None:
    path = timeline_file(tmp_path, tail=b'{"v":1,"ts":1003.0,"seq":30,"type":"STEP_ST')
    with open(path, "r+b") as f:
        data = f.read()
        f.seek(0)
        f.write(data.replace(b'"LIFECYCLE","from":"HYDRATING"', b'"LIFECYCLE"\x00"from":"HYDRATING"'))
    text = format_timeline(path)
    assert "line 4: corrupt, skipped" in text
    assert "line 16: corrupt, skipped (torn last line" in text
    assert "2 corrupt lines" in text
    assert "session ended, exit code 143" in text


def test_format_timeline_of_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        format_timeline(tmp_path / "nope.jsonl")
    with pytest.raises(ConfigError, match="directory"):
        format_timeline(tmp_path)


def make_cli() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentlife")
    register_cli(parser.add_subparsers(dest="command", required=True))
    return parser


def test_cli_journal_show_prints_the_timeline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = timeline_file(tmp_path)
    args = make_cli().parse_args(["journal", "show", str(path)])
    assert args.handler(args) == 0
    out = capsys.readouterr().out
    assert out == format_timeline(path) + "\n"


def test_cli_journal_show_missing_file_and_missing_subcommand(tmp_path: Path) -> None:
    args = make_cli().parse_args(["journal", "show", str(tmp_path / "gone.jsonl")])
    with pytest.raises(ConfigError) as info:
        args.handler(args)
    assert "\n" not in str(info.value)
    with pytest.raises(SystemExit) as exit_info:
        make_cli().parse_args(["journal"])
    assert exit_info.value.code == 2


def test_an_unfinished_step_is_marked(tmp_path: Path) -> None:
    only = write_session(tmp_path / "a", 1, [line(0, "STEP_STARTED", step=0)])
    assert "step 0 started (unfinished)" in format_timeline(only)
    later = write_session(
        tmp_path / "b", 1, [line(0, "STEP_STARTED", step=0), line(5, "DRAIN_STARTED", reason="x")]
    )
    assert "step 0 started (unfinished, at least 500.0 ms)" in format_timeline(later)
    assert "1 event;" in format_timeline(only)


def test_format_timeline_survives_fields_of_the_wrong_type(tmp_path: Path) -> None:
    odd: list[Mapping[str, Any]] = [
        {"type": "SESSION_STARTED", "ts": "yesterday", "job_id": ["x"]},
        {"type": "STEP_STARTED", "ts": 5.0, "step": {"a": 1}},
        {"type": "LLM_COMPLETED", "ts": 6.0, "call": None, "response": "just text", "usage": 7},
        {"type": "TOOL_STARTED", "ts": 7.0, "call": [1], "invocation_id": 3},
        {"type": "TOOL_COMPLETED", "ts": 8.0, "call": [1], "invocation_id": 3, "result": {"deep": [1, 2, 3]}},
        {"type": "CHECKPOINT_WRITTEN", "ts": float("inf"), "crc": True, "step": {"a": 1}},
        {"type": "RETRY", "ts": 9, "delay": "soon"},
        {"type": "SOMETHING_NEW", "ts": 10.0, "x": 1},
    ]
    path = tmp_path / "odd.jsonl"
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in odd))
    text = format_timeline(path)
    assert "SOMETHING_NEW x=1" in text
    assert "step {'a': 1} started" in text
