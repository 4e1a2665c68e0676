"""Followers on PostgreSQL: one ``LISTEN`` connection per store, one channel per followed job.

Every row of ``job_output`` sends ``NOTIFY`` on its job's channel when it commits (a trigger), and a
streaming job sends its model text there too (`agentlife.stores._output.send_deltas`). `PgOutputListener`
opens one connection of its own (outside the pool: a ``LISTEN`` lives as long as its session) on the first
watch, ``LISTEN``s to a job's channel while at least one watch follows the job, and hands each watch what
comes: an empty payload (a row: read the rows after the cursor) or a delta batch. A thousand followers in
one process are one connection and one ``LISTEN`` per job; the job's writes do not grow with them.

A notification is a hint: while the connection is down (or before it is up) a watch wakes every
`FALLBACK_SECONDS` and the follower reads the rows anyway, so no published event or status change is lost;
only model text sent meanwhile is.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Any

import anyio

from agentlife.stores._base import TableNames

__all__ = ["FALLBACK_SECONDS", "PgOutputListener", "PgWatch", "delta_channel"]

_log = logging.getLogger("agentlife.store")
#: A watch without a working ``LISTEN`` wakes this often (the follower reads the rows).
FALLBACK_SECONDS = 1.0
#: The delta batches a watch keeps for a follower that reads slowly; older ones are dropped.
MAX_QUEUED_BATCHES = 256


def delta_channel(output_table_oid: int, job_id: str) -> str:
    """The PostgreSQL channel of a job's output (`agentlife.stores._output_sql` spells it alike in SQL)."""
    digest = hashlib.md5(f"{output_table_oid}:{job_id}".encode(), usedforsecurity=False).hexdigest()
    return f"agentlife_out_{digest}"


