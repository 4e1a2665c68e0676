"""The journal's read side: tolerant readers, the recovery scan, the replay map and ``journal show``."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from agentlife._journal._show import format_timeline
from agentlife._journal._writer import session_path

JOB = "job-7"


def line(seq: int, type_: str, **fields: Any) -> bytes:
    return orjson.dumps({"v": 1, "ts": 1000.0 + seq / 10, "seq": seq, "type": type_, **fields}) + b"\n"


def write_session(session_dir: Path, attempt: int, parts: Iterable[bytes], unix_ms: int = 1) -> Path:
    session_dir.mkdir(parents=True, exist_ok=True)
    path = session_path(session_dir, attempt, unix_ms)
    path.write_bytes(b"".join(parts))
    return path


def marker(seq: int, checkpoint_id: str | None, step: int | None = None) -> bytes:
    return line(seq, "CHECKPOINT_WRITTEN", step=step, checkpoint_id=checkpoint_id, crc=1)


def head(seq: int = 0) -> list[bytes]:
    return [
        line(seq, "SESSION_STARTED", job_id=JOB, agent_id="a", attempt=1, pid=1),
        line(seq + 1, "LIFECYCLE", **{"from": "BOOTING", "to": "HYDRATING"}),
    ]


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


def test_python_m_agentlife_journal_show(tmp_path: Path) -> None:
    path = timeline_file(tmp_path, tail=b'{"v":1,"ts"')
    shown = subprocess.run(
        [sys.executable, "-m", "agentlife", "journal", "show", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == format_timeline(path) + "\n"
    missing = subprocess.run(
        [sys.executable, "-m", "agentlife", "journal", "show", str(tmp_path / "gone.jsonl")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"agentlife: error: journal file not found: {tmp_path / 'gone.jsonl'}"
    ]
