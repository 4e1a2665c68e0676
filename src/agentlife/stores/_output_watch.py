"""How a follower learns that a job's output moved: `OutputWatch`, and SQLite's, which polls.

A watch is entered before the follower first reads the job's output rows, so nothing written after that read
goes unseen. `OutputWatch.wait` returns when the output may have moved, with the delta batches (model text,
JSON each) that came meanwhile; the follower then reads the rows after its cursor. On SQLite it polls the
job's ring of recent delta batches, after a pause that starts short and doubles while nothing comes (up to
`POLL_MAX_SECONDS`), and starts short again after activity. PostgreSQL's is woken by ``NOTIFY``
(`agentlife.stores._pg_output_listen`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Protocol

import anyio

__all__ = ["POLL_MAX_SECONDS", "POLL_MIN_SECONDS", "OutputWatch", "PollingWatch"]

#: A polling follower looks again this soon after something moved ...
POLL_MIN_SECONDS = 0.01
#: ... and at least this often while nothing does.
POLL_MAX_SECONDS = 0.1


class OutputWatch(Protocol):
    """A follower's view of one job's output moving (an async context manager)."""

    async def __aenter__(self) -> OutputWatch: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...

    async def wait(self, moved: bool) -> list[bytes]:
        """Wait until the output may have moved; the delta batches that came meanwhile.

        ``moved``: the follower's last read found rows (a poll starts short again).
        """
        ...

    async def pending(self) -> list[bytes]:
        """The delta batches that came since the last `wait`, without waiting (the job ended)."""
        ...


class PollingWatch:
    """The watch of a store without notifications: it reads the job's recent delta batches on a backoff."""

    def __init__(
        self,
        read_deltas: Callable[[str, int | None], Awaitable[tuple[int, list[bytes]]]],
        job_id: str,
    ) -> None:
        self._read = read_deltas
        self._job_id = job_id
        self._after: int | None = None
        self._pause = POLL_MIN_SECONDS

    async def __aenter__(self) -> PollingWatch:
        # Deltas from now on: a follower that joins mid-stream sees the text written after it joined.
        self._after, _ = await self._read(self._job_id, None)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    async def wait(self, moved: bool) -> list[bytes]:
        """Pause, then read the delta batches written since the last read."""
        if moved:
            self._pause = POLL_MIN_SECONDS
        await anyio.sleep(self._pause)
        batches = await self.pending()
        self._pause = POLL_MIN_SECONDS if batches else min(self._pause * 2, POLL_MAX_SECONDS)
        return batches

    async def pending(self) -> list[bytes]:
        """The delta batches written since the last read."""
        last, batches = await self._read(self._job_id, self._after)
        if last < (self._after or 0):
            last = 0  # the ring was removed (a minute after an end) and a retry began it again
        self._after = last
        return batches
