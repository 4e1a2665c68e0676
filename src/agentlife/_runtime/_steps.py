"""Running one step: its context, its checkpoint, usage accounting, and parking for approval.

A checkpoint write is fenced by the attempt and retried while the store is unreachable, within the step
budget.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.abc
import anyio.to_thread
import orjson

from agentlife._agent import Done, Footprint
from agentlife._budget import Budget
from agentlife._checkpoint import CheckpointDoc
from agentlife._exceptions import AgentlifeError, StoreUnavailable
from agentlife._journal._recovery import build_replay, scan_for_resume
from agentlife._llm._protocol import LLMClient
from agentlife._replay import check_replayable
from agentlife._runtime._base import EXIT_DONE, EXIT_DRAINED, Hydrated, Outcome
from agentlife._state import State
from agentlife._step._context import CallEnv, StepContext
from agentlife._step._host import Booted
from agentlife.stores import JobStatus

if TYPE_CHECKING:
    from agentlife._journal._recovery import ReplayMap
    from agentlife._llm._protocol import LLMReply

from agentlife._runtime._services import ServicesMixin

log = logging.getLogger("agentlife.runtime")
_T = TypeVar("_T")


class StepsMixin(ServicesMixin):
    """Steps, checkpoints and usage."""

    async def _run_step(
        self, booted: Booted, hydrated: Hydrated, llm: LLMClient, doc: CheckpointDoc, replay: ReplayMap | None
    ) -> tuple[Done | bool | None, CheckpointDoc]:
        """Run one step; returns (outcome, new doc). Outcome None means cancelled at the drain deadline."""
        step, budget = doc.next_step, hydrated.budget
        budget.check_run_time()
        # A private copy: a crashed or cancelled step must not leak half-made changes into a checkpoint.
        state = orjson.loads(orjson.dumps(doc.state, option=orjson.OPT_NON_STR_KEYS))
        env = CallEnv(
            self,
            hydrated.approvals,
            functools.partial(self._add_usage, booted, budget),
            booted.journal,
            replay if replay and replay.step == step else None,
            budget,
            llm,
            self._rng,
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
        self._current_step = step
        self.board.update(step=step)
        booted.journal.append("STEP_STARTED", step=step)
        self.notify("step_started", step=step)
        started = time.monotonic()
        outcome: Done | None = None
        with anyio.CancelScope() as scope, self.telemetry.step_span(step):
            self._step_scope = scope
            if self.drain_deadline is not None:
                scope.deadline = self.drain_deadline
            outcome = await self.agent.step(ctx)
        self._step_scope = None
        # A refusal ends the job whatever the step did after it (caught it, told a model, returned Done):
        # nothing of this step is checkpointed.
        hydrated.approvals.check()
        if scope.cancelled_caught:
            log.warning("step %s cancelled at the drain deadline; nothing checkpointed for it", step)
            return None, doc
        if outcome is not None and not isinstance(outcome, Done):
            raise TypeError(
                f"{type(self.agent).__name__}.step() must return Done or None, got {type(outcome).__name__}"
            )
        check_replayable(ctx.state, "ctx.state")
        if isinstance(outcome, Done):
            check_replayable(outcome.result, "Done.result")
        self.telemetry.step_completed(time.monotonic() - started)
        self.stats.steps_completed += 1
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
        await self.write_checkpoint(booted, new, step, ctx.conversation.new_rows())
        ctx.conversation.commit()
        self.notify("step_completed", step=step)
        return outcome or True, new

    async def write_checkpoint(
        self, booted: Booted, doc: CheckpointDoc, step: int, messages: Sequence[tuple[int, bytes]] = ()
    ) -> None:
        """Store ``doc`` and the conversation's new ``messages`` (fenced by attempt) in one transaction.

        An unreachable store is retried within the step budget.
        """
        s, store = booted.settings, booted.store
        data = doc.evolve(attempt=s.attempt, written_at=time.time()).encode()
        checkpoint_id = f"{s.attempt:04d}-{step:06d}-{uuid.uuid4().hex[:8]}"
        crc = await self._retrying_store(
            "checkpoint write",
            lambda: store.write_checkpoint(s.job_id, s.attempt, checkpoint_id, step, data, messages),
        )
        self.checkpoint_id = checkpoint_id
        self.stats.checkpoints_written += 1
        booted.journal.append("CHECKPOINT_WRITTEN", step=step, checkpoint_id=checkpoint_id, crc=crc)
        await booted.journal.flush(fsync=False)

    async def _retrying_store(self, what: str, call: Callable[[], Awaitable[_T]]) -> _T:
        """``call()``, retried with backoff while the store is unreachable, within the step budget."""
        deadline = anyio.current_time() + self.constants.drain.step_deadline_seconds
        delay = self.constants.retry.transient_initial_seconds
        while True:
            try:
                return await call()
            except StoreUnavailable as exc:
                if anyio.current_time() + delay > deadline:
                    raise
                log.warning("%s failed (%s); retrying in %.1fs", what, self.redactor.redact(str(exc)), delay)
                await anyio.sleep(delay)
                delay = min(delay * 2, self.constants.retry.transient_max_seconds)

    async def _add_usage(self, booted: Booted, budget: Budget, reply: LLMReply) -> None:
        """Add a call's usage to the job row and the in-memory budget.

        Retried like a checkpoint write while the store is unreachable: a short PostgreSQL outage must not
        crash the step after its LLM call succeeded. A retry after a commit whose answer was lost counts the
        call twice, which errs on the side of the budget.
        """
        store, s, usage = booted.store, booted.settings, reply.usage
        totals = await self._retrying_store(
            "usage update",
            lambda: store.add_usage(
                s.job_id, s.attempt, usage.input_tokens, usage.output_tokens, reply.cost_usd
            ),
        )
        budget.add(totals)

    async def _park(self, booted: Booted, doc: CheckpointDoc) -> Outcome:
        # The park checkpoint's marker lands after the parked step's completed calls, and the next attempt
        # replays only what follows the marker: carry those calls past it, or they would run again.
        step_events = await self._step_events_since_checkpoint(booted, doc.next_step)
        parked = doc.evolve(phase="awaiting_approval")
        await self.write_checkpoint(booted, parked, max(doc.next_step - 1, 0))
        if step_events:
            booted.journal.carry_forward(step_events)
            await booted.journal.flush(fsync=True)
        await self._let_go_of_park(booted)
        if self.draining:
            return Outcome(EXIT_DRAINED, "drained while waiting for approval")
        self.machine.move(State.DRAINING, "parked: approval idle timeout")
        return Outcome(
            EXIT_DONE, "parked: WAITING_FOR_APPROVAL after the idle timeout", JobStatus.WAITING_FOR_APPROVAL
        )

    async def _let_go_of_park(self, booted: Booted) -> None:
        """Leave the parked row to whoever resumes it, even if an approval lands while this process exits.

        The claim goes first: from then on ``job approve`` sees no live owner and makes the row PENDING.
        An approval that came just before saw this process alive and made the row RUNNING for it; nothing
        here will run the call, so that row is handed back as PENDING (one conditional write), not left
        RUNNING for the reaper to count as a crash.
        """
        s, store = booted.settings, booted.store
        try:
            await store.drop_claim(s.job_id)
            if await store.release(s.job_id, s.attempt, JobStatus.PENDING):
                log.info("approved while parking: the job is runnable again (PENDING)")
        except AgentlifeError as exc:  # the row stays parked: an approval still makes it runnable
            log.warning("parking: could not let go of the row: %s", self.redactor.redact(str(exc)))

    async def _step_events_since_checkpoint(self, booted: Booted, step: int) -> list[dict[str, Any]]:
        """This session's events of ``step`` after the current checkpoint's marker (best effort)."""
        session_dir, checkpoint_id = booted.settings.session_dir, self.checkpoint_id
        budget = self.constants.hydration.buffer_scan_timeout_seconds
        try:
            await booted.journal.flush(fsync=False)
            result = await anyio.to_thread.run_sync(
                lambda: scan_for_resume(
                    session_dir, checkpoint_id, budget_seconds=budget, checkpoint_step=step - 1
                )
            )
        except Exception as exc:
            log.warning("parking: cannot read the step's calls back (%s: %s)", type(exc).__name__, exc)
            return []
        if not result.found:
            log.warning("parking: the step's calls were not found in the journal: %s", result.reason)
            return []
        return build_replay(result.events, step).events_for_carry_forward()

    def _drained_between_steps(self) -> str:
        if self._drained_in_step is None:
            return f"drained by {self.drain_reason} between steps"
        return (
            f"drained by {self.drain_reason} during step {self._drained_in_step}, "
            "which finished and was checkpointed"
        )

    def _enter_draining(self, reason: str) -> None:
        """Move to DRAINING after the job ended, unless a signal already did (SIGTERM during delivery)."""
        if self.state is not State.DRAINING:
            self.machine.move(State.DRAINING, reason)
