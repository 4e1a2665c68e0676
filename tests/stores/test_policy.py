"""Failure policy helpers: retry decisions, circuit breaker, phase budget and its CLI."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from agentlife import ConfigError
from agentlife._cli._budget import register as register_cli
from agentlife._journal._writer import Journal
from agentlife._redact import Redactor
from agentlife.constants import Constants
from agentlife.stores import SQLiteStore
from agentlife.stores._policy import (
    DEFAULT_SAFETY_BUFFER_SECONDS,
    CircuitBreaker,
    CircuitState,
    CrashRecord,
    RetryDecision,
    crash_backoff_schedule,
    derive_total_timeout,
    p95_from_journals,
    should_retry_after_crash,
)

# -- should_retry_after_crash ---------------------------------------------------------------------------


def crash(error_class: str = "ValueError", message: str = "boom", exit_code: int = 1) -> dict[str, Any]:
    return {"exit_code": exit_code, "error_class": error_class, "message": message, "at": 1.0, "attempt": 1}


def oom() -> dict[str, Any]:
    return crash("OOMKilled", "killed by SIGKILL (OOM)", 137)


A, B, C, D, E = (crash(message=m) for m in "abcde")

# (id, history, budget, consumed, retry, delay, status, footprint_reduced, reason fragment)
CASES = [
    ("first crash", [A], None, None, True, 5.0, "RETRYING", False, "retry 1 of 4 in 5 s after ValueError: a"),
    ("second crash", [A, B], None, None, True, 60.0, "RETRYING", False, "retry 2 of 4 in 60 s"),
    ("third crash", [A, B, C], None, None, True, 300.0, "RETRYING", False, "in 300 s"),
    ("fourth crash", [A, B, C, D], None, None, True, 1800.0, "RETRYING", False, "in 1800 s"),
    ("fifth crash", [A, B, C, D, E], None, None, False, 0.0, "DEAD_LETTER", False, "crash retries exhausted"),
    ("no record yet", [], None, None, True, 5.0, "RETRYING", False, "retry 1 of 4"),
    ("same error twice", [B, A, A], None, None, True, 300.0, "RETRYING", False, "in 300 s"),
    ("same error 3x", [A, A, A], None, None, False, 0.0, "DEAD_LETTER", False, "same error 3 times in a row"),
    ("same error 3x late", [B, A, A, A], None, None, False, 0.0, "DEAD_LETTER", False, "ValueError: a"),
    ("3x broken", [A, A, B, A], None, None, True, 1800.0, "RETRYING", False, "in 1800 s"),
    ("same class, new messages", [A, B, C], None, None, True, 300.0, "RETRYING", False, "in 300 s"),
    (
        "same message, new classes",
        [crash("KeyError", "x"), crash("ValueError", "x"), crash("KeyError", "x")],
        None, None, True, 300.0, "RETRYING", False, "in 300 s",
    ),
    ("single OOM", [oom()], None, None, True, 5.0, "RETRYING", True, "reduced footprint"),
    ("OOM after a crash", [A, oom()], None, None, True, 60.0, "RETRYING", True, "OOM kill (exit 137)"),
    ("persistent OOM", [oom(), oom()], None, None, False, 0.0, "DEAD_LETTER", False, "persistent OOM"),
    ("OOMs not in a row", [oom(), A, oom()], None, None, True, 300.0, "RETRYING", True, "reduced footprint"),
    ("crash after OOM", [oom(), A], None, None, True, 60.0, "RETRYING", False, "after ValueError: a"),
    (
        "cost budget spent",
        [A], None, {"input": 10, "output": 1, "cost_usd": 5.0},
        False, 0.0, "FAILED", False, "token budget exhausted ($5.00 / $5.00 max)",
    ),
    (
        "row cost budget spent",
        [A], {"max_cost_usd": 0.05}, {"cost_usd": 0.0512},
        False, 0.0, "FAILED", False, "token budget exhausted ($0.0512 / $0.0500 max)",
    ),
    (
        "row token budget spent",
        [A], {"max_input_tokens": 1000}, {"input": 1000, "cost_usd": 0.01},
        False, 0.0, "FAILED", False, "(1000 / 1000 input tokens max)",
    ),
    (
        "budget nearly spent",
        [A], {"max_input_tokens": 1000, "max_cost_usd": 1.0}, {"input": 999, "cost_usd": 0.99},
        True, 5.0, "RETRYING", False, "retry 1 of 4",
    ),
    (
        "budget beats OOM",
        [oom()], None, {"input": 500_000}, False, 0.0, "FAILED", False, "token budget exhausted",
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("history", "budget", "consumed", "retry", "delay", "status", "reduced", "reason"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_should_retry_after_crash(
    history: list[dict[str, Any]],
    budget: dict[str, Any] | None,
    consumed: dict[str, Any] | None,
    retry: bool,
    delay: float,
    status: str,
    reduced: bool,
    reason: str,
) -> None:
    decision = should_retry_after_crash(history, budget, consumed)
    assert (decision.retry, decision.delay_seconds, decision.status, decision.footprint_reduced) == (
        retry,
        delay,
        status,
        reduced,
    )
    assert reason in decision.reason
    assert "\n" not in decision.reason


def test_records_and_dicts_decide_alike() -> None:
    history = [A, oom(), B]
    records = [CrashRecord.from_dict(entry) for entry in history]
    assert should_retry_after_crash(records) == should_retry_after_crash(history)


def test_schedule_follows_the_constants() -> None:
    assert crash_backoff_schedule() == (5.0, 60.0, 300.0, 1800.0)
    fast = Constants().scaled(0.01)
    assert crash_backoff_schedule(fast) == pytest.approx((0.05, 0.6, 3.0, 18.0))
    decision = should_retry_after_crash([A, B], constants=fast)
    assert decision.delay_seconds == pytest.approx(0.6)


def test_decision_is_frozen() -> None:
    decision = should_retry_after_crash([A])
    assert isinstance(decision, RetryDecision)
    with pytest.raises(AttributeError):
        decision.retry = False  # type: ignore[misc]


def test_crash_record_round_trips_and_redacts() -> None:
    exc = RuntimeError("cannot reach postgresql://u:hunter2-secret@db/x\n  after 3 tries")
    record = CrashRecord.from_exception(exc, attempt=2, step=7, redact=Redactor().redact, at=12.5)
    assert record.error_class == "RuntimeError"
    assert "hunter2-secret" not in record.message
    assert record.message == "cannot reach postgresql://u:***@db/x after 3 tries"
    assert CrashRecord.from_dict(record.to_dict()) == record
    assert record.to_dict()["step"] == 7
    assert CrashRecord.from_exit_code(137, attempt=1).is_oom
    assert not CrashRecord.from_exit_code(1, attempt=1).is_oom


def test_crash_record_tolerates_foreign_rows() -> None:
    record = CrashRecord.from_dict({"message": "written by the control plane"})
    assert (record.exit_code, record.error_class, record.attempt) == (None, "", 0)


@pytest.mark.anyio
async def test_decision_from_a_real_job_row(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "db.sqlite")
    await store.open()
    try:
        await store.create_job("job-1", "agent", None, {"max_cost_usd": 1.0})
        for attempt in (1, 2):
            await store.claim("job-1", attempt)
            record = CrashRecord.from_exception(ValueError("bad input"), attempt=attempt, step=3)
            await store.set_status("job-1", attempt, "RETRYING", error=record.to_dict())
        await store.add_usage("job-1", 2, 100, 10, 0.5)
        job = await store.get_job("job-1")
    finally:
        await store.close()
    decision = should_retry_after_crash(job.error, job.token_budget, job.tokens_consumed)
    assert (decision.retry, decision.delay_seconds) == (True, 60.0)
    job_failed = should_retry_after_crash(job.error, job.token_budget, {"cost_usd": 1.0})
    assert (job_failed.retry, job_failed.status) == (False, "FAILED")


# -- circuit breaker ------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def breaker(clock: FakeClock) -> CircuitBreaker:
    return CircuitBreaker(failure_threshold=3, window=900, cooldown=1800, clock=clock)


def test_breaker_opens_after_three_failures_in_the_window(breaker: CircuitBreaker, clock: FakeClock) -> None:
    for _ in range(2):
        breaker.record_failure()
        clock.advance(400)
        assert breaker.state is CircuitState.CLOSED
        assert breaker.allow()
    breaker.record_failure()  # failures at 0, 400 and 800 s: within 15 min
    assert breaker.state is CircuitState.OPEN
    assert not breaker.allow()
    assert breaker.seconds_until_retry() == 1800


def test_failures_outside_the_window_do_not_open(breaker: CircuitBreaker, clock: FakeClock) -> None:
    for _ in range(5):
        breaker.record_failure()
        clock.advance(451)  # at most two failures within any 900 s
    assert breaker.state is CircuitState.CLOSED
    assert breaker.allow()


def test_success_while_closed_does_not_forgive(breaker: CircuitBreaker) -> None:
    breaker.record_failure()
    breaker.record_success()
    breaker.record_failure()
    breaker.record_success()
    breaker.record_failure()
    assert breaker.state is CircuitState.OPEN


def test_half_open_after_cooldown_then_success_closes(breaker: CircuitBreaker, clock: FakeClock) -> None:
    for _ in range(3):
        breaker.record_failure()
    clock.advance(1799)
    assert breaker.state is CircuitState.OPEN
    assert not breaker.allow()
    clock.advance(1)
    assert breaker.state is CircuitState.HALF_OPEN
    assert breaker.seconds_until_retry() == 0
    assert breaker.allow()  # the one trial
    assert not breaker.allow()  # no second call while the trial runs
    breaker.record_success()
    assert breaker.state is CircuitState.CLOSED
    assert breaker.allow()
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state is CircuitState.CLOSED  # the old failures were forgotten on closing


def test_half_open_failure_opens_for_a_full_cooldown(breaker: CircuitBreaker, clock: FakeClock) -> None:
    for _ in range(3):
        breaker.record_failure()
    clock.advance(1800)
    assert breaker.allow()
    clock.advance(60)
    breaker.record_failure()
    assert breaker.state is CircuitState.OPEN
    clock.advance(1799)
    assert not breaker.allow()
    clock.advance(1)
    assert breaker.allow()


def test_unanswered_trial_is_offered_again_after_a_cooldown(
    breaker: CircuitBreaker, clock: FakeClock
) -> None:
    for _ in range(3):
        breaker.record_failure()
    clock.advance(1800)
    assert breaker.allow()
    clock.advance(1799)
    assert not breaker.allow()
    clock.advance(1)
    assert breaker.allow()


def test_outcomes_recorded_while_open_change_nothing(breaker: CircuitBreaker, clock: FakeClock) -> None:
    for _ in range(3):
        breaker.record_failure()
    clock.advance(100)
    breaker.record_success()
    breaker.record_failure()
    assert breaker.state is CircuitState.OPEN
    assert breaker.seconds_until_retry() == 1700


def test_breaker_from_constants(clock: FakeClock) -> None:
    breaker = CircuitBreaker.from_constants(Constants().budget, clock=clock)
    assert (breaker.failure_threshold, breaker.window, breaker.cooldown) == (3, 900.0, 1800.0)


@pytest.mark.parametrize(("threshold", "window", "cooldown"), [(0, 900, 1800), (3, 0, 1800), (3, 900, -1)])
def test_breaker_rejects_nonsense(threshold: int, window: float, cooldown: float) -> None:
    with pytest.raises(ConfigError):
        CircuitBreaker(threshold, window, cooldown)


# -- derive_total_timeout -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("init", "exec_", "buffer", "granularity", "expected"),
    [
        (95.4, 420, 180, 60, 720),
        (0, 0, 0, 60, 60),  # never a zero timeout
        (300, 240, 60, 60, 600),  # already a multiple: not rounded further
        (0.1 * 3, 599.7, 0, 60, 600),  # float noise (0.30000000000000004) does not add a step
        (300, 240, 61, 60, 660),
        (95.4, 420, 180, 1, 696),
        (95.4, 420, 180, 300, 900),
    ],
)
def test_derive_total_timeout(
    init: float, exec_: float, buffer: float, granularity: int, expected: int
) -> None:
    result = derive_total_timeout(init, exec_, buffer, granularity)
    assert result == expected
    assert type(result) is int


@pytest.mark.parametrize(
    ("init", "exec_", "buffer", "granularity", "fragment"),
    [
        (-1, 420, 180, 60, "init_p95"),
        (95, -0.5, 180, 60, "exec_p95"),
        (95, 420, -180, 60, "safety_buffer"),
        (float("nan"), 420, 180, 60, "init_p95"),
        (95, float("inf"), 180, 60, "exec_p95"),
        (95, 420, 180, 0, "granularity"),
        (95, 420, 180, -60, "granularity"),
        (95, 420, 180, 1.5, "granularity"),
        (95, 420, 180, True, "granularity"),
    ],
)
def test_derive_total_timeout_rejects_bad_input(
    init: float, exec_: float, buffer: float, granularity: Any, fragment: str
) -> None:
    with pytest.raises(ConfigError, match=fragment):
        derive_total_timeout(init, exec_, buffer, granularity)


# -- p95_from_journals ----------------------------------------------------------------------------------


def write_session(
    data_dir: Path,
    job: str,
    attempt: int,
    init: float,
    exec_: float,
    *,
    ended: bool = True,
    via: str = "step",
) -> Path:
    t0 = 1_700_000_000.0 + attempt * 10_000
    events: list[dict[str, Any]] = [
        {"type": "SESSION_STARTED", "ts": t0},
        {"type": "LIFECYCLE", "ts": t0 + 0.01, "from": "BOOTING", "to": "HYDRATING"},
    ]
    if via == "lifecycle":
        events.append({"type": "LIFECYCLE", "ts": t0 + init, "from": "READY", "to": "EXECUTING"})
        events.append({"type": "STEP_STARTED", "ts": t0 + init + 0.5, "step": 0})
    else:
        events.append({"type": "STEP_STARTED", "ts": t0 + init, "step": 0})
    events.append({"type": "CHECKPOINT_WRITTEN", "ts": t0 + init + exec_ / 2, "step": 0})
    events.append(
        {"type": "SESSION_ENDED" if ended else "TOOL_STARTED", "ts": t0 + init + exec_, "exit_code": 0}
    )
    directory = data_dir / "sessions" / job
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"session_{attempt:04d}_{int(t0 * 1000)}.jsonl"
    lines = [orjson.dumps({"v": 1, "seq": i, **e}) for i, e in enumerate(events)]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_p95_is_nearest_rank_over_sessions(tmp_path: Path) -> None:
    for i in range(1, 21):  # init 1..20 s, exec 10..200 s
        write_session(tmp_path, f"job-{i}", 1, float(i), 10.0 * i)
    init_p95, exec_p95 = p95_from_journals(tmp_path)
    assert init_p95 == pytest.approx(19.0)  # ceil(0.95 * 20) = 19th of 20
    assert exec_p95 == pytest.approx(190.0)


def test_p95_handles_damage_and_unfinished_sessions(tmp_path: Path) -> None:
    torn = write_session(tmp_path, "job-a", 1, 2.0, 30.0)
    torn.write_bytes(torn.read_bytes() + b'{"v": 1, "ts": 1700000099.0, "type": "TOOL_STA')  # torn last line
    corrupt = write_session(tmp_path, "job-b", 1, 4.0, 50.0, via="lifecycle")
    lines = corrupt.read_bytes().split(b"\n")
    lines.insert(2, b"\x00\xff garbage {")
    lines.insert(3, b'["not", "an", "event"]')
    corrupt.write_bytes(b"\n".join(lines))
    write_session(tmp_path, "job-c", 1, 3.0, 40.0, ended=False)  # crashed: exec ends at its last event
    hydrating_only = tmp_path / "sessions" / "job-d" / "session_0001_1.jsonl"
    hydrating_only.parent.mkdir(parents=True)
    hydrating_only.write_bytes(orjson.dumps({"v": 1, "seq": 0, "ts": 5.0, "type": "SESSION_STARTED"}) + b"\n")
    (tmp_path / "sessions" / "job-a" / "notes.txt").write_text("not a journal")

    init_p95, exec_p95 = p95_from_journals(tmp_path)
    assert init_p95 == pytest.approx(4.0)  # the LIFECYCLE -> EXECUTING event marks job-b's start
    assert exec_p95 == pytest.approx(50.0)


def test_p95_without_sessions_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no session journals under"):
        p95_from_journals(tmp_path)
    (tmp_path / "sessions" / "job").mkdir(parents=True)
    (tmp_path / "sessions" / "job" / "session_0001_1.jsonl").write_bytes(b"torn")
    with pytest.raises(ConfigError, match="none of the 1 session journals"):
        p95_from_journals(tmp_path)


@pytest.mark.anyio
async def test_p95_reads_journals_written_by_the_real_journal(tmp_path: Path) -> None:
    journal = Journal.create(tmp_path / "sessions" / "job-1", 1)
    async with journal:
        journal.append("SESSION_STARTED", job_id="job-1", agent_id="a", attempt=1, pid=1)
        await anyio.sleep(0.05)
        journal.append("LIFECYCLE", **{"from": "READY", "to": "EXECUTING"})
        journal.append("STEP_STARTED", step=0)
        await anyio.sleep(0.1)
        journal.append("SESSION_ENDED", exit_code=0)
    init_p95, exec_p95 = p95_from_journals(tmp_path)
    assert 0.05 <= init_p95 < 5
    assert 0.1 <= exec_p95 < 5


# -- CLI --------------------------------------------------------------------------------------------------


def run_budget(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="agentlife")
    register_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["budget", *argv])
    code: int = args.handler(args)
    return code


def test_cli_prints_the_arithmetic(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_budget("--init-p95", "95.4", "--exec-p95", "420", "--safety-buffer", "180") == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "init p95 + exec p95 + safety buffer = 95.4 + 420 + 180 = 695.4 s",
        "rounded up to a multiple of 60 s: 720 s",
    ]


def test_cli_granularity(capsys: pytest.CaptureFixture[str]) -> None:
    run_budget("--init-p95", "95.4", "--exec-p95", "420", "--safety-buffer", "180", "--granularity", "300")
    assert capsys.readouterr().out.splitlines()[-1] == "rounded up to a multiple of 300 s: 900 s"


def test_cli_from_journals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for i in range(1, 21):
        write_session(tmp_path, f"job-{i}", 1, float(i), 10.0 * i)
    assert run_budget("--from-journals", str(tmp_path)) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"20 of 20 session journals under {tmp_path} reached execution"
    buffer = f"{DEFAULT_SAFETY_BUFFER_SECONDS:g}"
    assert out[1] == f"init p95 + exec p95 + safety buffer = 19 + 190 + {buffer} = {19 + 190 + 180:g} s"
    assert out[2] == "rounded up to a multiple of 60 s: 420 s"
    run_budget("--from-journals", str(tmp_path), "--safety-buffer", "0")
    assert capsys.readouterr().out.splitlines()[-1] == "rounded up to a multiple of 60 s: 240 s"


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        ((), "budget needs --init-p95"),
        (("--init-p95", "10", "--exec-p95", "20"), "--safety-buffer"),
        (("--init-p95", "ten", "--exec-p95", "20", "--safety-buffer", "5"), "--init-p95 must be a number"),
        (("--init-p95", "10", "--exec-p95", "-20", "--safety-buffer", "5"), "--exec-p95 must be a finite"),
        (
            ("--init-p95", "10", "--exec-p95", "20", "--safety-buffer", "nan"),
            "--safety-buffer must be a finite",
        ),
        (
            ("--init-p95", "1", "--exec-p95", "2", "--safety-buffer", "3", "--granularity", "0"),
            "--granularity",
        ),
        (
            ("--init-p95", "1", "--exec-p95", "2", "--safety-buffer", "3", "--granularity", "1.5"),
            "--granularity",
        ),
        (("--init-p95", "1", "--from-journals", "."), "not both"),
        (("--from-journals", "/nonexistent/agentlife"), "no session journals"),
    ],
)
def test_cli_bad_input_is_a_one_line_config_error(argv: tuple[str, ...], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        run_budget(*argv)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)
