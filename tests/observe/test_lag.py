"""The event-loop lag sampler and the watchdog that reads its silence from another thread."""

from __future__ import annotations

import logging
import time

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentlife._observe._lag import LoopWatchdog, run_lag_monitor
from agentlife._observe._status import StatusBoard
from agentlife._state import State


class RecordingBoard(StatusBoard):
    """A real board that also remembers every lag sample it was given."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(job_id="job-1", agent_id="agent-1", attempt=1, **kwargs)  # type: ignore[arg-type]
        self.lags: list[float] = []

    def tick(self, lag_seconds: float) -> None:
        self.lags.append(lag_seconds)
        super().tick(lag_seconds)


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def log() -> tuple[logging.Logger, ListHandler]:
    logger = logging.Logger("test.watchdog", logging.DEBUG)
    handler = ListHandler()
    logger.addHandler(handler)
    return logger, handler


@pytest.mark.anyio
async def test_monitor_ticks_every_interval_with_small_lag_on_an_idle_loop() -> None:
    board = RecordingBoard()
    with anyio.move_on_after(0.3):
        await run_lag_monitor(board, interval=0.02)
    # One tick at start, then roughly one per interval; a loaded CI machine may lose a few.
    assert 5 <= len(board.lags) <= 20
    assert board.lags[0] == 0.0
    assert all(lag >= 0.0 for lag in board.lags)
    assert sorted(board.lags)[len(board.lags) // 2] < 0.05


@pytest.mark.anyio
async def test_monitor_measures_the_drift_caused_by_a_blocking_call() -> None:
    board = RecordingBoard()
    async with anyio.create_task_group() as tg:
        tg.start_soon(run_lag_monitor, board, 0.02)
        await anyio.sleep(0.1)
        time.sleep(0.25)  # the bug under test: a blocking call on the agent's loop
        await anyio.sleep(0.1)
        tg.cancel_scope.cancel()
    # The sample that spans the block woke up about 0.25 - 0.02 s late.
    assert max(board.lags) >= 0.15
    assert max(board.lags) < 2.0


@pytest.mark.anyio
async def test_monitor_clears_its_tick_when_stopped_so_a_stopped_sampler_is_not_a_block() -> None:
    board = RecordingBoard(blocked_threshold_seconds=0.05)
    with anyio.move_on_after(0.1):
        await run_lag_monitor(board, interval=0.01)
    assert board.lags, "the sampler never ticked"
    assert board.snapshot().loop_tick_monotonic is None
    await anyio.sleep(0.1)
    assert board.health().ok


@pytest.mark.anyio
@pytest.mark.parametrize("interval", [0.0, -1.0, float("nan")])
async def test_monitor_refuses_a_non_positive_interval(interval: float) -> None:
    with pytest.raises(ValueError, match="interval"):
        await run_lag_monitor(RecordingBoard(), interval)


@pytest.mark.anyio
async def test_monitor_warns_when_the_interval_is_too_close_to_the_threshold(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="agentlife.lag"), anyio.move_on_after(0.05):
        await run_lag_monitor(RecordingBoard(blocked_threshold_seconds=1.0), interval=0.6)
    assert any("not well under the blocked threshold" in r.getMessage() for r in caplog.records)


def test_watchdog_logs_one_warning_per_block_and_one_line_on_recovery(
    log: tuple[logging.Logger, ListHandler],
) -> None:
    logger, handler = log
    board = StatusBoard(job_id="j", agent_id="a", attempt=1, blocked_threshold_seconds=5.0)
    board.tick(0.0)
    t0 = board.snapshot().loop_tick_monotonic
    assert t0 is not None
    dog = LoopWatchdog(board, logger)

    assert dog.check(now=t0 + 4.9) is False
    assert handler.records == []
    assert dog.check(now=t0 + 5.2) is True
    assert dog.check(now=t0 + 9.0) is True  # still the same block: no second warning
    warnings = [r for r in handler.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings] == ["event loop blocked for 5.2s"]
    assert dog.blocked
    assert dog.blocks_total == 1

    board.tick(0.0)  # the loop comes back
    assert dog.check() is False
    infos = [r for r in handler.records if r.levelno == logging.INFO]
    assert len(infos) == 1
    assert infos[0].getMessage().startswith("event loop recovered after")
    assert not dog.blocked

    t1 = board.snapshot().loop_tick_monotonic
    assert t1 is not None
    assert dog.check(now=t1 + 6.0) is True  # a second, separate block
    assert dog.blocks_total == 2
    assert len([r for r in handler.records if r.levelno == logging.WARNING]) == 2


def test_watchdog_ignores_a_sampler_that_never_started_and_a_terminated_process(
    log: tuple[logging.Logger, ListHandler],
) -> None:
    logger, handler = log
    board = StatusBoard(job_id="j", agent_id="a", attempt=1, blocked_threshold_seconds=1.0)
    dog = LoopWatchdog(board, logger)
    assert dog.check(now=time.monotonic() + 100) is False
    board.tick(0.0)
    board.update(state=State.TERMINATED)
    assert dog.check(now=time.monotonic() + 100) is False
    assert handler.records == []


def test_watchdog_reports_recovery_when_the_sampler_stops_during_a_block(
    log: tuple[logging.Logger, ListHandler],
) -> None:
    logger, handler = log
    board = StatusBoard(job_id="j", agent_id="a", attempt=1, blocked_threshold_seconds=1.0)
    board.tick(0.0)
    dog = LoopWatchdog(board, logger)
    assert dog.check(now=time.monotonic() + 2.0) is True
    board.update(loop_tick_monotonic=None)
    assert dog.check() is False
    assert "sampler stopped" in handler.records[-1].getMessage()


@settings(max_examples=200, deadline=None)
@given(
    threshold=st.floats(min_value=0.01, max_value=100.0),
    elapsed=st.floats(min_value=0.0, max_value=200.0),
    state=st.sampled_from(list(State)),
)
def test_watchdog_and_healthz_always_agree_about_a_block(
    threshold: float, elapsed: float, state: State
) -> None:
    board = StatusBoard(job_id="j", agent_id="a", attempt=1, blocked_threshold_seconds=threshold)
    board.tick(0.0)
    board.update(state=state)
    tick = board.snapshot().loop_tick_monotonic
    assert tick is not None
    now = tick + elapsed
    blocked = LoopWatchdog(board, logging.Logger("quiet", logging.CRITICAL + 1)).check(now=now)
    verdict = board.health(now=now)
    assert blocked == verdict.reason.startswith("event loop blocked")
    if blocked:
        assert not verdict.ok
