"""The model's tool calls: tool functions offered to the model, and its ``tool_use`` blocks run for real.

`offered_tools` turns ``tools=[search_docs, label_issue]`` into the definitions the provider sends (plain
dict definitions pass through) and remembers the functions; `run_tool_calls` runs every ``tool_use``
block of a reply through ``ctx.call_tool`` (journaled, replayed, ``verify``, timeouts, approvals, policy)
and returns the ``tool_result`` blocks to send back. Arguments that do not fit a tool never reach it: the
model gets ``is_error: true`` and what is wrong, and can correct itself. So does a tool that fails, an
unknown tool, or a restricted tool that ``check_policy`` refused; errors that end the step (budgets, replay
mismatches, values the journal cannot keep, a fenced store) still end it, and so does an operator's
rejection of a restricted call: it is final, not something for the model to work around.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from agentlife._exceptions import (
    ApprovalRejected,
    BudgetExhausted,
    ConfigError,
    ReplayMismatch,
    StoreError,
    ToolArgumentsInvalid,
    UnreplayableValue,
)
from agentlife._schema import validate_arguments
from agentlife._tools import ToolSpec, tool

if TYPE_CHECKING:
    from agentlife._llm import LLMReply
    from agentlife._redact import Redactor
    from agentlife._runtime._context import StepContext

__all__ = ["error_result", "offered_tools", "run_tool_calls"]

log = logging.getLogger("agentlife.calls")

#: Errors that end the step rather than go back to the model as a failed tool call.
_FATAL = (BudgetExhausted, ReplayMismatch, UnreplayableValue, StoreError, ConfigError, ApprovalRejected)
_MAX_ERROR_TEXT = 2000


def offered_tools(tools: Iterable[Any], registry: dict[str, ToolSpec[..., Any]]) -> list[Any]:
    """The provider-facing definitions of ``tools``; tool functions are remembered in ``registry``."""
    definitions: list[Any] = []
    for item in tools:
        if isinstance(item, Mapping):
            definitions.append(dict(item))
            continue
        spec: ToolSpec[..., Any] = item if isinstance(item, ToolSpec) else tool(item)
        registry[spec.name] = spec
        definitions.append(spec.definition)
    return definitions


async def run_tool_calls(
    ctx: StepContext,
    reply: LLMReply,
    registry: Mapping[str, ToolSpec[..., Any]],
    redactor: Redactor,
) -> list[dict[str, Any]]:
    """Run the reply's ``tool_use`` blocks in order; one ``tool_result`` block each, in the same order."""
    results = []
    for block in reply.content:
        if block.get("type") == "tool_use":
            results.append(await _run_one(ctx, block, registry, redactor))
    return results


async def _run_one(
    ctx: StepContext,
    block: Mapping[str, Any],
    registry: Mapping[str, ToolSpec[..., Any]],
    redactor: Redactor,
) -> dict[str, Any]:
    use_id, name = str(block.get("id", "")), str(block.get("name", ""))
    spec = registry.get(name)
    if spec is None:
        known = ", ".join(sorted(registry)) or "none"
        return error_result(use_id, f"unknown tool {name!r} (tools offered: {known})")
    try:
        arguments = validate_arguments(spec, block.get("input"))
    except ToolArgumentsInvalid as exc:
        log.info("tool %s: invalid arguments from the model: %s", name, "; ".join(exc.problems))
        return error_result(use_id, str(exc))
    try:
        result: Any = await ctx.call_tool(spec, **arguments)
    except _FATAL:
        raise
    except Exception as exc:
        message = redactor.redact(f"{type(exc).__name__}: {exc}")[:_MAX_ERROR_TEXT]
        return error_result(use_id, f"tool {name} failed: {message}")
    return {"type": "tool_result", "tool_use_id": use_id, "content": _as_content(result)}


def _as_content(result: Any) -> str | Sequence[Any]:
    if isinstance(result, str):
        return result
    return orjson.dumps(result, default=str).decode()


def error_result(use_id: str, message: str) -> dict[str, Any]:
    """A ``tool_result`` block telling the model its call failed (``is_error``)."""
    return {"type": "tool_result", "tool_use_id": use_id, "content": message, "is_error": True}
