"""`Client`: an application's way into agentlife: start jobs, read them, wait for results, answer them.

One client holds one open store (the URL rules, default and errors of every tool: ``database_url``, else
``AGENTLIFE_DATABASE_URL``, else the embedded SQLite file under ``AGENTLIFE_DATA_DIR``, which must exist:
a worker or ``db init`` makes it) and runs every operation through the implementation ``job`` commands and
the console run, so a job started or answered here is exactly one started or answered there.

Everything it is given is checked before the store is touched: a bad id, a payload that is not JSON the
row can hold, a timeout that is no number of seconds is a `ConfigError` in one line and writes nothing.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import os
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.to_thread
import orjson

from agentlife._client._views import JobPage, JobSnapshot, JobSummary, snapshot, summary
from agentlife._client._wait import check_timeout, outcome, wait_for_end
from agentlife._config import database_url_from_env, validate_database_url, validate_job_id
from agentlife._exceptions import ConfigError, JobNotFound
from agentlife._jobrefs import JobHandle
from agentlife._jobs._actor import check_actor, default_actor
from agentlife._jobs._approve import approve_parked
from agentlife._jobs._batch import (
    BATCH_ACTIONS,
    DEFAULT_LIMIT,
    BatchAction,
    BatchReport,
    Selection,
    act_on_each,
    check_limit,
    parse_age,
    select_jobs,
)
from agentlife._jobs._cursor import decode_position, encode_position, position_of
from agentlife._jobs._mask import Masker, masker_for
from agentlife._jobs._pause import pause_job, resume_job
from agentlife._jobs._reason import check_reason
from agentlife._jobs._rewind import plan_rewind, rewind_job
from agentlife._jobs._start import check_start, create_job
from agentlife._jobs._view import missing_job, read_job_state
from agentlife._output._follow import JobFollower, follow_job
from agentlife.stores import CheckpointStore, JobStatus, store_from_url
from agentlife.stores._childjobs import cancel_with_children
from agentlife.stores._events import check_event

if TYPE_CHECKING:
    from agentlife.stores._pg_listen import PgListener

__all__ = ["MAX_LIST", "Client"]

#: Payloads up to this much JSON are checked on the loop (a few milliseconds); larger ones on a thread.
_CHECK_INLINE_BYTES = 16 * 1024
_T = TypeVar("_T")

#: The most jobs one `Client.list` page holds.
MAX_LIST = 1000
#: The longest agent id a list filter may name (rows written by other tools may break the id pattern).
_MAX_FILTER = 512


class Client:
    """A connection to agentlife's store for an application: start, read, wait for and answer jobs.

    Make one with `connect` (or ``async with await Client.connect(...)``), share it between tasks, and
    `close` it at the end. `BlockingClient` offers the same for code that is not async.

    Example::

        async with await agentlife.Client.connect() as client:
            job = await client.start("researcher", {"topic": "tides"}, job_id="research-42")
            answer = await client.result(job.job_id, timeout=600)
    """

    def __init__(self, store: CheckpointStore, masker: Masker) -> None:
        """Use `connect`: this takes an open store and the masker of its URL."""
        self._store = store
        self._masker = masker
        self._listener: PgListener | None = None
        self._listening: dict[str, int] = {}
        self._closed = False
        self._loop = _running_loop()  # a pool's connections belong to the loop that opened them

    @classmethod
    async def connect(cls, database_url: str | None = None) -> Client:
        """Open the store at ``database_url`` (default: ``AGENTLIFE_DATABASE_URL``, else the embedded file).

        Raises:
            ConfigError: the URL names no usable store (its password is never quoted).
            StoreError: there is no store there (``no store at PATH``: run ``python -m agentlife db init``).
            StoreUnavailable: the database cannot be reached.
        """
        if database_url is None:
            url = database_url_from_env(os.environ)
            validate_database_url(url)
        elif not isinstance(database_url, str):
            raise ConfigError(f"database_url must be a string, got {type(database_url).__name__}")
        else:
            url = validate_database_url(database_url, "database_url")
        store = _open_store(url)
        try:
            await store.open()
            # One read: a refused login, a missing database or a schema `db init` never made fails here,
            # not at the application's first request (the pool opens no connection by itself).
            await store.list_jobs(limit=1)
        except BaseException:
            with anyio.CancelScope(shield=True):  # a cancelled connect leaves no pool or file open
                await store.close()
            raise
        return cls(store, masker_for(os.environ, url))

    async def close(self) -> None:
        """Close the store and the ``LISTEN`` connection; safe to call twice.

        From another event loop than the one that connected it (that loop has ended, say), it only marks
        the client closed: what it held belonged to that loop.
        """
        self._closed = True
        listener, self._listener = self._listener, None
        if self._loop is not None and _running_loop() is not self._loop:
            return
        try:
            if listener is not None:
                await listener.close()
        finally:
            await self._store.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- starting and reading ---------------------------------------------------------------------------

    async def start(
        self,
        agent_id: str,
        payload: Any = None,
        *,
        job_id: str | None = None,
        concurrency_key: str | None = None,
        priority: int = 0,
    ) -> JobHandle:
        """Start a job of ``agent_id`` with ``payload`` (JSON): a PENDING row a worker of the agent claims.

        ``concurrency_key`` and ``priority`` are the job's key and priority (see "Concurrency keys and
        priority": workers never run more jobs of one key than its limit; higher priority is claimed first).

        Starting ``job_id`` again with the same agent and payload returns the job that exists (whatever its
        status), so a start retried after a timeout or a crash creates one job: give a ``job_id`` to make
        a start safe to retry. Without one, each call makes a new id.

        Raises:
            ConfigError: a bad agent id, job id, key or priority, or a payload that is not JSON the row can
                hold (U+0000, a NaN, nesting past 128 levels, more than 1 MiB); nothing is written.
            JobStateConflict: ``job_id`` exists with another agent or payload.
        """
        self._check_open()
        agent, job = await _checked(payload, check_start, agent_id, payload, job_id, "the payload")
        row = await create_job(
            self._store,
            job,
            agent,
            payload,
            exclusive=False,
            concurrency_key=concurrency_key,
            priority=priority,
        )
        return JobHandle(job_id=row.id, agent_id=row.agent_id)

    async def get(self, job_id: str) -> JobSnapshot:
        """The job as it stands now.

        Raises:
            JobNotFound: there is no such job.
        """
        job = self._job_id(job_id)
        state = await read_job_state(self._store, job)
        if state is None:
            raise JobNotFound(await missing_job(self._store, job))
        return snapshot(state, self._masker)

    async def list(
        self,
        *,
        status: str | None = None,
        agent_id: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> JobPage:
        """One page of jobs, most recently updated first, filtered as ``job list`` filters.

        Args:
            status: only jobs in this status (`agentlife.stores.JobStatus`).
            agent_id: only jobs of this agent.
            limit: at most this many jobs (1 to `MAX_LIST`).
            after: the `JobPage.next_cursor` of the page before (keyset paging: a job updated meanwhile
                moves to the top and is not seen twice on the pages that follow).

        Raises:
            ConfigError: an unknown status, a bad limit, or a cursor that is not one of this store's.
        """
        self._check_open()
        if status is not None and status not in {str(s) for s in JobStatus}:
            raise ConfigError("status must be one of " + ", ".join(str(s) for s in JobStatus))
        if agent_id is not None and (
            not isinstance(agent_id, str) or len(agent_id) > _MAX_FILTER or "\x00" in agent_id
        ):
            raise ConfigError(f"agent_id must be text of at most {_MAX_FILTER} characters, without NUL")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST:
            raise ConfigError(f"limit must be a whole number from 1 to {MAX_LIST}, got {limit!r}")
        position = _position(after)
        try:
            rows = await self._store.list_jobs(status, agent_id, limit + 1, after=position)
        except ValueError:  # a cursor of another store (bytes or a non-number time on PostgreSQL)
            raise ConfigError("after is not a paging cursor of this store") from None
        more = len(rows) > limit
        rows = rows[:limit]
        cursor = encode_position(position_of(rows[-1])) if more and rows else None
        return JobPage(tuple(summary(row) for row in rows), cursor)

    def events(self, job_id: str, after: str | None = None, *, live: bool = True) -> JobFollower:
        """Follow the job's output: its published events, status changes, model text and its end.

        Use it as ``async with client.events(job_id) as events: async for event in events: ...``. Each
        `JobEvent` carries a ``cursor``: pass the last one seen as ``after`` to rejoin later, missing
        nothing and seeing nothing twice (a ``delta`` of model text carries the cursor of the durable event
        before it: text is live only, never replayed). With ``live`` it waits for new events and ends after
        the job's end; without, it ends after the last event written so far. A slow follower costs the job
        nothing: the job writes each event once, whoever follows it.

        Raises:
            ConfigError: at once, a malformed job id, or ``after`` is not a cursor of this job; from the
                first iteration, ``after`` is past the job's last event.
            JobNotFound: from the first iteration, there is no such job.
        """
        return follow_job(self._store, self._job_id(job_id, any_loop=True), after, live=live)

    async def result(self, job_id: str, timeout: float | None = None) -> Any:
        """Wait for the job to end; its result (``Done(result=...)``) when it COMPLETED.

        A job that crashed and is retried is waited for to its final outcome. The job is never changed:
        at the timeout it goes on running.

        Args:
            job_id: the job.
            timeout: the most seconds to wait; None (or ``inf``) waits as long as it takes. 0, negative
                and NaN are refused: read the job without waiting with `get`.

        Raises:
            JobFailed: it ended FAILED (`JobCancelled`: by a cancel); ``last_error`` is its last crash record.
            JobDeadLettered: it was given up after repeated crashes.
            ResultTimeout: (also `TimeoutError`) ``timeout`` passed first.
            JobNotFound: there is no such job.
            ConfigError: a bad job id or timeout.
        """
        job = self._job_id(job_id)
        seconds = check_timeout(timeout)
        listener = self._listen(job)
        try:
            row = await wait_for_end(self._store, job, seconds, listener)
        finally:
            self._unlisten(job)
        return outcome(row, self._masker)

    # -- answering and acting ---------------------------------------------------------------------------

    async def send(self, job_id: str, name: str, payload: Any = None) -> int:
        """Send the event ``name`` with ``payload`` (JSON) to the job; its sequence number.

        A ``ctx.wait_for_event(name)`` of the job takes it (each event taken once, oldest first); a job
        parked WAITING for it becomes runnable at once. A None payload reaches the step as None, which is
        also what a wait returns at its timeout.

        Raises:
            ConfigError: an empty, overlong or unprintable name, or a payload not JSON or over 256 KiB.
            JobNotFound: there is no such job.
            JobStateConflict: the job has ended, or keeps 1,000 events no wait has taken.
        """
        job = self._job_id(job_id)
        await _checked(payload, check_event, name, payload)
        return await self._store.send_event(job, name, payload)

    async def approve(self, job_id: str, *, call: str | None = None, actor: str | None = None) -> JobSummary:
        """Approve the call the job is parked on (only if it is ``call``, an invocation id, when given).

        ``actor``: who approves, recorded in the grant (default: ``user@host`` of this process).

        Raises:
            JobStateConflict: the job is not parked for approval, or waits for another call than ``call``.
            JobNotFound: there is no such job.
        """
        job = self._job_id(job_id)
        if call is not None and not isinstance(call, str):
            raise ConfigError(f"call must be an invocation id (text), got {type(call).__name__}")
        who = _actor(actor)
        row, _ = await approve_parked(self._store, job, call, given_by="call=", actor=who)
        return summary(row)

    async def reject(
        self, job_id: str, reason: str = "approval rejected", *, actor: str | None = None
    ) -> JobSummary:
        """Refuse the call the job is parked on: it ends FAILED, ``reason`` in its crash history.

        ``actor``: who refuses, recorded with the reason (default: ``user@host`` of this process).

        Raises:
            JobStateConflict: the job is not parked for approval.
            JobNotFound: there is no such job.
        """
        job = self._job_id(job_id)
        why, who = check_reason(reason) or "approval rejected", _actor(actor)
        return summary(await self._store.reject(job, why, actor=who))

    async def cancel(
        self, job_id: str, reason: str = "cancelled by an operator", *, actor: str | None = None
    ) -> JobSummary:
        """End a job that has not finished, and its child jobs not started detached: FAILED, attempt + 1.

        A process still running it is fenced out: its next write fails and it stops. ``actor``: who
        cancels, recorded with the reason (default: ``user@host`` of this process).

        Raises:
            JobStateConflict: the job has already ended.
            JobNotFound: there is no such job.
        """
        job = self._job_id(job_id)
        why, who = check_reason(reason) or "cancelled by an operator", _actor(actor)
        row, _ = await cancel_with_children(self._store, job, why, actor=who)
        return summary(row)

    async def retry(self, job_id: str, *, actor: str | None = None) -> JobSummary:
        """Run a FAILED or DEAD_LETTER job again (PENDING now); it approves nothing a reject refused.

        ``actor``: who retries, recorded in the history (default: ``user@host`` of this process).

        Raises:
            JobStateConflict: the job is not FAILED or DEAD_LETTER.
            JobNotFound: there is no such job.
        """
        job = self._job_id(job_id)
        who = _actor(actor)
        return summary(await self._store.retry(job, actor=who))

    async def pause(self, job_id: str, reason: str | None = None, *, actor: str | None = None) -> JobSummary:
        """Pause a job: no worker runs it until `resume`; a RUNNING job stops at its next step boundary.

        A PENDING, RETRYING, WAITING or WAITING_FOR_APPROVAL job is PAUSED at once, keeping what it was
        doing (a wait's timer and events, the approval request) for `resume`. A RUNNING job stays RUNNING
        with the pause requested until its process reaches the end of its step or a wait, then it is
        PAUSED (its checkpoint written, its process or worker slot free). ``reason`` (one printable line,
        default "paused by an operator") and ``actor`` (default: this process's user@host) are recorded in
        its crash history. `result` goes on waiting through a pause.

        Raises:
            ConfigError: the reason or the actor is not one printable line of bounded length.
            JobStateConflict: the job has ended, is PAUSED already, or its pause is already requested.
            JobNotFound: there is no such job.
        """
        job = self._job_id(job_id)
        return summary(await pause_job(self._store, job, reason, actor))

    async def resume(self, job_id: str, *, actor: str | None = None) -> JobSummary:
        """Put a PAUSED job back in the status it was paused in (a RUNNING job's request is withdrawn).

        A job paused while WAITING whose awaited event was sent, or whose timer ended, meanwhile is runnable
        at once; a job paused at an approval waits for it again (approve it after the resume).

        Raises:
            ConfigError: the actor is not one printable line of bounded length.
            JobStateConflict: the job is not PAUSED.
            JobNotFound: there is no such job.
        """
        job = self._job_id(job_id)
        return summary(await resume_job(self._store, job, actor))

    async def rewind(
        self,
        job_id: str,
        to_step: int,
        *,
        as_job_id: str | None = None,
        force: bool = False,
        reason: str | None = None,
        actor: str | None = None,
    ) -> JobSummary:
        """Start the job again from the checkpoint it had after step ``to_step`` (or fork it from there).

        In place, the job becomes PENDING with the next attempt, and nothing recorded after the step is
        replayed: the side effects recorded after it may happen again (``job rewind`` lists them first).
        With ``as_job_id``, a new job gets that checkpoint and the conversation up to then; the original
        is not touched. ``actor`` defaults to ``user@host`` of this process.

        Raises:
            ConfigError: ``to_step`` is not a step the kept checkpoint history holds (the message names the
                reachable steps), or the new id, reason or actor is not valid.
            JobStateConflict: a live worker holds the job and ``force`` is not set (``force`` fences it
                out), the job changed meanwhile (another operator or a worker acted first), or
                ``as_job_id`` exists.
            JobNotFound: there is no such job.
        """
        job = self._job_id(job_id)
        plan = await plan_rewind(self._store, job, to_step)
        row = await rewind_job(
            self._store,
            plan,
            actor=default_actor() if actor is None else actor,
            reason=reason or "",
            force=force,
            as_job_id=as_job_id,
        )
        return summary(row)

    # -- many jobs at once -------------------------------------------------------------------------------

    async def select(
        self,
        action: str,
        *,
        status: str | None = None,
        agent_id: str | None = None,
        older_than: float | str | None = None,
        ids: Sequence[str] | None = None,
        limit: int = DEFAULT_LIMIT,
    ) -> builtins.list[str]:
        """The ids of the jobs ``action`` (``retry``, ``cancel``, ``pause``, ``resume``) would act on.

        Among the statuses the action acts on (or ``status``, which must be one of them): of ``agent_id``,
        last written at least ``older_than`` ago (seconds, or an age such as ``"7d"``, ``"12h"``,
        ``"30m"``), among ``ids`` when given; least recently written first. What ``job ACTION --dry-run``
        prints; hand the list to `act_many`.

        Raises:
            ConfigError: an unknown action, a status it does not act on, a bad age, agent id or limit.
            SelectionTooLarge: (a `ConfigError`) more than ``limit`` jobs match (default 10 000, at most
                100 000); nothing is done.
            JobNotFound: no job matches.
        """
        self._check_open()
        batch = _batch_action(action)
        age = parse_age(older_than, "older_than") if isinstance(older_than, str) else older_than
        wanted = None if ids is None else tuple(self._job_id(job_id) for job_id in ids)
        selection = Selection(status, agent_id, age, wanted, check_limit(limit))
        return await select_jobs(self._store, batch, selection)

    async def act_many(
        self,
        action: str,
        job_ids: Sequence[str],
        *,
        reason: str | None = None,
        actor: str | None = None,
    ) -> BatchReport:
        """Apply ``action`` (``retry``, ``cancel``, ``pause``, ``resume``) to each job, one at a time.

        Each job in its own transaction, as the single-job method does it; a job whose status changed
        since it was selected, or that is gone, is skipped (`BatchReport.skipped`: its id and the store's
        reason) and the rest go on. ``reason`` (cancel and pause) and ``actor`` (default: ``user@host`` of
        this process) are recorded with each.

        Raises:
            ConfigError: an unknown action, a bad id, reason or actor, or more than 100 000 ids; nothing
                is done.
        """
        self._check_open()
        batch = _batch_action(action)
        jobs = [self._job_id(job_id) for job_id in job_ids]
        check_limit(max(len(jobs), 1))
        why = None if reason is None else check_reason(reason) or None
        return await act_on_each(self._store, batch, jobs, actor=_actor(actor), reason=why)

    # -- helpers ----------------------------------------------------------------------------------------

    def _check_open(self, *, any_loop: bool = False) -> None:
        if self._closed:
            raise ConfigError("this agentlife.Client is closed")
        if not any_loop and self._loop is not None and _running_loop() is not self._loop:
            raise ConfigError(
                "this agentlife.Client belongs to the event loop that connected it: connect one per loop "
                "(each asyncio.run is a new loop)"
            )

    def _job_id(self, job_id: object, *, any_loop: bool = False) -> str:
        self._check_open(any_loop=any_loop)
        if not isinstance(job_id, str):
            raise ConfigError(f"job_id must be a string, got {type(job_id).__name__}")
        return validate_job_id(job_id)

    def _listen(self, job_id: str) -> PgListener | None:
        """The end listener for a wait on ``job_id`` (PostgreSQL only), opened with the first wait."""
        if self._store.url_scheme != "postgresql":
            return None
        if self._listener is None:
            self._listener = self._store.end_listener()  # type: ignore[attr-defined]
        self._listening[job_id] = self._listening.get(job_id, 0) + 1
        self._listener.watch(job_id)  # before the first read of the row: no end announced meanwhile is lost
        return self._listener

    def _unlisten(self, job_id: str) -> None:
        left = self._listening.get(job_id, 0) - 1
        if left > 0:
            self._listening[job_id] = left
            return
        self._listening.pop(job_id, None)
        if self._listener is not None:
            self._listener.forget(job_id)


def _open_store(url: str) -> CheckpointStore:
    """The store at ``url``, not yet opened; a SQLite file that is not there is refused at `open`."""
    if not url.startswith(("postgresql://", "postgres://")):
        return store_from_url(url, must_exist=True)
    from agentlife.stores._postgres import PostgresStore  # asyncpg: only for postgresql:// URLs

    # No connection floor: asyncpg's background refill of one logs a traceback on every try while the
    # database is gone, into the application's log. No LISTEN for work: the client claims none.
    return PostgresStore(url, min_size=0, listen=False)


def _position(after: object) -> tuple[Any, Any] | None:
    if after is None:
        return None
    if not isinstance(after, str) or not after or len(after) > 65_536:
        raise ConfigError("after must be the next_cursor of a page of this client's list")
    try:
        return decode_position(after)
    except ValueError:
        raise ConfigError("after is not a paging cursor (a page's next_cursor)") from None


def _batch_action(action: object) -> BatchAction:
    if not isinstance(action, str) or action not in BATCH_ACTIONS:
        raise ConfigError(f"the action must be one of {', '.join(BATCH_ACTIONS)}, got {action!r}")
    return BATCH_ACTIONS[action]


def _actor(actor: object) -> str:
    """``actor`` checked (`check_actor`: else `ConfigError`), or `default_actor` when None."""
    if actor is None:
        return default_actor()
    try:
        return check_actor(actor)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # no asyncio loop runs here (a thread, or another anyio backend)
        return None


async def _checked(payload: Any, check: Callable[..., _T], *args: Any) -> _T:
    """``check(*args)``, on a worker thread when ``payload`` is large.

    The walk over a payload's values is Python, ~10 µs per value (a second for a legal 1 MiB of small
    objects), and the loop is shared by every task of the application.
    """
    try:
        large = len(orjson.dumps(payload)) > _CHECK_INLINE_BYTES
    except (TypeError, orjson.JSONEncodeError):  # the check refuses it, quickly and in its own words
        large = False
    if large:
        return await anyio.to_thread.run_sync(functools.partial(check, *args))
    return check(*args)
