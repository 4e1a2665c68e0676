"""What the recovery scan says about expected outcomes, and that it never follows a symlinked
session file.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from agentlife._journal._recovery import scan_for_resume
from agentlife._journal._writer import list_sessions

# -- a fresh job does not warn ---------------------------------------------------------------------------


def test_scan_says_which_outcomes_are_expected(tmp_path: Path) -> None:
    sessions = tmp_path / "s"
    assert scan_for_resume(sessions, None).expected  # fresh job: no directory yet
    sessions.mkdir()
    assert scan_for_resume(sessions, None).expected  # fresh job: no files
    assert not scan_for_resume(sessions, "c1").expected  # a checkpoint but no journal: data lost
    marker = {"v": 1, "ts": 1.0, "seq": 0, "type": "CHECKPOINT_WRITTEN", "step": 2, "checkpoint_id": "c2"}
    (sessions / "session_0001_1.jsonl").write_bytes(orjson.dumps(marker) + b"\n")
    killed = scan_for_resume(sessions, "c3", checkpoint_step=3)  # killed between commit and marker
    assert not killed.found and killed.expected
    (sessions / "session_0001_1.jsonl").write_bytes(b"garbage\n")
    assert not scan_for_resume(sessions, "c3", checkpoint_step=3).expected


# -- data-dir containment --------------------------------------------------------------------------------


def test_the_recovery_scan_does_not_follow_a_symlinked_session_file(tmp_path: Path) -> None:
    secret = tmp_path / "elsewhere.jsonl"
    secret.write_bytes(b'{"v":1,"ts":1,"seq":0,"type":"CHECKPOINT_WRITTEN","checkpoint_id":null}\n')
    sessions = tmp_path / "sessions" / "j"
    sessions.mkdir(parents=True)
    (sessions / "session_0001_1.jsonl").symlink_to(secret)
    assert list_sessions(sessions) == []
    assert not scan_for_resume(sessions, None).found
