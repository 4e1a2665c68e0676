"""``ctx.llm``: the calls a step makes to its model, through `StepContext`'s journaled, replayed call.

`StepLLM.complete` (plain, or structured with ``output_type=``), `StepLLM.complete_structured` and
`StepLLM.stream` all end in ``StepContext._llm_complete``: one call number, one digest, one journal record
per model request, whichever way the caller reads the reply.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, overload

from agentlife._llm._protocol import LLMReply, OnEvent
from agentlife._step._streaming import LLMStream
from agentlife._step._toolcalls import offered_tools, refuse

if TYPE_CHECKING:
    from agentlife._step._context import StepContext
    from agentlife._step._structured import StructuredReply

__all__ = ["StepLLM"]

T = TypeVar("T")


class StepLLM:
    """``ctx.llm``: the agent's LLM client behind replay, budget checks, retries and the stream guard."""

    def __init__(self, ctx: StepContext) -> None:
        self._ctx = ctx

    @overload
    async def complete(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        max_tokens: int,
        output_type: None = None,
        **params: Any,
    ) -> LLMReply: ...

    @overload
    async def complete(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        max_tokens: int,
        output_type: type[T],
        output_retries: int = 2,
        **params: Any,
    ) -> T: ...

    @overload
    async def complete(  # a type form that is not a class: int | None, Annotated[...]
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        max_tokens: int,
        output_type: object,
        output_retries: int = 2,
        **params: Any,
    ) -> Any: ...

    async def complete(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        max_tokens: int,
        output_type: Any = None,
        output_retries: int = 2,
        **params: Any,
    ) -> Any:
        """One completion; replayed from the journal when this call already completed before a crash.

        ``tools`` may hold ``@tool`` functions (their definitions are derived from the function) as well
        as plain definition dicts; `StepContext.run_tool_calls` then runs what the model asked for.

        With ``output_type`` (a pydantic model, a dataclass, a ``TypedDict``, ``int`` ...) the model
        answers through a forced tool and the validated value is returned; a wrong answer is sent back
        with what is wrong, ``output_retries`` times at most (each try a journaled call).

        Raises:
            BudgetExhausted: the token, cost or run budget would be exceeded; the call is not made.
            OutputValidationError: the structured answer still did not fit after the retries.
        """
        if output_type is not None:
            answer = await self.complete_structured(
                model=model,
                messages=messages,
                max_tokens=max_tokens,
                output_type=output_type,
                output_retries=output_retries,
                **params,
            )
            return answer.output
        return await self._ctx._llm_complete(
            model=model, messages=messages, max_tokens=max_tokens, params=self._offer(params)
        )

    async def complete_structured(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        max_tokens: int,
        output_type: type[T],
        output_retries: int = 2,
        **params: Any,
    ) -> StructuredReply[T]:
        """Like ``complete(output_type=...)``, returning the value with the reply it came in and the tries.

        Raises:
            OutputValidationError: the answer still did not fit after ``output_retries`` retries.
        """

        async def call(conversation: Sequence[Mapping[str, Any]], request: dict[str, Any]) -> LLMReply:
            return await self._ctx._llm_complete(
                model=model, messages=conversation, max_tokens=max_tokens, params=dict(request)
            )

        def refused(block: Mapping[str, Any], reason: str, message: str) -> dict[str, Any]:
            return refuse(self._ctx, block, reason, message)

        from agentlife._step._structured import complete_structured  # only for output_type=: not at boot

        return await complete_structured(
            call,
            messages=messages,
            params=self._offer(params),
            output_type=output_type,
            output_retries=output_retries,
            refuse=refused,
        )

    def stream(
        self, *, model: str, messages: Sequence[Mapping[str, Any]], max_tokens: int, **params: Any
    ) -> LLMStream:
        """The same call as `complete`, its text handed on as it arrives: ``async with ... as s``.

        ``async for text in s.text_stream`` (or ``s.thinking_stream``, or ``async for event in s``),
        then ``await s.get_final_reply()``. Replayed calls stream the recorded reply at once; leaving
        the block before the reply completed cancels the call.
        """
        params = self._offer(params)

        def begin() -> Callable[[OnEvent], Awaitable[LLMReply]]:
            call = self._ctx._claim_call()  # on entering the block, in order with the step's other calls

            def run(on_event: OnEvent) -> Awaitable[LLMReply]:
                return self._ctx._llm_complete(
                    model=model,
                    messages=messages,
                    max_tokens=max_tokens,
                    params=params,
                    on_event=on_event,
                    call=call,
                )

            return run

        return LLMStream(begin)

    def _offer(self, params: dict[str, Any]) -> dict[str, Any]:
        if params.get("tools") is not None:
            params["tools"] = offered_tools(params["tools"], self._ctx._offered)
        return params
