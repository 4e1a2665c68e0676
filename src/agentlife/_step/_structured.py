"""Structured output: ``ctx.llm.complete(..., output_type=T)`` returns a validated ``T``.

The model is offered one more tool, ``final_result``, whose input schema is the JSON Schema of ``T``
(pydantic's ``TypeAdapter``, loaded on first use, one adapter per type), and made to call it
(``tool_choice``). Its input is validated against ``T``; when it does not fit, or was cut off by
``max_tokens``, or came twice, the model gets its own reply back with a ``tool_result`` (``is_error: true``)
saying what is wrong, and is asked again, up to ``output_retries`` times, then `OutputValidationError`.
Structured output runs no tools: another tool call in the reply is refused (``not run``), and every
refusal is logged at WARNING and journaled (``TOOL_REFUSED``). Each try is an ordinary ``ctx.llm`` call
(journaled, replayed, budgeted), so a resumed step replays the same tries and gets the same value without a
request.

A type whose schema is not an object (``int``, ``list[str]``, a union) is wrapped, since a tool's input
must be an object: the model fills ``{"result": ...}``.
"""

from __future__ import annotations

import functools
import inspect
import logging
import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from agentlife._exceptions import OutputValidationError
from agentlife._llm._protocol import LLMReply
from agentlife._step._toolcalls import error_result, unusable_inputs

__all__ = [
    "OUTPUT_TOOL",
    "Refuse",
    "StructuredReply",
    "assistant_turn",
    "complete_structured",
    "output_json",
    "output_tool",
]

T = TypeVar("T")
log = logging.getLogger("agentlife.calls")

#: The name of the tool the model answers through.
OUTPUT_TOOL = "final_result"
_WRAPPED = "result"

