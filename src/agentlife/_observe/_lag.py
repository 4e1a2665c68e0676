"""Event-loop lag: the sampler on the agent's loop and the watchdog on the probe thread.

Two halves that never share a loop:

* `run_lag_monitor` runs *in the agent's event loop*. Every ``interval`` it sleeps, measures how late it
  woke up (the drift: actual minus expected wake-up time) and calls `StatusBoard.tick`. A tick is the loop's
  proof of life; its drift is the ``agent.event_loop.lag`` gauge.
* `LoopWatchdog` runs *on the probe server's thread*. It looks at how long the board has gone without a tick.
  A blocked loop cannot tick, so the silence grows while the block is still going on; the watchdog does not
  wait for the block to end to notice it. ``/healthz`` reads the same silence through `StatusBoard.health`, so
  the log line and the probe answer always agree.

Example:
    >>> import anyio
    >>> from agentlife._observe._status import StatusBoard
    >>> board = StatusBoard(job_id="j1", agent_id="a1", attempt=1)
    >>> async def main() -> None:
    ...     with anyio.move_on_after(0.05):
    ...         await run_lag_monitor(board, interval=0.01)
    >>> anyio.run(main)
    >>> board.snapshot().loop_lag_seconds >= 0
    True
"""

from __future__ import annotations

import logging
import time

import anyio

from agentlife._logging import get_logger, log_fields
from agentlife._observe._status import StatusBoard
from agentlife._state import State

__all__ = ["LoopWatchdog", "run_lag_monitor"]


async def run_lag_monitor(board: StatusBoard, interval: float) -> None:
    """Sample the current event loop's lag forever, publishing each sample with ``board.tick(lag)``.

    Start it in the runtime's task group and cancel it at the end. It ticks once at start, so the watchdog
    measures silence from the moment sampling began. When it stops (cancelled), it clears the board's tick
    time: a sampler that was stopped on purpose is not a blocked loop, and a probe answering during the last
    moments of cleanup must not report one.

    Args:
        board: the status board the probe thread reads.
        interval: seconds between samples; keep it well under the blocked threshold (default 1 s vs 5 s),
            or a healthy loop's normal silence between two ticks would look like a block.

    Raises:
        ValueError: ``interval`` is not a positive number.
    """
    if not interval > 0:
        raise ValueError(f"lag sampling interval must be > 0 s, got {interval!r}")
    threshold = board.snapshot().blocked_threshold_seconds
    if interval >= threshold / 2:
        get_logger("agentlife.lag").warning(
            "lag sampling interval %.3gs is not well under the blocked threshold %.3gs: "
            "a busy but healthy loop may be reported as blocked",
            interval,
            threshold,
            extra=log_fields(interval_seconds=interval, blocked_threshold_seconds=threshold),
        )
    board.tick(0.0)
    try:
        while True:
            expected = time.monotonic() + interval
            await anyio.sleep(interval)
            board.tick(max(0.0, time.monotonic() - expected))
    finally:
        board.update(loop_tick_monotonic=None)


class LoopWatchdog:
    """Notices a blocked agent loop from another thread and logs it once per block.

    Call `check` periodically from a thread that does not depend on the agent's loop (the probe server
    calls it every ``blocked_threshold / 4``). "Blocked" means exactly what `StatusBoard.health` means: the
    sampler has been silent for at least the board's ``blocked_threshold_seconds``. Not thread-safe: one
    thread calls `check`.

    Args:
        board: the board the sampler ticks.
        logger: where the warning ("event loop blocked for Xs") and the recovery line go.
    """

    def __init__(self, board: StatusBoard, logger: logging.Logger | None = None) -> None:
        self._board = board
        self._logger = logger or get_logger("agentlife.probes")
        self._blocked_since_tick: float | None = None
        self._blocks_total = 0

    @property
    def blocked(self) -> bool:
        """Whether the last `check` saw a block in progress."""
        return self._blocked_since_tick is not None

    @property
    def blocks_total(self) -> int:
        """How many distinct blocks have been detected since this watchdog was created."""
        return self._blocks_total

    def check(self, now: float | None = None) -> bool:
        """Look at the board once; log when a block starts and when it ends.

        Args:
            now: the monotonic time to judge against (tests pass a fake one).

        Returns:
            Whether the loop is blocked right now.
        """
        now = time.monotonic() if now is None else now
        snap = self._board.snapshot()
        last_tick = snap.loop_tick_monotonic
        silence = snap.loop_silence(now)
        is_blocked = (
            last_tick is not None
            and snap.state is not State.TERMINATED
            and silence >= snap.blocked_threshold_seconds
        )
        if is_blocked and self._blocked_since_tick is None:
            self._blocked_since_tick = last_tick
            self._blocks_total += 1
            self._logger.warning(
                "event loop blocked for %.1fs",
                silence,
                extra=log_fields(
                    event="event_loop_blocked",
                    blocked_seconds=round(silence, 3),
                    blocked_threshold_seconds=snap.blocked_threshold_seconds,
                ),
            )
        elif not is_blocked and self._blocked_since_tick is not None:
            self._log_recovery(last_tick)
            self._blocked_since_tick = None
        return is_blocked

    def _log_recovery(self, last_tick: float | None) -> None:
        assert self._blocked_since_tick is not None
        if last_tick is None:
            # The sampler was stopped during the block; there is no tick to measure the end by.
            self._logger.info(
                "event loop sampler stopped while the loop was blocked",
                extra=log_fields(event="event_loop_unblocked"),
            )
            return
        duration = max(0.0, last_tick - self._blocked_since_tick)
        self._logger.info(
            "event loop recovered after %.1fs without a tick",
            duration,
            extra=log_fields(event="event_loop_unblocked", blocked_seconds=round(duration, 3)),
        )
