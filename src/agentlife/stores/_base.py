"""The `CheckpointStore` protocol and the records it returns."""

from __future__ import annotations

import enum
import logging
import math
import os
import socket
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from agentlife._exceptions import CheckpointCorrupt, ConfigError

if TYPE_CHECKING:
    from agentlife._jobrefs import JobOutcome
    from agentlife.constants import Constants
    from agentlife.stores._approval import ApprovalRequest, ApprovalState
    from agentlife.stores._childjobs import JobFamily
    from agentlife.stores._jobs import ReapDecision
    from agentlife.stores._steprecords import StepRecord
    from agentlife.stores._waits import WaitState

__all__ = [
    "HISTORY_KEEP",
    "CheckpointStore",
    "JobRecord",
    "JobStatus",
    "LoadedCheckpoint",
    "StepUsage",
    "TableNames",
    "add_usage_totals",
    "claim_refusal",
    "crc32",
    "first_valid_checkpoint",
    "namespace_id",
    "new_owner",
    "owner_is_gone",
    "owner_is_live",
]

#: How many checkpoints per job `checkpoint_history` keeps.
HISTORY_KEEP = 5
#: A same-attempt claim held by a process on another host is taken over once the row's ``heartbeat_at`` is
#: this old: the default zombie threshold (``AGENTLIFE_HEARTBEAT_ZOMBIE_AFTER_SECONDS``).
CLAIM_STALE_AFTER_SECONDS = 300.0
#: The ``owner`` the reaper leaves on a row it took from a dead process: a claim token no process holds, so
#: the reaped process, were it only paused, is fenced out of every write without the attempt being bumped
#: (the next claim gives the job the reaped attempt + 1, like after any other crash).
REAPED_OWNER = "reaped"


class JobStatus(enum.StrEnum):
    """The job row's ``status`` column."""

    PENDING = "PENDING"
    """Created and never claimed: runnable once ``not_before`` has passed."""
    RUNNING = "RUNNING"
    """Claimed by a live process, which writes ``heartbeat_at`` every job heartbeat interval."""
    WAITING_FOR_APPROVAL = "WAITING_FOR_APPROVAL"
    """Parked at a restricted tool until an operator approves (``job approve``) or rejects it."""
    COMPLETED = "COMPLETED"
    """Finished: the step returned ``Done()``; ``result`` holds its result. Terminal."""
    FAILED = "FAILED"
    """Finished without success: ``Done(status="FAILED")`` or a spent budget. Terminal."""
    DEAD_LETTER = "DEAD_LETTER"
    """Given up after repeated crashes (the backoff schedule spent, the same error three times, OOM twice).
    Terminal until ``job retry``."""
    WAITING = "WAITING"
    """Parked at a durable wait (``ctx.sleep``): no process holds it; runnable again once ``not_before``
    (the end of the wait) has passed, when a worker resumes it and the step replays to the wait."""
    RETRYING = "RETRYING"
    """Crashed or reaped: runnable again, with the next attempt, once ``not_before`` has passed (a drained
    job goes back to PENDING instead)."""


