"""Hydration, in order: checkpoint (mandatory), journal scan (5 s), memory (10 s)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from agentlife._checkpoint import CheckpointDoc
from agentlife._exceptions import BootFailure, CheckpointCorrupt, JobNotFound, StoreUnavailable
from agentlife._journal._conversation import ConversationLog
from agentlife._journal._recovery import ReplayMap, ScanResult, build_replay, scan_for_resume
from agentlife._journal._steprecords import replay_events
from agentlife._logging import log_fields
from agentlife.stores import JobRecord
from agentlife.stores._jobs import REWIND_EVENT
from agentlife.stores._rows import unreadable_summary

if TYPE_CHECKING:
    from agentlife._agent import AgentProcess, Job
    from agentlife._journal._steprecords import StepJournal
    from agentlife._memory import MemoryRecord, QdrantMemory
    from agentlife._observe._telemetry_facade import TelemetryFacade
    from agentlife._redact import Redactor
    from agentlife._step._host import Booted
    from agentlife.stores._steprecords import StepRecord

__all__ = ["Hydrator"]

log = logging.getLogger("agentlife.hydration")


class Hydrator:
    """The three hydration steps, each timed into ``agent.hydration.duration``.

    Args:
        booted: the job's settings, store and this process's journal.
        redactor: masks secrets in what hydration logs.
        telemetry: where each step's duration goes.
    """

    def __init__(self, booted: Booted, *, redactor: Redactor, telemetry: TelemetryFacade) -> None:
        self.settings = booted.settings
        self.store = booted.store
        self.journal = booted.journal
        self.constants = booted.settings.constants.hydration
        self.redactor = redactor
        self.telemetry = telemetry

    async def _with_store_retries(self, what: str, fn: Any) -> Any:
        """Up to ``checkpoint_tries`` attempts with a fixed backoff while the store is unreachable."""
        tries = max(1, self.constants.checkpoint_tries)
        for attempt in range(1, tries + 1):
            try:
                return await fn()
            except StoreUnavailable as exc:
                message = self.redactor.redact(str(exc))
                if attempt == tries:
                    raise BootFailure(f"{what}: store unreachable after {tries} tries: {message}") from None
                log.warning("%s: store unreachable (try %s/%s): %s", what, attempt, tries, message)
                await anyio.sleep(self.constants.checkpoint_backoff_seconds)
        raise AssertionError("unreachable")

    async def claim_job(
        self, *, create: bool = False, payload: Any = None, claimed: JobRecord | None = None
    ) -> JobRecord:
        """Find (or create) the job row and claim it for this attempt.

        Args:
            create: create a missing row on PostgreSQL too (SQLite always creates it).
            payload: the payload of a row this process creates.
            claimed: the row a worker already claimed for this attempt; taken as it is.
        """
        s = self.settings
        started = time.monotonic()
        if claimed is not None:
            if claimed.id != s.job_id or claimed.attempt != s.attempt:
                handed = f"{claimed.id} attempt {claimed.attempt}"
                raise BootFailure(f"job {s.job_id} attempt {s.attempt}: handed the claim of {handed}")
            return self._claimed(claimed, started)

        async def find_or_create() -> JobRecord:
            row = await self.store.get_job(s.job_id)
            if row is None:
                if self.store.url_scheme != "sqlite" and not create:
                    raise JobNotFound(
                        f"job {s.job_id} does not exist in the store (the control plane creates job rows; "
                        "pass --create-job to create it)"
                    )
                budget = {
                    "max_input_tokens": s.constants.budget.max_input_tokens,
                    "max_cost_usd": s.constants.budget.max_cost_usd,
                }
                row = await self.store.create_job(s.job_id, s.agent_id, payload, budget)
                log.info("created job row %s", s.job_id)
            return await self.store.claim(s.job_id, s.attempt)

        try:
            row: JobRecord = await self._with_store_retries("claim", find_or_create)
        except JobNotFound as exc:
            raise BootFailure(str(exc)) from None
        return self._claimed(row, started)

    def _claimed(self, row: JobRecord, started: float) -> JobRecord:
        if row.unreadable:
            # Its payload, budget or history would be guessed: a row written by another client that
            # agentlife cannot read is never run (a worker sets it aside at its claim).
            raise BootFailure(f"job {row.id}: the job row cannot be read: {unreadable_summary(row)}")
        self.telemetry.hydration_phase("claim", time.monotonic() - started)
        return row

    async def load_checkpoint(self) -> tuple[CheckpointDoc, str | None]:
        """Step 1: the newest checkpoint that verifies (history fallback); a fresh job starts at step 0."""
        s = self.settings
        started = time.monotonic()
        try:
            loaded = await self._with_store_retries(
                "checkpoint load", lambda: self.store.load_checkpoint(s.job_id)
            )
            doc = CheckpointDoc() if loaded is None else CheckpointDoc.decode(loaded.data, s.job_id)
        except CheckpointCorrupt as exc:
            raise BootFailure(str(exc)) from None
        self.telemetry.hydration_phase("checkpoint", time.monotonic() - started)
        if loaded is None:
            log.info("fresh job: starting at step 0")
            return doc, None
        if loaded.source == "history":
            log.warning("resuming from history checkpoint %s", loaded.checkpoint_id)
        log.info(
            "checkpoint %s loaded: resuming at step %s (%s)",
            loaded.checkpoint_id,
            doc.next_step,
            doc.phase,
            extra=log_fields(checkpoint_id=loaded.checkpoint_id, next_step=doc.next_step),
        )
        return doc, loaded.checkpoint_id

    async def load_conversation(self, doc: CheckpointDoc) -> ConversationLog:
        """Step 1b: the conversation the checkpoint describes, read back from its rows and verified."""
        if not doc.conversation:
            return ConversationLog()
        s = self.settings
        length = int(doc.conversation["length"])
        rows = await self._with_store_retries(
            "conversation load", lambda: self.store.load_conversation(s.job_id, length)
        )
        try:
            return ConversationLog.restore(s.job_id, doc.conversation, rows)
        except CheckpointCorrupt as exc:
            raise BootFailure(str(exc)) from None

    async def load_step_records(self) -> list[StepRecord]:
        """Step 2a: the step records the job keeps in the store, what a resumed step replays on any pod."""
        s = self.settings
        started = time.monotonic()
        records: list[StepRecord] = await self._with_store_retries(
            "step record load", lambda: self.store.load_step_records(s.job_id)
        )
        self.telemetry.hydration_phase("step_records", time.monotonic() - started)
        return records

    async def replay_map(
        self,
        checkpoint_id: str | None,
        doc: CheckpointDoc,
        journal: Callable[[Sequence[StepRecord], int], StepJournal],
        row: JobRecord,
    ) -> tuple[StepJournal, ReplayMap | None]:
        """Step 2: the steps' journal (``journal(the store's records, the step resumed)``), the replay map.

        A rewind to the checkpoint resumed (in the ``row``'s crash history) is journaled first; a fresh job
        replays only the session files of the row's incarnation.
        """
        records = await self.load_step_records()
        self._journal_rewind(checkpoint_id, row.error)
        replay = await self.scan_journal(checkpoint_id, doc, records, row.incarnation)
        return journal(records, doc.next_step), replay

    async def scan_journal(
        self,
        checkpoint_id: str | None,
        doc: CheckpointDoc,
        records: Sequence[StepRecord] = (),
        incarnation: str | None = None,
    ) -> ReplayMap | None:
        """Step 2b: the replay map of the resumed step, from the journal and the store's ``records``.

        Any trouble with the journal degrades to what the store holds (checkpoint-only resume when that is
        nothing too).
        """
        step = doc.next_step
        result = await self._scan_session_files(checkpoint_id, doc, incarnation)
        events, source = replay_events(result, records, step)
        replay: ReplayMap | None = None
        if events:
            replay = build_replay(events, step)
            log.info(
                "replaying step %s: %s; %s LLM and %s tool calls to replay",
                step,
                source,
                len(replay.llm),
                len(replay.tools),
            )
        self._write_resume_marker(checkpoint_id, doc, replay, incarnation)
        return replay

    async def _scan_session_files(
        self, checkpoint_id: str | None, doc: CheckpointDoc, incarnation: str | None
    ) -> ScanResult | None:
        """The recovery scan of this pod's session files, bounded; None when it could not run."""
        budget = self.constants.buffer_scan_timeout_seconds
        started = time.monotonic()
        result: ScanResult | None = None
        try:
            with anyio.fail_after(budget + 0.5):
                result = await anyio.to_thread.run_sync(
                    lambda: scan_for_resume(
                        self.settings.session_dir,
                        checkpoint_id,
                        budget_seconds=budget,
                        exclude=[self.journal.path],
                        checkpoint_step=doc.next_step - 1,
                        incarnation=incarnation,
                    ),
                    abandon_on_cancel=True,
                )
            if result.found:
                log.info("journal scan: %s events after checkpoint %s", len(result.events), checkpoint_id)
            elif result.expected:
                # A fresh job, a pod that never ran it, or the documented kill between checkpoint and
                # marker: nothing was lost, and WARNING stays for what an operator should look at.
                log.info("journal scan: nothing to replay from this pod's journal: %s", result.reason)
            else:
                log.warning("journal scan: this pod's journal cannot be replayed: %s", result.reason)
        except TimeoutError:
            log.warning("journal scan: this pod's journal cannot be replayed: exceeded %gs", budget)
        except Exception as exc:  # the scan is optional: nothing it meets may stop hydration
            log.warning(
                "journal scan: this pod's journal cannot be replayed: %s: %s", type(exc).__name__, exc
            )
        self.telemetry.hydration_phase("journal_scan", time.monotonic() - started)
        return result

    def _journal_rewind(self, checkpoint_id: str | None, history: Sequence[Any]) -> None:
        """``REWOUND`` (who, why, to which step) when the checkpoint resumed is one a rewind wrote."""
        for entry in reversed(history):
            rewind = isinstance(entry, dict) and entry.get("event") == REWIND_EVENT
            if rewind and checkpoint_id is not None and entry.get("checkpoint_id") == checkpoint_id:
                self.journal.append(
                    "REWOUND",
                    to_step=entry.get("to_step"),
                    checkpoint_id=checkpoint_id,
                    actor=entry.get("actor"),
                    reason=entry.get("reason"),
                    at=entry.get("at"),
                )
                log.info("resuming job rewound to step %s by %s", entry.get("to_step"), entry.get("actor"))
                return

    def _write_resume_marker(
        self, checkpoint_id: str | None, doc: CheckpointDoc, replay: ReplayMap | None, incarnation: str | None
    ) -> None:
        """Start this session's file with the marker and the resumed step's completed calls.

        Each session file then holds everything the next attempt's scan needs, however many attempts die
        in the same step. A fresh job's marker (no checkpoint id) carries the row's incarnation: the only
        thing that tells it from the marker of another job of the same id.
        """
        own = {"incarnation": incarnation} if checkpoint_id is None and incarnation is not None else {}
        self.journal.append(
            "CHECKPOINT_WRITTEN",
            step=doc.next_step - 1,
            checkpoint_id=checkpoint_id,
            crc=None,
            resumed=True,
            **own,
        )
        if replay is not None:
            self.journal.carry_forward(replay.events_for_carry_forward())

    async def fetch_memories(
        self,
        doc: CheckpointDoc,
        *,
        job: Job,
        agent: AgentProcess,
        open_memory: Callable[[], Awaitable[QdrantMemory]],
    ) -> list[MemoryRecord]:
        """Step 3: memories for the query text; unreachable or slow means a warning and none.

        Args:
            doc: the checkpoint loaded in step 1.
            job: the job, for ``memory_query``.
            agent: the agent whose ``memory_query`` gives the query text.
            open_memory: opens (once) the memory store.
        """
        started = time.monotonic()
        try:
            query = agent.memory_query(job, {"summary": doc.state.get("summary"), **doc.state})
        except Exception as exc:
            log.warning("memory_query() failed: %s; continuing without memories", exc)
            return []
        if not query:
            return []
        path = self.settings.data_dir / "qdrant"
        if self.settings.qdrant_url is None and not path.exists():
            log.info("memory: no memory store yet; continuing without memories")
            return []
        records: list[MemoryRecord] = []
        try:
            with anyio.fail_after(self.constants.memory_timeout_seconds):
                memory = await open_memory()
                records = await memory.search(query, top_k=self.constants.memory_top_k)
            log.info("memory: %s records hydrated", len(records))
        except Exception as exc:
            reason = "timed out" if isinstance(exc, TimeoutError) else self.redactor.redact(str(exc))
            log.warning("memory fetch failed (%s); continuing without memories", reason)
        self.telemetry.hydration_phase("memory", time.monotonic() - started)
        return records