#: Refuses one ``tool_use`` block: ``(block, reason, message) -> tool_result``, logged and journaled.
Refuse = Callable[[Mapping[str, Any], str, str], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class StructuredReply(Generic[T]):
    """A validated answer and the reply it came from (``ctx.llm.complete_structured``)."""

    output: T
    """The validated value, an instance of the ``output_type`` asked for."""
    reply: LLMReply
    """The model's reply that carried it (the last try's)."""
    attempts: int
    """How many calls it took (1 when the first answer fitted)."""


def output_tool(output_type: Any, *, name: str = OUTPUT_TOOL) -> tuple[dict[str, Any], Callable[[Any], Any]]:
    """The tool a model answers through, and the parser of what it sends.

    Args:
        output_type: anything pydantic's ``TypeAdapter`` takes: a pydantic model, a dataclass, a
            ``TypedDict``, ``int``, ``list[str]``, a union ...
        name: the tool's name.

    Returns:
        ``(definition, parse)``: the Anthropic-shaped tool definition (``name``, ``description``,
        ``input_schema``; a non-object type wrapped as ``{"result": ...}``), and a function that turns a
        ``tool_use`` block's ``input`` into the validated value, raising `OutputValidationError` (with
        one line per problem in ``problems``) when it does not fit.
    """
    adapter, wrapped, schema = _adapter(output_type)
    definition = {"name": name, "description": _description(output_type), "input_schema": schema}

    def parse(arguments: Any) -> Any:
        from pydantic import ValidationError

        if wrapped:
            if not isinstance(arguments, Mapping) or _WRAPPED not in arguments:
                raise OutputValidationError(_type_name(output_type), [f"{_WRAPPED}: missing (required)"])
            arguments = arguments[_WRAPPED]
        try:
            return adapter.validate_python(arguments)
        except ValidationError as exc:
            problems = _problems(exc, _WRAPPED if wrapped else "")
            raise OutputValidationError(_type_name(output_type), problems) from None

    return definition, parse


def output_json(output_type: Any, value: Any) -> Any:
    """``value`` (validated against ``output_type``) as plain JSON, to store as a job's result."""
    adapter, _, _ = _adapter(output_type)
    return adapter.dump_python(value, mode="json")


@functools.lru_cache(maxsize=256)
def _cached_adapter(output_type: Any) -> tuple[Any, bool, dict[str, Any]]:
    from pydantic import TypeAdapter

    adapter = TypeAdapter(output_type)
    schema = adapter.json_schema()
    schema.pop("title", None)
    if schema.get("type") == "object":
        return adapter, False, schema
    defs = schema.pop("$defs", None)
    wrapped: dict[str, Any] = {
        "type": "object",
        "properties": {_WRAPPED: schema},
        "required": [_WRAPPED],
        "additionalProperties": False,
    }
    if defs:
        wrapped["$defs"] = defs
    return adapter, True, wrapped


def _adapter(output_type: Any) -> tuple[Any, bool, dict[str, Any]]:
    """One ``TypeAdapter`` per type (cached; an unhashable type form builds a new one)."""
    try:
        return _cached_adapter(output_type)
    except TypeError:
        return _cached_adapter.__wrapped__(output_type)


def _type_name(output_type: Any) -> str:
    """``Triage``, ``int``, ``list[str]``, ``int | None``, ``Literal['a', 'b']``."""
    if typing.get_origin(output_type) is None and isinstance(output_type, type):
        return output_type.__name__  # not list[str], which passes for a type but has list's name
    return repr(output_type).replace("typing.", "").replace("typing_extensions.", "")


def _description(output_type: Any) -> str:
    """What the tool is for, with the first paragraph of the type's own docstring when it has one."""
    own = output_type.__dict__.get("__doc__") if isinstance(output_type, type) else None
    name = _type_name(output_type)
    if getattr(output_type, "__module__", "") == "builtins" or not own or own.startswith(f"{name}("):
        own = ""  # int's docstring, or the signature a dataclass gets as its docstring
    first = " ".join(inspect.cleandoc(own).split("\n\n", 1)[0].split())
    return f"Give the final answer ({name}) by calling this tool" + (f": {first}" if first else ".")


def _problems(exc: Any, prefix: str) -> list[str]:
    problems = []
    for error in exc.errors(include_url=False):
        loc = ".".join(str(part) for part in (prefix, *error.get("loc", ())) if part != "")
        where = loc or "(answer)"
        if error.get("type") == "missing":
            problems.append(f"{where}: missing (required)")
        else:
            problems.append(f"{where}: {error.get('msg', 'invalid')}")
    return problems


async def complete_structured(
    call: Callable[[Sequence[Mapping[str, Any]], dict[str, Any]], Awaitable[LLMReply]],
    *,
    messages: Sequence[Mapping[str, Any]],
    params: dict[str, Any],
    output_type: Any,
    output_retries: int = 2,
    refuse: Refuse | None = None,
) -> StructuredReply[Any]:
    """Ask through the output tool until the answer validates, ``1 + output_retries`` calls at most.

    Args:
        call: one journaled call with these messages and parameters (``ctx.llm``'s).
        messages: the conversation.
        params: the call's other parameters; ``tools`` already in definition form. The output tool is
            added to them and forced through ``tool_choice`` unless ``params`` names one.
        output_type: the type to validate the answer against.
        output_retries: how many times a wrong answer is sent back to the model.
        refuse: logs and journals each refused ``tool_use`` block and gives its ``tool_result``
            (default: logged only).

    Raises:
        OutputValidationError: the last answer still did not fit (naming the type and the problems).
        ValueError: ``output_retries`` is negative, or a tool of the caller is named like the output tool.
    """
    if output_retries < 0:
        raise ValueError(f"output_retries must be >= 0, got {output_retries}")
    refuse = refuse or _logged_refusal
    definition, parse = output_tool(output_type)
    tools = list(params.get("tools") or ())
    if any(isinstance(t, Mapping) and t.get("name") == OUTPUT_TOOL for t in tools):
        raise ValueError(f"a tool is already named {OUTPUT_TOOL!r}, the structured output's tool")
    params = {**params, "tools": [*tools, definition]}
    params.setdefault("tool_choice", {"type": "tool", "name": OUTPUT_TOOL})
    conversation = list(messages)
    attempts = 0
    while True:
        attempts += 1
        reply = await call(conversation, params)
        try:
            value = _answer(reply, parse, _type_name(output_type))
        except OutputValidationError as exc:
            if attempts > output_retries:
                raise OutputValidationError(exc.type_name, exc.problems, attempts=attempts) from None
            # A refused tool call is logged at WARNING by ``refuse``; a reply without one is, here.
            level = logging.INFO if _tool_uses(reply) else logging.WARNING
            log.log(level, "structured output %s: no usable answer, asking again: %s", exc.type_name, exc)
            conversation += _sent_back(reply, str(exc), refuse)
            continue
        for block in _tool_uses(reply):
            if block.get("name") != OUTPUT_TOOL:
                refuse(
                    block, "not_run", f"not run: structured output runs no tools; {OUTPUT_TOOL} came with it"
                )
        return StructuredReply(value, reply, attempts)


def _tool_uses(reply: LLMReply) -> list[Mapping[str, Any]]:
    return [block for block in reply.content if block.get("type") == "tool_use"]


def _answer(reply: LLMReply, parse: Callable[[Any], Any], type_name: str) -> Any:
    """The validated answer the reply holds, or `OutputValidationError` saying why there is none."""
    answers = [block for block in _tool_uses(reply) if block.get("name") == OUTPUT_TOOL]
    if not answers:
        raise OutputValidationError(type_name, [f"no answer: call the {OUTPUT_TOOL} tool with it"])
    if len(answers) > 1:
        raise OutputValidationError(
            type_name, [f"{OUTPUT_TOOL} was called {len(answers)} times in one reply: call it once"]
        )
    problem = unusable_inputs(reply).get(str(answers[0].get("id", "")))
    if problem is not None:
        raise OutputValidationError(type_name, [problem])
    return parse(answers[0].get("input"))


def _logged_refusal(block: Mapping[str, Any], reason: str, message: str) -> dict[str, Any]:
    log.warning("tool call %s refused, %s: %s", str(block.get("name", ""))[:100], reason, message)
    return error_result(str(block.get("id", "")), message)


def assistant_turn(reply: LLMReply) -> dict[str, Any] | None:
    """The reply as an assistant message to send back; None when it holds nothing to send.

    Text blocks of nothing but whitespace are left out, and a reply with no tool call and no text (an
    empty reply, or only thinking) is no turn at all: the APIs refuse an assistant message without
    content, so it would fail every later request of the conversation.
    """
    content = [
        dict(block)
        for block in reply.content
        if not (block.get("type") == "text" and not str(block.get("text", "")).strip())
    ]
    if not any(block.get("type") in ("text", "tool_use") for block in content):
        return None
    return {"role": "assistant", "content": content}


def _sent_back(reply: LLMReply, message: str, refuse: Refuse) -> list[dict[str, Any]]:
    """The reply as the assistant's turn and the user's turn telling it what was wrong."""
    results: list[dict[str, Any]] = []
    for block in _tool_uses(reply):
        if block.get("name") == OUTPUT_TOOL:
            results.append(refuse(block, "invalid_final_result", message))
        else:
            results.append(refuse(block, "not_run", f"not run: answer with {OUTPUT_TOOL}"))
    if not results:
        results.append({"type": "text", "text": message})
    turn = assistant_turn(reply)
    if turn is not None:
        turn["content"] = [_api_block(block) for block in turn["content"]]
    return [*([turn] if turn is not None else []), {"role": "user", "content": results}]


def _api_block(block: Mapping[str, Any]) -> dict[str, Any]:
    if block.get("type") == "tool_use":
        return {key: block[key] for key in ("type", "id", "name", "input") if key in block}
    return dict(block)
