"""What the HTTP API does to jobs: the operations it serves, as one object the routes call.

`Operations` is the seam between the routes and the job store: each route calls one of its methods and
turns what it returns into JSON. `StoreOperations` makes each with the same store calls and rules as the
``job`` commands and the console's actions (creating a job exclusively, ``approve_parked``,
``cancel_with_children``), through the console's `ConsoleStore`, so the API can do nothing the command
line could not.

A job's events (`Operations.follow`) are its status changes and its end, read from its row; each
carries a cursor bound to the job (a MAC under a key of this process over the job id and the row's
version), so a cursor of another job, or one made up, is refused before a stream starts.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import anyio

from agentlife._config import validate_job_id
from agentlife._console._data import BadRequest, row_version
from agentlife._console._sse import Frame, data
from agentlife._console._store import ConsoleStore
from agentlife._exceptions import JobNotFound, JobStateConflict
from agentlife._jobs._approve import approve_parked
from agentlife._jobs._mask import Masker
from agentlife.stores import JobRecord, JobStatus
from agentlife.stores._childjobs import cancel_with_children

__all__ = ["Detail", "Operations", "Started", "StoreOperations"]

#: The statuses after which a job's events end.
TERMINAL = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.DEAD_LETTER})


@dataclass(frozen=True, slots=True)
class Detail:
    """A job as `Operations.get` reads it: its row, the call it is parked on, what it waits for."""

    row: JobRecord
    approval: Mapping[str, Any] | None = None
    waiting_for: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Started:
    """What `Operations.start` did: the job's row, and whether this call created it."""

    row: JobRecord
    created: bool


class Operations(Protocol):
    """The operations the HTTP API serves.

    Every method raises `JobNotFound`, `JobStateConflict`, `ConfigError` (bad input) or `StoreError` as
    the job commands do.
    """

    async def start(self, agent_id: str, payload: Any, job_id: str | None) -> Started: ...

    async def get(self, job_id: str) -> Detail | None: ...

    async def result(self, job_id: str, timeout: float) -> JobRecord | None: ...

    async def list(
        self, status: str | None, agent_id: str | None, limit: int, after: tuple[Any, Any] | None
    ) -> list[JobRecord]: ...

    async def send(self, job_id: str, name: str, payload: Any) -> int: ...

    async def approve(self, job_id: str, call: str | None) -> JobRecord: ...

    async def reject(self, job_id: str, reason: str) -> JobRecord: ...

    async def cancel(self, job_id: str, reason: str) -> JobRecord: ...

    async def retry(self, job_id: str) -> JobRecord: ...

    def check_cursor(self, job_id: str, cursor: str) -> None: ...

    def follow(self, job_id: str, after: str | None) -> AsyncIterator[Frame]: ...


