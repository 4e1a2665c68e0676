"""`ToolAgent`: a ready agent whose every step is one model turn plus the tool calls it asks for.

Its message history is ``ctx.conversation``: each step appends the model's reply and the tool results, and
they are saved with the step's checkpoint, so a drained or killed agent resumes the conversation exactly
where it was. The model call and every tool call are journaled like any other, so the step that was cut off
replays what it had finished (no re-sent request, no repeated side effect) and goes on live from there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import orjson

from agentlife._agent import AgentProcess, Done, Job
from agentlife._exceptions import OutputValidationError
from agentlife._step._structured import OUTPUT_TOOL, assistant_turn, output_json, output_tool
from agentlife._step._toolcalls import refuse, run_tool_uses, tool_registry, unusable_inputs

if TYPE_CHECKING:
    from agentlife._llm._protocol import LLMReply
    from agentlife._step._context import StepContext

__all__ = ["ToolAgent"]

#: `output_tool`'s (definition, parse) for ``ToolAgent.output_type``.
_OutputTool = tuple[dict[str, Any], Callable[[Any], Any]]

_log = logging.getLogger("agentlife.calls")
#: What the model is told after an empty reply, which leaves no assistant turn to keep; it counts as a turn.
_EMPTY_REPLY_NOTE: Mapping[str, Any] = {
    "role": "user",
    "content": "Your reply was empty. Go on: call a tool, or give your final answer.",
}


class ToolAgent(AgentProcess):
    """An agent that runs the tool-use loop: set the class attributes, write the tools, and it is done.

    Each step sends the conversation to the model with the tools offered, appends the reply, runs the
    ``tool_use`` blocks through ``ctx.run_tool_calls`` (validated arguments, journaled, replayed,
    ``verify``, timeouts, approvals, policy) and appends their results. The job ends with `Done` when
    the model answers without asking for a tool: the reply's text, or, with ``output_type``, the
    validated structured result (as JSON). It ends FAILED when ``max_turns`` model turns did not get there.

    Not a final answer, and the model is told so and asked again: an empty reply, a reply that stopped for
    a tool call (``stop_reason`` ``tool_use``) without one, a text cut off at ``max_tokens``, and, with
    ``output_type``, a ``final_result`` call that came with other tool calls (those run first, exactly
    once) or that does not fit the type.

    Attributes:
        model: the model to call.
        system: the system prompt (None: none).
        tools: ``@tool`` functions (or plain functions, or definition dicts) the model may call.
        max_turns: model turns before the job ends FAILED.
        max_tokens: ``max_tokens`` of each model call.
        output_type: a type the final answer must fit (a pydantic model, dataclass, TypedDict ...): the model
            answers by calling a ``final_result`` tool whose schema is the type's; invalid answers go back to
            it with the validation errors. None: the final answer is the reply's text.
        llm_params: other parameters of every call (``temperature``, ``thinking`` ...).

    Example:
        >>> class Triage(ToolAgent):
        ...     agent_id = "triage"
        ...     model = "claude-sonnet-4-5"
        ...     system = "You label GitHub issues."
        ...     tools = (search_docs, label_issue)
    """

    model: ClassVar[str] = "claude-sonnet-4-5"
    system: ClassVar[str | None] = None
    tools: ClassVar[Sequence[Any]] = ()
    max_turns: ClassVar[int] = 20
    max_tokens: ClassVar[int] = 4096
    output_type: ClassVar[Any] = None
    llm_params: ClassVar[Mapping[str, Any]] = {}

    def prompt(self, job: Job) -> str | list[dict[str, Any]]:
        """The first user message: the payload's ``prompt``, the payload if it is text, else its JSON."""
        payload = job.payload
        if isinstance(payload, Mapping) and isinstance(payload.get("prompt"), str):
            return str(payload["prompt"])
        if isinstance(payload, str):
            return payload
        return orjson.dumps(payload, option=orjson.OPT_SORT_KEYS).decode()

    async def step(self, ctx: StepContext) -> Done | None:
        """One model turn, then the tool calls it asked for."""
        conversation = ctx.conversation
        if not len(conversation):
            conversation.append({"role": "user", "content": self.prompt(ctx.job)})
        turns = sum(1 for m in conversation if m.get("role") == "assistant" or m == _EMPTY_REPLY_NOTE)
        if turns >= self.max_turns:
            return Done(status="FAILED", reason=f"no final answer after {self.max_turns} model turns")
        output = output_tool(self.output_type) if self.output_type is not None else None
        reply = await ctx.llm.complete(
            model=self.model,
            max_tokens=self.max_tokens,
            messages=list(conversation),
            **self._call_params(output),
        )
        turn = assistant_turn(reply)
        if turn is None:
            # Nothing to send back (the APIs refuse an empty assistant turn): the note counts the turn.
            _log.warning("model turn %s: an empty reply is not a final answer; asking again", turns)
            conversation.append(_EMPTY_REPLY_NOTE)
            return None
        conversation.append(turn)
        return await self._after_reply(ctx, reply, output)

    def _call_params(self, output: _OutputTool | None) -> dict[str, Any]:
        params = dict(self.llm_params)
        if self.system is not None:
            params["system"] = self.system
        tools = list(self.tools)
        if output is not None:
            tools.append(output[0])
            # Every turn ends in a tool call: a real tool, or the final answer through the output tool.
            params["tool_choice"] = {"type": "any"}
        if tools:
            params["tools"] = tools
        return params

    async def _after_reply(
        self, ctx: StepContext, reply: LLMReply, output: _OutputTool | None
    ) -> Done | None:
        uses = [block for block in reply.content if block.get("type") == "tool_use"]
        if not uses:
            return self._without_tool_calls(ctx, reply, output)
        unusable = unusable_inputs(reply)
        finals = [b for b in uses if output is not None and b.get("name") == OUTPUT_TOOL]
        calls = [b for b in uses if not any(b is final for final in finals)]
        if output is not None and len(finals) == 1 and not calls:
            answer = self._final_answer(ctx, finals[0], unusable, output)
            if isinstance(answer, Done):
                return answer
            ctx.conversation.append({"role": "user", "content": [answer]})
            return None
        # The other calls run first, exactly once; an answer that came with them was given without their
        # results, so it is refused and the model answers again having read them.
        ran = await run_tool_uses(
            ctx, calls, unusable, tool_registry(ctx, self.tools), ctx._env.host.redactor
        )
        results = {id(block): result for block, result in zip(calls, ran, strict=True)}
        if output is not None:
            for final in finals:
                results[id(final)] = self._refused_answer(ctx, final, unusable, output, calls, len(finals))
        ctx.conversation.append({"role": "user", "content": [results[id(block)] for block in uses]})
        return None

    def _final_answer(
        self, ctx: StepContext, final: Mapping[str, Any], unusable: Mapping[str, str], output: _OutputTool
    ) -> Done | dict[str, Any]:
        """`Done` with the validated answer, or the refusal to send back (a turn to fix it)."""
        problem = unusable.get(str(final.get("id", "")))
        if problem is not None:
            return refuse(ctx, final, "invalid_final_result", f"the answer was not accepted: {problem}")
        try:
            value = output[1](final.get("input"))
        except OutputValidationError as exc:
            return refuse(ctx, final, "invalid_final_result", str(exc))
        return Done(result=output_json(self.output_type, value))

    def _refused_answer(
        self,
        ctx: StepContext,
        final: Mapping[str, Any],
        unusable: Mapping[str, str],
        output: _OutputTool,
        calls: Sequence[Mapping[str, Any]],
        answers: int,
    ) -> dict[str, Any]:
        """The refusal of an answer that did not come alone (with other calls, or twice)."""
        checked = self._final_answer(ctx, final, unusable, output)
        if not isinstance(checked, Done):
            return checked  # its own problem is what the model needs to fix first
        if answers > 1:
            why = f"{OUTPUT_TOOL} was called {answers} times in one reply: call it once"
        else:
            names = ", ".join(sorted({str(b.get("name", ""))[:100] for b in calls}))
            why = (
                f"it came with other tool calls ({names}), which ran first: read their results, then "
                f"call {OUTPUT_TOOL} again, alone"
            )
        return refuse(ctx, final, "final_result_refused", f"the answer was not accepted: {why}")

    def _without_tool_calls(
        self, ctx: StepContext, reply: LLMReply, output: _OutputTool | None
    ) -> Done | None:
        """A final answer when the reply is one; otherwise the model is told why it is not."""
        if output is not None:
            note = f"Answer by calling the {OUTPUT_TOOL} tool."
        elif reply.stop_reason == "tool_use":
            note = (
                "Your reply stopped to call a tool (stop_reason tool_use) but holds no tool call: call "
                "the tool, or give your final answer."
            )
        elif reply.stop_reason == "max_tokens":
            note = (
                f"Your reply was cut off at max_tokens ({self.max_tokens} tokens): give your final "
                "answer again, shorter."
            )
        else:
            return Done(result=reply.text)
        _log.warning(
            "the model's reply is not a final answer (stop_reason %s); asking again", reply.stop_reason
        )
        ctx.conversation.append({"role": "user", "content": note})
        return None
