"""`BlockingClient`: `Client`'s operations for code that is not async (scripts, Flask or Django views).

It runs a `Client` on an event loop of its own, in a daemon thread, and hands each call to that loop
through anyio's blocking portal, blocking the calling thread until it is answered. Any number of threads
may share one (a web server's worker threads): their calls run concurrently on the one loop and its one
store. Not for async code (it would block the caller's loop): use `Client` there.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import queue
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from types import TracebackType
from typing import Any, TypeVar

import anyio
from anyio.from_thread import BlockingPortal

from agentlife._client._client import Client
from agentlife._client._views import JobPage, JobSnapshot, JobSummary
from agentlife._exceptions import ConfigError
from agentlife._jobrefs import JobHandle
from agentlife._jobs._batch import DEFAULT_LIMIT, BatchReport
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

    def __init__(self, loop: _LoopThread, client: Client):
        """Use `connect`."""
        self._loop = loop
        self._client = client
        self._lock = threading.Lock()
        self._closed = False
        self._calls: set[anyio.CancelScope] = set()  # touched on the loop's thread only

    @classmethod
    def connect(cls, database_url: str | None = None) -> BlockingClient:
        """Start the client's loop and open the store, as `Client.connect` does (and raises)."""
        loop = _LoopThread.start()
        try:
            client = loop.portal.call(Client.connect, database_url)
        except BaseException:
            loop.stop()
            raise
        return cls(loop, client)

    def close(self) -> None:
        """Close the store and stop the loop's thread; safe to call twice, from any thread but the loop's.

        Calls other threads are waiting in (a `result` without a timeout, an `events` loop) end at once
        with `ConfigError` ("closed while the call waited").
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._loop.portal.call(self._end_calls_and_close)
        finally:
            self._loop.stop()

    async def _end_calls_and_close(self) -> None:
        for scope in self._calls:
            scope.cancel()
        await self._client.close()

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

    def approve(self, job_id: str, *, call: str | None = None, actor: str | None = None) -> JobSummary:
        """`Client.approve`."""
        return self._call(functools.partial(self._client.approve, job_id, call=call, actor=actor))

    def reject(
        self, job_id: str, reason: str = "approval rejected", *, actor: str | None = None
    ) -> JobSummary:
        """`Client.reject`."""
        return self._call(functools.partial(self._client.reject, job_id, reason, actor=actor))

    def cancel(
        self, job_id: str, reason: str = "cancelled by an operator", *, actor: str | None = None
    ) -> JobSummary:
        """`Client.cancel`."""
        return self._call(functools.partial(self._client.cancel, job_id, reason, actor=actor))

    def retry(self, job_id: str, *, actor: str | None = None) -> JobSummary:
        """`Client.retry`."""
        return self._call(functools.partial(self._client.retry, job_id, actor=actor))

    def pause(self, job_id: str, reason: str | None = None, *, actor: str | None = None) -> JobSummary:
        """`Client.pause`."""
        return self._call(functools.partial(self._client.pause, job_id, reason, actor=actor))

    def resume(self, job_id: str, *, actor: str | None = None) -> JobSummary:
        """`Client.resume`."""
        return self._call(functools.partial(self._client.resume, job_id, actor=actor))

    def select(
        self,
        action: str,
        *,
        status: str | None = None,
        agent_id: str | None = None,
        older_than: float | str | None = None,
        ids: Sequence[str] | None = None,
        limit: int = DEFAULT_LIMIT,
    ) -> builtins.list[str]:
        """`Client.select`."""
        return self._call(
            functools.partial(
                self._client.select,
                action,
                status=status,
                agent_id=agent_id,
                older_than=older_than,
                ids=ids,
                limit=limit,
            )
        )

    def act_many(
        self, action: str, job_ids: Sequence[str], *, reason: str | None = None, actor: str | None = None
    ) -> BatchReport:
        """`Client.act_many`."""
        return self._call(
            functools.partial(self._client.act_many, action, job_ids, reason=reason, actor=actor)
        )

    def rewind(
        self,
        job_id: str,
        to_step: int,
        *,
        as_job_id: str | None = None,
        force: bool = False,
        reason: str | None = None,
        actor: str | None = None,
    ) -> JobSummary:
        """`Client.rewind`."""
        return self._call(
            functools.partial(
                self._client.rewind,
                job_id,
                to_step,
                as_job_id=as_job_id,
                force=force,
                reason=reason,
                actor=actor,
            )
        )

    def events(self, job_id: str, after: str | None = None, *, live: bool = True) -> Iterator[JobEvent]:
        """`Client.events`, one event at a time: leaving the loop early (``break``) closes the follower."""
        if self._closed:
            raise ConfigError("this agentlife.BlockingClient is closed")
        return self._iterate(self._client.events(job_id, after, live=live))

    def _iterate(self, follower: JobFollower) -> Iterator[JobEvent]:
        try:
            while True:
                try:
                    event = self._call(follower.__anext__)
                except StopAsyncIteration:
                    return
                yield event
        finally:
            if not self._closed:
                self._call(follower.aclose)

    def _call(self, operation: Callable[[], Awaitable[_T]]) -> _T:
        if self._closed:
            raise ConfigError("this agentlife.BlockingClient is closed")
        try:
            return self._loop.portal.call(self._guarded, operation)
        except RuntimeError as exc:  # the portal stopped between the check above and the call
            if not self._closed:
                raise
            raise ConfigError("this agentlife.BlockingClient is closed") from exc

    async def _guarded(self, operation: Callable[[], Awaitable[_T]]) -> _T:
        with anyio.CancelScope() as scope:
            self._calls.add(scope)
            try:
                return await operation()
            finally:
                self._calls.discard(scope)
        raise ConfigError("this agentlife.BlockingClient was closed while the call waited")


class _LoopThread:
    """An event loop on a daemon thread, and the portal other threads call it through.

    A daemon thread, unlike the pool thread of anyio's ``start_blocking_portal``: a script that ends (or
    raises) without closing its client must still exit, not wait for ever on the loop.
    """

    def __init__(self, portal: BlockingPortal, thread: threading.Thread) -> None:
        self.portal = portal
        self._thread = thread

    @classmethod
    def start(cls) -> _LoopThread:
        started: queue.SimpleQueue[BlockingPortal | BaseException] = queue.SimpleQueue()

        async def serve() -> None:
            async with BlockingPortal() as portal:
                started.put(portal)
                await portal.sleep_until_stopped()

        def run() -> None:
            try:
                anyio.run(serve)
            except BaseException as exc:  # handed to the thread that waits for the portal
                started.put(exc)

        thread = threading.Thread(target=run, name="agentlife-client", daemon=True)
        thread.start()
        got = started.get()
        if isinstance(got, BaseException):
            raise got
        return cls(got, thread)

    def stop(self) -> None:
        """Stop the loop (cancelling what still runs on it) and wait for its thread."""
        with contextlib.suppress(RuntimeError):  # stopped already
            self.portal.call(self.portal.stop, True)
        self._thread.join(timeout=10)
