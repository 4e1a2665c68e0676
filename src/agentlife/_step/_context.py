"""`StepContext` and the guarded, journaled, replayable calls a step makes."""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.to_thread

from agentlife._agent import BudgetView, Footprint, Job
from agentlife._budget import Budget, estimate_input_tokens
from agentlife._exceptions import (
    BackgroundOperationRestricted,
    PolicyUnavailable,
    ReplayMismatch,
    UnreplayableValue,
)
from agentlife._journal._conversation import Conversation, ConversationLog
from agentlife._journal._recovery import ReplayMap, ToolRecord
from agentlife._journal._writer import args_digest
from agentlife._llm._guard import stream_timeouts_from_constants
from agentlife._llm._protocol import (
    CURRENT_CALL,
    CallAddress,
    LLMClient,
    LLMReply,
    OnEvent,
    bounded_tool_inputs,
    provider_name,
)
from agentlife._logging import log_fields
from agentlife._replay import check_replayable, llm_request_digest, tool_call_digest
from agentlife._retry import RetryEvent, classify, retry_call
from agentlife._step._childjobs import ChildJobCalls
from agentlife._step._publish import OutputCalls, tap_deltas
from agentlife._step._ratewait import CapacityWait, limited_attempt
from agentlife._step._stepllm import StepLLM
from agentlife._step._streaming import emit_reply, is_streaming_adapter, retry_event
from agentlife._step._toolcalls import Registry, run_tool_calls, tool_registry
from agentlife._step._toolrun import call_with_timeout, read_only, recorded_refusal
from agentlife._step._waits import sleep, sleep_until, wait_for_event
from agentlife._tools import NOT_DONE, ToolSpec, loaded_mcp, tool

if TYPE_CHECKING:
    from agentlife._journal._steprecords import StepJournal
    from agentlife._llm._ratelimiter import RateLimiter
    from agentlife._memory import MemoryRecord
    from agentlife._output._deltas import DeltaBuffer
    from agentlife._step._approvals import Approvals
    from agentlife._step._host import StepHost

__all__ = ["StepContext", "StepLLM"]

T = TypeVar("T")
log = logging.getLogger("agentlife.calls")


@dataclass(slots=True)
class _CallCounter:
    next: int = 0
    current: str | None = None


@dataclass(slots=True)
class CallEnv:
    """What the calls of one step need from the process around them."""

    host: StepHost
    approvals: Approvals
    add_usage: Callable[[LLMReply], Awaitable[None]]
    journal: StepJournal
    replay: ReplayMap | None
    budget: Budget
    llm_client: LLMClient
    rng: random.Random
    step_started: float = field(default_factory=anyio.current_time)
    limiter: RateLimiter | None = None
    """The process's fleet-wide rate limiter; None when no limit is configured (then nothing is paid)."""
    #: Where a streaming reply's text goes on to the job's followers (None: nowhere).
    deltas: DeltaBuffer | None = None


