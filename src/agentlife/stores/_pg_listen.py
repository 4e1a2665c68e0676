"""Instant pickup on PostgreSQL: a ``LISTEN`` connection per store, woken by writes that make jobs runnable.

Every write that makes a job runnable now (create, a release to PENDING, retry, an approval that leaves the
row PENDING, a reap whose backoff is already over) calls ``pg_notify(channel, agent_id)`` in the same
statement, so the notification is sent when, and only if, the write commits. An idle worker waits in
`PgListener.wait` on a connection of its own (outside the pool: a ``LISTEN`` lives as long as its session,
and the pool hands sessions around), and claims as soon as a notification for its agent arrives.

The channel is named from the job table as the database resolves it, ``agentlife_<table>_<oid>``: two
agentlife schemas in one database, even with the same table name on different search paths, never wake each
other. The payload is the agent id; an empty payload (an agent id too long for a notification, or a control
plane's own ``SELECT pg_notify(channel, '')`` after a bulk insert) wakes every waiter.

The same connection class follows the ends of jobs for `agentlife.Client.result`: a trigger made by ``db
init`` (`pg_schema`) calls ``pg_notify(end channel, job id)`` when a row's status becomes terminal, on a
channel of its own (`end_channel_prefix`), so a worker is never woken by a job's end nor a waiting client by
new work; there the key waited for is a job id instead of an agent id.

A notification is a hint, never the only way to a job: a waiter that missed one (the connection dropped, it
was busy running a job, the row's backoff had not ended) still finds the job at its next fallback poll.
Nothing here raises: a failed connect or a dropped connection is logged once (redacted) and the wait falls
back to sleeping; a later wait connects again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import anyio

from agentlife.stores._base import TableNames
from agentlife.stores._pg_statements import (
    NOTIFY_PAYLOAD_LIMIT,
    channel_prefix,
    end_channel_prefix,
    notify_call,
)

__all__ = ["NOTIFY_PAYLOAD_LIMIT", "PgListener", "channel_prefix", "end_channel_prefix", "notify_call"]

_log = logging.getLogger("agentlife.store")
#: After a failed connect or a dropped connection, waits sleep this long at least before connecting again.
RECONNECT_AFTER_SECONDS = 1.0


class PgListener:
    """The dedicated ``LISTEN`` connection of one `PostgresStore`, opened on the first `wait`.

    Args:
        url: the connection URL (never logged: ``describe`` redacts every error text).
        tables: the store's table names (the channel is named from the job table).
        connect_timeout: seconds one connection attempt may take.
        describe: the store's redacting formatter for exceptions.
        prefix: the channel's name before the job table's OID (default: the channel of runnable work,
            whose notifications name agent ids; `end_channel_prefix` for the ends of jobs, naming job ids).
        waiters: who waits, for the log lines (``idle workers``).
    """

    def __init__(
        self,
        url: str,
        tables: TableNames,
        connect_timeout: float,
        describe: Callable[[BaseException], str],
        *,
        prefix: str | None = None,
        waiters: str = "idle workers",
    ) -> None:
        self._url = url
        self._tables = tables
        self._prefix = channel_prefix(tables) if prefix is None else prefix
        self._waiters = waiters
        self._connect_timeout = connect_timeout
        self._describe = describe
        self._conn: Any = None
        self._connecting: asyncio.Task[Any] | None = None
        self._retry_at = 0.0
        self._failing = False  # a failure was logged: stay quiet until a connection works again
        self._closed = False
        self.channel: str | None = None
        self._agents: set[str] = set()  # agent ids waited for, the only ones a notification marks
        self._pending: set[str] = set()  # notified since their last wait returned: claim at once
        self._events: dict[str, anyio.Event] = {}

    @property
    def listening(self) -> bool:
        """Whether the ``LISTEN`` connection is open now."""
        return self._conn is not None and not self._conn.is_closed()

    async def wait(self, agent_id: str, timeout: float) -> bool:
        """Whether work for ``agent_id`` may be runnable: True when notified or just (re)connected.

        False at ``timeout``. Never raises but for cancellation.
        """
        self._agents.add(agent_id)
        if self._take(agent_id):
            return True
        with anyio.move_on_after(max(timeout, 0.0)):
            if await self._ensure_connected():
                # Notifications sent before this LISTEN was in place are lost: have the caller claim once.
                return True
            if not self.listening:
                await anyio.sleep_forever()  # the fallback: the caller polls at the timeout
            event = self._events.get(agent_id)
            if event is None:
                event = self._events[agent_id] = anyio.Event()
            await event.wait()
            self._pending.discard(agent_id)
            return True
        return False

    def watch(self, key: str) -> None:
        """Mark notifications for ``key`` from now on, before the caller reads what it will wait for.

        A notification that comes between that read and the `wait` is kept for it, never lost.
        """
        self._agents.add(key)

    def forget(self, key: str) -> None:
        """Stop marking notifications for ``key`` (a job id no one waits for any more)."""
        self._agents.discard(key)
        self._pending.discard(key)
        self._events.pop(key, None)

    def _take(self, agent_id: str) -> bool:
        if agent_id in self._pending:
            self._pending.discard(agent_id)
            return True
        return False

    def _notified(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        agents = set(self._agents) if not payload else {payload} & self._agents
        for agent in agents:
            self._pending.add(agent)
            event = self._events.pop(agent, None)
            if event is not None:
                event.set()

    def _terminated(self, conn: Any) -> None:
        if conn is self._conn:
            self._conn = None
            self._retry_at = time.monotonic() + RECONNECT_AFTER_SECONDS
            self._failed(f"PostgreSQL LISTEN connection lost; {self._waiters} poll until it is back")

    def _failed(self, message: str, exc: BaseException | None = None) -> None:
        if not self._failing:
            self._failing = True
            detail = f": {self._describe(exc)}" if exc is not None else ""
            _log.warning("%s%s", message, detail)

    async def _ensure_connected(self) -> bool:
        """Connect (or go on connecting) unless open, closed or failed lately; True when it connected now."""
        if self._closed or self.listening:
            return False
        if self._connecting is None:
            if time.monotonic() < self._retry_at:
                return False
            # Its own task: a waiter cancelled mid-connect (its timeout, a drain) must not leave a half-open
            # session behind; the next wait picks the result up.
            self._connecting = asyncio.get_running_loop().create_task(self._connect())
        task = self._connecting
        await asyncio.wait([task])  # never raises what the task raised; cancelling us leaves it running
        if self._connecting is task:
            self._connecting = None
        return self.listening

    async def _connect(self) -> None:
        import asyncpg  # type: ignore[import-untyped]  # loaded already: the store's pool is open

        conn: Any = None
        try:
            conn = await asyncpg.connect(self._url, timeout=self._connect_timeout)
            oid = await conn.fetchval(
                "SELECT to_regclass($1)::oid", self._tables.job, timeout=self._connect_timeout
            )
            if oid is None:
                raise LookupError(f"no table {self._tables.job}: run `python -m agentlife db init`")
            channel = f"{self._prefix}{oid}"
            await conn.add_listener(channel, self._notified)
            conn.add_termination_listener(self._terminated)
        except BaseException as exc:
            if conn is not None:
                conn.terminate()  # no half-open session left behind, whatever stopped us
            if not isinstance(exc, Exception):
                raise  # cancelled by `close`
            self._retry_at = time.monotonic() + RECONNECT_AFTER_SECONDS
            self._failed(f"PostgreSQL LISTEN unavailable; {self._waiters} poll instead", exc)
            return
        if self._closed:  # closed while connecting
            conn.terminate()
            return
        if self._failing:
            _log.info("PostgreSQL LISTEN connection is back: %s are woken at once again", self._waiters)
        self._failing = False
        self.channel = channel
        self._conn = conn

    async def close(self) -> None:
        """Close the connection (shielded, a few seconds at most); a later `wait` connects again."""
        self._closed = True
        try:
            await self._close()
        finally:
            self._closed = False
            self._pending.clear()

    async def _close(self) -> None:
        task, self._connecting = self._connecting, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task], timeout=2.0)
        conn, self._conn = self._conn, None
        if conn is None:
            return
        with anyio.move_on_after(2.0, shield=True):
            with contextlib.suppress(Exception):
                await conn.close(timeout=2.0)
        if not conn.is_closed():
            conn.terminate()
