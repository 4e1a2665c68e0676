"""The fake model servers as processes (``python -m agentlife.testing``); a real agent on the OpenAI one."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from agentlife.testing._fake_cli import load_script


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)  # closes the pipes


def test_the_script_format_builds_every_kind_of_turn(tmp_path: Path) -> None:
    script = tmp_path / "turns.json"
    script.write_text(
        orjson.dumps(
            [
                "plain",
                {
                    "text": "chunked",
                    "chunks": 3,
                    "delay": 0.01,
                    "usage": {"input_tokens": 5, "output_tokens": 2},
                },
                {"tool_use": {"name": "search", "input": {"q": "x"}, "id": "t1"}, "text": "Looking."},
                {"thinking": "Hmm", "text": "Hi", "pause": 0.1},
                {"stall_after_chunks": 1},
                {"trickle": 0.2},
                {"never_answer": True},
                {"http_error": 503, "message": "busy"},
            ]
        ).decode()
    )
    turns = load_script(script)
    assert isinstance(turns, list)
    assert [t.after for t in turns] == ["end", "end", "end", "end", "stall", "trickle", "end", "end"]
    assert turns[6].answer is False and turns[7].status == 503 and turns[7].error_message == "busy"
    assert turns[5].trickle_interval == 0.2
    assert any(e.event.get("content_block", {}).get("id") == "t1" for e in turns[2].events)
