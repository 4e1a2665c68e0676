"""The model's tool calls: tool functions offered to the model, and its ``tool_use`` blocks run for real.

`offered_tools` turns ``tools=[search_docs, label_issue]`` into the definitions the provider sends (plain
dict definitions pass through, their names remembered) and remembers the functions; `run_tool_calls` runs
every ``tool_use`` block of a reply through ``ctx.call_tool`` (journaled, replayed, ``verify``, timeouts,
approvals, policy) and returns the ``tool_result`` blocks to send back.

A call runs only on the arguments the model sent. Input the adapter could not read as sent (cut off by
``max_tokens``, not JSON, not an object: ``LLMReply.tool_input_errors``), arguments that do not fit the
tool, and an unknown tool never reach a function: the model gets ``is_error: true`` and what is wrong, the
refusal is logged at WARNING and journaled (``TOOL_REFUSED``), and the model can correct itself. A tool
that fails comes back as an error result too; errors that end the step (budgets, replay mismatches, values
the journal cannot keep, a fenced store) still end it, and so does an operator's rejection of a
restricted call: it is final, not something for the model to work around. A restricted tool that
``check_policy`` refused comes back to the model as an error result.
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
from agentlife._llm._protocol import CUT_OFF, cut_off_tool_use
from agentlife._logging import log_fields
from agentlife._replay import utf8_safe
from agentlife._schema import validate_arguments
from agentlife._tools import ToolSpec, loaded_mcp, tool

if TYPE_CHECKING:
    from agentlife._llm._protocol import LLMReply
    from agentlife._redact import Redactor
    from agentlife._step._context import StepContext

__all__ = [
    "Registry",
    "error_result",
    "offered_tools",
    "refuse",
    "run_tool_calls",
    "run_tool_uses",
    "tool_registry",
    "unusable_inputs",
]

log = logging.getLogger("agentlife.calls")

#: Tool name -> its function; None for a tool offered as a definition dict only (nothing here runs it).
Registry = dict[str, ToolSpec[..., Any] | None]

#: Errors that end the step rather than go back to the model as a failed tool call.
_FATAL = (BudgetExhausted, ReplayMismatch, UnreplayableValue, StoreError, ConfigError, ApprovalRejected)
_MAX_ERROR_TEXT = 2000
# A refusal names what the model sent; a 10 MB tool name or a list of 10 000 problems is cut short.
_MAX_NAME = 100
_MAX_REFUSAL_TEXT = 4000


def offered_tools(tools: Iterable[Any], registry: Registry) -> list[Any]:
    """The provider-facing definitions of ``tools``; every name offered is remembered in ``registry``."""
    definitions: list[Any] = []
    for item in tools:
        if isinstance(item, Mapping):
            definitions.append(dict(item))
            name = _definition_name(item)
            if name:
                registry.setdefault(name, None)  # a function offered for that name still wins
            continue
        mcp = loaded_mcp()
        served = None if mcp is None else mcp.live_tool_specs(item)  # an MCP server: the tools it serves
        if served is not None:
            for mcp_tool in served:
                registry[mcp_tool.name] = mcp_tool
                definitions.append(mcp_tool.definition)
            continue
        spec: ToolSpec[..., Any] = item if isinstance(item, ToolSpec) else tool(item)
        registry[spec.name] = spec
        definitions.append(spec.definition)
    return definitions


def _definition_name(definition: Mapping[str, Any]) -> str:
    function = definition.get("function")
    if isinstance(function, Mapping):  # a definition already in OpenAI's form
        return str(function.get("name") or "")
    return str(definition.get("name") or "")


def tool_registry(ctx: StepContext, tools: Iterable[Any] = ()) -> Registry:
    """What the step offered the model so far (``ctx.llm.complete(tools=...)``), plus ``tools``."""
    registry: Registry = dict(ctx._offered)
    offered_tools(tools, registry)
    return registry


def unusable_inputs(reply: LLMReply) -> dict[str, str]:
    """``tool_use`` id -> why its input is not arguments the model sent.

    What the adapter reported (``tool_input_errors``), and for a reply from any client that stopped at
    ``max_tokens``, its last block when that is a tool call: the model was cut off inside it.
    """
    errors = dict(reply.tool_input_errors)
    cut = cut_off_tool_use(reply.content, reply.stop_reason)
    if cut is not None:
        errors.setdefault(cut, CUT_OFF)
    return errors


async def run_tool_calls(
    ctx: StepContext,
    reply: LLMReply,
    registry: Registry,
    redactor: Redactor,
) -> list[dict[str, Any]]:
    """Run the reply's ``tool_use`` blocks in order; one ``tool_result`` block each, in the same order."""
    uses = [block for block in reply.content if block.get("type") == "tool_use"]
    return await run_tool_uses(ctx, uses, unusable_inputs(reply), registry, redactor)


