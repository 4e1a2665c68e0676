"""The records a store returns (`JobRecord`, `LoadedCheckpoint`), job statuses, table names, claim tokens."""

from __future__ import annotations

import enum
import logging
import os
import socket
import zlib
from dataclasses import dataclass, field
from typing import Any

from agentlife._exceptions import CheckpointCorrupt, ConfigError

__all__ = [
    "HISTORY_KEEP",
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
    PAUSED = "PAUSED"
    """Paused by an operator (``job pause``): no worker claims it, no reaper touches it, until ``job resume``
    puts it back in the status it was paused in (kept in the row's ``paused`` column with the reason)."""
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
    rate_bucket: str = "rate_bucket"
    """The fleet-wide rate-limit buckets: one row per configured account or model."""
    rate_slot: str = "rate_slot"
    """The model calls in flight under an in-flight limit, each leased until it ends or its lease runs out."""
    output: str = "job_output"
    """A running job's output: its published events and status changes, in one order per job."""
    output_delta: str = "job_output_delta"
    """SQLite only: the recent batches of a streaming job's model text, overwritten in place."""
    pruned: str = "job_pruned"
    """The tombstones of pruned jobs: id, agent, final status, when it finished and when it was pruned."""

    def __post_init__(self) -> None:
        names = (
            self.job,
            self.checkpoint_history,
            self.delivery,
            self.conversation,
            self.event,
            self.step_record,
            self.rate_bucket,
            self.rate_slot,
            self.output,
            self.output_delta,
            self.pruned,
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
    concurrency_key: str | None = None
    """The job's concurrency key, or None: a worker with a running limit per key never runs more of the
    key's jobs at once than the limit allows."""
    priority: int = 0
    """Higher is claimed first; jobs of one priority in the order they came due (their creation)."""
    incarnation: str | None = None
    """Random per creation of the row, so that a job re-created under the same id (in another store that
    shares the data directory, or after its tombstone expired) never replays the old one's journal; None on
    rows created before the column existed."""


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