class StepContext(ChildJobCalls, OutputCalls):
    """What a step sees: its number, the saved state, the job, memories and guarded calls.

    Attributes:
        step (int): the step number (from 0).
        state (dict[str, Any]): JSON-serialisable dict, saved in the checkpoint after every completed step.
        job (Job): the job being run.
        memories (list[MemoryRecord]): memory records hydrated for this job (best first).
        footprint (Footprint): resource settings, reduced after an OOM-killed attempt.
        llm (StepLLM): the progress-guarded, journaled, budget-checked LLM client: ``complete``,
            ``complete_structured`` and ``stream``.
        conversation (Conversation): the job's durable message history: what a step appends is saved
            with its checkpoint, without rewriting what earlier steps saved.
    """

    def __init__(
        self,
        *,
        step: int,
        state: dict[str, Any],
        job: Job,
        memories: Sequence[MemoryRecord],
        footprint: Footprint,
        env: CallEnv,
        conversation: Conversation | None = None,
    ) -> None:
        self.step = step
        self.state = state
        self.job = job
        self.memories = list(memories)
        self.footprint = footprint
        self.llm = StepLLM(self)
        self.conversation = conversation if conversation is not None else ConversationLog().begin_step()
        self._env = env
        self._calls = _CallCounter()
        self._offered: Registry = {}
        self._tool_slots = anyio.Semaphore(max(1, footprint.max_concurrent_tools))
        # The text of the step's latest model reply: an approval request shows it before the call.
        self._said: str | None = None

    # -- public read-only views ------------------------------------------------------------------------

    @property
    def draining(self) -> bool:
        """True once a drain began: finish quickly, start nothing long."""
        return self._env.host.draining

    @property
    def budget(self) -> BudgetView:
        """What is left of the job's budgets."""
        return self._env.budget.view()

    @property
    def invocation_id(self) -> str:
        """``{job_id}/{step}/{call}`` of the call in progress (or of the next call when none is)."""
        return self._calls.current or self._invocation_id(self._calls.next)

    async def call_tool(self, fn: ToolSpec[..., T] | Callable[..., Any], /, **kwargs: Any) -> T:
        """Run a tool under its timeout, journaled (write-ahead when it has side effects) and replayable.

        Raises:
            ToolTimeout: the tool outlived its timeout (after retries within the step budget).
            BackgroundOperationRestricted: a restricted tool was refused by ``check_policy``.
            ApprovalRejected: the call (or an earlier one of the job) was refused approval: the job ends
                FAILED whatever the step does next.
            PolicyUnavailable: the policy check kept failing until the step budget ran out.
        """
        mcp = loaded_mcp()
        if mcp is not None:
            fn = mcp.resolve_tool_ref(fn)  # an MCP server's tool: the job's live one
        spec: ToolSpec[..., Any] = fn if isinstance(fn, ToolSpec) else tool(fn)
        call = self._claim_call()
        invocation_id = self._invocation_id(call)
        self._calls.current = invocation_id
        try:
            return await self._run_tool_call(spec, call, invocation_id, kwargs)  # type: ignore[no-any-return]
        finally:
            self._calls.current = None

    async def run_tool_calls(
        self, reply: LLMReply, *, tools: Sequence[ToolSpec[..., Any] | Callable[..., Any]] = ()
    ) -> list[dict[str, Any]]:
        """Run every ``tool_use`` block of ``reply`` through `call_tool`; the ``tool_result`` blocks to send.

        The tools are those offered to the model in this step's ``ctx.llm.complete(tools=[...])`` calls,
        plus ``tools``. A call runs only on the arguments the model sent: input cut off by ``max_tokens``
        or unreadable (``reply.tool_input_errors``), and arguments that do not fit the tool's type hints,
        never reach it; the model gets ``is_error: true`` with what is wrong, and the refusal is logged
        at WARNING and journaled (``TOOL_REFUSED``). A failing or unknown tool also comes back as an
        error result; budgets, replay mismatches and store errors end the step.
        """
        return await run_tool_calls(self, reply, tool_registry(self, tools), self._env.host.redactor)

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` durably: a journaled call that a resumed step does not wait for twice.

        A wait shorter than ``park_after_seconds`` stays in the process (a drain ends it at once and the
        next attempt waits for the rest); a longer one ends the step here, parks the job in WAITING and frees
        the process, and the job resumes at this call once the time has come.

        Raises:
            ConfigError: ``seconds`` is not a finite number from 0 to about 31 years.
        """
        await sleep(self, seconds)

    async def sleep_until(self, when: datetime) -> None:
        """Wait until ``when`` (a timezone-aware datetime) durably; see `sleep`.

        Raises:
            ConfigError: ``when`` is not an aware datetime, or lies more than about 31 years ahead.
        """
        await sleep_until(self, when)

    async def wait_for_event(self, name: str, timeout: float | None = None) -> Any:
        """The payload of the next event ``name`` sent to the job (``job send``), or None after ``timeout``.

        Events sent before the wait are kept and taken in the order they were sent, each by exactly one
        wait. A durable wait like `sleep`: journaled, replayed, parked (WAITING) when it may last longer
        than ``park_after_seconds``, and woken at once when the event comes.

        Raises:
            ConfigError: an empty or overlong name, or a timeout that is not a finite number of seconds.
        """
        return await wait_for_event(self, name, timeout)

    # -- numbering ----------------------------------------------------------------------------------------

    def _claim_call(self) -> int:
        call = self._calls.next
        self._calls.next += 1
        return call

    def _invocation_id(self, call: int) -> str:
        return f"{self.job.id}/{self.step}/{call}"

    def _retry_deadline(self) -> float:
        """Retries never start past the step budget, the drain deadline or the run budget.

        The step budget is the longer of the drain's step deadline (45 s) and the LLM total timeout
        (300 s), counted from the step's start: with the step deadline alone, a stream that stalled for the
        60 s inter-chunk timeout could never be retried at all. A drain still caps it at its own deadline.
        """
        host = self._env.host
        c = host.constants
        step_budget = max(c.drain.step_deadline_seconds, c.calls.llm_total_timeout_seconds)
        deadline = self._env.step_started + step_budget
        if host.drain_deadline is not None:
            deadline = min(deadline, host.drain_deadline)
        remaining_run = self._env.budget.run_seconds_remaining()
        if remaining_run is not None:
            deadline = min(deadline, anyio.current_time() + remaining_run)
        return deadline

    def _on_retry(self, kind: str, name: str, call: int) -> Callable[[RetryEvent], None]:
        def record(event: RetryEvent) -> None:
            self._env.journal.append(
                "RETRY",
                step=self.step,
                call=call,
                kind=kind,
                name=name,
                attempt=event.attempt,
                delay=round(event.delay, 3),
                error_class=event.error_type,
                classified_as=event.error_class,
                error=self._env.host.redactor.redact(event.message),
                remaining_budget=round(event.remaining_budget, 3)
                if event.remaining_budget is not None
                else None,
            )
            log.warning(
                "%s %s call %s failed with %s; retry %s in %.2fs",
                kind,
                name,
                call,
                event.error_type,
                event.attempt,
                event.delay,
                extra=log_fields(step=self.step, call=call, remaining_budget_s=event.remaining_budget),
            )

        return record

    # -- LLM ----------------------------------------------------------------------------------------------

    async def _llm_complete(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        max_tokens: int,
        params: dict[str, Any],
        on_event: OnEvent | None = None,
        call: int | None = None,
    ) -> LLMReply:
        """One journaled call; ``on_event`` (``ctx.llm.stream``) sees its events, never the request."""
        self._env.approvals.check()  # after a refusal nothing of the job runs
        call = self._claim_call() if call is None else call
        self._calls.current = self._invocation_id(call)
        digest = llm_request_digest(model, messages, max_tokens, params)
        token = CURRENT_CALL.set(CallAddress(self.job.id, self.step, call))
        try:
            replayed = self._recorded_llm_reply(call, model, digest)
            if replayed is not None:
                log.info("LLM call %s of step %s replayed from the journal", call, self.step)
                reply = bounded_tool_inputs(LLMReply.from_json(replayed))  # as recorded by 0.3 too
                self._said = reply.text
                if self._env.replay is not None and call in self._env.replay.uncounted:
                    await self._env.add_usage(reply)  # paid by an attempt whose step never counted it
                if on_event is not None:
                    emit_reply(reply, on_event, "journal")
                return reply
            return await self._llm_call_live(call, model, messages, max_tokens, params, digest, on_event)
        finally:
            CURRENT_CALL.reset(token)
            self._calls.current = None

    def _recorded_llm_reply(self, call: int, model: str, digest: str) -> Any | None:
        """The recorded response of this call, after checking that the journal recorded this request."""
        replay = self._env.replay
        if replay is None:
            return None
        recorded = replay.llm_result(call)
        if recorded is None:
            self._check_call_kind(call, "llm", f"LLM {model} ({digest})")
            return None
        recorded_digest = replay.llm_digests.get(call)
        if recorded_digest is None or recorded_digest == digest:  # None: a journal of agentlife 0.1
            return recorded
        recorded_model = recorded.get("model") if isinstance(recorded, dict) else None
        self._replay_mismatch(
            call, f"LLM {recorded_model or '?'} ({recorded_digest})", f"LLM {model} ({digest})"
        )
        return None

    def _check_call_kind(self, call: int, kind: str, current: str) -> None:
        """A replay mismatch when the journal recorded another kind of call at ``call``."""
        replay = self._env.replay
        other = replay.recorded_other(call, kind) if replay is not None else None
        if other is not None:
            self._replay_mismatch(call, other, current)

    def _replay_mismatch(self, call: int, recorded: str, current: str) -> None:
        """Fail the step (the default), or void the step's records from ``call`` on and go on live."""
        invocation_id = self._invocation_id(call)
        if self._env.host.agent.replay_mismatch != "rerun":
            raise ReplayMismatch(invocation_id, recorded, current)
        replay = self._env.replay
        if replay is not None:
            replay.discard_from(call)
        self._env.journal.append(
            "REPLAY_DISCARDED",
            step=self.step,
            call=call,
            invocation_id=invocation_id,
            recorded=recorded,
            current=current,
        )
        log.warning(
            "replay mismatch at %s: recorded %s, now %s; running the rest of the "
            "step afresh (replay_mismatch = 'rerun')",
            invocation_id,
            recorded,
            current,
        )

    async def _llm_call_live(
        self,
        call: int,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        max_tokens: int,
        params: dict[str, Any],
        digest: str,
        on_event: OnEvent | None = None,
    ) -> LLMReply:
        host, env = self._env.host, self._env
        estimate = estimate_input_tokens(messages, params)
        env.budget.check_before_call(estimate, messages)
        timeouts = stream_timeouts_from_constants(host.constants.calls)
        env.journal.append("LLM_STARTED", step=self.step, call=call, model=model, digest=digest)
        streams = on_event is not None and is_streaming_adapter(env.llm_client)
        events = {"on_event": on_event} if streams else {}
        deltas = env.deltas if is_streaming_adapter(env.llm_client) else None
        if deltas is not None:  # the job's followers see the text as it streams
            events = {
                "on_event": tap_deltas(deltas, self._invocation_id(call), on_event if streams else None)
            }
        on_retry = self._on_retry("llm", model, call)

        def attempt() -> Awaitable[LLMReply]:  # the adapter's coroutine itself: no frame between per chunk
            return env.llm_client.complete(
                model=model, messages=messages, max_tokens=max_tokens, timeouts=timeouts, **events, **params
            )

        def retried(event: RetryEvent) -> None:
            on_retry(event)
            if deltas is not None:
                deltas.restart(self._invocation_id(call))
            if on_event is not None:
                on_event(retry_event(event))

        waited: Callable[[], float] | None = None
        if env.limiter is not None:
            capacity = CapacityWait(host, self._invocation_id(call))
            attempt = limited_attempt(env.limiter, attempt, model=model, estimate=estimate, wait=capacity)
            waited = capacity.seconds_waited

        started = time.monotonic()
        with (
            host.telemetry.llm_span(
                model, max_tokens=max_tokens, system=provider_name(env.llm_client)
            ) as span,
            _finishing(deltas, self._invocation_id(call)),
        ):
            try:
                reply = await retry_call(
                    attempt,
                    initial=host.constants.retry.transient_initial_seconds,
                    cap=host.constants.retry.transient_max_seconds,
                    deadline=self._retry_deadline(),
                    rng=env.rng,
                    on_retry=retried,
                    waited=waited,
                )
            except Exception as exc:
                host.telemetry.llm_call(model, "error", None)
                host.stats.llm_calls += 1
                span.record_error(exc)
                raise
            span.record_reply(reply)
        reply = bounded_tool_inputs(reply)  # before the journal, which keeps no deeper
        self._said = reply.text
        host.stats.llm_calls += 1
        host.telemetry.llm_call(model, "ok", reply.usage)
        env.journal.append(
            "LLM_COMPLETED",
            step=self.step,
            call=call,
            response=reply.to_json(),
            usage=reply.usage.to_json(),
            duration=round(time.monotonic() - started, 6),
            digest=digest,
            usage_deferred=True,  # counted in tokens_consumed by the step's checkpoint, not now
        )
        await env.add_usage(reply)
        if on_event is not None and not streams:
            emit_reply(reply, on_event, "reply")
        return reply

    # -- tools --------------------------------------------------------------------------------------------

    async def _run_tool_call(
        self, spec: ToolSpec[..., Any], call: int, invocation_id: str, kwargs: dict[str, Any]
    ) -> Any:
        self._env.approvals.check()  # after a refusal nothing of the job runs
        digest = tool_call_digest(spec.name, kwargs)
        replay = self._recorded_tool_call(spec, call, kwargs, digest)
        if replay is not None and replay.status == "completed":
            log.info("tool %s (%s) replayed from the journal", spec.name, invocation_id)
            if replay.refused:  # the effect happened; the journal kept the error its result raised
                raise recorded_refusal(replay)
            return replay.result
        if self._may_have_run(spec, call, replay) and spec.verify is not None:
            verified = await spec.verify(invocation_id)
            if verified is not NOT_DONE:
                log.info("tool %s (%s) verified as already done", spec.name, invocation_id)
                await self._journal_tool_completed(
                    spec, call, invocation_id, verified, digest=digest, verified=True
                )
                return verified
        if spec.restricted:
            redactor = self._env.host.redactor
            await self._env.approvals.require_approval(
                spec.name,
                invocation_id,
                digest,
                arguments=redactor.redact_obj(kwargs),
                said=redactor.redact(self._said) if self._said else None,
            )
            await self._check_policy(spec, call, kwargs)
        tries = 0

        async def try_once() -> Any:
            nonlocal tries
            tries += 1
            if tries > 1 and spec.side_effects and spec.verify is not None:
                # The failed try may have done its effect before failing (a timeout after the request went
                # out): ask verify, as after a crash, rather than doing the effect a second time.
                verified = await spec.verify(invocation_id)
                if verified is not NOT_DONE:
                    log.info("tool %s (%s) verified as done after a failed try", spec.name, invocation_id)
                    await self._journal_tool_completed(
                        spec, call, invocation_id, verified, digest=digest, verified=True
                    )
                    return verified
            return await self._run_tool_once(spec, call, invocation_id, kwargs, digest)

        async with self._tool_slots:
            try:
                return await retry_call(
                    try_once,
                    initial=self._env.host.constants.retry.transient_initial_seconds,
                    cap=self._env.host.constants.retry.transient_max_seconds,
                    deadline=self._retry_deadline(),
                    rng=self._env.rng,
                    on_retry=self._on_retry("tool", spec.name, call),
                    max_attempts=spec.max_tries,
                )
            except Exception as exc:
                if spec.retries is None and spec.max_tries == 1 and classify(exc).retryable:
                    log.warning(
                        "tool %s (%s) failed with %s: not retried in this process (side "
                        "effects and no verify); @tool(retries=N) allows retries",
                        spec.name,
                        invocation_id,
                        type(exc).__name__,
                    )
                raise

    def _recorded_tool_call(
        self, spec: ToolSpec[..., Any], call: int, kwargs: Mapping[str, Any], digest: str
    ) -> ToolRecord | None:
        """What the journal recorded for this call, after checking that it recorded this very call."""
        replay = self._env.replay
        record = replay.tool(call) if replay is not None else None
        if record is None:
            self._check_call_kind(call, "tool", f"tool {spec.name} ({digest})")
        if record is None or record.status == "failed":
            return record
        if record.status == "pending" and read_only(record, spec):
            # Started, never finished, and without effects: nothing is recorded to return or to verify, so
            # the call runs with this attempt's arguments (a timestamp, a remaining budget) unchecked.
            return None
        if record.digest is not None:
            same = record.digest == digest
        else:  # a journal of agentlife 0.1: the tool's name and the digest of its arguments, both recorded
            same = record.tool == spec.name and record.args_digest == args_digest(kwargs)
        if same:
            return record
        self._replay_mismatch(
            call,
            f"tool {record.tool or '?'} ({record.digest or record.args_digest or '?'})",
            f"tool {spec.name} ({digest})",
        )
        return None

    def _may_have_run(self, spec: ToolSpec[..., Any], call: int, record: ToolRecord | None) -> bool:
        """Whether this call's effect may already have happened: pending, or voided by a ``"rerun"``."""
        if record is not None:
            return record.status == "pending"
        replay = self._env.replay
        return spec.side_effects and replay is not None and call in replay.discarded

    async def _run_tool_once(
        self, spec: ToolSpec[..., Any], call: int, invocation_id: str, kwargs: dict[str, Any], digest: str
    ) -> Any:
        host, journal = self._env.host, self._env.journal
        fields: dict[str, Any] = {
            "step": self.step,
            "call": call,
            "invocation_id": invocation_id,
            "tool": spec.name,
            "args_digest": args_digest(kwargs),
            "digest": digest,
        }
        if spec.side_effects:
            await journal.append_durable("TOOL_STARTED", **fields, side_effects=True)
        else:
            journal.append("TOOL_STARTED", **fields, side_effects=False)
        host.notify("tool_started", tool=spec.name, step=self.step, call=call)
        timeout = spec.timeout if spec.timeout is not None else host.constants.tool_timeout(spec.name)
        if spec.timeout is not None:
            timeout *= host.constants.time_scale
        args = dict(kwargs)
        if spec.wants_invocation_id:
            args["invocation_id"] = invocation_id
        started = time.monotonic()
        try:
            with host.telemetry.tool_span(spec.name, invocation_id):
                result = await call_with_timeout(spec, args, timeout)
        except Exception as exc:
            duration = time.monotonic() - started
            host.stats.tool_calls += 1
            host.telemetry.tool_call(spec.name, type(exc).__name__, duration)
            journal.append(
                "TOOL_FAILED",
                **fields,
                error_class=type(exc).__name__,
                error=host.redactor.redact(str(exc))[:2000],
                duration=round(duration, 6),
            )
            raise
        host.stats.tool_calls += 1
        host.telemetry.tool_call(spec.name, "ok", time.monotonic() - started)
        await self._journal_tool_completed(
            spec, call, invocation_id, result, digest=digest, duration=time.monotonic() - started
        )
        return result

    async def _journal_tool_completed(
        self,
        spec: ToolSpec[..., Any],
        call: int,
        invocation_id: str,
        result: Any,
        *,
        digest: str,
        verified: bool = False,
        duration: float | None = None,
    ) -> None:
        """Journal the call's result, or, when the journal cannot hold it exactly, the refusal.

        A refused result of a call whose effect happened (a side-effecting tool, or one ``verify`` found
        done) is recorded as *completed* with the refusal: a resumed step gets the same error back instead
        of doing the effect again. A read-only call's refusal is a failure, so a resume runs it again.

        Raises:
            UnreplayableValue: the result was refused (after the refusal was journaled).
        """
        fields: dict[str, Any] = {
            "step": self.step,
            "call": call,
            "invocation_id": invocation_id,
            "tool": spec.name,
            "digest": digest,
        }
        if verified:
            fields["verified"] = True
        if duration is not None:
            fields["duration"] = round(duration, 6)
        effect_done = spec.side_effects or verified
        # Without verify nothing else could tell an attempt on another pod that the effect happened: the
        # store holds the result before the step goes on. With verify it goes with the next store write.
        to_store = spec.verify is None
        try:
            check_replayable(result, f"tool {spec.name}'s {'verified ' if verified else ''}result")
        except UnreplayableValue as exc:
            refusal = UnreplayableValue(self._env.host.redactor.redact(str(exc)))
            error = {"error_class": "UnreplayableValue", "error": str(refusal)}
            if effect_done:
                await self._env.journal.append_durable(
                    "TOOL_COMPLETED", **fields, result=None, **error, to_store=to_store
                )
            else:
                self._env.journal.append("TOOL_FAILED", **fields, **error)
            raise refusal from None
        if effect_done and to_store:
            await self._env.journal.append_durable("TOOL_COMPLETED", **fields, result=result)
        else:
            # With verify the result needs no fsync of its own: an attempt that finds the call pending asks
            # verify, the exactly-once path, and the next durable event or the checkpoint writes it out in
            # order. Waiting for it here put a second fsync on every turn's path.
            self._env.journal.append("TOOL_COMPLETED", **fields, result=result)

    async def _check_policy(self, spec: ToolSpec[..., Any], call: int, kwargs: Mapping[str, Any]) -> None:
        """Ask ``check_policy`` under its timeout; a timeout or error refuses the call (fail closed)."""
        host = self._env.host
        calls = host.constants.calls
        while True:
            try:
                with anyio.fail_after(calls.policy_timeout_seconds):
                    allowed = await host.agent.check_policy(spec.name, kwargs)
            except Exception as exc:
                reason = "timed out" if isinstance(exc, TimeoutError) else f"failed: {type(exc).__name__}"
                self._env.journal.append(
                    "TOOL_FAILED",
                    step=self.step,
                    call=call,
                    invocation_id=self._invocation_id(call),
                    tool=spec.name,
                    error_class="PolicyUnavailable",
                    error=f"policy check {reason}",
                )
                if anyio.current_time() + calls.policy_retry_seconds > self._retry_deadline():
                    raise PolicyUnavailable(
                        f"policy check for {spec.name} {reason}; refused (fail closed)"
                    ) from exc
                log.warning(
                    "policy check for %s %s; call refused, retrying in %gs",
                    spec.name,
                    reason,
                    calls.policy_retry_seconds,
                )
                await anyio.sleep(calls.policy_retry_seconds)
                continue
            if not allowed:
                raise BackgroundOperationRestricted(f"policy refused tool {spec.name}")
            return


@contextlib.contextmanager
def _finishing(deltas: DeltaBuffer | None, call: str) -> Iterator[None]:
    """The model call's text held back for its followers goes once the call ends, however it ends."""
    try:
        yield
    finally:
        if deltas is not None:
            deltas.finish(call)
