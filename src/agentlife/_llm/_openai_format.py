"""Anthropic-shaped requests and replies to and from the OpenAI Chat Completions format.

agentlife speaks Anthropic's content blocks everywhere (the journal, ``ctx.run_tool_calls``, replay), so
`OpenAICompatibleLLM` translates at the edge, both ways:

* **request** (`chat_request`): ``system`` becomes the first ``system`` message; a user turn's ``text``
  blocks its content, its ``image`` blocks ``image_url`` parts, and each ``tool_result`` block a ``tool``
  message of its own (placed before the rest of that turn, as the API wants them right after the assistant's
  ``tool_calls``); an assistant turn's ``tool_use`` blocks become ``tool_calls`` with JSON-string
  ``arguments`` and its ``thinking`` blocks are left out; ``tools`` become ``function`` tools and
  ``tool_choice`` ``auto`` / ``required`` / ``none`` / a named function;
* **reply** (`ChatAssembler`): streamed ``chat.completion.chunk`` objects become a ``thinking`` block
  (from ``reasoning_content`` or ``reasoning`` deltas, as vLLM, Ollama and DeepSeek send them), a ``text``
  block and one ``tool_use`` block per tool call, with the stop reason and usage in Anthropic's terms.
  Arguments that cannot be read as the model's (cut off by ``finish_reason: length``, not JSON, not a JSON
  object, sent as an object where the API specifies a string) become ``input: {}`` and are named in
  ``LLMReply.tool_input_errors``, so nothing runs on them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from agentlife._exceptions import CallError, PermanentError, TransientError
from agentlife._llm._pricing import PriceTable
from agentlife._llm._protocol import (
    CUT_OFF,
    LLMReply,
    StreamEvent,
    Usage,
    cut_off_tool_use,
    json_kind,
    stream_event,
)
from agentlife._retry import error_for_http_status

__all__ = [
    "FINISH_REASONS",
    "ChatAssembler",
    "chat_request",
    "chat_stream_event",
    "error_details",
    "error_for_status",
    "stream_error",
    "uses_max_completion_tokens",
]

_log = logging.getLogger("agentlife.llm")

#: OpenAI ``finish_reason`` to Anthropic ``stop_reason``; others are passed on unchanged.
FINISH_REASONS: Mapping[str, str] = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
    "content_filter": "refusal",
}
#: Anthropic-only parameters with no OpenAI counterpart: left out of the request (logged at debug level).
DROPPED_PARAMS = frozenset({"thinking", "metadata", "anthropic_beta", "betas"})
# Reasoning models of the OpenAI API refuse ``max_tokens`` and want ``max_completion_tokens``.
_COMPLETION_TOKEN_MODELS = ("o1", "o3", "o4", "gpt-5")


def uses_max_completion_tokens(model: str) -> bool:
    """Whether ``model`` takes ``max_completion_tokens``, not ``max_tokens`` (OpenAI's reasoning models)."""
    return model.startswith(_COMPLETION_TOKEN_MODELS)


# --- request ------------------------------------------------------------------------------------------


def chat_request(
    model: str, messages: Sequence[Mapping[str, Any]], max_tokens: int, params: Mapping[str, Any]
) -> dict[str, Any]:
    """The JSON body of a streaming Chat Completions request for an Anthropic-shaped call.

    ``max_tokens`` is sent as ``max_tokens``, or as ``max_completion_tokens`` for OpenAI's reasoning models
    (``o1``, ``o3``, ``o4``, ``gpt-5`` prefixes) or when ``params`` has ``max_completion_tokens``.
    ``stop_sequences`` becomes ``stop``, ``disable_parallel_tool_use`` inside ``tool_choice`` becomes
    ``parallel_tool_calls: false``; `DROPPED_PARAMS` are left out; every other parameter (``temperature``,
    ``top_p``, ``seed``, ``reasoning_effort``, ``response_format`` ...) is sent unchanged.

    Raises:
        PermanentError: a content block this mapping cannot express (never retried).
    """
    params = dict(params)
    body: dict[str, Any] = {"model": model}
    out: list[dict[str, Any]] = []
    system = params.pop("system", None)
    if system:
        out.append({"role": "system", "content": _joined_text(system, "system")})
    for message in messages:
        out.extend(_chat_messages(message))
    body["messages"] = out
    if "max_completion_tokens" in params or uses_max_completion_tokens(model):
        body["max_completion_tokens"] = params.pop("max_completion_tokens", max_tokens)
    else:
        body["max_tokens"] = max_tokens
    stop = params.pop("stop_sequences", None)
    if stop:
        body["stop"] = list(stop)
    tools = params.pop("tools", None)
    if tools:
        body["tools"] = [_chat_tool(t) for t in tools]
    choice = params.pop("tool_choice", None)
    if choice is not None:
        body["tool_choice"], parallel = _chat_tool_choice(choice)
        if parallel is False:
            body["parallel_tool_calls"] = False
    for name in DROPPED_PARAMS & params.keys():
        _log.debug("OpenAICompatibleLLM leaves out the Anthropic-only parameter %r", name)
        del params[name]
    body.update(params)
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    return body


def _chat_messages(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    role = str(message.get("role") or "user")
    content = message.get("content")
    if isinstance(content, str) or content is None:
        return [{"role": role, "content": content or ""}]
    blocks = [b for b in content if isinstance(b, Mapping)]
    if role == "assistant":
        return [_assistant_message(blocks)]
    tool_messages: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "tool_result":
            tool_messages.append(_tool_message(block))
        elif kind == "text":
            parts.append({"type": "text", "text": str(block.get("text", ""))})
        elif kind == "image":
            parts.append(_image_part(block))
        elif kind in ("thinking", "redacted_thinking"):
            continue
        else:
            raise PermanentError(f"OpenAICompatibleLLM cannot send a {kind!r} content block in a {role} turn")
    out = tool_messages
    if parts:
        if all(p["type"] == "text" for p in parts):
            # Plain text as a string: every OpenAI-compatible server accepts that form.
            out.append({"role": role, "content": "".join(p["text"] for p in parts)})
        else:
            out.append({"role": role, "content": parts})
    return out


def _assistant_message(blocks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            arguments = orjson.dumps(block.get("input") or {}, default=str).decode()
            calls.append(
                {
                    "id": str(block.get("id", "")),
                    "type": "function",
                    "function": {"name": str(block.get("name", "")), "arguments": arguments},
                }
            )
        elif kind in ("thinking", "redacted_thinking"):
            # Reasoning is not sent back: OpenAI has no such input and DeepSeek refuses it.
            continue
        else:
            raise PermanentError(
                f"OpenAICompatibleLLM cannot send a {kind!r} content block in an assistant turn"
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    return message


def _tool_message(block: Mapping[str, Any]) -> dict[str, Any]:
    content = block.get("content")
    text = content if isinstance(content, str) else _joined_text(content or [], "tool_result")
    if block.get("is_error"):
        # The format has no error flag: the model reads it in the text, as Anthropic models see is_error.
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")), "content": text}


def _image_part(block: Mapping[str, Any]) -> dict[str, Any]:
    source = block.get("source") or {}
    if source.get("type") == "url":
        url = str(source.get("url", ""))
    elif source.get("type") == "base64":
        url = f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    else:
        raise PermanentError(
            f"OpenAICompatibleLLM cannot send an image of source type {source.get('type')!r}"
        )
    return {"type": "image_url", "image_url": {"url": url}}


def _joined_text(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    texts = []
    for block in value:
        if isinstance(block, Mapping) and block.get("type") == "text":
            texts.append(str(block.get("text", "")))
        elif isinstance(block, str):
            texts.append(block)
        else:
            kind = block.get("type") if isinstance(block, Mapping) else type(block).__name__
            raise PermanentError(f"OpenAICompatibleLLM cannot send a {kind!r} block in {where}")
    return "\n".join(texts)


def _chat_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    if tool.get("type") == "function" and "function" in tool:
        return dict(tool)  # already in OpenAI form
    function: dict[str, Any] = {"name": str(tool.get("name", ""))}
    if tool.get("description"):
        function["description"] = str(tool["description"])
    function["parameters"] = tool.get("input_schema") or {"type": "object", "properties": {}}
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: Any) -> tuple[Any, bool | None]:
    if isinstance(choice, str):
        return choice, None
    if not isinstance(choice, Mapping):
        raise PermanentError(f"tool_choice {choice!r} is neither a string nor a mapping")
    parallel = None if not choice.get("disable_parallel_tool_use") else False
    kind = choice.get("type")
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", parallel
    if kind == "tool":
        return {"type": "function", "function": {"name": str(choice.get("name", ""))}}, parallel
    if kind == "function":
        return dict(choice), parallel  # already in OpenAI form
    raise PermanentError(f"tool_choice type {kind!r} is not auto, any, none or tool")


# --- reply --------------------------------------------------------------------------------------------


def _reasoning(delta: Mapping[str, Any]) -> str:
    value = delta.get("reasoning_content")
    if value is None:
        value = delta.get("reasoning")
    return value if isinstance(value, str) else ""


def chat_stream_event(chunk: Mapping[str, Any]) -> StreamEvent:
    """Classify one ``chat.completion.chunk``: a content delta is ``text``, a reasoning delta ``thinking``."""
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") if isinstance(choice, Mapping) else None
        if isinstance(delta, Mapping):
            content = delta.get("content")
            if isinstance(content, str) and content:
                return stream_event("text", content, chunk)
            thinking = _reasoning(delta)
            if thinking:
                return stream_event("thinking", thinking, chunk)
    return stream_event("other", "", chunk)


class ChatAssembler:
    """Builds an `LLMReply` from ``chat.completion.chunk`` dicts, in the order they arrive.

    Only the first choice (``index`` 0) is kept: agentlife asks for one. The reply is complete once a
    ``finish_reason`` arrived; usage comes from the final chunk ``stream_options.include_usage`` asks for.
    A chunk holding an ``error`` object (vLLM and LiteLLM send one mid-stream) raises the matching error.
    """

    def __init__(self, model: str = "") -> None:
        self.model = model
        self.finish_reason: str | None = None
        self.done = False
        self._text: list[str] = []
        self._thinking: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self._arguments: dict[int, list[str]] = {}
        # Tool call index -> why its arguments are unusable (sent as something other than a string).
        self._argument_errors: dict[int, str] = {}
        self._usage: Mapping[str, Any] | None = None

    def feed(self, chunk: Mapping[str, Any]) -> None:
        """Take one chunk into account."""
        error = chunk.get("error")
        if isinstance(error, Mapping):
            raise stream_error(error)
        if chunk.get("model"):
            self.model = str(chunk["model"])
        usage = chunk.get("usage")
        if isinstance(usage, Mapping):
            self._usage = usage
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, Mapping) or int(choice.get("index") or 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, Mapping):
                self._delta(delta)
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])

    def _delta(self, delta: Mapping[str, Any]) -> None:
        content = delta.get("content")
        if isinstance(content, str) and content:
            self._text.append(content)
        thinking = _reasoning(delta)
        if thinking:
            self._thinking.append(thinking)
        for position, call in enumerate(delta.get("tool_calls") or ()):
            if not isinstance(call, Mapping):
                continue
            index = int(call.get("index", position))
            block = self._calls.setdefault(index, {"type": "tool_use", "id": "", "name": "", "input": {}})
            if call.get("id"):
                block["id"] = str(call["id"])
            function = call.get("function") or {}
            if function.get("name") and not block["name"]:
                # Sent whole in the first delta; some servers repeat it in every delta.
                block["name"] = str(function["name"])
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                self._arguments.setdefault(index, []).append(arguments)
            elif arguments is not None:
                # The API sends JSON text; an object here would be read as its Python repr, and {} as nothing.
                self._argument_errors.setdefault(
                    index,
                    f"its function.arguments arrived as JSON {json_kind(arguments)}, not as the JSON "
                    "string the API sends",
                )

    def reply(self, prices: PriceTable | None = None) -> LLMReply:
        """The whole reply; its ``cost_usd`` from ``prices`` (0 without a table).

        Raises:
            TransientError: no ``finish_reason`` arrived (the stream was cut off).
        """
        if self.finish_reason is None:
            raise TransientError("the model's stream ended before a finish_reason (connection dropped?)")
        content: list[dict[str, Any]] = []
        if self._thinking:
            content.append({"type": "thinking", "thinking": "".join(self._thinking)})
        text = "".join(self._text)
        if text:
            content.append({"type": "text", "text": text})
        errors: dict[str, str] = {}
        for index in sorted(self._calls):
            block = self._calls[index]
            if not block["id"]:
                block["id"] = f"call_{index}"
            block["input"], problem = _parse_arguments("".join(self._arguments.get(index, ())))
            problem = self._argument_errors.get(index, problem)
            if problem is not None:
                errors.setdefault(block["id"], problem)
            content.append(block)
        stop_reason = FINISH_REASONS.get(self.finish_reason, self.finish_reason)
        cut = cut_off_tool_use(content, stop_reason)
        if cut is not None:
            errors[cut] = CUT_OFF
        usage = _usage(self._usage)
        cost = prices.cost_usd(self.model, usage) if prices is not None else 0.0
        return LLMReply(
            text=text,
            content=tuple(content),
            usage=usage,
            stop_reason=stop_reason,
            model=self.model,
            cost_usd=cost,
            tool_input_errors=errors,
        )


def _parse_arguments(raw: str) -> tuple[dict[str, Any], str | None]:
    """A tool call's input from its arguments text, and why it cannot be used (None when it can)."""
    if not raw.strip():
        return {}, None  # a tool without parameters; "" cut off by finish_reason length is caught apart
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        # Cut off, or a small model's broken JSON: {} keeps the block sendable, the error keeps it from
        # running.
        return {}, f"its arguments are not valid JSON ({exc}, {len(raw)} characters)"
    if not isinstance(value, dict):
        return {}, f"its arguments are JSON {json_kind(value)}, not an object"
    return value, None


def _usage(raw: Mapping[str, Any] | None) -> Usage:
    """OpenAI usage in Anthropic's terms: cached prompt tokens count as cache reads, not as input."""
    if raw is None:
        return Usage()
    prompt = _int(raw.get("prompt_tokens"))
    details = raw.get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, Mapping) else 0
    return Usage(
        input_tokens=max(0, prompt - cached),
        output_tokens=_int(raw.get("completion_tokens")),
        cache_read_input_tokens=cached,
    )


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def error_for_status(
    status: int,
    *,
    error_type: str | None = None,
    message: str | None = None,
    retry_after: float | None = None,
) -> CallError:
    """The agentlife error for an HTTP error status of an OpenAI-compatible server.

    429, 408/409 and 5xx give `TransientError` (with ``retry_after`` when the server said), 401/403
    `LLMConfigurationError`, any other status (400, 404, 422 ...) `PermanentError`. The returned exception
    carries ``status_code``.
    """
    return error_for_http_status(
        status,
        api="OpenAI-compatible API",
        key_variable="OPENAI_API_KEY",
        error_type=error_type,
        message=message,
        retry_after=retry_after,
    )


def error_details(body: Any) -> tuple[str | None, str | None]:
    """The error type (or code) and message of an OpenAI-style error body ``{"error": {...}}``."""
    error = body.get("error") if isinstance(body, Mapping) else None
    if isinstance(error, Mapping):
        error_type = error.get("type") or error.get("code")
        message = error.get("message")
        return (str(error_type) if error_type else None, str(message) if message else None)
    if isinstance(error, str):
        return None, error
    return None, None


def stream_error(error: Mapping[str, Any]) -> CallError:
    """The agentlife error for an ``error`` object sent inside the stream (status from its ``code``)."""
    code = error.get("code")
    status = code if isinstance(code, int) and 400 <= code <= 599 else 500
    error_type, message = error_details({"error": error})
    return error_for_status(status, error_type=error_type, message=message)
