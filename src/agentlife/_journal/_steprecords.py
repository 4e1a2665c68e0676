"""The journal a step writes: every event to the session file, and what a resumed step replays to the store.

A pod's disk goes with the pod, so the session file alone cannot make a step exactly-once when the next
attempt runs elsewhere. `StepJournal` writes each event to the session file, as before, and keeps the
events a resumed step replays (`STORED_TYPES`: model replies, tool starts and results, wait starts and
outcomes, replay voids, usage already counted) for the job's store as `StepRecord` rows:

* a side-effecting call's start (its write-ahead record) is committed to the store before the call runs,
  in the same moment as its fsync to the session file, and carries every record the step made before it;
  the write is fenced, so a process that has lost the job learns it before the effect;
* its result is committed before the step goes on when the tool has no ``verify`` (nothing else could
  tell whether the effect happened); with ``verify`` it goes with the step's next store write;
* a durable wait's start is committed before the wait, so its end is the same on every pod, and its
  outcome before the step goes on;
* everything else goes with the step's next store write: the next one of the above, the park checkpoint,
  the records a drain or a crash leaves (best effort), and is not needed once the step's checkpoint is
  written.

`replay_events` puts the two sources together when a step resumes.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import orjson

from agentlife._exceptions import AttemptFenced
from agentlife._journal._writer import Event, EventType, Journal, session_of
from agentlife.stores._base import HISTORY_KEEP
from agentlife.stores._steprecords import StepRecord

if TYPE_CHECKING:
    from agentlife._journal._recovery import ScanResult

__all__ = ["STORED_TYPES", "RecordStore", "StepJournal", "replay_events"]

log = logging.getLogger("agentlife.journal")

#: The events a resumed step replays (what `build_replay` reads): the store keeps these.
STORED_TYPES = frozenset(
    {
        EventType.LLM_COMPLETED,
        EventType.TOOL_STARTED,
        EventType.TOOL_COMPLETED,
        EventType.TOOL_FAILED,
        EventType.WAIT_STARTED,
        EventType.WAIT_COMPLETED,
        EventType.REPLAY_DISCARDED,
        EventType.USAGE_COUNTED,
        # The tool lists of the job's MCP servers as this attempt found them, at the step it resumed: the
        # next attempt, on any pod, compares its own with them.
        "MCP_TOOLS",
    }
)


class RecordStore(Protocol):
    """What `StepJournal` needs of the job store."""

    async def append_step_records(self, job_id: str, attempt: int, records: Sequence[StepRecord]) -> None:
        """Store records of this session, fenced by ``attempt``."""
        ...


#: Runs a store write, retrying it while the store is unreachable (within the step's budget).
Retrying = Callable[[str, Callable[[], Awaitable[None]]], Awaitable[None]]


async def _no_retry(what: str, call: Callable[[], Awaitable[None]]) -> None:
    await call()


class StepJournal:
    """The step's journal: the session file, and the store for what a resumed step replays.

    Args:
        journal: this process's session journal.
        store: the job store.
        job_id: the job.
        attempt: this process's attempt (the store write is fenced by it).
        stored: the records the store kept for the job when this process read them (at hydration).
        resume_step: the step this process resumes at.
        retrying: runs a store write, retrying while the store is unreachable.
        on_fenced: told when the store refuses a write because another attempt holds the job.
    """

    def __init__(
        self,
        journal: Journal,
        store: RecordStore,
        job_id: str,
        attempt: int,
        *,
        stored: Sequence[StepRecord] = (),
        resume_step: int = 0,
        retrying: Retrying = _no_retry,
        on_fenced: Callable[[AttemptFenced], None] | None = None,
    ) -> None:
        self.journal = journal
        self._store = store
        self._job_id = job_id
        self._attempt = attempt
        key = session_of(journal.path)
        self._session = key[1] if key is not None else 0
        self._retrying = retrying
        self._on_fenced = on_fenced
        self._unsent: list[StepRecord] = []
        self._accepted = 0  # records made so far
        self._stored = 0  # of those, how many the store holds (always the oldest ones)
        self._lock = anyio.Lock()
        #: The steps whose records the store keeps.
        self.stored_steps: set[int] = {record.step for record in stored}
        #: The step this process resumes at.
        self.resume_step = resume_step
        self._loaded = list(stored)
        #: Store writes made (a commit each), for the benchmarks.
        self.store_writes = 0

    # -- the journal's interface, as the step's calls use it ----------------------------------------------

    def append(self, type: str, **fields: Any) -> int:
        """`Journal.append`; an event a resumed step replays is also kept for the step's next store write."""
        if type not in STORED_TYPES:
            return self.journal.append(type, **fields)
        seq, line = self.journal.append_line(type, **fields)
        self._keep(fields, seq, line)
        return seq

    async def append_durable(self, type: str, *, to_store: bool = True, **fields: Any) -> int:
        """`Journal.append_durable`; with ``to_store``, the store holds it (and all before it) on return too.

        The fsync and the store write run at the same time. Without ``to_store`` the event goes to the
        store with the step's next store write.

        Raises:
            AttemptFenced: another attempt holds the job: the step is being stopped, nothing may follow.
            StoreUnavailable: the store stayed unreachable for the step's budget.
            RuntimeError: the journal is closed.
            OSError: the session file could not be written.
        """
        if self.journal.closed:
            raise RuntimeError(f"journal {self.journal.path.name} is closed")
        seq, line = self.journal.append_line(type, **fields)
        if type in STORED_TYPES:
            self._keep(fields, seq, line)
        if not to_store:
            await self.journal.sync_through(seq)
            return seq
        upto = self._accepted
        await _together(lambda: self.store_through(upto), lambda: self.journal.sync_through(seq))
        return seq

    def stored_events(self, type: str) -> list[tuple[tuple[int, int, int], Event]]:
        """The events of ``type`` among the records read at hydration, with where each was written."""
        found = []
        for record in self._loaded:
            event = _parsed(record)
            if event is not None and event["type"] == type:
                found.append((record.order, event))
        return found

    # -- the store side -------------------------------------------------------------------------------------

    def _keep(self, fields: dict[str, Any], seq: int, line: bytes) -> None:
        step = fields.get("step")
        if seq < 0 or not isinstance(step, int) or isinstance(step, bool):
            return  # dropped by a closed journal, or not an event of a step
        self._unsent.append(StepRecord(step, self._attempt, self._session, seq, line))
        self._accepted += 1

    async def store_through(self, upto: int) -> None:
        """Return once the store holds the first ``upto`` records (one write for all that wait)."""
        while self._stored < upto:
            async with self._lock:
                if self._stored >= upto:
                    return
                await self._retrying("step record write", self._write_unsent)

    async def _write_unsent(self) -> None:
        batch, accepted = self._unsent, self._accepted
        self._unsent = []
        try:
            await self._store.append_step_records(self._job_id, self._attempt, batch)
        except BaseException as exc:
            self._unsent = batch + self._unsent
            if isinstance(exc, AttemptFenced) and self._on_fenced is not None:
                self._on_fenced(exc)
            raise
        self.store_writes += 1
        self._stored = accepted
        self.stored_steps.update(record.step for record in batch)

    async def store_all(self) -> None:
        """Write every record not yet in the store (a step that ends without its checkpoint)."""
        await self.store_through(self._accepted)

    def take_unsent(self) -> list[StepRecord]:
        """The records not yet in the store, for a checkpoint that writes them (it is their store write)."""
        batch = self._unsent
        self._unsent = []
        self._stored = self._accepted
        self.stored_steps.update(record.step for record in batch)
        return batch

    def drop_unsent(self) -> None:
        """Forget the records not yet in the store: the step's checkpoint makes them unneeded."""
        self._unsent = []
        self._stored = self._accepted

    def prune_before(self, step: int) -> int | None:
        """The first step whose records a checkpoint after ``step`` keeps, when older ones are stored.

        The store keeps the records of the last `HISTORY_KEEP` steps, the checkpoints' history: a resume
        from an older checkpoint (the newest failed its CRC) still replays its step.
        """
        keep_from = step + 1 - HISTORY_KEEP
        if not any(stored < keep_from for stored in self.stored_steps):
            return None
        return keep_from

    def pruned(self, keep_from: int) -> None:
        """A checkpoint removed the records of the steps before ``keep_from``."""
        self.stored_steps = {step for step in self.stored_steps if step >= keep_from}


