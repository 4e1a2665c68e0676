"""The roles a caller of the job store plays, each a narrow protocol, and `CheckpointStore`, their union.

A caller is typed by the role it plays, so a reader sees which operations it uses:

- `JobStore`: what one job's process uses (the engine, the step API, the job heartbeat, the journal's step
  records, delivery): its claim, checkpoints, conversation, step records, status, usage, heartbeat, the
  approvals and waits it parks on, the events it takes and the child jobs it starts;
- `WorkQueue`: what a worker's queue uses: the claim of the next runnable job, the wait for one, the count of
  runnable jobs, the reaper, and handing a job back;
- `RateBuckets`: what a process's rate limiter uses: the fleet-wide buckets of model calls;
- `OperatorStore`: what an operator uses (``python -m agentlife job``, the console): creating, listing and
  reading jobs, approving, rejecting, cancelling and retrying them, sending events.

They share `JobRows` (the connection and a job row as it stands) and `Handback` (giving a claimed job back).
`CheckpointStore` is all of them plus ``init_schema``: what a store implements (`SQLiteStore`,
`PostgresStore`), and what a caller that plays every role (the worker) holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from agentlife._jobrefs import JobOutcome
    from agentlife.constants import Constants
    from agentlife.stores._approval import ApprovalRequest, ApprovalState
    from agentlife.stores._base import JobRecord, LoadedCheckpoint, StepUsage
    from agentlife.stores._childjobs import JobFamily
    from agentlife.stores._jobs import ReapDecision
    from agentlife.stores._limits import ClaimLimits
    from agentlife.stores._output import OutputRow
    from agentlife.stores._output_watch import OutputWatch
    from agentlife.stores._overview import Overview
    from agentlife.stores._prune import PrunedJob, PruneResult
    from agentlife.stores._ratebuckets import Caps, RateDraw, RateGrant
    from agentlife.stores._rewind import KeptCheckpoint, RewindTarget
    from agentlife.stores._steprecords import StepRecord
    from agentlife.stores._waits import WaitState

__all__ = ["CheckpointStore", "Handback", "JobRows", "JobStore", "OperatorStore", "RateBuckets", "WorkQueue"]


class JobRows(Protocol):
    """What every caller of the store uses: its connection, and a job row as it stands."""

    url_scheme: str

    async def pause_requested(self, job_id: str, attempt: int) -> bool:
        """Whether an operator asked the RUNNING job held by ``attempt`` to pause (``job pause``).

        The process holding it reads it at each step boundary and, when asked, hands the row back
        (`Handback.release` as PENDING), which the store turns into PAUSED; an operator's batch resume reads
        it to find the requests it withdraws.
        """

    async def open(self) -> None:
        """Connect; raise `agentlife.StoreUnavailable` when the store cannot be reached."""

    async def close(self) -> None:
        """Release connections; safe to call twice and after a failed `open`."""

    def has_free_connection(self) -> bool:
        """Liveness signal: False when every pooled connection is taken (called from the probe thread)."""

    async def get_job(self, job_id: str) -> JobRecord | None:
        """The job row, or None."""

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
        """Insert a PENDING job row (no-op returning the row if it exists).

        ``concurrency_key`` (text, see `validate_concurrency_key`) and ``priority`` (an int from -1000 to
        1000, higher claimed first) are written with the row; a row that exists keeps its own.

        Raises:
            ConfigError: a concurrency key or a priority that is not allowed (nothing is written).
            JobStateConflict: ``exclusive`` and the row exists: of creators racing for one id, exactly one
                is told it created the job.
        """

    async def load_checkpoint(self, job_id: str) -> LoadedCheckpoint | None:
        """The newest checkpoint that verifies, falling back to history; None for a fresh job.

        Raises:
            CheckpointCorrupt: a checkpoint exists but neither it nor any history entry verifies.
        """

    async def load_conversation(self, job_id: str, length: int) -> list[bytes]:
        """The first ``length`` stored conversation messages of the job, in order."""

    async def get_approval(self, job_id: str) -> ApprovalState | None:
        """The row's status and approval record (request, grants, rejection), or None for no such row."""

    async def get_family(self, job_id: str) -> JobFamily | None:
        """The job's parent and the children it started; None when there is no such job."""


