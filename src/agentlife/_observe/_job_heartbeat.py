"""The job row's heartbeat: ``heartbeat_at = now()`` every 30 s, failures counted, never fatal.

A fenced write (a later attempt owns the job) stops it and tells the runtime; the control plane's zombie
sweep reads ``heartbeat_at``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from agentlife._exceptions import AttemptFenced, describe_error
from agentlife._observe._status import StatusBoard
from agentlife._redact import Redactor

if TYPE_CHECKING:
    from agentlife.stores._roles import JobStore


__all__ = ["JobHeartbeat"]

_log = logging.getLogger("agentlife.heartbeat")


class JobHeartbeat:
    """Sets the job row's ``heartbeat_at`` every ``interval`` seconds through `JobStore.heartbeat`.

    Start it after the job was claimed (before that the row still carries the previous attempt, and the
    fenced write would stop it). A failed beat is counted, logged and recorded on the board, and the loop goes
    on; a beat that takes longer than ``timeout`` (default: the interval) counts as failed. `AttemptFenced`
    means a later attempt owns the job: the loop logs it, records it, calls ``on_fenced`` and returns.

    Attributes:
        failures: failed beats since start.
        consecutive_failures: failed beats since the last success (what the board shows).
        beats: successful beats.
        fenced: the `AttemptFenced` error that stopped the loop, or None.
    """

    def __init__(
        self,
        store: JobStore,
        job_id: str,
        attempt: int,
        interval: float,
        board: StatusBoard | None = None,
        *,
        on_fenced: Callable[[AttemptFenced], None] | None = None,
        timeout: float | None = None,
        redactor: Redactor | None = None,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"job heartbeat interval must be > 0, got {interval}")
        self._store = store
        self._job_id, self._attempt = job_id, attempt
        self.interval = interval
        self._board = board
        self._on_fenced = on_fenced
        self._timeout = interval if timeout is None else timeout
        self._redactor = redactor or Redactor()
        self.failures = 0
        self.consecutive_failures = 0
        self.beats = 0
        self.fenced: AttemptFenced | None = None

    async def run(self, *, beat_now: bool = True) -> None:
        """Beat now, then every interval until cancelled or fenced.

        ``beat_now=False`` waits one interval before the first beat, for a row whose ``heartbeat_at`` was
        written a moment ago (by the claim): a beat at once would be a commit that says nothing new.
        """
        next_at = anyio.current_time()
        if not beat_now:
            self._record(ok=True)
            next_at += self.interval
            await anyio.sleep(self.interval)
        while True:
            await self.beat_once()
            if self.fenced is not None:
                return
            next_at += self.interval
            now = anyio.current_time()
            if next_at < now:  # a slow beat: keep the rhythm from now rather than firing a burst
                next_at = now
            await anyio.sleep(next_at - now)

    async def beat_once(self) -> bool:
        """One ``heartbeat_at`` update; True when it was written."""
        try:
            with anyio.fail_after(self._timeout):
                await self._store.heartbeat(self._job_id, self._attempt)
        except AttemptFenced as exc:
            self._fenced_by(exc)
            return False
        except Exception as exc:
            self._failed(exc)
            return False
        self.beats += 1
        self.consecutive_failures = 0
        self._record(ok=True)
        return True

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        self.consecutive_failures += 1
        error = describe_error(exc, redact=self._redactor.redact)
        _log.warning(
            "job heartbeat for %s failed (%s); %d failure(s) so far", self._job_id, error, self.failures
        )
        self._record(ok=False, error=error)

    def _fenced_by(self, exc: AttemptFenced) -> None:
        self.fenced = exc
        error = self._redactor.redact(str(exc))
        _log.error("job heartbeat stopped: %s", error)
        self._record(ok=False, error=f"fenced: {error}")
        if self._on_fenced is not None:
            self._on_fenced(exc)

    def _record(self, *, ok: bool, error: str | None = None) -> None:
        if self._board is not None:
            self._board.record_heartbeat("job", ok=ok, error=error, failures=self.consecutive_failures)