async def _together(first: Callable[[], Awaitable[None]], second: Callable[[], Awaitable[None]]) -> None:
    """Run both at once; raise the first one's error if it failed, else the second's."""
    failures: dict[int, Exception] = {}

    async def run(index: int, call: Callable[[], Awaitable[None]]) -> None:
        try:
            await call()
        except Exception as exc:
            failures[index] = exc

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(run, 1, second)
        await run(0, first)
    if failures:
        raise failures[min(failures)]


# ------------------------------------------------------------------------------------------------ resuming


def replay_events(
    scan: ScanResult | None, records: Sequence[StepRecord], step: int
) -> tuple[list[Event], str]:
    """The events to replay ``step`` from, and where they came from (for the log).

    The session file of this pod that holds the store's checkpoint (``scan``, when found) and the store's
    records of the step each hold what their writers wrote: the file more (everything the process
    journaled), the store what outlives the pod. Each event keeps where it was first written (the writer's
    attempt and session, and its ``seq`` there; ``carried_from`` once carried forward into a newer session
    file), so the union of the two, in that order, is the step as it was written, whichever pods wrote it.
    """
    merged: dict[tuple[int, int, int], Event] = {}
    local = 0
    if scan is not None and scan.found and scan.path is not None:
        writer = session_of(scan.path)
        for event in scan.events:
            origin = _origin(event, writer)
            if origin is not None:
                merged.setdefault(origin, event)
                local += 1
    stored = _stored_events(records, step)
    for origin, event in stored:
        merged.setdefault(origin, event)
    events = []
    for origin, event in sorted(merged.items()):
        events.append({**event, "carried_from": list(origin)})
    new_from_store = len(merged) - local
    if not events:
        return [], "nothing recorded"
    return (
        events,
        f"{len(events)} events ({local} from this pod's journal, {new_from_store} only in the store)",
    )