class Handback(Protocol):
    """Giving a claimed job back: what a job's process and a worker's queue both do."""

    async def release(self, job_id: str, attempt: int, status: str, *, delay_seconds: float = 0.0) -> bool:
        """Hand back a job this process holds (RUNNING with ``attempt``), its claim token dropped.

        ``status`` is PENDING or RETRYING (runnable again after ``delay_seconds``, by the store's clock), or
        DEAD_LETTER / FAILED. One conditional UPDATE: returns False, changing nothing, when the row has moved
        on (another attempt holds it, or it is no longer RUNNING). A worker releases a drained job (PENDING)
        and a crashed one (the crash policy's verdict and backoff).
        """

    async def drop_claim(self, job_id: str) -> None:
        """This process no longer runs ``job_id``: clear the row's claim token if it is still this store's.

        The status is left as it is. A process that goes on living after a job (a worker) calls it, so a
        job it left parked for approval is not taken for one a live process still waits on: an approve
        then makes it PENDING, for any worker to resume.
        """


class JobStore(JobRows, Handback, Protocol):
    """What one job's process uses. Every write after `claim` is fenced by the process's attempt.

    A write whose ``attempt`` no longer owns the row (or whose claim token is not this store's) raises
    `agentlife.AttemptFenced` and changes nothing.
    """

    async def claim(self, job_id: str, attempt: int) -> JobRecord:
        """Take ownership: set ``attempt`` and status RUNNING when ``attempt`` >= the row's.

        Raises:
            JobNotFound: no such row.
            AttemptFenced: the row belongs to a later attempt.
        """

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
        """Store ``data`` exactly, with its CRC-32, and append it to history; returns the CRC.

        ``messages`` (``(position, encoded message)``, the conversation's new messages) are stored in the
        same transaction, replacing any row at the same position (left by a checkpoint that was lost);
        ``usage`` (the step's model calls) is added to ``tokens_consumed`` in it too, ``records`` (step
        records of this process's session) are stored, the job's step records of steps before
        ``prune_before`` are removed, and ``heartbeat_at`` is set: a checkpoint is the step's one commit.

        Without ``flushed`` the commit may return before the database's log is flushed where the database
        flushes its log in order (PostgreSQL): for a checkpoint that guards no effect of its own, which the
        next flushed commit (a write-ahead record, a status change) makes durable first. SQLite flushes
        every commit.
        """

    async def append_step_records(self, job_id: str, attempt: int, records: Sequence[StepRecord]) -> None:
        """Store step records of this process's session, if ``attempt`` still holds the live job.

        A side-effecting call's write-ahead record goes through here before the call runs: the write is
        fenced like a checkpoint, so a process that lost the job (a frozen attempt woken after its
        successor took over) learns it before the effect. Rows already stored are left as they are.

        Raises:
            AttemptFenced: another attempt or process holds the job, or it has ended; nothing was written.
        """

    async def load_step_records(self, job_id: str) -> list[StepRecord]:
        """Every step record the job keeps, oldest writer first (`StepRecord.order`)."""

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
        """Record a status (and result, or a crash record appended to ``error``), if the row is as expected.

        ``expect``: the statuses the row may have for the write to happen; None means any status that is not
        terminal (COMPLETED, FAILED, DEAD_LETTER): a terminal row is never rewritten by a late writer.

        Raises:
            AttemptFenced: the row belongs to another attempt or process, or its status is not expected;
                nothing changed.
        """

    async def add_usage(
        self, job_id: str, attempt: int, input_tokens: int, output_tokens: int, cost_usd: float
    ) -> dict[str, Any]:
        """Add to ``tokens_consumed`` and return the new totals."""

    async def heartbeat(self, job_id: str, attempt: int) -> None:
        """Set ``heartbeat_at`` to now."""

    async def request_approval(self, job_id: str, attempt: int, request: ApprovalRequest) -> ApprovalState:
        """Park on ``request``: WAITING_FOR_APPROVAL and the request on the row, in one fenced write.

        Nothing changes when a grant already names the call (same invocation id and digest) or the row is
        terminal; the state returned says which (`ApprovalState.decide`).

        Raises:
            AttemptFenced: the row belongs to another attempt or process.
        """

    async def park_waiting(
        self, job_id: str, attempt: int, until: float, waiting_for: dict[str, Any]
    ) -> bool:
        """Park a job this process holds (RUNNING with ``attempt``) at a durable wait, its claim dropped.

        The row becomes WAITING with ``not_before`` = ``until`` (unix time: a worker claims it once the wait
        is over) and ``waiting_for`` (JSON: what it waits for) in its ``waiting`` column. One conditional
        UPDATE: False, changing nothing, when the row has moved on (cancelled, or another attempt's).
        """

    async def take_event(
        self,
        job_id: str,
        attempt: int,
        names: Sequence[str],
        invocation_id: str,
        *,
        sent_by: float | None = None,
    ) -> tuple[str, Any] | None:
        """For the wait ``invocation_id``: the event it took before, else the oldest not taken of ``names``.

        The take is bound to ``invocation_id``: asked again after a crash, it returns the same event.
        Returns (name, payload), or None when no such event was sent yet. ``sent_by`` (unix time, the wait's
        deadline) leaves events sent after it alone: a wait resumed after its deadline times out rather than
        take an answer that came too late.

        Raises:
            AttemptFenced: the row is another attempt's.
        """

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
        """Create the PENDING row of a child job unless it exists; True when this call created it.

        The row records its parent, the starting call (``invocation_id``) and ``detached``. Keyed on the id:
        asked again (a start re-run after a crash) it finds the row this call created and changes nothing.

        Raises:
            ChildJobError: a job ``job_id`` exists that another job or call created, or of another agent.
            AttemptFenced: the parent row is not held by ``attempt`` (and this store's claim).
        """

    async def child_outcomes(
        self, parent_id: str, job_ids: Sequence[str], *, ended_by: float | None = None
    ) -> list[JobOutcome]:
        """Each job's status, result and error, in the order of ``job_ids``.

        ``ended_by`` (unix time, a wait's deadline): a child that ended after it is reported as it stood
        then, not finished (``RUNNING``, no result), so a wait resumed after its deadline times out.

        Raises:
            ChildJobError: one of them does not exist or is not a child of ``parent_id``.
        """

    async def is_delivered(self, key: str) -> bool:
        """Whether the delivery registry holds ``key``."""

    async def record_delivery(self, key: str, job_id: str, channel: str) -> None:
        """Record ``key`` as delivered (idempotent)."""

    async def publish_output(
        self, job_id: str, attempt: int, invocation_id: str, name: str, value: bytes
    ) -> int:
        """Add the event ``name`` (``value``: its JSON, already checked and masked) to the job's output.

        Once per ``invocation_id``: a call that published before a crash gets its event's ``seq`` back and
        writes nothing. Fenced like the step's records.

        Raises:
            AttemptFenced: another attempt or process holds the job, or it has ended; nothing was written.
            ConfigError: the job's output already holds `MAX_OUTPUT_EVENTS_PER_JOB` events.
        """

    async def send_deltas(self, job_id: str, payloads: Sequence[str]) -> None:
        """Hand batches of model text (JSON text each, under 8000 bytes) to the job's followers.

        Nothing durable: PostgreSQL notifies the job's channel, SQLite overwrites its ring of recent batches
        without an fsync. A job that has ended gets none.
        """