def crc32(data: bytes) -> int:
    """CRC-32 of the exact stored bytes, as an unsigned 32-bit integer."""
    return zlib.crc32(data) & 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class TableNames:
    """Table names, configurable to fit an existing control-plane schema."""

    job: str = "job"
    """The job rows (one per job: status, attempt, checkpoint, heartbeat, budgets, result)."""
    checkpoint_history: str = "checkpoint_history"
    """The last checkpoints of each job, the fallback when the current one fails its CRC."""
    delivery: str = "delivery"
    """The delivery registry: one key per delivered (job, channel), so a delivery happens once."""
    conversation: str = "conversation"
    """The messages of ``ctx.conversation``, one row each, written with their step's checkpoint."""
    event: str = "job_event"
    """The events sent to jobs (``job send``), kept until a ``ctx.wait_for_event`` takes them."""
    step_record: str = "step_record"
    """The journal events a resumed step replays (write-ahead starts, results, waits), on any pod."""

    def __post_init__(self) -> None:
        names = (
            self.job,
            self.checkpoint_history,
            self.delivery,
            self.conversation,
            self.event,
            self.step_record,
        )
        for name in names:
            # Names are interpolated into SQL, so only plain (optionally schema-qualified) identifiers pass.
            parts = name.split(".")
            if not (1 <= len(parts) <= 2) or not all(p.isidentifier() and p.isascii() for p in parts):
                raise ConfigError(f"table name {name!r} is not a plain SQL identifier")


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A snapshot of one job row."""

    id: str
    """The job id (the row's key)."""
    agent_id: str
    """The agent that runs the job."""
    status: str
    """A `JobStatus` value."""
    payload: Any
    """The job's input (JSON), as created."""
    attempt: int
    """The attempt that owns the row: writes of any other attempt raise `AttemptFenced`."""
    checkpoint_id: str | None = None
    """The id of the current checkpoint, or None before the first."""
    checkpoint_crc: int | None = None
    """The CRC-32 (unsigned) of the current checkpoint's exact bytes."""
    heartbeat_at: float | None = None
    """Unix time of the last job heartbeat, or None; the reaper judges a RUNNING row by it."""
    tokens_consumed: dict[str, Any] = field(default_factory=dict)
    """What the job spent over all attempts: ``input`` and ``output`` tokens, ``cost_usd``."""
    token_budget: dict[str, Any] | None = None
    """The job's own limits (``max_input_tokens``, ``max_cost_usd``), or None for the defaults."""
    error: list[dict[str, Any]] = field(default_factory=list)
    """The crash history, oldest first: one record per crash, reap or operator decision."""
    result: Any = None
    """The ``Done`` result of a finished job (JSON), else None."""
    updated_at: float | None = None
    """Unix time of the row's last write."""
    not_before: float | None = None
    """Unix time from which the row is runnable: its creation for a PENDING row, the end of the crash backoff
    for a RETRYING one; None on rows written by other tools (runnable at once)."""
    unreadable: dict[str, str] = field(default_factory=dict)
    """The JSON columns that did not decode (a row written by another client), each with why.

    They hold their neutral value above. A worker sets such a row aside (DEAD_LETTER) instead of running it.
    """
    key: str | bytes | None = None
    """The row's id exactly as stored, when ``id`` cannot say it (a SQLite row written by another client).

    The bytes of an id stored as a BLOB; for an id stored as text that is not UTF-8 (``id`` shows U+FFFD), a
    ``str`` whose undecodable bytes are ``surrogateescape`` escapes. None when ``id`` is the stored id. It
    goes back into `CheckpointStore.list_jobs`' ``after`` cursor, so a page that ends on such a row is
    followed by the rows after it; it is never printed.
    """


@dataclass(frozen=True, slots=True)
class LoadedCheckpoint:
    """A checkpoint that passed its CRC check; ``source`` says whether history had to be used."""

    checkpoint_id: str
    """The checkpoint's id."""
    data: bytes
    """The checkpoint's exact stored bytes."""
    crc: int
    """Their CRC-32 (unsigned), checked against the stored one."""
    source: str
    """``"job"`` (the row's current checkpoint) or ``"history"`` (an older one: the current failed CRC)."""
    step: int | None = None
    """The step it was saved after, when known."""


@dataclass(frozen=True, slots=True)
class StepUsage:
    """What a step's model calls used, added to ``tokens_consumed`` by the step's checkpoint write."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0

    def __bool__(self) -> bool:
        return bool(self.input_tokens or self.output_tokens or self.cost_usd)

    def plus(self, input_tokens: int, output_tokens: int, cost_usd: float) -> StepUsage:
        """This usage with one more call's."""
        return StepUsage(
            self.input_tokens + input_tokens, self.output_tokens + output_tokens, self.cost_usd + cost_usd
        )

    def added_to(self, totals: Any) -> dict[str, Any]:
        """``tokens_consumed`` after adding this; a field that is not a number (a hand-made row) is 0."""
        base = totals if isinstance(totals, dict) else {}
        numbers = {k: v for k, v in base.items() if _is_number(v)}
        return add_usage_totals(numbers, self.input_tokens, self.output_tokens, self.cost_usd)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@runtime_checkable
class CheckpointStore(Protocol):
    """Durable job state. Every write after `claim` is fenced by the process's attempt.

    A write whose ``attempt`` no longer owns the row raises `agentlife.AttemptFenced` and changes nothing.
    Implementations: `SQLiteStore` (embedded default) and `PostgresStore` (asyncpg pool).
    """

    url_scheme: str

    async def open(self) -> None:
        """Connect; raise `agentlife.StoreUnavailable` when the store cannot be reached."""

    async def close(self) -> None:
        """Release connections; safe to call twice and after a failed `open`."""

    async def init_schema(self) -> None:
        """Create the tables if they do not exist (``python -m agentlife db init``)."""

    async def get_job(self, job_id: str) -> JobRecord | None:
        """The job row, or None."""

    async def create_job(
        self, job_id: str, agent_id: str, payload: Any, token_budget: dict[str, Any] | None = None
    ) -> JobRecord:
        """Insert a PENDING job row (no-op returning the row if it exists)."""

    async def claim(self, job_id: str, attempt: int) -> JobRecord:
        """Take ownership: set ``attempt`` and status RUNNING when ``attempt`` >= the row's.

        Raises:
            JobNotFound: no such row.
            AttemptFenced: the row belongs to a later attempt.
        """

    async def load_checkpoint(self, job_id: str) -> LoadedCheckpoint | None:
        """The newest checkpoint that verifies, falling back to history; None for a fresh job.

        Raises:
            CheckpointCorrupt: a checkpoint exists but neither it nor any history entry verifies.
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
    ) -> int:
        """Store ``data`` exactly, with its CRC-32, and append it to history; returns the CRC.

        ``messages`` (``(position, encoded message)``, the conversation's new messages) are stored in the
        same transaction, replacing any row at the same position (left by a checkpoint that was lost);
        ``usage`` (the step's model calls) is added to ``tokens_consumed`` in it too, ``records`` (step
        records of this process's session) are stored, the job's step records of steps before
        ``prune_before`` are removed, and ``heartbeat_at`` is set: a checkpoint is the step's one commit.
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

    async def load_conversation(self, job_id: str, length: int) -> list[bytes]:
        """The first ``length`` stored conversation messages of the job, in order."""

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

    async def request_approval(self, job_id: str, attempt: int, request: ApprovalRequest) -> ApprovalState:
        """Park on ``request``: WAITING_FOR_APPROVAL and the request on the row, in one fenced write.

        Nothing changes when a grant already names the call (same invocation id and digest) or the row is
        terminal; the state returned says which (`ApprovalState.decide`).

        Raises:
            AttemptFenced: the row belongs to another attempt or process.
        """

    async def get_approval(self, job_id: str) -> ApprovalState | None:
        """The row's status and approval record (request, grants, rejection), or None for no such row."""

    async def add_usage(
        self, job_id: str, attempt: int, input_tokens: int, output_tokens: int, cost_usd: float
    ) -> dict[str, Any]:
        """Add to ``tokens_consumed`` and return the new totals."""

    async def heartbeat(self, job_id: str, attempt: int) -> None:
        """Set ``heartbeat_at`` to now."""

    async def is_delivered(self, key: str) -> bool:
        """Whether the delivery registry holds ``key``."""

    async def record_delivery(self, key: str, job_id: str, channel: str) -> None:
        """Record ``key`` as delivered (idempotent)."""

    def has_free_connection(self) -> bool:
        """Liveness signal: False when every pooled connection is taken (called from the probe thread)."""

    # -- job operations (a worker's claim, the command line's ``job`` and ``reap``) ----------------------

    async def claim_next(self, agent_id: str | None = None) -> JobRecord | None:
        """Claim the oldest runnable job (of ``agent_id``, or of any agent), or return None when none is.

        Runnable: PENDING, or RETRYING whose ``not_before`` has passed; the oldest is the one with the
        earliest ``not_before``. The claim is atomic (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, an
        exclusive transaction on SQLite): two claimers never get the same row. The row becomes RUNNING with
        ``attempt + 1``, this store's claim token and ``heartbeat_at`` now; the returned record has the new
        attempt, which every later write of the job must pass.
        """

    async def list_jobs(
        self,
        status: str | None = None,
        agent_id: str | None = None,
        limit: int = 100,
        *,
        after: tuple[Any, str | bytes | None] | None = None,
    ) -> list[JobRecord]:
        """Job rows, most recently updated first (ties by id), filtered by status and agent.

        ``after`` is a page's cursor: the ``(updated_at, key)`` of the last row of the page before, ``key``
        being the row's `JobRecord.key` when it has one, else its ``id``; the rows that follow it in that
        order come back (keyset paging: an index range, as fast deep as at the top).

        Raises:
            ValueError: ``after`` holds what no row of this store can (bytes, a NUL or a non-number time on
                PostgreSQL): it is not a cursor of this store.
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

    async def approve(
        self, job_id: str, *, invocation_id: str | None = None, digest: str | None = None
    ) -> JobRecord:
        """Grant the call the job is parked on; WAITING_FOR_APPROVAL -> RUNNING or PENDING; returns the row.

        The grant is the row's recorded request (invocation id and digest): it approves that call and no
        other. RUNNING when the process that parked still holds the row (its owner not provably gone, its
        heartbeat within the zombie threshold): it polls and carries on. Otherwise PENDING: the next run or
        worker resumes the job and runs the granted call without asking again. ``invocation_id`` and
        ``digest``, when given, must name the recorded request (approve exactly the call that was shown).

        Raises:
            JobNotFound: no such row.
            JobStateConflict: the job is not waiting for approval, or waits for another call.
        """

    async def reject(self, job_id: str, reason: str) -> JobRecord:
        """WAITING_FOR_APPROVAL -> FAILED, final: the reason recorded in the crash history.

        The parked process, or whichever step reaches the call, ends the job FAILED whatever it does next.
        """

    async def cancel(self, job_id: str, reason: str) -> JobRecord:
        """PENDING, RETRYING, RUNNING or WAITING_FOR_APPROVAL -> FAILED with ``attempt + 1``.

        The bumped attempt fences out a process still running the job: its next write raises
        `agentlife.AttemptFenced` and it stops without touching the row.
        """

    async def retry(self, job_id: str) -> JobRecord:
        """FAILED or DEAD_LETTER -> PENDING, runnable now; earlier crashes stop counting to retry limits.

        A retry approves nothing: a rejected call parks again and asks. Earlier grants stand.
        """

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

    async def drop_claim(self, job_id: str) -> None:
        """This process no longer runs ``job_id``: clear the row's claim token if it is still this store's.

        The status is left as it is. A process that goes on living after a job (a worker) calls it, so a
        job it left parked for approval is not taken for one a live process still waits on: an approve
        then makes it PENDING, for any worker to resume.
        """

    async def release(self, job_id: str, attempt: int, status: str, *, delay_seconds: float = 0.0) -> bool:
        """Hand back a job this process holds (RUNNING with ``attempt``), its claim token dropped.

        ``status`` is PENDING or RETRYING (runnable again after ``delay_seconds``, by the store's clock), or
        DEAD_LETTER / FAILED. One conditional UPDATE: returns False, changing nothing, when the row has moved
        on (another attempt holds it, or it is no longer RUNNING). A worker releases a drained job (PENDING)
        and a crashed one (the crash policy's verdict and backoff).
        """

    async def park_waiting(
        self, job_id: str, attempt: int, until: float, waiting_for: dict[str, Any]
    ) -> bool:
        """Park a job this process holds (RUNNING with ``attempt``) at a durable wait, its claim dropped.

        The row becomes WAITING with ``not_before`` = ``until`` (unix time: a worker claims it once the wait
        is over) and ``waiting_for`` (JSON: what it waits for) in its ``waiting`` column. One conditional
        UPDATE: False, changing nothing, when the row has moved on (cancelled, or another attempt's).
        """

    async def get_wait(self, job_id: str) -> WaitState | None:
        """The row's status and, while it is WAITING, what it waits for; None when there is no such job."""

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

    async def get_family(self, job_id: str) -> JobFamily | None:
        """The job's parent and the children it started; None when there is no such job."""


def first_valid_checkpoint(job_id: str, history: list[tuple[Any, ...]]) -> LoadedCheckpoint:
    """Log the mismatch and return the newest history entry that verifies, else raise."""
    logging.getLogger("agentlife.store").error("Checkpoint CRC mismatch for job %s", job_id)
    for checkpoint_id, data, crc, step in history:
        if crc32(bytes(data)) == crc:
            return LoadedCheckpoint(checkpoint_id, bytes(data), crc, "history", step)
    raise CheckpointCorrupt(f"Checkpoint CRC mismatch for job {job_id}: no valid checkpoint in history")


def add_usage_totals(
    totals: dict[str, Any], input_tokens: int, output_tokens: int, cost_usd: float
) -> dict[str, Any]:
    """``tokens_consumed`` after adding one call's usage."""
    return {
        "input": int(totals.get("input", 0)) + input_tokens,
        "output": int(totals.get("output", 0)) + output_tokens,
        "cost_usd": round(float(totals.get("cost_usd", 0.0)) + cost_usd, 6),
    }


def _start_ticks(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), None when it is gone or unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # Field 2 (comm) may hold spaces and parentheses: count fields after its closing parenthesis.
    fields = stat[stat.rfind(b")") + 2 :].split()
    return fields[19].decode() if len(fields) > 19 else None


_NAMESPACE: str | None = None


def namespace_id() -> str:
    """Which pid namespace of which boot this process lives in: ``{boot id}.{pid namespace inode}``.

    A pid means something only inside its pid namespace, and a host name says nothing about that: two
    containers may share one (``hostNetwork: true``, compose's ``hostname:``, a UTS namespace of their own)
    while each sees only its own processes. '-' when ``/proc`` cannot tell (then no pid is ever judged).
    """
    global _NAMESPACE  # read once: neither can change while the process lives
    if _NAMESPACE is None:
        try:
            with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
                boot = f.read().strip()
            inode = os.stat("/proc/self/ns/pid").st_ino
        except (OSError, ValueError):
            _NAMESPACE = "-"
        else:
            # Only characters a claim token may hold (it is split on ':').
            boot = "".join(c for c in boot if c.isalnum() or c == "-")
            _NAMESPACE = f"{boot}.{inode}" if boot else "-"
    return _NAMESPACE


def new_owner() -> str:
    """A claim token for this process: ``host:pid:start-ticks:random:namespace``.

    pid and start time tell whether the owner still runs (a pid alone may have been reused), but only seen
    from the same pid namespace of the same boot (`namespace_id`); the random part tells two stores of one
    process apart (the test harness runs agents in one interpreter).
    """
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{_start_ticks(pid) or '-'}:{os.urandom(4).hex()}:{namespace_id()}"


def owner_is_gone(owner: str) -> bool:
    """True when ``owner`` is known to have exited: its pid, in this very pid namespace, is gone or reused.

    Only a token naming this process's namespace (`namespace_id`: boot id and pid namespace inode) can be
    judged; a token from another namespace, another host, or an older version that did not record its
    namespace, is never called gone: only the heartbeat's age can tell for those.
    """
    parts = owner.split(":")
    if len(parts) != 5:
        return False
    host, pid_text, ticks, _, namespace = parts
    if host != socket.gethostname() or namespace in ("", "-") or namespace != namespace_id():
        return False
    if not (pid_text.isascii() and pid_text.isdigit()) or ticks in ("", "-"):
        return False  # '²'.isdigit() holds, and int() refuses it: a token written badly judges nothing
    return _start_ticks(int(pid_text)) != ticks


def owner_is_live(owner: str | None, heartbeat_age: float | None, stale_after: float) -> bool:
    """Whether a process may still hold the row: it has an owner that is not provably gone, with a heartbeat.

    The check a same-attempt `CheckpointStore.claim` makes, and ``approve`` (RUNNING for a live parked
    process, PENDING otherwise): an owner that has exited (`owner_is_gone`) or whose heartbeat is older than
    ``stale_after`` holds nothing any more.
    """
    if owner is None or owner == REAPED_OWNER:
        return False
    if owner_is_gone(owner):
        return False
    return heartbeat_age is not None and heartbeat_age <= stale_after


def claim_refusal(
    job_id: str,
    attempt: int,
    row_attempt: int,
    row_owner: str | None,
    owner: str,
    heartbeat_age: float | None,
    stale_after: float = CLAIM_STALE_AFTER_SECONDS,
) -> str | None:
    """Why this process may not claim the row, or None when it may.

    A lower attempt never may. The same attempt may only when the row is unowned (or reaped), owned by this
    process, owned by a process that has exited (same pid namespace: pid and start time), or owned by one
    whose heartbeat is older than ``stale_after`` (another host or namespace): two live processes with the
    same attempt would both do every side effect of the job, so the second one loses.
    """
    if attempt < row_attempt:
        return f"job {job_id} is owned by attempt {row_attempt}, this is {attempt}"
    if attempt > row_attempt or row_owner == owner:
        return None
    if not owner_is_live(row_owner, heartbeat_age, stale_after):
        return None
    assert row_owner is not None
    host, _, rest = row_owner.partition(":")
    return (
        f"job {job_id} attempt {attempt} is already claimed by a live process (pid {rest.partition(':')[0]} "
        f"on {host}, heartbeat {heartbeat_age:.0f} s ago): a second process with the same attempt is refused"
    )