def _origin(event: Event, writer: tuple[int, int] | None) -> tuple[int, int, int] | None:
    """Where ``event`` was first written: (attempt, session, seq)."""
    carried = event.get("carried_from")
    if isinstance(carried, list) and len(carried) == 3 and all(_is_int(x) for x in carried):
        return (carried[0], carried[1], carried[2])
    seq = event.get("seq")
    if writer is None or not isinstance(seq, int) or isinstance(seq, bool):
        return None
    # Written here (or carried here by a version that did not say from where: its place in this file).
    return (writer[0], writer[1], seq)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _stored_events(records: Sequence[StepRecord], step: int) -> list[tuple[tuple[int, int, int], Event]]:
    events: list[tuple[tuple[int, int, int], Event]] = []
    bad = 0
    for record in (r for r in records if r.step == step):
        event = _parsed(record)
        if event is None:
            bad += 1
        elif event["type"] in _REPLAYED:
            events.append((record.order, event))
    if bad:
        log.warning("%s step records of step %s are not journal events; passed over", bad, step)
    return events


#: The stored types a step's replay reads (the others are read by what wrote them).
_REPLAYED = STORED_TYPES - {"MCP_TOOLS"}


def _parsed(record: StepRecord) -> Event | None:
    """The journal event a record holds, or None when it holds none."""
    try:
        event = orjson.loads(record.data)
    except orjson.JSONDecodeError:
        return None
    return event if isinstance(event, dict) and isinstance(event.get("type"), str) else None