class StoreOperations:
    """`Operations` made with the job commands' store calls, through the console's store."""

    def __init__(self, store: ConsoleStore, masker: Masker, poll: float = 0.25) -> None:
        self._store = store
        self._masker = masker
        self._poll = poll
        self._key = secrets.token_bytes(32)

    async def start(self, agent_id: str, payload: Any, job_id: str | None) -> Started:
        """Create the job, or return the one with this id when it was created with the same input."""
        job_id = validate_job_id(job_id) if job_id is not None else _new_job_id()
        store = await self._store.get()
        try:
            row = await store.create_job(job_id, agent_id, payload, exclusive=True)
        except JobStateConflict:
            row_now = await store.get_job(job_id)
            if row_now is None or row_now.agent_id != agent_id or row_now.payload != payload:
                raise JobStateConflict(
                    f"job {job_id} exists with another agent or payload: starting it again is refused"
                ) from None
            return Started(row_now, created=False)
        await self._store.confirm(store)
        return Started(row, created=True)

    async def get(self, job_id: str) -> Detail | None:
        """The job's row with what it waits for, or None."""
        store = await self._store.get()
        row = await store.get_job(job_id)
        if row is None:
            return None
        approval = await store.get_approval(job_id) if row.status == JobStatus.WAITING_FOR_APPROVAL else None
        wait = await store.get_wait(job_id) if row.status == JobStatus.WAITING else None
        request = approval.request if approval is not None else None
        return Detail(row, request, wait.waiting_for if wait is not None else None)

    async def result(self, job_id: str, timeout: float) -> JobRecord | None:
        """The job's row once it is COMPLETED, FAILED or DEAD_LETTER; None when ``timeout`` passed first."""
        with anyio.move_on_after(timeout):
            while True:
                row = await (await self._store.get()).get_job(job_id)
                if row is None:
                    raise JobNotFound(f"there is no job {job_id!r}")
                if row.status in TERMINAL:
                    return row
                await anyio.sleep(self._poll)
        return None

    async def list(
        self, status: str | None, agent_id: str | None, limit: int, after: tuple[Any, Any] | None
    ) -> list[JobRecord]:
        """Rows newest first after the keyset cursor ``after``."""
        store = await self._store.get()
        try:
            return await store.list_jobs(status, agent_id, limit, after=after)
        except ValueError:
            raise BadRequest("the paging cursor is not one of this store") from None

    async def send(self, job_id: str, name: str, payload: Any) -> int:
        """Send an event to the job (what ``wait_for_event`` takes); its sequence number."""
        store = await self._store.get()
        seq = await store.send_event(job_id, name, payload)
        await self._store.confirm(store)
        return seq

    async def approve(self, job_id: str, call: str | None) -> JobRecord:
        """Grant the parked call ``call`` (None: the job records none)."""
        store = await self._store.get()
        await approve_parked(store, job_id, call, given_by="the HTTP API", shown=True)
        return await self._recorded(store, job_id)

    async def reject(self, job_id: str, reason: str) -> JobRecord:
        """Refuse the parked call: the job ends FAILED."""
        store = await self._store.get()
        await store.reject(job_id, reason)
        return await self._recorded(store, job_id)

    async def cancel(self, job_id: str, reason: str) -> JobRecord:
        """Cancel the job and its children that were not started detached."""
        store = await self._store.get()
        await cancel_with_children(store, job_id, reason)
        return await self._recorded(store, job_id)

    async def retry(self, job_id: str) -> JobRecord:
        """Make a FAILED or DEAD_LETTER job runnable again."""
        store = await self._store.get()
        await store.retry(job_id)
        return await self._recorded(store, job_id)

    async def _recorded(self, store: Any, job_id: str) -> JobRecord:
        row = await store.get_job(job_id)
        await self._store.confirm(store)
        if row is None:
            raise JobNotFound(f"job {job_id} is gone from the store")
        return row  # type: ignore[no-any-return]

    # -- events -------------------------------------------------------------------------------------------

    def check_cursor(self, job_id: str, cursor: str) -> None:
        """`BadRequest` unless ``cursor`` is one this process made for ``job_id``."""
        version, _, mac = cursor.rpartition(".")
        if not version or not hmac.compare_digest(mac, self._mac(job_id, version)):
            raise BadRequest("the cursor is not one of this job's events (Last-Event-ID or ?after=)")

    async def follow(self, job_id: str, after: str | None) -> AsyncIterator[Frame]:
        """The job's status changes after ``after``, then its end."""
        seen = after.rpartition(".")[0] if after is not None else None
        while True:
            row = await (await self._store.get()).get_job(job_id)
            if row is None:
                return
            version = row_version(row)
            if version != seen:
                seen = version
                status = self._masker.text(row.status, 100)
                value = {"status": status, "attempt": row.attempt}
                yield self._frame(job_id, version, "status", value)
            if row.status in TERMINAL:
                yield self._frame(job_id, version + "-end", "end", {"status": row.status}, last=True)
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


def _new_job_id() -> str:
    return f"job-{secrets.token_hex(8)}"