async def run_tool_uses(
    ctx: StepContext,
    uses: Sequence[Mapping[str, Any]],
    unusable: Mapping[str, str],
    registry: Registry,
    redactor: Redactor,
) -> list[dict[str, Any]]:
    """Run these ``tool_use`` blocks in order (``unusable``: from `unusable_inputs` of their reply)."""
    return [await _run_one(ctx, block, unusable, registry, redactor) for block in uses]


async def _run_one(
    ctx: StepContext,
    block: Mapping[str, Any],
    unusable: Mapping[str, str],
    registry: Registry,
    redactor: Redactor,
) -> dict[str, Any]:
    use_id, name = str(block.get("id", "")), str(block.get("name", ""))
    problem = unusable.get(use_id)
    if problem is not None:
        message = f"tool {_shown(name)} was not run: {problem}. Call it again with all of its arguments."
        return refuse(ctx, block, "unusable_arguments", message)
    if name not in registry:
        known = ", ".join(_shown(n) for n in sorted(registry)) or "none"
        return refuse(ctx, block, "unknown_tool", f"unknown tool {_shown(name)!r} (tools offered: {known})")
    spec = registry[name]
    if spec is None:
        runnable = ", ".join(_shown(n) for n in sorted(registry) if registry[n] is not None) or "none"
        message = (
            f"tool {_shown(name)!r} was offered as a definition only: no function here runs it "
            f"(tools that run: {runnable})"
        )
        return refuse(ctx, block, "unknown_tool", message)
    try:
        arguments = validate_arguments(spec, block.get("input"))
    except ToolArgumentsInvalid as exc:
        return refuse(ctx, block, "invalid_arguments", str(exc))
    try:
        result: Any = await ctx.call_tool(spec, **arguments)
    except _FATAL:
        raise
    except Exception as exc:
        # utf8_safe: the message goes into the conversation and the next request, which must be JSON.
        message = utf8_safe(redactor.redact(f"{type(exc).__name__}: {exc}"))[:_MAX_ERROR_TEXT]
        return error_result(use_id, f"tool {name} failed: {message}")
    return {"type": "tool_result", "tool_use_id": use_id, "content": _as_content(result)}


def refuse(ctx: StepContext, block: Mapping[str, Any], reason: str, message: str) -> dict[str, Any]:
    """Refuse one of the model's tool calls: log it at WARNING, journal it, and tell the model why.

    Args:
        ctx: the step the call came in.
        block: the model's ``tool_use`` block.
        reason: ``unknown_tool``, ``invalid_arguments``, ``unusable_arguments``, ``invalid_final_result``,
            ``final_result_refused`` or ``not_run``: the journal's ``TOOL_REFUSED.reason``.
        message: what the model is told (and the log and the journal say).

    Returns:
        The ``tool_result`` block (``is_error: true``) to send back.
    """
    use_id, name = str(block.get("id", "")), _shown(str(block.get("name", "")))
    message = ctx._env.host.redactor.redact(_cut(message))
    log.warning(
        "tool call %s (%s) refused, %s: %s",
        name,
        _shown(use_id),
        reason,
        message,
        extra=log_fields(step=ctx.step, tool=name, reason=reason),
    )
    ctx._env.journal.append(
        "TOOL_REFUSED", step=ctx.step, tool=name, tool_use_id=_shown(use_id), reason=reason, error=message
    )
    return error_result(use_id, message)


def _shown(text: str) -> str:
    return text if len(text) <= _MAX_NAME else text[: _MAX_NAME - 3] + "..."


def _cut(message: str) -> str:
    if len(message) <= _MAX_REFUSAL_TEXT:
        return message
    return f"{message[:_MAX_REFUSAL_TEXT]}... ({len(message) - _MAX_REFUSAL_TEXT} more characters)"


def _as_content(result: Any) -> str | Sequence[Any]:
    if isinstance(result, str):
        return result
    return orjson.dumps(result, default=str).decode()


def error_result(use_id: str, message: str) -> dict[str, Any]:
    """A ``tool_result`` block telling the model its call failed (``is_error``)."""
    return {"type": "tool_result", "tool_use_id": use_id, "content": message, "is_error": True}
