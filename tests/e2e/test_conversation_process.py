"""``ctx.conversation``: append-only rows beside the checkpoint, rebuilt exactly on resume, on both stores."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from procs import agent_env, json_lines, run_cli

pytestmark = pytest.mark.anyio

CHAT = "agents.journal_agents:ChatAgent"


# Each way of editing stored message 1 by hand: a forged message, bytes that are not JSON, JSON that is
# not a message, and the same text stored as TEXT (what the sqlite3 shell writes for a quoted string).
_EDITS = {
    "forged message": b'{"role":"user","content":"forged"}',
    "not JSON": b"not json{",
    "not an object": b"[1, 2]",
    "TEXT, not a BLOB": "not json",
}


def test_a_hand_edited_row_refuses_boot_like_every_other_tampering(tmp_path: Path) -> None:
    outcomes = {}
    for edit, value in _EDITS.items():
        env = agent_env(
            tmp_path / edit.replace(" ", "_"), AGENTLIFE_JOB_ID="job-c", TEST_MARKER_DIR=str(tmp_path)
        )
        first = run_cli("run", CHAT, env={**env, "AGENTLIFE_ATTEMPT": "1"})
        assert first.returncode == 1, first.stdout[-2000:]  # crashed at step 3: checkpoint of step 2
        conn = sqlite3.connect(Path(env["AGENTLIFE_DATA_DIR"]) / "agentlife.db")
        conn.execute("UPDATE conversation SET message = ? WHERE job_id = 'job-c' AND seq = 1", (value,))
        conn.commit()
        conn.close()
        again = run_cli("run", CHAT, env={**env, "AGENTLIFE_ATTEMPT": "2"})
        errors = [line["msg"] for line in json_lines(again.stdout) if line["level"] == "ERROR"]
        outcomes[edit] = (again.returncode, tuple(errors), again.stderr)
    assert set(outcomes.values()) == {
        (1, ("fatal: job job-c: the stored conversation does not match the checkpoint's digest",), "")
    }, outcomes
