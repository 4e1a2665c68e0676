"""The LLM client protocol and the reply it returns.

Adapters (`AnthropicLLM`, `ScriptedLLM`) implement `LLMClient.complete`, which streams under the timeouts
it is given and returns a whole `LLMReply`. The runtime wraps the client the agent made into ``ctx.llm``,
which adds journaling and replay, the token budget and retries; adapters never do those themselves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from agentlife._replay import MAX_DEPTH, nesting
from agentlife.constants import CallConstants

__all__ = [
    "CURRENT_CALL",
    "CUT_OFF",
    "INVOCATION_HEADER",
    "MAX_TOOL_INPUT_DEPTH",
    "TOO_DEEP",
    "CallAddress",
    "LLMClient",
    "LLMReply",
    "OnEvent",
    "StreamEvent",
    "StreamTimeouts",
    "Usage",
    "bounded_tool_inputs",
    "cut_off_tool_use",
    "json_kind",
    "provider_name",
    "stream_event",
]

#: The request header that carries ``{job_id}/{step}/{call}`` to the model server: proxies and the fake
#: servers of `agentlife.testing` can tell a re-sent request from a new one by it.
INVOCATION_HEADER = "x-agentlife-invocation"
#: The defaults of `StreamTimeouts`: the constants'.
_CALLS = CallConstants()


@dataclass(frozen=True, slots=True)
class CallAddress:
    """Where an LLM call sits in its job: the step and the call's number within the step."""

    job_id: str
    step: int
    call: int

    def __str__(self) -> str:
        return f"{self.job_id}/{self.step}/{self.call}"


#: The call ``ctx.llm`` is making, for adapters that address a script or tag a request by it.
CURRENT_CALL: ContextVar[CallAddress | None] = ContextVar("agentlife_current_call", default=None)


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One event of a streamed reply, as ``ctx.llm.stream`` hands it on."""

    kind: Literal["text", "thinking", "other"]
    """``text`` (a text delta), ``thinking`` (a thinking delta) or ``other``."""
    text: str = ""
    """The delta's text for ``text`` and ``thinking``; empty otherwise."""
    raw: Mapping[str, Any] = field(default_factory=dict)
    """The provider's event as it came off the wire."""


#: What an adapter that streams events (``streams_events = True``) calls for each one.
OnEvent = Callable[[StreamEvent], None]

# The slots of `StreamEvent`, set directly by `stream_event`.
_new_object = object.__new__
_set_kind = StreamEvent.__dict__["kind"].__set__
_set_text = StreamEvent.__dict__["text"].__set__
_set_raw = StreamEvent.__dict__["raw"].__set__


def stream_event(
    kind: Literal["text", "thinking", "other"], text: str, raw: Mapping[str, Any]
) -> StreamEvent:
    """``StreamEvent(kind, text, raw)``, built in about 60 % of the time.

    The adapters build one per chunk of ``ctx.llm.stream``. The frozen dataclass's ``__init__`` sets each
    field through ``object.__setattr__`` looked up anew (330 ns a chunk); this sets the slots through
    their descriptors, bound once (200 ns). The result is an ordinary, equal `StreamEvent`.
    """
    event = _new_object(StreamEvent)
    _set_kind(event, kind)
    _set_text(event, text)
    _set_raw(event, raw)
    return event


@dataclass(frozen=True, slots=True)
class StreamTimeouts:
    """The three clocks of a progress-guarded stream, in seconds.

    The defaults are the ``AGENTLIFE_LLM_*_TIMEOUT_SECONDS`` constants' (`CallConstants`); an expired clock
    raises `LLMTimeout` naming it.
    """

    connect: float = _CALLS.llm_connect_timeout_seconds
    """From the request until the first event of the stream arrives."""
    chunk: float = _CALLS.llm_inter_chunk_timeout_seconds
    """The longest silence between two events once the stream has started (keep-alive pings count)."""
    total: float = _CALLS.llm_total_timeout_seconds
    """The whole call, from the request to the last event, whatever the stream does."""


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens one call consumed, as the provider reported them."""

    input_tokens: int = 0
    """Input tokens billed at the full rate (not read from or written to the prompt cache)."""
    output_tokens: int = 0
    """Tokens the model generated, thinking included."""
    cache_creation_input_tokens: int = 0
    """Input tokens written to the provider's prompt cache by this call."""
    cache_read_input_tokens: int = 0
    """Input tokens read from the provider's prompt cache (billed at the cache-read rate)."""

    def to_json(self) -> dict[str, int]:
        """A plain dict for the journal."""
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Usage:
        """Inverse of `to_json`; unknown keys are ignored."""
        return cls(**{k: int(data.get(k) or 0) for k in cls.__dataclass_fields__})