class PgOutputListener:
    """The ``LISTEN`` connection of one store's followers (see the module).

    Args:
        url: the connection URL (never logged).
        tables: the store's table names (a job's channel is named from the output table's OID).
        connect_timeout: seconds one connection attempt may take.
        describe: the store's redacting formatter for exceptions.
    """

    def __init__(
        self, url: str, tables: TableNames, connect_timeout: float, describe: Callable[[BaseException], str]
    ) -> None:
        self._url = url
        self._tables = tables
        self._connect_timeout = connect_timeout
        self._describe = describe
        self._conn: Any = None
        self._oid: int | None = None
        self._lock = anyio.Lock()
        self._retry_at = 0.0
        self._watches: dict[str, set[PgWatch]] = {}
        self._jobs: dict[str, str] = {}  # channel -> job id: a notification finds its watches at once
        self._warned = False

    def watch(self, job_id: str) -> PgWatch:
        """A watch of ``job_id``'s output (enter it before reading the rows)."""
        return PgWatch(self, job_id)

    @property
    def connections(self) -> int:
        """Open connections (0 or 1): what a test of leaks counts."""
        return 0 if self._conn is None or self._conn.is_closed() else 1

    async def _add(self, watch: PgWatch) -> None:
        async with self._lock:
            await self._connected()
            channel = self._channel(watch.job_id)
            watchers = self._watches.setdefault(watch.job_id, set())
            if not watchers and channel is not None and self._conn is not None:
                await self._listen(channel)
            watchers.add(watch)

    async def _remove(self, watch: PgWatch) -> None:
        async with self._lock:
            watchers = self._watches.get(watch.job_id, set())
            watchers.discard(watch)
            if watchers:
                return
            self._watches.pop(watch.job_id, None)
            channel = self._channel(watch.job_id)
            self._jobs.pop(channel or "", None)
            if channel is not None and self._conn is not None and not self._conn.is_closed():
                with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                    await self._conn.remove_listener(channel, self._notified)
            if not self._watches:
                await self._close()  # nobody follows: the connection goes

    def _channel(self, job_id: str) -> str | None:
        if self._oid is None:
            return None
        channel = delta_channel(self._oid, job_id)
        self._jobs[channel] = job_id
        return channel

    async def _listen(self, channel: str) -> None:
        try:
            await self._conn.add_listener(channel, self._notified)
        except Exception as exc:
            self._lost(exc)

    async def reconnect_if_due(self) -> None:
        """Connect again (and listen to every followed job) when the connection is down and a retry is due."""
        if self._conn is not None and not self._conn.is_closed():
            return
        async with self._lock:
            if await self._connected():
                for job_id in list(self._watches):
                    channel = self._channel(job_id)
                    if channel is not None and self._conn is not None:
                        await self._listen(channel)

    async def _connected(self) -> bool:
        """Open the connection unless open or failed lately; True when it opened now."""
        if self._conn is not None and not self._conn.is_closed():
            return False
        if time.monotonic() < self._retry_at:
            return False
        import asyncpg  # type: ignore[import-untyped]  # loaded already: the store's pool is open

        conn: Any = None
        try:
            conn = await asyncpg.connect(self._url, timeout=self._connect_timeout)
            oid = await conn.fetchval(
                "SELECT to_regclass($1)::oid", self._tables.output, timeout=self._connect_timeout
            )
            if oid is None:
                raise LookupError(f"no table {self._tables.output}: run `python -m agentlife db init`")
            conn.add_termination_listener(self._terminated)
        except BaseException as exc:
            if conn is not None:
                conn.terminate()
            if not isinstance(exc, Exception):
                raise
            self._lost(exc)
            return False
        self._oid, self._conn = int(oid), conn
        if self._warned:
            _log.info("PostgreSQL LISTEN connection of the followers is back")
        self._warned = False
        return True

    def _lost(self, exc: BaseException | None) -> None:
        self._retry_at = time.monotonic() + FALLBACK_SECONDS
        if not self._warned:
            self._warned = True
            detail = f": {self._describe(exc)}" if exc is not None else ""
            _log.warning("PostgreSQL LISTEN for followers unavailable; followers poll%s", detail)
        for watchers in self._watches.values():
            for watch in watchers:
                watch.wake(None)

    def _terminated(self, conn: Any) -> None:
        if conn is self._conn:
            self._conn = None
            self._lost(None)

    def _notified(self, _conn: Any, _pid: int, channel: str, payload: str) -> None:
        batch = payload.encode() if payload else None
        for watch in self._watches.get(self._jobs.get(channel, ""), ()):
            watch.wake(batch)

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        with anyio.move_on_after(2.0, shield=True), contextlib.suppress(Exception):
            await conn.close(timeout=2.0)
        if not conn.is_closed():
            conn.terminate()

    async def close(self) -> None:
        """Close the connection (the store closes)."""
        async with self._lock:
            self._watches.clear()
            await self._close()


class PgWatch:
    """One follower's watch of one job on PostgreSQL (an `agentlife.stores._output_watch.OutputWatch`)."""

    def __init__(self, listener: PgOutputListener, job_id: str) -> None:
        self.job_id = job_id
        self._listener = listener
        self._batches: deque[bytes] = deque(maxlen=MAX_QUEUED_BATCHES)
        self._event = anyio.Event()

    async def __aenter__(self) -> PgWatch:
        await self._listener._add(self)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # Shielded: a follower leaves when its task is cancelled too, and must not leave its LISTEN behind.
        with anyio.move_on_after(5.0, shield=True):
            await self._listener._remove(self)

    def wake(self, batch: bytes | None) -> None:
        """A notification came: a delta batch, or None for a row."""
        if batch is not None:
            self._batches.append(batch)
        self._event.set()

    async def wait(self, moved: bool) -> list[bytes]:
        """Until a notification (or `FALLBACK_SECONDS`); the delta batches that came."""
        if not self._event.is_set():
            with anyio.move_on_after(FALLBACK_SECONDS):
                await self._event.wait()
        self._event = anyio.Event()
        await self._listener.reconnect_if_due()
        return await self.pending()

    async def pending(self) -> list[bytes]:
        """The delta batches notified since the last call."""
        batches = list(self._batches)
        self._batches.clear()
        return batches