class WorkQueue(JobRows, Handback, Protocol):
    """What a worker's queue uses: claim the next runnable job, wait for one, count them, reap zombies."""

    async def claim_next(
        self, agent_id: str | None = None, *, limits: ClaimLimits | None = None
    ) -> JobRecord | None:
        """Claim the first runnable job (of ``agent_id``, or of any agent), or return None when none is.

        Runnable: PENDING, or RETRYING whose ``not_before`` has passed; the first is the one with the
        highest ``priority``, then the earliest ``not_before`` (a new row's is its creation), then the id.
        With ``limits``, a row whose concurrency key, or agent, has as many RUNNING rows as its limit is
        skipped by the claim statement itself, so concurrent claimers never exceed a limit. The claim is
        atomic (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, an exclusive transaction on SQLite): two claimers
        never get the same row. The row becomes RUNNING with ``attempt + 1``, this store's claim token and
        ``heartbeat_at`` now; the returned record has the new attempt, which every later write of the job
        must pass.
        """

    @property
    def notifies(self) -> bool:
        """Whether `wait_for_work` ends as soon as a job is made runnable (PostgreSQL's ``LISTEN``).

        False: it only sleeps, and an idle worker must poll briskly to pick jobs up soon.
        """
        ...

    async def wait_for_work(self, agent_id: str, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a sign that a job of ``agent_id`` may have become runnable.

        True when such a sign came, False at the timeout. An idle worker waits here between two claims;
        a store without notifications simply sleeps, so the worker polls.
        """

    async def count_runnable(self) -> dict[str, int]:
        """How many jobs are runnable now, per agent id (agents with none are left out)."""

    async def reap(
        self,
        threshold_seconds: float,
        now: float | None = None,
        constants: Constants | None = None,
        *,
        dead_owners: bool = False,
    ) -> list[ReapDecision]:
        """The zombie reaper: act on every RUNNING row whose heartbeat is older than ``threshold_seconds``.

        Each row becomes RETRYING (``not_before`` from the crash backoff schedule, or the circuit breaker's
        cooldown), DEAD_LETTER or FAILED, with the decision appended to its crash history, in its own
        conditional UPDATE: two reapers at once never both act on a row. The row keeps its attempt and its
        owner becomes a tombstone no process holds, so the reaped process is fenced out and the next claim
        gives the job the reaped attempt + 1 (`ReapDecision.attempt`). ``now`` (unix time) defaults to the
        clock, ``constants`` to `Constants()`. With ``dead_owners``, a RUNNING row claimed by a process of
        this pid namespace that has exited (its pid gone, or reused by another process) is reaped too once
        its heartbeat is older than one job heartbeat interval: a fresh heartbeat always wins.
        """


class OperatorStore(JobRows, Protocol):
    """What an operator uses (``python -m agentlife job``, the console): list, act on and talk to jobs."""

    async def prune_jobs(
        self,
        *,
        older_than: float,
        statuses: Sequence[str],
        agent_id: str | None = None,
        batch_size: int = 500,
        dry_run: bool = False,
        tombstones_older_than: float | None = None,
        on_batch: Callable[[list[str]], None] | None = None,
        max_batches: int | None = None,
    ) -> PruneResult:
        """Delete finished jobs last written more than ``older_than`` seconds ago, with all their rows.

        Only rows of ``statuses`` (each one of COMPLETED, FAILED, DEAD_LETTER: anything else is a
        `ConfigError`), of ``agent_id`` if given, and none whose children still run. In batches of
        ``batch_size`` jobs, each one short transaction that deletes the job's rows in every table and its
        row last and writes its tombstone (`pruned_job`); ``on_batch(ids)`` after each commits. Two prunes
        at once take different rows; a prune killed mid-batch leaves the batch whole. ``dry_run``: nothing
        changes; the count and the first ids of what would go. ``tombstones_older_than`` (seconds): also
        delete tombstones written longer ago. ``max_batches``: stop after that many (the rest next time).
        """
        ...

    async def pruned_job(self, job_id: str) -> PrunedJob | None:
        """The tombstone of a pruned job (id, agent, status, when it finished and was pruned), or None."""
        ...

    async def pruned_ids(self, job_ids: Sequence[str]) -> set[str]:
        """Those of ``job_ids`` whose job was pruned: a tombstone and no row (one query)."""
        ...

    async def expire_tombstones(self, older_than: float) -> int:
        """Delete the tombstones written more than ``older_than`` seconds ago (the ids are free again)."""
        ...

    async def list_jobs(
        self,
        status: str | None = None,
        agent_id: str | None = None,
        limit: int = 100,
        *,
        after: tuple[Any, str | bytes | None] | None = None,
        concurrency_key: str | None = None,
    ) -> list[JobRecord]:
        """Job rows, most recently updated first (ties by id), filtered by status, agent and concurrency key.

        ``after`` is a page's cursor: the ``(updated_at, key)`` of the last row of the page before, ``key``
        being the row's `JobRecord.key` when it has one, else its ``id``; the rows that follow it in that
        order come back (keyset paging: an index range, as fast deep as at the top).

        Raises:
            ValueError: ``after`` holds what no row of this store can (bytes, a NUL or a non-number time on
                PostgreSQL): it is not a cursor of this store.
        """

    async def job_overview(self, stale_after: float, window: float = 3600.0) -> Overview:
        """The job table at a glance, each read bounded (`agentlife.stores._overview.Overview`).

        Rows per (status, agent), the runnable queue and its oldest row, RUNNING rows whose heartbeat is
        older than ``stale_after`` seconds, and rows ended in the last ``window`` seconds.
        """

    async def approve(
        self,
        job_id: str,
        *,
        invocation_id: str | None = None,
        digest: str | None = None,
        no_call: bool = False,
        actor: str | None = None,
    ) -> JobRecord:
        """Grant the call the job is parked on; WAITING_FOR_APPROVAL -> RUNNING or PENDING; returns the row.

        The grant is the row's recorded request (invocation id and digest): it approves that call and no
        other. RUNNING when the process that parked still holds the row (its owner not provably gone, its
        heartbeat within the zombie threshold): it polls and carries on. Otherwise PENDING: the next run or
        worker resumes the job and runs the granted call without asking again. ``invocation_id`` and
        ``digest``, when given, must name the recorded request (approve exactly the call that was shown);
        ``no_call=True`` says no call was shown, and refuses the approval if a request is recorded (a job
        that records none is approved and names its call when it asks again). ``actor`` (who approved,
        `agentlife._jobs._actor.check_actor`) is recorded in the grant as ``approved_by``.

        Raises:
            JobNotFound: no such row.
            JobStateConflict: the job is not waiting for approval, or waits for another call.
        """

    async def reject(self, job_id: str, reason: str, *, actor: str | None = None) -> JobRecord:
        """WAITING_FOR_APPROVAL -> FAILED, final: the reason (and ``actor``) recorded in the crash history.

        The parked process, or whichever step reaches the call, ends the job FAILED whatever it does next.
        """

    async def cancel(self, job_id: str, reason: str, *, actor: str | None = None) -> JobRecord:
        """PENDING, RETRYING, RUNNING, WAITING_FOR_APPROVAL, WAITING or PAUSED -> FAILED with ``attempt + 1``.

        The reason and ``actor`` (who cancelled) are recorded in the crash history.

        The bumped attempt fences out a process still running the job: its next write raises
        `agentlife.AttemptFenced` and it stops without touching the row.
        """

    async def retry(self, job_id: str, *, actor: str | None = None) -> JobRecord:
        """FAILED or DEAD_LETTER -> PENDING, runnable now; earlier crashes stop counting to retry limits.

        ``actor`` (who retried) is recorded in the crash history's retry marker.

        A retry approves nothing: a rejected call parks again and asks. Earlier grants stand.
        """

    async def pause(self, job_id: str, *, reason: str, actor: str) -> JobRecord:
        """Pause a job; PENDING, RETRYING, WAITING or WAITING_FOR_APPROVAL -> PAUSED, returns the row.

        A PAUSED row is claimed by no worker and touched by no reaper; it keeps what it was doing (its
        status, a wait's timer and events, the approval request) for `resume`. A RUNNING job stays RUNNING
        with the request on its row: its process parks it PAUSED at its next step boundary or wait, never
        inside a tool call. ``reason`` and ``actor`` are recorded in the crash history and the row.

        Raises:
            JobNotFound: no such row.
            JobStateConflict: the job has ended, is PAUSED already, or its pause is already requested.
            StoreUnavailable: a PostgreSQL job table from before pauses (run ``db init``).
        """

    async def resume(self, job_id: str, *, actor: str) -> JobRecord:
        """PAUSED -> the status it was paused in; returns the row.

        A WAITING job whose awaited event came (or whose timer ended) while it was paused is runnable at
        once. A RUNNING job whose pause is still requested has the request withdrawn.

        Raises:
            JobNotFound: no such row.
            JobStateConflict: the job is not PAUSED (nor RUNNING with a pause requested).
        """

    async def kept_checkpoints(self, job_id: str) -> list[KeptCheckpoint]:
        """The job's checkpoint history (the last `HISTORY_KEEP`), newest first: what a rewind can reach."""

    async def step_records(self, job_id: str) -> list[StepRecord]:
        """Every step record the job keeps (what a rewind lists as the effects it may repeat)."""

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
        """Rewind the job to ``target``'s step in place (PENDING, ``attempt + 1``), or fork it (``new_id``).

        Conditional on the attempt the target was planned against (see `agentlife.stores._rewind`).

        Raises:
            JobNotFound: no such row.
            JobStateConflict: the row changed since, a live worker holds it (without ``force``), or
                ``new_id`` exists.
        """

    async def send_event(self, job_id: str, name: str, payload: Any = None) -> int:
        """Send the event ``name`` with ``payload`` (JSON) to a job; returns its sequence number.

        The event is kept until a ``ctx.wait_for_event(name)`` of the job takes it (each event is taken by
        exactly one wait, oldest first); a job parked WAITING for ``name`` becomes runnable at once.

        Raises:
            JobNotFound: there is no such job.
            JobStateConflict: the job is COMPLETED, FAILED or DEAD_LETTER, or already keeps 1,000 events
                that no wait has taken.
            ConfigError: an empty or overlong name, or a payload that is not JSON or over 256 KiB.
        """

    async def kept_events(self, job_id: str) -> dict[str, int]:
        """How many events of each name the job keeps that no wait has taken yet (oldest name first)."""

    async def get_wait(self, job_id: str) -> WaitState | None:
        """The row's status and, while it is WAITING, what it waits for; None when there is no such job."""

    async def output_head(self, job_id: str) -> int | None:
        """The ``seq`` of the job's last output row (0: none yet); None when there is no such job."""

    async def read_output(self, job_id: str, after: int, limit: int = 500) -> list[OutputRow]:
        """The job's output rows (published events, status changes, its end) after ``after``, in order."""

    async def read_deltas(self, job_id: str, after: int | None) -> tuple[int, list[bytes]]:
        """SQLite's recent delta batches of the job after ``after`` (None: only where they stand)."""

    def output_watch(self, job_id: str) -> OutputWatch:
        """A watch of the job's output moving: enter it before reading the rows, then `OutputWatch.wait`."""


class RateBuckets(Protocol):
    """The fleet-wide rate-limit buckets of model calls, shared by every process of the store.

    See `agentlife.stores._ratebuckets`.
    """

    async def draw_rate_capacity(self, key: str, caps: Caps, draw: RateDraw) -> RateGrant:
        """Take a slice of bucket ``key`` (and an in-flight slot), or learn how long to wait for one.

        ``caps`` are the bucket's limits per minute (requests, input tokens, output tokens; None: not
        limited); the bucket is made full on first use. What ``draw.give_back`` returns is applied first.
        """

    async def return_rate_capacity(
        self, key: str, caps: Caps, give_back: Sequence[float], slot: str | None = None
    ) -> None:
        """Give back what a slice left (negative: take what it overspent) and end in-flight slot ``slot``."""

    async def pause_rate_bucket(
        self, key: str, caps: Caps, until: float, remaining: Sequence[float | None] = (None, None, None)
    ) -> None:
        """No capacity from bucket ``key`` before ``until`` (unix seconds), at most ``remaining`` now."""

    async def rate_bucket_levels(self, key: str, caps: Caps) -> tuple[tuple[float, ...], float, int] | None:
        """(levels now, pause end, live in-flight slots) of bucket ``key``; None before its first use."""


@runtime_checkable
class CheckpointStore(JobStore, WorkQueue, OperatorStore, RateBuckets, Protocol):
    """Durable job state, every role's operations. Every write after `claim` is fenced by the attempt.

    A write whose ``attempt`` no longer owns the row raises `agentlife.AttemptFenced` and changes nothing.
    Implementations: `SQLiteStore` (embedded default) and `PostgresStore` (asyncpg pool).
    """

    async def init_schema(self) -> None:
        """Create the tables if they do not exist (``python -m agentlife db init``)."""
