"""The judge of ``benchmarks/chaos.py`` on synthetic evidence: each bad outcome is counted (a judge
that never fails proves nothing).
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import chaos


def _job(tmp_path: Path, result_steps: list[list[Any]], effects: list[str], deliveries: list[str]) -> Path:
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    (evidence / "effects").write_text("".join(f"{line}\n" for line in effects))
    (evidence / "deliveries").write_text("".join(f"{line}\n" for line in deliveries))
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    # Attempt 1 committed the checkpoint of step 1 (a journal marker), so step 1's state must survive.
    marker = {"v": 1, "ts": 0.0, "seq": 0, "type": "CHECKPOINT_WRITTEN", "step": 1, "checkpoint_id": "c1"}
    (sessions / "session_0001_1.jsonl").write_bytes(orjson.dumps(marker) + b"\n")
    return evidence


def test_the_judge_counts_each_bad_outcome(tmp_path: Path) -> None:
    evidence = _job(
        tmp_path,
        [],
        effects=["j/0/1 1 10", "j/0/1 2 11", "j/1/1 2 11"],  # step 0's effect ran twice; step 2's never
        deliveries=["j 2 11", "j 3 12"],  # attempt 2 delivered, was not killed, and 3 delivered again
    )
    result = {"steps": [[0, 1, "r", 1], [1, 2, "r", 1], [2, 2, "r", 1], [2, 3, "r", 1]]}
    verdict = chaos.analyse_job("j", 4, result, evidence, tmp_path / "sessions", next_steps=[2, 1, 4])
    assert verdict.duplicated_effects == 1
    assert verdict.duplicate_deliveries == 1
    assert verdict.missing_effects == 1  # step 2 ran (listed) but its effect is not recorded
    # Step 1 was committed by attempt 1 but re-run by attempt 2; step 2 is listed twice; step 3 never;
    # next_step went back from 2 to 1.
    assert verdict.lost_steps == {1, 2, 3}

    for excuse in ({"sigkilled_attempts": [2]}, {"unrecorded_attempts": [2]}):  # the at-least-once window
        excused = chaos.analyse_job("j", 4, result, evidence, tmp_path / "sessions", **excuse)
        assert excused.duplicate_deliveries == 0 and excused.excused_deliveries == 1


def test_a_slow_or_bad_drain_is_counted(tmp_path: Path) -> None:
    runner = chaos.Chaos(chaos.ChaosSettings(), None, "", tmp_path)  # type: ignore[arg-type]
    report = chaos.Report()

    def drained(seconds: float, code: int) -> chaos.RunRecord:
        record = chaos.RunRecord("j", 1, chaos.Fault("sigterm_tool"), landed=["sigterm_tool"])
        record.sigterms, record.exit_at, record.exit_code = [100.0], 100.0 + seconds, code
        return record

    for seconds, code in ((0.5, 143), (chaos.DRAIN_BUDGET + 0.2, 143), (0.5, 1), (0.5, 0)):
        chaos._judge_drain(runner, report, drained(seconds, code))
    assert (report.drains, report.drains_over_budget) == (4, 2)
    runner.outages.append(chaos.Outage(99.0, 101.0))
    chaos._judge_drain(runner, report, drained(0.5, 1))  # PostgreSQL was down: exit 1 is honest
    assert (report.drains_over_budget, report.excused_exit_1) == (2, 1)
    killed = drained(0.5, -signal.SIGKILL)
    killed.killed = True
    chaos._judge_drain(runner, report, killed)  # a SIGKILL is not a drain
    assert report.drains == 5
