"""`BlockingClient`: `Client`'s operations for code that is not async (scripts, Flask or Django views).

It runs a `Client` on an event loop of its own, in a thread anyio's blocking portal starts, and hands each
call to that loop, blocking the calling thread until it is answered. Any number of threads may share one
(a web server's worker threads): their calls run concurrently on the one loop and its one store. Not for
async code (it would block the caller's loop): use `Client` there.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, TypeVar

from anyio.from_thread import BlockingPortal, start_blocking_portal

from agentlife._client._client import Client
from agentlife._client._views import JobPage, JobSnapshot, JobSummary
from agentlife._exceptions import ConfigError
from agentlife._jobrefs import JobHandle
from agentlife._output._events import JobEvent
from agentlife._output._follow import JobFollower

__all__ = ["BlockingClient"]

_T = TypeVar("_T")


class BlockingClient:
    """`Client` for code that is not async: the same operations, each blocking until it is answered.

    Example::

        with agentlife.BlockingClient.connect() as client:
            job = client.start("researcher", {"topic": "tides"}, job_id="research-42")
            answer = client.result(job.job_id, timeout=600)
    """

    def __init__(
        self, portal: BlockingPortal, context: AbstractContextManager[BlockingPortal], client: Client
    ):
        """Use `connect`."""
        self._portal = portal
        self._context = context
        self._client = client
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def connect(cls, database_url: str | None = None) -> BlockingClient:
        """Start the client's loop and open the store, as `Client.connect` does (and raises)."""
        context = start_blocking_portal()
        portal = context.__enter__()
        try:
            client = portal.call(Client.connect, database_url)
        except BaseException as exc:
            context.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return cls(portal, context, client)

    def close(self) -> None:
        """Close the store and stop the loop's thread; safe to call twice, from any thread but the loop's."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._portal.call(self._client.close)
        finally:
            self._context.__exit__(None, None, None)

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def start(
        self,
        agent_id: str,
        payload: Any = None,
        *,
        job_id: str | None = None,
        concurrency_key: str | None = None,
        priority: int = 0,
    ) -> JobHandle:
        """`Client.start`."""
        start = functools.partial(
            self._client.start,
            agent_id,
            payload,
            job_id=job_id,
            concurrency_key=concurrency_key,
            priority=priority,
        )
        return self._call(start)

    def get(self, job_id: str) -> JobSnapshot:
        """`Client.get`."""
        return self._call(functools.partial(self._client.get, job_id))

    def list(
        self,
        *,
        status: str | None = None,
        agent_id: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> JobPage:
        """`Client.list`."""
        listing = self._client.list
        return self._call(
            functools.partial(listing, status=status, agent_id=agent_id, limit=limit, after=after)
        )

    def result(self, job_id: str, timeout: float | None = None) -> Any:
        """`Client.result`: blocks the calling thread until the job ends or ``timeout`` passes."""
        return self._call(functools.partial(self._client.result, job_id, timeout))

    def send(self, job_id: str, name: str, payload: Any = None) -> int:
        """`Client.send`."""
        return self._call(functools.partial(self._client.send, job_id, name, payload))

    def approve(self, job_id: str, *, call: str | None = None) -> JobSummary:
        """`Client.approve`."""
        return self._call(functools.partial(self._client.approve, job_id, call=call))

    def reject(self, job_id: str, reason: str = "approval rejected") -> JobSummary:
        """`Client.reject`."""
        return self._call(functools.partial(self._client.reject, job_id, reason))

    def cancel(self, job_id: str, reason: str = "cancelled by an operator") -> JobSummary:
        """`Client.cancel`."""
        return self._call(functools.partial(self._client.cancel, job_id, reason))

    def retry(self, job_id: str) -> JobSummary:
        """`Client.retry`."""
        return self._call(functools.partial(self._client.retry, job_id))

    def events(self, job_id: str, after: str | None = None, *, live: bool = True) -> Iterator[JobEvent]:
        """`Client.events`, one event at a time: leaving the loop early (``break``) closes the follower."""
        if self._closed:
            raise ConfigError("this agentlife.BlockingClient is closed")
        return self._iterate(self._client.events(job_id, after, live=live))

    def _iterate(self, follower: JobFollower) -> Iterator[JobEvent]:
        try:
            while True:
                try:
                    event = self._portal.call(follower.__anext__)
                except StopAsyncIteration:
                    return
                yield event
        finally:
            if not self._closed:
                self._portal.call(follower.aclose)

    def _call(self, operation: Callable[[], Awaitable[_T]]) -> _T:
        if self._closed:
            raise ConfigError("this agentlife.BlockingClient is closed")
        return self._portal.call(operation)
