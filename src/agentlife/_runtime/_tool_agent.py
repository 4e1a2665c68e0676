"""`ToolAgent`: a ready agent whose every step is one model turn plus the tool calls it asks for.

Its message history is ``ctx.conversation``: each step appends the model's reply and the tool results, and
they are saved with the step's checkpoint, so a drained or killed agent resumes the conversation exactly
where it was. The model call and every tool call are journaled like any other, so the step that was cut off
replays what it had finished (no re-sent request, no repeated side effect) and goes on live from there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import orjson

from agentlife._agent import AgentProcess, Done, Job
from agentlife._exceptions import OutputValidationError
from agentlife._runtime._structured import OUTPUT_TOOL, output_json, output_tool
from agentlife._runtime._toolcalls import error_result

if TYPE_CHECKING:
    from agentlife._llm import LLMReply
    from agentlife._runtime._context import StepContext

__all__ = ["ToolAgent"]

#: `output_tool`'s (definition, parse) for ``ToolAgent.output_type``.
_OutputTool = tuple[dict[str, Any], Callable[[Any], Any]]


class ToolAgent(AgentProcess):
    """An agent that runs the tool-use loop: set the class attributes, write the tools, and it is done.

    Each step sends the conversation to the model with the tools offered, appends the reply, runs the
    ``tool_use`` blocks through ``ctx.run_tool_calls`` (validated arguments, journaled, replayed,
    ``verify``, timeouts, approvals, policy) and appends their results. The job ends with `Done` when
    the model answers without asking for a tool: the reply's text, or, with ``output_type``, the
    validated structured result (as JSON). It ends FAILED when ``max_turns`` model turns did not get there.

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
        turns = sum(1 for message in conversation if message.get("role") == "assistant")
        if turns >= self.max_turns:
            return Done(status="FAILED", reason=f"no final answer after {self.max_turns} model turns")
        output = output_tool(self.output_type) if self.output_type is not None else None
        reply = await ctx.llm.complete(
            model=self.model,
            max_tokens=self.max_tokens,
            messages=list(conversation),
            **self._call_params(output),
        )
        conversation.append({"role": "assistant", "content": [dict(block) for block in reply.content]})
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
        final = next((b for b in uses if output is not None and b.get("name") == OUTPUT_TOOL), None)
        problem: list[dict[str, Any]] = []
        if final is not None and output is not None:
            try:
                value = output[1](final.get("input"))
            except OutputValidationError as exc:
                # Back to the model, like invalid tool arguments: it gets another turn to fix its answer.
                problem.append(error_result(str(final.get("id", "")), str(exc)))
            else:
                return Done(result=output_json(self.output_type, value))
        if not uses:
            if output is None:
                return Done(result=reply.text)
            ctx.conversation.append({"role": "user", "content": f"Answer by calling the {OUTPUT_TOOL} tool."})
            return None
        others = dataclasses.replace(reply, content=[b for b in reply.content if b is not final])
        results = await ctx.run_tool_calls(others, tools=self.tools)
        ctx.conversation.append({"role": "user", "content": [*results, *problem]})
        return None