@dataclass(frozen=True, slots=True)
class LLMReply:
    """A complete model reply."""

    text: str
    """The text blocks joined."""
    content: Sequence[Mapping[str, Any]] = field(default_factory=tuple)
    """Every content block as a dict, in order (``text``, ``thinking``, ``tool_use`` ...)."""
    usage: Usage = field(default_factory=Usage)
    """The tokens this call consumed."""
    stop_reason: str | None = None
    """Why the model stopped (``end_turn``, ``tool_use``, ``max_tokens`` ...)."""
    model: str = ""
    """The model that answered."""
    cost_usd: float = 0.0
    """The price of this call from the adapter's price table (0 when unknown)."""
    tool_input_errors: Mapping[str, str] = field(default_factory=dict)
    """``tool_use`` id -> why that call's input cannot be used as the model's arguments.

    Cut off by ``max_tokens``, not valid JSON, not a JSON object, sent as an object where the API wants a
    string. Such a block's ``input`` is what could be read of it (``{}`` when nothing could: the API needs
    an object), not arguments the model sent whole: ``ctx.run_tool_calls`` and `ToolAgent` never run it
    and tell the model instead.
    """

    def to_json(self) -> dict[str, Any]:
        """A plain dict for the journal (``LLM_COMPLETED.response``)."""
        data: dict[str, Any] = {
            "text": self.text,
            "content": [dict(block) for block in self.content],
            "usage": self.usage.to_json(),
            "stop_reason": self.stop_reason,
            "model": self.model,
            "cost_usd": self.cost_usd,
        }
        if self.tool_input_errors:
            data["tool_input_errors"] = dict(self.tool_input_errors)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LLMReply:
        """Rebuild a reply recorded by `to_json` (replay after a crash).

        A record of agentlife 0.2 kept an unparsable tool input as a ``partial_json`` field of its block
        (not an API field): it is moved to `tool_input_errors`, and the block keeps only API fields.
        """
        content: list[Any] = []
        errors = {str(k): str(v) for k, v in _mapping(data.get("tool_input_errors")).items()}
        for block in data.get("content") or ():
            if isinstance(block, Mapping) and "partial_json" in block:
                errors.setdefault(str(block.get("id", "")), "its input is not valid JSON (cut off?)")
                block = {k: v for k, v in block.items() if k != "partial_json"}
            content.append(block)
        stop_reason = data.get("stop_reason")
        cut = cut_off_tool_use(content, stop_reason)
        if cut is not None:
            errors.setdefault(cut, CUT_OFF)
        return cls(
            text=str(data.get("text", "")),
            content=tuple(content),
            usage=Usage.from_json(data.get("usage") or {}),
            stop_reason=stop_reason,
            model=str(data.get("model", "")),
            cost_usd=float(data.get("cost_usd") or 0.0),
            tool_input_errors=errors,
        )


#: Why the last ``tool_use`` of a reply that stopped at ``max_tokens`` cannot be used.
CUT_OFF = "the reply was cut off at max_tokens inside this call, so its arguments are incomplete"


#: How many levels a tool call's input may nest: a conversation message keeps it three levels down (the
#: message, its content list, the block), and a message holds what the journal holds, `MAX_DEPTH` levels.
MAX_TOOL_INPUT_DEPTH = MAX_DEPTH - 3
#: Why a ``tool_use`` whose input nests deeper than that cannot be used.
TOO_DEEP = (
    f"its arguments nest deeper than {MAX_TOOL_INPUT_DEPTH} levels, more than the journal keeps: send them "
    "less deeply nested"
)


def bounded_tool_inputs(reply: LLMReply) -> LLMReply:
    """``reply`` with each tool input nested past `MAX_TOOL_INPUT_DEPTH` levels flagged, and emptied.

    A model may send arguments nested thousands of levels deep. The journal and the conversation keep
    `MAX_DEPTH` levels, so such a block could be neither journaled, replayed nor sent back: its ``input``
    becomes ``{}`` (the API wants an object there) and `LLMReply.tool_input_errors` says why, so the call
    goes back to the model as an error like any input it did not send whole, instead of ending the job.
    """
    limit = MAX_TOOL_INPUT_DEPTH
    deep = [
        index
        for index, block in enumerate(reply.content)
        if isinstance(block, Mapping) and nesting(block.get("input"), limit + 1) > limit
    ]
    if not deep:
        return reply
    content, errors = list(reply.content), dict(reply.tool_input_errors)
    for index in deep:
        block = content[index]
        content[index] = {**block, "input": {}}
        errors.setdefault(str(block.get("id", "")), TOO_DEEP)
    return dataclasses.replace(reply, content=tuple(content), tool_input_errors=errors)


def cut_off_tool_use(content: Sequence[Any], stop_reason: Any) -> str | None:
    """The id of the ``tool_use`` block a ``max_tokens`` stop cut off, if any.

    A reply that stopped at ``max_tokens`` was cut inside its last block; when that block is a tool call,
    its input is whatever had arrived, even when that happens to parse (``""`` reads as ``{}``).
    """
    if stop_reason != "max_tokens" or not content:
        return None
    last = content[-1]
    if isinstance(last, Mapping) and last.get("type") == "tool_use":
        return str(last.get("id", ""))
    return None


def json_kind(value: Any) -> str:
    """``an object``, ``an array``, ``a string`` ...: the kind of JSON value, never what it holds."""
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return "null" if value is None else f"a {type(value).__name__}"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


@runtime_checkable
class LLMClient(Protocol):
    """What ``AgentProcess.make_llm()`` returns: one streamed completion per `complete` call.

    An adapter whose class sets ``streams_events = True`` also accepts ``on_event=`` (an `OnEvent`) in
    `complete` and calls it for every event it reads; ``ctx.llm.stream`` uses it to hand text on as it
    arrives. Other adapters are streamed to the caller whole, when the reply is complete.
    """

    async def complete(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        max_tokens: int,
        timeouts: StreamTimeouts | None = None,
        **params: Any,
    ) -> LLMReply:
        """Stream one completion under ``timeouts`` and return it whole.

        Raises:
            LLMTimeout: the stream made no progress in time (the response is closed first).
            TransientError: rate limits, overload, 5xx, connection errors (``retry_after`` when known).
            PermanentError: the request itself is wrong (HTTP 400).
            LLMConfigurationError: no credentials, or 401/403.
        """

    async def aclose(self) -> None:
        """Release connections."""


def provider_name(client: object) -> str:
    """The ``gen_ai.provider.name`` of ``client``'s calls: its ``provider`` attribute, else its class name."""
    name = getattr(client, "provider", None)
    return name if isinstance(name, str) and name else type(client).__name__
