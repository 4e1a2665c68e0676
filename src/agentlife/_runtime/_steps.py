"""Running one step: its context, its checkpoint, usage accounting, and parking (approval, durable waits).

`StepRunner` runs the steps of one job over `Booted`: it owns the step's cancel scope (a drain brings its
deadline forward, a fence cancels it), the current step number and the id of the last checkpoint written.
A checkpoint write is fenced by the attempt and retried while the store is unreachable, within the step
budget. `JobHost` is the `StepHost` a step's calls get: the agent, the constants, the job's drain and its
counters, nothing of the lifecycle.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.abc
import anyio.to_thread
import orjson

from agentlife._agent import AgentProcess, Done, Footprint
from agentlife._budget import Budget
from agentlife._checkpoint import CheckpointDoc
from agentlife._exceptions import (
    PAUSED_AT_APPROVAL,
    PAUSED_AT_BOUNDARY,
    AgentlifeError,
    AttemptFenced,
    ParkRequested,
    StoreUnavailable,
    WaitParked,
    describe_error,
)
from agentlife._exitcode import ExitCode
from agentlife._journal._recovery import build_replay, scan_for_resume
from agentlife._journal._steprecords import StepJournal, replay_events
from agentlife._llm._protocol import CURRENT_CALL, LLMClient
from agentlife._observe._telemetry_facade import TelemetryFacade
from agentlife._redact import Redactor
from agentlife._replay import check_replayable
from agentlife._runtime._base import Hydrated, Outcome
from agentlife._runtime._drain import Drain
from agentlife._runtime._events import JobEvents
from agentlife._state import State
from agentlife._step._context import CallEnv, StepContext
from agentlife._step._host import Booted, RuntimeStats
from agentlife.constants import Constants
from agentlife.stores import JobStatus
from agentlife.stores._base import StepUsage
from agentlife.stores._steprecords import StepRecord

if TYPE_CHECKING:
    from agentlife._journal._recovery import ReplayMap
    from agentlife._llm._protocol import LLMReply
    from agentlife._llm._ratelimiter import RateLimiter
    from agentlife._output._deltas import DeltaBuffer

__all__ = ["JobHost", "StepRunner"]

log = logging.getLogger("agentlife.runtime")
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class JobHost:
    """The `StepHost` of one job: what its steps' calls need, and nothing of the lifecycle."""

    agent: AgentProcess
    constants: Constants
    drain: Drain
    redactor: Redactor
    telemetry: TelemetryFacade
    events: JobEvents

    @property
    def draining(self) -> bool:
        """True once the job's drain began."""
        return self.drain.draining

    @property
    def drain_event(self) -> anyio.Event | None:
        """Set when the job's drain begins."""
        return self.drain.drain_event

    @property
    def drain_deadline(self) -> float | None:
        """When the drain cancels the step (anyio clock); None while not draining."""
        return self.drain.deadline

    @property
    def stats(self) -> RuntimeStats:
        """The job's counters."""
        return self.events.stats

    def notify(self, event: str, **info: Any) -> None:
        """Tell the job's observers."""
        self.events.notify(event, **info)


