"""What the HTTP API does to jobs: `agentlife.Client`'s operations, over the store the console reads.

`ConsoleClients` gives the routes a `Client` on the console's `ConsoleStore` (the store at the configured
path now: a SQLite file replaced or removed is noticed), one per open store, so every operation the API
serves is the client's, the one implementation the ``job`` commands and the console's pages run too. A
write is acknowledged only once `ConsoleStore.confirm` shows it went to the store at the path.

`OutputFollower` is what a job's event stream reads: `follow_job` over the same store, its events masked.
A cursor of another job, one made up or one past the job's last event is refused before a stream starts.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import orjson

from agentlife._client._client import Client
from agentlife._config import validate_job_id
from agentlife._console._sse import Frame
from agentlife._console._store import ConsoleStore
from agentlife._exceptions import ConfigError, JobNotFound, StoreError
from agentlife._jobs._mask import Masker
from agentlife._output._events import JobEvent, parse_cursor
from agentlife._output._follow import follow_job
from agentlife.stores._prune import pruned_message

__all__ = ["ConsoleClients", "OutputFollower"]


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


class OutputFollower:
    """A job's output (`follow_job`: published events, status changes, model text, its end) as frames."""

    def __init__(self, store: ConsoleStore, masker: Masker) -> None:
        self._store = store
        self._masker = masker

    async def check(self, job_id: str, after: str | None) -> int | None:
        """The order of ``after`` in the job's output, once the job and the cursor are known good.

        Raises:
            ConfigError: a malformed job id, or a cursor of another job, made up, or past its last event.
            JobNotFound: there is no such job.
        """
        validate_job_id(job_id)
        seq = parse_cursor(job_id, after) if after is not None else None
        store = await self._store.get()
        head = await store.output_head(job_id)
        if head is None:
            raise JobNotFound(pruned_message(job_id, await store.pruned_job(job_id)))
        if seq is not None and seq > head:
            raise ConfigError(f"the cursor is past job {job_id}'s last event: not one of its cursors")
        return seq

    async def follow(self, job_id: str, after: str | None) -> AsyncIterator[Frame]:
        """The job's output after ``after``, masked, ending after its end."""
        store = await self._store.get()
        async with follow_job(store, job_id, after) as events:
            async for event in events:
                yield self._frame(event)

    def _frame(self, event: JobEvent) -> Frame:
        body = event.to_json()
        body["name"] = self._masker.text(event.name, 200)
        body["value"] = self._masker.whole(event.value)
        durable = event.kind != "delta"
        seq = int(event.cursor.partition(".")[0])
        # No frame ends a stream by itself: it ends when the follower does (after the job's end when that
        # is its last event; a job retried after its end goes on, as `Client.events` does).
        return Frame(event.cursor, event.kind, orjson.dumps(body), False, durable, seq)
