"""What the HTTP API does to jobs: `agentlife.Client`'s operations, over the store the console reads.

`ConsoleClients` gives the routes a `Client` on the console's `ConsoleStore` (the store at the configured
path now: a SQLite file replaced or removed is noticed), one per open store, so every operation the API
serves is the client's, the one implementation the ``job`` commands and the console's pages run too. A
write is acknowledged only once `ConsoleStore.confirm` shows it went to the store at the path.

`StatusFollower` is what a job's event stream reads until the store records published events: the job's
status changes and its end, read from its row. Each event carries a cursor bound to the job (a MAC under a
key of this process over the job id and the row's version), so a cursor of another job, or one made up,
is refused before a stream starts.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio

from agentlife._client._client import Client
from agentlife._console._data import BadRequest, row_version
from agentlife._console._sse import Frame, data
from agentlife._console._store import ConsoleStore
from agentlife._exceptions import StoreError
from agentlife._jobs._mask import Masker
from agentlife.stores import CheckpointStore, JobStatus

__all__ = ["ConsoleClients", "StatusFollower"]

#: The statuses after which a job's events end.
TERMINAL = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.DEAD_LETTER})


class ConsoleClients:
    """A `Client` on the console's store as it is now: a new one when the store was opened again."""

    def __init__(self, store: ConsoleStore, masker: Masker) -> None:
        self._store = store
        self._masker = masker
        self._current: tuple[object, Client] | None = None

    async def get(self) -> Client:
        """The client of the store at the configured path.

        Raises:
            StoreError: there is no store there, or it cannot be opened.
        """
        store = await self._store.get()
        if self._current is None or self._current[0] is not store:
            old, self._current = self._current, (store, Client(store, self._masker))  # type: ignore[arg-type]
            if old is not None:
                await _close(old[1])
        return self._current[1]

    async def confirm(self, client: Client) -> None:
        """Check that a write just made through ``client`` went to the store at the configured path.

        Raises:
            NotRecorded: the SQLite file was removed or replaced meanwhile.
        """
        store = self._current[0] if self._current is not None and self._current[1] is client else None
        await self._store.confirm(store)  # type: ignore[arg-type]

    async def close(self) -> None:
        """Close the current client's listener (the console closes the store)."""
        current, self._current = self._current, None
        if current is not None:
            await _close(current[1])


async def _close(client: Client) -> None:
    # The store is the console's: it was closed already (it was replaced), or the console closes it.
    with contextlib.suppress(StoreError, OSError):
        await client.close()


class StatusFollower:
    """A job's status changes and its end, as a stream's events, with cursors bound to the job."""

    def __init__(self, store: ConsoleStore, masker: Masker, poll: float = 0.25) -> None:
        self._store = store
        self._masker = masker
        self._poll = poll
        self._key = secrets.token_bytes(32)

    def check_cursor(self, job_id: str, cursor: str) -> None:
        """`BadRequest` unless ``cursor`` is one this process made for ``job_id``."""
        version, _, mac = cursor.rpartition(".")
        if not version or not hmac.compare_digest(mac, self._mac(job_id, version)):
            raise BadRequest("the cursor is not one of this job's events (Last-Event-ID or ?after=)")

    async def follow(self, job_id: str, after: str | None) -> AsyncIterator[Frame]:
        """The job's status changes after ``after``, then its end."""
        seen = after.rpartition(".")[0] if after is not None else None
        while True:
            store: CheckpointStore = await self._store.get()  # type: ignore[assignment]
            row = await store.get_job(job_id)
            if row is None:
                return
            version = row_version(row)
            if version != seen:
                seen = version
                value = {"status": self._masker.text(row.status, 100), "attempt": row.attempt}
                yield self._frame(job_id, version, "status", value)
            if row.status in TERMINAL:
                value = {"status": self._masker.text(row.status, 100)}
                yield self._frame(job_id, version + "-end", "end", value, last=True)
                return
            await anyio.sleep(self._poll)

    def _frame(self, job_id: str, version: str, kind: str, value: Any, *, last: bool = False) -> Frame:
        cursor = f"{version}.{self._mac(job_id, version)}"
        body = {"cursor": cursor, "kind": kind, "name": None, "value": value, "time": time.time()}
        return Frame(cursor, kind, data(body, self._masker.value), last=last)

    def _mac(self, job_id: str, version: str) -> str:
        message = f"{job_id}\x00{version}".encode("utf-8", "surrogatepass")
        digest = hmac.new(self._key, message, hashlib.sha256).digest()[:12]
        return base64.urlsafe_b64encode(digest).decode()
