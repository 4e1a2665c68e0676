"""`SQLStore`: the job store over a SQL database, each operation written once and run in its dialect.

The store holds its collaborators: its `Database` (the connection or pool, the statements in the
database's dialect, the transaction, the row decoding) and its `WorkSignal` (how an idle worker learns that
a job became runnable). Each public method runs one operation of the module of its concern through
``Database.run``; what the store itself keeps is this process's claim token and the jobs it claimed, so
that closing it hands them back. `SQLiteStore` and `PostgresStore` are this store with their database.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

import anyio

from agentlife._jobrefs import JobOutcome
from agentlife.constants import Constants
from agentlife.stores import (
    _approval,
    _checkpoints,
    _childjobs,
    _claims,
    _delivery,
    _events,
    _output,
    _overview,
    _pause,
    _prune,
    _ratebuckets,
    _reaper,
    _rewind,
    _steprecords,
    _transitions,
    _waits,
)
from agentlife.stores._approval import ApprovalRequest, ApprovalState
from agentlife.stores._base import JobRecord, LoadedCheckpoint, StepUsage, TableNames, new_owner
from agentlife.stores._childjobs import JobFamily
from agentlife.stores._claims import Claimed
from agentlife.stores._dialect import Database
from agentlife.stores._jobs import ReapDecision
from agentlife.stores._limits import ClaimLimits, validate_concurrency_key, validate_priority
from agentlife.stores._output import OutputRow
from agentlife.stores._output_watch import OutputWatch, PollingWatch
from agentlife.stores._overview import Overview
from agentlife.stores._prune import DEFAULT_BATCH_SIZE, PrunedJob, PruneResult, check_prune
from agentlife.stores._ratebuckets import Caps, RateDraw, RateGrant
from agentlife.stores._rewind import KeptCheckpoint, RewindTarget
from agentlife.stores._rows import log_set_aside
from agentlife.stores._steprecords import StepRecord
from agentlife.stores._waits import WaitState

__all__ = ["Polling", "SQLStore", "WorkSignal"]

_log = logging.getLogger("agentlife.store")
D = TypeVar("D", bound=Database)
#: How long `close` may spend handing this store's claims back (best effort: a claim's heartbeat ages).
_RELEASE_SECONDS = 1.0


class WorkSignal(Protocol):
    """How an idle worker learns that a job of its agent may have become runnable."""

    @property
    def notifies(self) -> bool:
        """Whether `wait` ends as soon as a job is made runnable (False: it only sleeps)."""
        ...

    async def wait(self, agent_id: str, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a sign; True when one came."""
        ...

    def claimed(self, agent_id: str | None, claim: Claimed) -> None:
        """What a claim of ``agent_id``'s jobs (or any agent's) found, and learnt of the next due time."""
        ...

    async def close(self) -> None:
        """Stop listening; a later `wait` starts again."""
        ...


class Polling:
    """The `WorkSignal` of a database without notifications: the wait sleeps, and the worker polls."""

    notifies = False

    async def wait(self, agent_id: str, timeout: float) -> bool:
        """Sleep ``timeout`` seconds; False."""
        await anyio.sleep(timeout)
        return False

    def claimed(self, agent_id: str | None, claim: Claimed) -> None:
        """Nothing to remember: the wait does not look at due times."""

    async def close(self) -> None:
        """Nothing to stop."""


