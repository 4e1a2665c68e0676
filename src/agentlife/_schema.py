"""What a model sees of a tool, derived from the function, and the check of what the model sends back.

`tool_definition` turns a ``@tool`` function into the model-facing definition: its name, the first
paragraph of its docstring as the description, and the JSON Schema of its parameters from the type hints
(``str``, ``int``, ``float``, ``bool``, ``Literal``, ``Enum``, ``list[...]``, ``dict[str, ...]``,
``Optional``, defaults, ``TypedDict``, dataclasses and pydantic models), each parameter described by its
entry in the Google-style ``Args:`` section. `validate_arguments` checks the arguments a model sent
against the same types, as JSON (so ``"5"`` is not an ``int``, and extra fields are refused), before the
tool runs.

Both go through pydantic, loaded on first use and not at ``import agentlife``; the derived model is
cached on the tool, so the second access costs a dictionary lookup.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agentlife._exceptions import ToolArgumentsInvalid

if TYPE_CHECKING:
    from agentlife._tools import ToolSpec

__all__ = ["RUNTIME_PARAMETERS", "openai_tool", "tool_definition", "validate_arguments"]

#: Parameters the runtime fills in itself: never in the schema, never taken from the model.
RUNTIME_PARAMETERS = frozenset({"invocation_id"})

_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters):\s*$")
_SECTION = re.compile(r"^\s*[A-Z][A-Za-z ]*:\s*$")
# The blanks after the optional "(type)" belong to it: two adjacent "\s*" around an optional group would
# try every split of a long run of blanks (quadratic on one long line).
_ARG_LINE = re.compile(r"^\s*(\*{0,2}\w+)\s*(?:\([^)]*\)\s*)?:\s*(.*)$")


def tool_definition(spec: ToolSpec[..., Any]) -> dict[str, Any]:
    """The Anthropic-shaped definition: ``{"name", "description", "input_schema"}`` (cached)."""
    cached = spec._derived.get("definition")
    if cached is None:
        schema = _model(spec).model_json_schema()
        schema.pop("title", None)
        cached = {"name": spec.name, "description": _description(spec.fn), "input_schema": schema}
        spec._derived["definition"] = cached
    return cached


def openai_tool(spec: ToolSpec[..., Any]) -> dict[str, Any]:
    """The same definition in the OpenAI Chat Completions shape (``{"type": "function", ...}``)."""
    definition = tool_definition(spec)
    return {
        "type": "function",
        "function": {
            "name": definition["name"],
            "description": definition["description"],
            "parameters": definition["input_schema"],
        },
    }


def validate_arguments(spec: ToolSpec[..., Any], arguments: Any) -> dict[str, Any]:
    """The keyword arguments to call ``spec`` with, checked against its type hints.

    Args:
        spec: the tool the model asked for.
        arguments: what the model sent (``tool_use.input``).

    Raises:
        ToolArgumentsInvalid: with one line per problem (wrong type, missing or extra field), written
            for the model to correct itself; the tool is not called.
    """
    import orjson
    from pydantic import ValidationError

    own = spec._derived.get("validate")
    if own is not None:  # a tool with its own JSON Schema (an MCP tool) checks against it
        return own(arguments)  # type: ignore[no-any-return]
    model = _model(spec)
    try:
        data = orjson.dumps(arguments if arguments is not None else {})
        instance = model.model_validate_json(data, strict=True)
    except ValidationError as exc:
        raise ToolArgumentsInvalid(spec.name, _problems(exc)) from None
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise ToolArgumentsInvalid(spec.name, [f"the arguments are not JSON: {exc}"]) from None
    return {name: getattr(instance, name) for name in type(instance).model_fields}


def _model(spec: ToolSpec[..., Any]) -> Any:
    model = spec._derived.get("model")
    if model is None:
        model = spec._derived["model"] = _build_model(spec)
    return model


def _build_model(spec: ToolSpec[..., Any]) -> Any:
    from pydantic import ConfigDict, Field, create_model

    hints = typing.get_type_hints(spec.fn, include_extras=True)
    described = _argument_docs(spec.fn)
    fields: dict[str, Any] = {}
    for name, param in inspect.signature(spec.fn).parameters.items():
        if name in RUNTIME_PARAMETERS or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        default = ... if param.default is param.empty else param.default
        fields[name] = (hints.get(name, Any), Field(default, description=described.get(name)))
    config = ConfigDict(extra="forbid", arbitrary_types_allowed=False)
    return create_model(f"{spec.name}_arguments", __config__=config, **fields)


def _description(fn: Any) -> str:
    """The docstring's first paragraph, on one line."""
    doc = inspect.getdoc(fn) or ""
    first = doc.split("\n\n", 1)[0]
    return " ".join(first.split())


def _argument_docs(fn: Any) -> dict[str, str]:
    """Each parameter's description from the Google-style ``Args:`` section (continuation lines joined)."""
    docs: dict[str, str] = {}
    inside, current = False, None
    for line in (inspect.getdoc(fn) or "").splitlines():
        if _ARGS_HEADER.match(line):
            inside = True
            continue
        if not inside:
            continue
        if not line.strip():
            continue
        if _SECTION.match(line) and not line.startswith((" ", "\t")):
            break
        match = _ARG_LINE.match(line)
        indent = len(line) - len(line.lstrip())
        if match and (current is None or indent <= _indent_of(docs, current)):
            current = match.group(1).lstrip("*")
            docs[current] = match.group(2).strip()
            docs[f"\0{current}"] = str(indent)
        elif current is not None:
            docs[current] = f"{docs[current]} {line.strip()}".strip()
    return {k: v for k, v in docs.items() if not k.startswith("\0")}


def _indent_of(docs: Mapping[str, str], name: str) -> int:
    return int(docs.get(f"\0{name}", "0"))


def _problems(exc: Any) -> list[str]:
    problems = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(part) for part in error.get("loc", ())) or "(arguments)"
        kind = error.get("type", "")
        if kind == "missing":
            problems.append(f"{where}: missing (required)")
        elif kind == "extra_forbidden":
            problems.append(f"{where}: not a parameter of this tool")
        else:
            problems.append(f"{where}: {error.get('msg', 'invalid')}")
    return problems