class StepRunner:
    """Runs one job's steps, writes its checkpoints and parks it; see the module docstring."""

    def __init__(self, host: JobHost, booted: Booted, checkpoint_id: str | None = None) -> None:
        self.host = host
        self.booted = booted
        self.agent = host.agent
        self.constants = host.constants
        #: The last checkpoint written (or loaded): where a parked step's calls are read back from.
        self.checkpoint_id = checkpoint_id
        #: The row's incarnation: a park before the first checkpoint reads back only its own marker.
        self.incarnation: str | None = None
        #: The step running now, or the last one run.
        self.current_step: int | None = None
        #: Set when a later attempt fenced this one out: the loop stops and the process exits 1.
        self.fenced: AttemptFenced | None = None
        self._scope: anyio.CancelScope | None = None
        self._rng = random.Random()
        self._drained_in_step: int | None = None  # the step a drain interrupted, if it came during one
        #: The step's model calls not yet in ``tokens_consumed`` (call number -> usage): the checkpoint
        #: write adds them, in its one commit.
        self._uncounted: dict[int, StepUsage] = {}
        #: The journal the steps write, which also keeps what a resumed step replays in the store.
        self.records = self.step_journal()
        #: The process's fleet-wide rate limiter (None: no limit configured).
        self.limiter: RateLimiter | None = None
        #: Where a streaming reply's text goes on to the job's followers (set once the job is claimed).
        self.deltas: DeltaBuffer | None = None
        host.drain.add_listener(self._on_drain)

    def step_journal(self, stored: Sequence[StepRecord] = (), resume_step: int = 0) -> StepJournal:
        """The steps' journal over this process's session file and the store (see `StepJournal`).

        Args:
            stored: the records the store kept for the job (read at hydration).
            resume_step: the step this process resumes at.
        """
        s = self.booted.settings
        return StepJournal(
            self.booted.journal,
            self.booted.store,
            s.job_id,
            s.attempt,
            stored=stored,
            resume_step=resume_step,
            retrying=self.retrying_store,
            on_fenced=self.fenced_out,
        )

    def _on_drain(self, reason: str) -> None:
        self._drained_in_step = self.step_in_progress

    def drained_between_steps(self) -> str:
        """The exit line's reason for a drain that stopped the loop before a step."""
        reason = self.host.drain.reason
        if self._drained_in_step is None:
            return f"drained by {reason} between steps"
        return f"drained by {reason} during step {self._drained_in_step}, which finished and was checkpointed"

    @property
    def step_in_progress(self) -> int | None:
        """The step whose scope is open now (a drain that comes now lets it finish), else None."""
        return self.current_step if self._scope is not None else None

    @contextlib.contextmanager
    def scope(self) -> Iterator[anyio.CancelScope]:
        """A step's (or delivery's) cancel scope: the drain bounds it, a fence cancels it."""
        with anyio.CancelScope() as scope, self.host.drain.bounded(scope):
            self._scope = scope
            try:
                yield scope
            finally:
                self._scope = None

    def fenced_out(self, exc: AttemptFenced) -> None:
        """A later attempt owns the job: stop the step loop now, exit 1, never write the row again."""
        log.error("fenced: %s; stopping the step loop", exc)
        self.fenced = exc
        if self._scope is not None:
            self._scope.cancel()

    async def run_step(
        self, hydrated: Hydrated, llm: LLMClient, doc: CheckpointDoc, replay: ReplayMap | None
    ) -> tuple[Done | bool | None, CheckpointDoc]:
        """Run one step; returns (outcome, new doc). Outcome None means cancelled at the drain deadline.

        An operator's pause requested before it starts (`job pause`) raises `ParkRequested` instead: the
        job stops at this boundary, never inside a step (`park`).
        """
        if await self.pause_requested():
            raise ParkRequested(PAUSED_AT_BOUNDARY)
        booted, host, step, budget = self.booted, self.host, doc.next_step, hydrated.budget
        budget.check_run_time()
        # A private copy: a crashed or cancelled step must not leak half-made changes into a checkpoint.
        state = orjson.loads(orjson.dumps(doc.state, option=orjson.OPT_NON_STR_KEYS))
        env = CallEnv(
            host,
            hydrated.approvals,
            functools.partial(self._add_usage, budget),
            self.records,
            replay if replay and replay.step == step else None,
            budget,
            llm,
            self._rng,
            limiter=self.limiter,
            deltas=self.deltas,
        )
        ctx = StepContext(
            step=step,
            state=state,
            job=hydrated.job,
            memories=hydrated.resume.memories,
            footprint=Footprint.after_exit(booted.settings.previous_exit_code),
            env=env,
            conversation=hydrated.resume.conversation.begin_step(),
        )
        self.current_step = step
        host.events.board.update(step=step)
        booted.journal.append("STEP_STARTED", step=step)
        host.notify("step_started", step=step)
        started = time.monotonic()
        outcome: Done | None = None
        self._uncounted = {}
        try:
            with self.scope() as scope, host.telemetry.step_span(step):
                outcome = await self.agent.step(ctx)
        except ParkRequested:
            await self.count_usage_now(step)  # the park's checkpoint writes the step's records
            await self._flush_deltas()  # a step that parks after a model reply: its last words go too
            raise
        except Exception:
            await self.settle_unfinished(step)  # a crash: the step ends without its checkpoint
            raise
        await self._flush_deltas()
        # A refusal ends the job whatever the step did after it (caught it, told a model, returned Done):
        # nothing of this step is checkpointed.
        hydrated.approvals.check()
        if scope.cancelled_caught:
            if self.fenced is None:
                log.warning("step %s cancelled at the drain deadline; nothing checkpointed for it", step)
            await self.settle_unfinished(step)
            return None, doc
        if outcome is not None and not isinstance(outcome, Done):
            raise TypeError(
                f"{type(self.agent).__name__}.step() must return Done or None, got {type(outcome).__name__}"
            )
        check_replayable(ctx.state, "ctx.state")
        if isinstance(outcome, Done):
            check_replayable(outcome.result, "Done.result")
        host.telemetry.step_completed(time.monotonic() - started)
        host.stats.steps_completed += 1
        new = doc.evolve(
            next_step=step + 1,
            state=ctx.state,
            phase="running",
            approved=hydrated.approvals.approved,
            conversation=ctx.conversation.meta(),
        )
        if isinstance(outcome, Done):
            new = new.evolve(
                phase="delivering", result=outcome.result, status=outcome.status, reason=outcome.reason
            )
        # A step the job goes on from guards no effect with its checkpoint: each effect of the next step has
        # its own flushed write-ahead record, which flushes this commit first. A finishing step's does.
        await self.write_checkpoint(new, step, ctx.conversation.new_rows(), flushed=isinstance(outcome, Done))
        ctx.conversation.commit()
        host.notify("step_completed", step=step)
        return outcome or True, new

    async def write_checkpoint(
        self,
        doc: CheckpointDoc,
        step: int,
        messages: Sequence[tuple[int, bytes]] = (),
        *,
        parked: bool = False,
        flushed: bool = True,
    ) -> None:
        """Store ``doc`` and the conversation's new ``messages`` (fenced by attempt) in one transaction.

        The step's records not yet in the store are no longer needed once its checkpoint is written, except
        for a step ``parked`` at a call, which the next attempt replays: the checkpoint writes those. Step
        records older than the checkpoints' history go with it. An unreachable store is retried within the
        step budget. Without ``flushed`` the commit need not wait for the store's log flush (see
        `JobStore.write_checkpoint`).
        """
        booted = self.booted
        s, store, records = booted.settings, booted.store, self.records
        data = doc.evolve(attempt=s.attempt, written_at=time.time()).encode()
        checkpoint_id = f"{s.attempt:04d}-{step:06d}-{uuid.uuid4().hex[:8]}"
        usage = self._step_usage()
        unsent = records.take_unsent() if parked else ()
        keep_from = records.prune_before(step)
        crc = await self.retrying_store(
            "checkpoint write",
            lambda: store.write_checkpoint(
                s.job_id, s.attempt, checkpoint_id, step, data, messages, usage,
                records=unsent, prune_before=keep_from, flushed=flushed,
            ),
        )  # fmt: skip
        if not parked:
            records.drop_unsent()
        if keep_from is not None:
            records.pruned(keep_from)
        self._uncounted = {}
        self.checkpoint_id = checkpoint_id
        self.host.stats.checkpoints_written += 1
        # Buffered, not flushed: the marker only saves the next attempt a replay of nothing. Lost with the
        # process, the scan finds the store's checkpoint in no file and resumes from it (expected); any
        # later durable event writes it out first, in order.
        booted.journal.append("CHECKPOINT_WRITTEN", step=step, checkpoint_id=checkpoint_id, crc=crc)

    def _step_usage(self) -> StepUsage:
        total = StepUsage()
        for usage in self._uncounted.values():
            total = total.plus(usage.input_tokens, usage.output_tokens, usage.cost_usd)
        return total

    async def _flush_deltas(self) -> None:
        """The step's last model text reaches its followers before the step ends or parks."""
        if self.deltas is not None:
            with anyio.move_on_after(1.0):  # a preview: never worth holding the step's checkpoint for long
                await self.deltas.flush()

    async def count_usage_now(self, step: int) -> None:
        """Add the step's uncounted model calls to ``tokens_consumed`` when no checkpoint will.

        For a step that crashed, parked or was cancelled at the drain deadline. ``USAGE_COUNTED`` then
        tells the attempt that replays those calls not to count them again. Best effort: a fenced or
        unreachable store leaves them uncounted (logged), never masks why the step ended.
        """
        if not self._uncounted:
            return
        usage, calls = self._step_usage(), sorted(self._uncounted)
        self._uncounted = {}
        store, s = self.booted.store, self.booted.settings
        try:
            budget = self.constants.drain.cleanup_budget_seconds
            with anyio.CancelScope(shield=True), anyio.fail_after(budget):
                await store.add_usage(
                    s.job_id, s.attempt, usage.input_tokens, usage.output_tokens, usage.cost_usd
                )
        except Exception as exc:
            why = describe_error(exc, redact=self.host.redactor.redact)
            log.warning("the usage of step %s's model calls %s was not counted: %s", step, calls, why)
            return
        self.records.append("USAGE_COUNTED", step=step, calls=calls)

    async def settle_unfinished(self, step: int) -> None:
        """A step that ends without its checkpoint (a crash, the drain deadline): its usage and its records.

        Best effort, within the cleanup budget: whatever the store does not take now, an attempt on this
        pod still finds in the journal, and one elsewhere runs again (the documented worst case).
        """
        await self.count_usage_now(step)
        if self.fenced is not None:
            return
        try:
            budget = self.constants.drain.cleanup_budget_seconds
            with anyio.CancelScope(shield=True), anyio.fail_after(budget):
                await self.records.store_all()
        except Exception as exc:
            why = describe_error(exc, redact=self.host.redactor.redact)
            log.warning("step %s's calls were not all written to the store: %s", step, why)

    async def retrying_store(self, what: str, call: Callable[[], Awaitable[_T]]) -> _T:
        """``call()``, retried with backoff while the store is unreachable, within the step budget."""
        deadline = anyio.current_time() + self.constants.drain.step_deadline_seconds
        delay = self.constants.retry.transient_initial_seconds
        while True:
            try:
                return await call()
            except StoreUnavailable as exc:
                if anyio.current_time() + delay > deadline:
                    raise
                why = self.host.redactor.redact(str(exc))
                log.warning("%s failed (%s); retrying in %.1fs", what, why, delay)
                await anyio.sleep(delay)
                delay = min(delay * 2, self.constants.retry.transient_max_seconds)

    async def _add_usage(self, budget: Budget, reply: LLMReply) -> None:
        """Count a model call of the step: in the budget now, in ``tokens_consumed`` with the checkpoint.

        The step's checkpoint write adds it in the same commit (no commit per call); a step that ends
        without one counts it then (`count_usage_now`). Called for live calls and for replayed calls whose
        usage the attempt that made them never counted.
        """
        usage, address = reply.usage, CURRENT_CALL.get()
        spent = StepUsage(usage.input_tokens, usage.output_tokens, reply.cost_usd)
        call = address.call if address is not None else -1 - len(self._uncounted)
        self._uncounted[call] = spent
        budget.add(
            {
                "input": budget.input_tokens + spent.input_tokens,
                "output": budget.output_tokens + spent.output_tokens,
                "cost_usd": budget.cost_usd + spent.cost_usd,
            }
        )

    async def park(self, doc: CheckpointDoc, parked: ParkRequested | None = None) -> Outcome:
        """Checkpoint a step parked at a call and let go of the row.

        ``parked`` says where: a durable wait (`WaitParked`: the row becomes WAITING until the wait ends),
        else a call waiting for approval (the approval idle timeout).
        """
        if parked is not None and parked.args == (PAUSED_AT_BOUNDARY,):  # before the step: nothing to write
            return await self.pause_at_boundary(doc)
        booted = self.booted
        wait = parked if isinstance(parked, WaitParked) else None
        # The park checkpoint's marker lands after the parked step's completed calls, and the next attempt
        # replays only what follows the marker: carry those calls past it, or they would run again.
        step_events = await self._step_events_since_checkpoint(doc.next_step)
        await self.write_checkpoint(
            doc.evolve(phase="awaiting_approval" if wait is None else "waiting"),
            max(doc.next_step - 1, 0),
            parked=True,
        )
        if step_events:
            booted.journal.carry_forward(step_events)
            await booted.journal.flush(fsync=True)
        if wait is not None:
            return await self._park_waiting(wait)
        await self._let_go_of_park()
        if self.host.draining:
            return Outcome(ExitCode.DRAINED, "drained while waiting for approval")
        if parked is not None and parked.args == (PAUSED_AT_APPROVAL,):
            self.host.events.machine.move(State.DRAINING, "parked: paused by an operator")
            why = "paused by an operator while waiting for approval"
            return Outcome(ExitCode.DONE, why, JobStatus.PAUSED)
        self.host.events.machine.move(State.DRAINING, "parked: approval idle timeout")
        return Outcome(
            ExitCode.DONE,
            "parked: WAITING_FOR_APPROVAL after the idle timeout",
            JobStatus.WAITING_FOR_APPROVAL,
        )

    async def pause_requested(self) -> bool:
        """Whether an operator asked this job to pause (read at each step boundary); False if unreadable."""
        s = self.booted.settings
        try:
            return await self.booted.store.pause_requested(s.job_id, s.attempt)
        except AgentlifeError as exc:  # the next boundary reads it again; the job is not stopped for it
            log.warning("could not read the job's pause request: %s", self.host.redactor.redact(str(exc)))
            return False

    async def pause_at_boundary(self, doc: CheckpointDoc) -> Outcome:
        """Hand the row back between steps (its last step checkpointed): the store makes it PAUSED."""
        s, store = self.booted.settings, self.booted.store
        await store.drop_claim(s.job_id)
        released = await self.retrying_store(
            "pause", lambda: store.release(s.job_id, s.attempt, JobStatus.PENDING)
        )
        if not released:  # cancelled or taken over meanwhile: not ours to park
            log.warning("pausing: the row is no longer this attempt's RUNNING job; left as it is")
        self.booted.journal.append("JOB_PAUSED", step=doc.next_step)
        self.host.events.machine.move(State.DRAINING, "parked: paused by an operator")
        return Outcome(ExitCode.DONE, f"paused by an operator before step {doc.next_step}", JobStatus.PAUSED)

    async def _park_waiting(self, wait: WaitParked) -> Outcome:
        """The row becomes WAITING until the wait ends; the process exits 0 (or as drained)."""
        s, store = self.booted.settings, self.booted.store
        left = max(wait.until - time.time(), 0.0)
        await store.drop_claim(s.job_id)
        released = await self.retrying_store(
            "park", lambda: store.park_waiting(s.job_id, s.attempt, wait.until, wait.waiting_for)
        )
        if not released:  # cancelled or taken over meanwhile: not ours to park
            log.warning("parking at a wait: the row is no longer this attempt's RUNNING job; left as it is")
        self.booted.journal.append("WAIT_PARKED", step=self.current_step, until=wait.until)
        if wait.drained or self.host.draining:
            return Outcome(ExitCode.DRAINED, f"drained during a wait; {left:.0f} s of it left")
        self.host.events.machine.move(State.DRAINING, "parked: waiting")
        return Outcome(ExitCode.DONE, f"parked: WAITING for {left:.0f} s", JobStatus.WAITING)

    async def _let_go_of_park(self) -> None:
        """Leave the parked row to whoever resumes it, even if an approval lands while this process exits.

        The claim goes first: from then on ``job approve`` sees no live owner and makes the row PENDING.
        An approval that came just before saw this process alive and made the row RUNNING for it; nothing
        here will run the call, so that row is handed back as PENDING (one conditional write), not left
        RUNNING for the reaper to count as a crash.
        """
        s, store = self.booted.settings, self.booted.store
        try:
            await store.drop_claim(s.job_id)
            if await store.release(s.job_id, s.attempt, JobStatus.PENDING):
                log.info("approved while parking: the job is runnable again (PENDING)")
        except AgentlifeError as exc:  # the row stays parked: an approval still makes it runnable
            log.warning("parking: could not let go of the row: %s", self.host.redactor.redact(str(exc)))

    async def _step_events_since_checkpoint(self, step: int) -> list[dict[str, Any]]:
        """This session's events of ``step`` after the current checkpoint's marker (best effort)."""
        booted = self.booted
        session_dir, checkpoint_id = booted.settings.session_dir, self.checkpoint_id
        budget = self.constants.hydration.buffer_scan_timeout_seconds
        try:
            await booted.journal.flush(fsync=False)
            result = await anyio.to_thread.run_sync(
                lambda: scan_for_resume(
                    session_dir,
                    checkpoint_id,
                    budget_seconds=budget,
                    checkpoint_step=step - 1,
                    incarnation=self.incarnation,
                )
            )
        except Exception as exc:
            log.warning("parking: cannot read the step's calls back (%s: %s)", type(exc).__name__, exc)
            return []
        if not result.found:
            log.warning("parking: the step's calls were not found in the journal: %s", result.reason)
            return []
        events, _ = replay_events(result, (), step)  # each marked with where it was first written
        return build_replay(events, step).events_for_carry_forward()