class SQLStore(Generic[D]):
    """A `CheckpointStore` over a SQL database: every operation once, run by ``db`` in its dialect.

    Args:
        db: the database (connection or pool, statements, transaction, row decoding).
        tables: the table names its statements were built for.
        signal: how `wait_for_work` learns of runnable jobs (default: it sleeps).
    """

    url_scheme = ""

    def __init__(self, db: D, tables: TableNames, *, signal: WorkSignal | None = None) -> None:
        self.tables = tables
        #: This process's claim token, written to the row's ``owner`` column at claim.
        self.owner = new_owner()
        self._db = db
        self._signal: WorkSignal = signal or Polling()
        self._claimed: set[str] = set()

    # -- the connection ---------------------------------------------------------------------------------

    async def open(self) -> None:
        """Connect; `agentlife.StoreUnavailable` when the database cannot be reached."""
        await self._db.open()

    async def close(self) -> None:
        """Hand back this store's claims (best effort), then release the connections; idempotent."""
        await self._signal.close()
        if self._claimed:
            await self._hand_back_claims()
        await self._db.close()

    async def _hand_back_claims(self) -> None:
        """The claim lasts while the store is open: a re-run may take it once it is closed.

        Best effort and short: with the database gone, the heartbeat's age frees the claim later.
        """
        ids, self._claimed = sorted(self._claimed), set()
        with anyio.move_on_after(_RELEASE_SECONDS, shield=True):
            try:
                await self._db.run(_claims.release_claims, ids, self.owner)
            except Exception as exc:
                _log.info("could not release the claim of %s: %s", ", ".join(ids), type(exc).__name__)

    async def init_schema(self) -> None:
        """Create the tables and indexes that are missing (``python -m agentlife db init``)."""
        await self._db.init_schema()

    def has_free_connection(self) -> bool:
        """Whether a statement could start now; safe to call from another thread."""
        return self._db.has_free_connection()

    # -- job rows and claims ----------------------------------------------------------------------------

    async def get_job(self, job_id: str) -> JobRecord | None:
        """The job row, or None."""
        return await self._db.run(_claims.get_job, job_id)

    async def create_job(
        self,
        job_id: str,
        agent_id: str,
        payload: Any,
        token_budget: dict[str, Any] | None = None,
        *,
        exclusive: bool = False,
        concurrency_key: str | None = None,
        priority: int = 0,
    ) -> JobRecord:
        """Insert a PENDING job row (no-op returning the row if it exists); see `JobStore.create_job`."""
        key = validate_concurrency_key(concurrency_key, "concurrency_key")
        rank = validate_priority(priority, "priority")
        return await self._db.run(
            _claims.create_job, job_id, agent_id, payload, token_budget, exclusive, key, rank
        )

    async def claim(self, job_id: str, attempt: int) -> JobRecord:
        """Take ownership for ``attempt``; see `JobStore.claim`."""
        row = await self._db.run(_claims.claim, job_id, attempt, self.owner)
        self._claimed.add(job_id)
        return row

    async def claim_next(
        self, agent_id: str | None = None, *, limits: ClaimLimits | None = None
    ) -> JobRecord | None:
        """Claim the first runnable job (of ``agent_id``, or of any agent); see `WorkQueue.claim_next`."""
        claimed = await self._db.run(_claims.claim_next, agent_id, self.owner, limits)
        for row in claimed.set_aside:
            log_set_aside(row)
        if claimed.row is not None:
            self._claimed.add(claimed.row.id)
        self._signal.claimed(agent_id, claimed)
        return claimed.row

    async def list_jobs(
        self,
        status: str | None = None,
        agent_id: str | None = None,
        limit: int = 100,
        *,
        after: tuple[Any, str | bytes | None] | None = None,
        concurrency_key: str | None = None,
    ) -> list[JobRecord]:
        """Job rows, most recently updated first; see `OperatorStore.list_jobs`."""
        return await self._db.run(_claims.list_jobs, status, agent_id, limit, after, concurrency_key)

    async def job_overview(self, stale_after: float, window: float = 3600.0) -> Overview:
        """The job table at a glance: counts, the queue, stale runs; see `OperatorStore.job_overview`."""
        return await self._db.run(_overview.job_overview, stale_after, window)

    async def count_runnable(self) -> dict[str, int]:
        """How many jobs are runnable now, per agent id."""
        return await self._db.run(_claims.count_runnable)

    async def set_status(
        self,
        job_id: str,
        attempt: int,
        status: str,
        *,
        result: Any = None,
        error: dict[str, Any] | None = None,
        expect: Sequence[str] | None = None,
    ) -> None:
        """Record a status if the row is as expected; see `JobStore.set_status`."""
        await self._db.run(_claims.set_status, job_id, attempt, self.owner, status, result, error, expect)

    async def add_usage(
        self, job_id: str, attempt: int, input_tokens: int, output_tokens: int, cost_usd: float
    ) -> dict[str, Any]:
        """Add to ``tokens_consumed`` and return the new totals."""
        return await self._db.run(
            _claims.add_usage, job_id, attempt, self.owner, input_tokens, output_tokens, cost_usd
        )

    async def heartbeat(self, job_id: str, attempt: int) -> None:
        """Set ``heartbeat_at`` to the database's now."""
        await self._db.run(_claims.heartbeat, job_id, attempt, self.owner)

    async def release(self, job_id: str, attempt: int, status: str, *, delay_seconds: float = 0.0) -> bool:
        """Hand back a RUNNING job held by ``attempt``; see `Handback.release`."""
        return await self._db.run(_claims.release, job_id, attempt, status, delay_seconds)

    async def drop_claim(self, job_id: str) -> None:
        """Clear the row's claim token if it is still this store's; see `Handback.drop_claim`."""
        self._claimed.discard(job_id)
        await self._db.run(_claims.drop_claim, job_id, self.owner)

    # -- checkpoints, the conversation, step records -----------------------------------------------------

    async def load_checkpoint(self, job_id: str) -> LoadedCheckpoint | None:
        """The newest checkpoint that verifies, falling back to history; None for a fresh job."""
        return await self._db.run(_checkpoints.load_checkpoint, job_id)

    async def write_checkpoint(
        self,
        job_id: str,
        attempt: int,
        checkpoint_id: str,
        step: int,
        data: bytes,
        messages: Sequence[tuple[int, bytes]] = (),
        usage: StepUsage | None = None,
        *,
        records: Sequence[StepRecord] = (),
        prune_before: int | None = None,
        flushed: bool = True,
    ) -> int:
        """Store ``data`` exactly with its CRC-32, the step's one commit; see `JobStore.write_checkpoint`."""
        return await self._db.run(
            _checkpoints.write_checkpoint,
            job_id,
            attempt,
            self.owner,
            checkpoint_id,
            step,
            data,
            messages,
            usage,
            records,
            prune_before,
            flushed,
        )

    async def load_conversation(self, job_id: str, length: int) -> list[bytes]:
        """The first ``length`` stored conversation messages of the job, in order."""
        return await self._db.run(_checkpoints.load_conversation, job_id, length)

    async def append_step_records(self, job_id: str, attempt: int, records: Sequence[StepRecord]) -> None:
        """Store step records of this session if ``attempt`` still holds the live job."""
        await self._db.run(_steprecords.append_step_records, job_id, attempt, self.owner, records)

    async def load_step_records(self, job_id: str) -> list[StepRecord]:
        """Every step record the job keeps, oldest writer first."""
        return await self._db.run(_steprecords.load_step_records, job_id)

    # -- rate-limit buckets ---------------------------------------------------------------------------------

    async def draw_rate_capacity(self, key: str, caps: Caps, draw: RateDraw) -> RateGrant:
        """Take a slice of bucket ``key``, or learn how long to wait for one."""
        return await self._db.run(_ratebuckets.draw_rate_capacity, key, caps, draw)

    async def return_rate_capacity(
        self, key: str, caps: Caps, give_back: Sequence[float], slot: str | None = None
    ) -> None:
        """Give back what a slice left and end in-flight slot ``slot``."""
        await self._db.run(_ratebuckets.return_rate_capacity, key, caps, give_back, slot)

    async def pause_rate_bucket(
        self, key: str, caps: Caps, until: float, remaining: Sequence[float | None] = (None, None, None)
    ) -> None:
        """No capacity from bucket ``key`` before ``until``, at most ``remaining`` now."""
        await self._db.run(_ratebuckets.pause_rate_bucket, key, caps, until, remaining)

    async def rate_bucket_levels(self, key: str, caps: Caps) -> tuple[tuple[float, ...], float, int] | None:
        """(levels, pause end, live slots) of bucket ``key``; None before its first use."""
        return await self._db.run(_ratebuckets.rate_bucket_levels, key, caps)

    # -- approvals and operator transitions ---------------------------------------------------------------

    async def request_approval(self, job_id: str, attempt: int, request: ApprovalRequest) -> ApprovalState:
        """Park on ``request`` unless a grant names it or the job has ended; see `JobStore`."""
        return await self._db.run(_approval.request_approval, job_id, attempt, self.owner, request)

    async def get_approval(self, job_id: str) -> ApprovalState | None:
        """The row's status and approval record, or None."""
        return await self._db.run(_approval.get_approval, job_id)

    async def approve(
        self,
        job_id: str,
        *,
        invocation_id: str | None = None,
        digest: str | None = None,
        no_call: bool = False,
        actor: str | None = None,
    ) -> JobRecord:
        """Grant the call the job is parked on; see `OperatorStore.approve`."""
        return await self._db.run(_transitions.approve, job_id, invocation_id, digest, no_call, actor)

    async def reject(self, job_id: str, reason: str, *, actor: str | None = None) -> JobRecord:
        """WAITING_FOR_APPROVAL -> FAILED, final, the reason recorded."""
        return await self._db.run(_transitions.reject, job_id, reason, actor)

    async def cancel(self, job_id: str, reason: str, *, actor: str | None = None) -> JobRecord:
        """PENDING, RETRYING, RUNNING, WAITING_FOR_APPROVAL, WAITING or PAUSED -> FAILED, ``attempt + 1``."""
        return await self._db.run(_transitions.cancel, job_id, reason, actor)

    async def retry(self, job_id: str, *, actor: str | None = None) -> JobRecord:
        """FAILED or DEAD_LETTER -> PENDING, runnable now; approves nothing."""
        return await self._db.run(_transitions.retry, job_id, actor)

    async def pause(self, job_id: str, *, reason: str, actor: str) -> JobRecord:
        """PAUSED where it is, or a RUNNING job's pause requested; see `OperatorStore.pause`."""
        return await self._db.run(_pause.pause, job_id, reason, actor)

    async def resume(self, job_id: str, *, actor: str) -> JobRecord:
        """PAUSED -> the status it was paused in; see `OperatorStore.resume`."""
        return await self._db.run(_pause.resume, job_id, actor)

    async def pause_requested(self, job_id: str, attempt: int) -> bool:
        """Whether an operator asked the RUNNING job held by ``attempt`` to pause."""
        return await self._db.run(_pause.pause_requested, job_id, attempt)

    async def kept_checkpoints(self, job_id: str) -> list[KeptCheckpoint]:
        """The job's checkpoint history, newest first."""
        return await self._db.run(_rewind.kept_checkpoints, job_id)

    async def step_records(self, job_id: str) -> list[StepRecord]:
        """Every step record the job keeps."""
        return await self._db.run(_steprecords.load_step_records, job_id)

    async def rewind(
        self,
        job_id: str,
        target: RewindTarget,
        *,
        actor: str,
        reason: str,
        force: bool = False,
        new_id: str | None = None,
    ) -> JobRecord:
        """Rewind the job to ``target`` in place, or fork it into ``new_id``; see `_rewind`."""
        return await self._db.run(
            _rewind.rewind, job_id, target, actor=actor, reason=reason, force=force, new_id=new_id
        )

    async def reap(
        self,
        threshold_seconds: float,
        now: float | None = None,
        constants: Constants | None = None,
        *,
        dead_owners: bool = False,
    ) -> list[ReapDecision]:
        """Move RUNNING rows whose heartbeat stopped on; see `WorkQueue.reap`."""
        return await _reaper.reap(self._db, threshold_seconds, now, constants, dead_owners)

    async def prune_jobs(
        self,
        *,
        older_than: float,
        statuses: Sequence[str],
        agent_id: str | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        dry_run: bool = False,
        tombstones_older_than: float | None = None,
        on_batch: Callable[[list[str]], None] | None = None,
        max_batches: int | None = None,
    ) -> PruneResult:
        """Delete finished jobs and every row keyed by them, in batches; see `OperatorStore.prune_jobs`."""
        check_prune(older_than, statuses, batch_size)
        return await _prune.prune(
            self._db,
            older_than=older_than,
            statuses=statuses,
            agent_id=agent_id,
            batch_size=batch_size,
            dry_run=dry_run,
            tombstones_older_than=tombstones_older_than,
            on_batch=on_batch,
            max_batches=max_batches,
        )

    async def pruned_job(self, job_id: str) -> PrunedJob | None:
        """The tombstone of a pruned job, or None; see `OperatorStore.pruned_job`."""
        return await self._db.run(_prune.pruned_job, job_id)

    async def pruned_ids(self, job_ids: Sequence[str]) -> set[str]:
        """Those of ``job_ids`` whose job was pruned; see `OperatorStore.pruned_ids`."""
        if not job_ids:
            return set()
        return await self._db.run(_prune.pruned_among, job_ids)

    async def expire_tombstones(self, older_than: float) -> int:
        """Delete tombstones older than ``older_than`` seconds; see `OperatorStore.expire_tombstones`."""
        return await _prune.expire_tombstones(self._db, older_than)

    # -- waiting for work ---------------------------------------------------------------------------------

    @property
    def notifies(self) -> bool:
        """Whether `wait_for_work` ends as soon as a job is made runnable."""
        return self._signal.notifies

    async def wait_for_work(self, agent_id: str, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a sign that a job of ``agent_id`` may be runnable."""
        return await self._signal.wait(agent_id, timeout)

    # -- durable waits, events, child jobs ----------------------------------------------------------------

    async def park_waiting(
        self, job_id: str, attempt: int, until: float, waiting_for: dict[str, Any]
    ) -> bool:
        """RUNNING (held by ``attempt``) -> WAITING until ``until``; False when the row was not that."""
        return await self._db.run(_waits.park_waiting, job_id, attempt, until, waiting_for)

    async def get_wait(self, job_id: str) -> WaitState | None:
        """The row's status and what it waits for, or None when there is no such job."""
        return await self._db.run(_waits.get_wait, job_id)

    async def send_event(self, job_id: str, name: str, payload: Any = None) -> int:
        """Keep an event for the job and wake it if it waits for ``name``; see `OperatorStore.send_event`."""
        return await self._db.run(_events.send_event, job_id, name, payload)

    async def kept_events(self, job_id: str) -> dict[str, int]:
        """How many events of each name the job keeps that no wait has taken yet."""
        return await self._db.run(_events.kept_events, job_id)

    async def take_event(
        self,
        job_id: str,
        attempt: int,
        names: Sequence[str],
        invocation_id: str,
        *,
        sent_by: float | None = None,
    ) -> tuple[str, Any] | None:
        """The event the wait took, else the oldest untaken of ``names``; see `JobStore.take_event`."""
        return await self._db.run(_events.take_event, job_id, attempt, names, invocation_id, sent_by)

    async def start_child(
        self,
        parent_id: str,
        attempt: int,
        job_id: str,
        agent_id: str,
        payload: Any,
        *,
        invocation_id: str,
        detached: bool = False,
        concurrency_key: str | None = None,
        priority: int = 0,
    ) -> bool:
        """Create the child's row if absent; True when this call created it. See `JobStore.start_child`."""
        key = validate_concurrency_key(concurrency_key, "concurrency_key")
        rank = validate_priority(priority, "priority")
        return await self._db.run(
            _childjobs.start_child,
            parent_id,
            attempt,
            self.owner,
            job_id,
            agent_id,
            payload,
            invocation_id,
            detached,
            key,
            rank,
        )

    async def child_outcomes(
        self, parent_id: str, job_ids: Sequence[str], *, ended_by: float | None = None
    ) -> list[JobOutcome]:
        """Each child's status, result and error, in the order of ``job_ids``."""
        return await self._db.run(_childjobs.child_outcomes, parent_id, job_ids, ended_by)

    async def get_family(self, job_id: str) -> JobFamily | None:
        """The job's parent and the children it started; None when there is no such job."""
        return await self._db.run(_childjobs.get_family, job_id)

    # -- the delivery registry ----------------------------------------------------------------------------

    async def is_delivered(self, key: str) -> bool:
        """Whether the delivery registry holds ``key``."""
        return await self._db.run(_delivery.is_delivered, key)

    async def record_delivery(self, key: str, job_id: str, channel: str) -> None:
        """Record ``key`` as delivered (idempotent)."""
        await self._db.run(_delivery.record_delivery, key, job_id, channel)

    # -- a running job's output ---------------------------------------------------------------------------

    async def publish_output(
        self, job_id: str, attempt: int, invocation_id: str, name: str, value: bytes
    ) -> int:
        """Add a published event to the job's output once per ``invocation_id``; see `JobStore`."""
        return await self._db.run(
            _output.publish_output, job_id, attempt, self.owner, invocation_id, name, value
        )

    async def send_deltas(self, job_id: str, payloads: Sequence[str]) -> None:
        """Hand batches of model text to the job's followers (nothing durable); see `JobStore`."""
        await self._db.run(_output.send_deltas, job_id, payloads)

    async def output_head(self, job_id: str) -> int | None:
        """The ``seq`` of the job's last output row (0: none); None when there is no such job."""
        return await self._db.run(_output.output_head, job_id)

    async def read_output(self, job_id: str, after: int, limit: int = 500) -> list[OutputRow]:
        """The job's output rows after ``after``, in order, at most ``limit``."""
        return await self._db.run(_output.read_output, job_id, after, limit)

    async def read_deltas(self, job_id: str, after: int | None) -> tuple[int, list[bytes]]:
        """The delta batches a polling watch has not read (SQLite); see `agentlife.stores._output`."""
        return await self._db.run(_output.read_deltas, job_id, after)

    def output_watch(self, job_id: str) -> OutputWatch:
        """A watch of ``job_id``'s output moving (enter it, then read the rows); this store polls."""
        return PollingWatch(self.read_deltas, job_id)
