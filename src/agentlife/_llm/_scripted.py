"""`ScriptedLLM`: an `LLMClient` that replays scripted streams, for tests and the demo.

A script is a list of `ScriptedTurn`, one per ``complete`` call. A turn is a recorded stream of
Messages API events (the same dicts the Anthropic adapter reads off the wire) with the pause before each
one, followed by what happens after the last event: the stream ends, stalls forever, or trickles pings
forever. A turn may instead be an HTTP error (429 with ``retry_after``, 529, 400, 401 ...) or any exception.

Replies go through the very loop of the real adapter (`collect_reply`: `guard_stream` plus the message
assembler), so a stalled scripted stream times out with ``LLMTimeout(kind="chunk")`` exactly as a stalled
API stream does. The same turns drive `agentlife.testing.FakeAnthropicServer`, which sends them as real
SSE over HTTP.

Build turns with the helpers::

    llm = ScriptedLLM([
        ScriptedTurn.text("Hello!", chunks=3, delay=0.01),
        ScriptedTurn.stall(after_chunks=2),                 # -> LLMTimeout("chunk")
        ScriptedTurn.http_error(429, retry_after=0.05),      # -> TransientError(retry_after=0.05)
        ScriptedTurn.tool_use("read_file", {"path": "README.md"}),
    ])

When the script runs out, the next call raises `ScriptExhausted` (a `PermanentError`, so it is never
retried); pass ``cycle=True`` to start over instead (the demo does).

A script may instead be addressed by where the call sits in the job, ``{(step, call): turn}``: a process
that resumes the job at step 3 then gets step 3's turn, not the script's first one, exactly as a real model
would be asked step 3's question again::

    llm = ScriptedLLM({(0, 0): ScriptedTurn.tool_use("search", {"q": "x"}), (1, 0): "Done."})
"""

from __future__ import annotations

import math
import os
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, overload

import anyio
import orjson

from agentlife._exceptions import PermanentError
from agentlife._llm._anthropic import collect_reply, error_for_status
from agentlife._llm._guard import stream_timeouts_from_env
from agentlife._llm._pricing import PriceTable
from agentlife._llm._protocol import CURRENT_CALL, LLMReply, OnEvent, StreamTimeouts, Usage

__all__ = [
    "ScriptExhausted",
    "ScriptedEvent",
    "ScriptedLLM",
    "ScriptedRequest",
    "ScriptedTurn",
    "estimate_tokens",
    "output_text",
]

After = Literal["end", "stall", "trickle"]

_PING: Mapping[str, Any] = {"type": "ping"}
_SIGNATURE = "c2NyaXB0ZWQtc2lnbmF0dXJl"  # a stand-in for the opaque signature of a thinking block


class ScriptExhausted(PermanentError):
    """A `ScriptedLLM` got more calls than it has scripted turns (and ``cycle`` is off)."""


def estimate_tokens(text: str) -> int:
    """A rough token count (4 characters per token, at least 1), for scripted usage."""
    return max(1, math.ceil(len(text) / 4))


@dataclass(frozen=True, slots=True)
class ScriptedEvent:
    """One Messages API stream event and the pause before it is sent.

    Attributes:
        event: the event as the API sends it (``{"type": "ping"}``, ``{"type": "content_block_delta",
            ...}``).
        delay: seconds to wait before sending it.
    """

    event: Mapping[str, Any]
    delay: float = 0.0


@dataclass(frozen=True, slots=True)
class ScriptedTurn:
    """What one ``complete`` call (or one HTTP request to the fake server) gets.

    Build turns with the class methods (`text`, `tool_use`, `malformed_tool_use`, `thinking`, `reply`,
    `stall`, `trickle`, `never_answer`, `http_error`, `raw`, `error`, `from_reply`); the fields are the
    low-level form.
    """

    events: tuple[ScriptedEvent, ...] = ()
    """The stream, in order, each with the pause before it."""
    after: After = "end"
    """After the last event: ``"end"`` the stream, ``"stall"`` (send nothing more, keep the connection open)
    or ``"trickle"`` (a ping every ``trickle_interval`` seconds, forever)."""
    trickle_interval: float = 0.01
    """Seconds between the pings of ``after="trickle"``."""
    answer: bool = True
    """False accepts the request and never answers (no HTTP headers, no event)."""
    status: int = 200
    """An HTTP error status to answer with instead of a stream (200: stream)."""
    error_type: str | None = None
    """The API error type of that status (``"rate_limit_error"`` ...)."""
    error_message: str | None = None
    """The error message of that status."""
    retry_after: float | None = None
    """Seconds for the ``retry-after`` header of that status."""
    exception: BaseException | None = None
    """An exception `ScriptedLLM` raises instead (the fake server cannot send it)."""
    estimate_usage: bool = False
    """Fill the usage from the request and the reply (4 characters per token) when the turn was built without
    one."""
    model: str | None = None
    """The model to report; None reports the one requested."""
    body: str | None = None
    """A raw HTTP body to answer with instead of a stream or an error body (`raw`), with ``status`` and
    ``content_type``."""
    content_type: str = "text/html; charset=utf-8"
    """The ``content-type`` of ``body``."""

    def __post_init__(self) -> None:
        if self.after not in ("end", "stall", "trickle"):
            raise ValueError(f"after must be 'end', 'stall' or 'trickle', got {self.after!r}")
        if self.after == "trickle" and not self.trickle_interval > 0:
            raise ValueError(f"trickle_interval must be > 0, got {self.trickle_interval!r}")

    # --- builders ---------------------------------------------------------------------------------

    @classmethod
    def reply(
        cls,
        content: Sequence[Mapping[str, Any]],
        *,
        chunks: int = 1,
        delay: float = 0.0,
        initial_delay: float = 0.0,
        usage: Usage | None = None,
        stop_reason: str | None = None,
        model: str | None = None,
    ) -> ScriptedTurn:
        """A complete reply made of API content blocks, each text split into ``chunks`` deltas.

        Args:
            content: blocks in API form: ``{"type": "text", "text": ...}``, ``{"type": "thinking",
                "thinking": ..., "signature": ...}``, ``{"type": "tool_use", "id": ..., "name": ...,
                "input": {...}}``, ``{"type": "redacted_thinking", "data": ...}``.
            chunks: how many deltas each text, thinking or tool input is split into.
            delay: seconds before each delta.
            initial_delay: seconds before the first event (time to first token).
            usage: the usage to report; None estimates it (4 characters per token).
            stop_reason: None means ``"tool_use"`` when a tool_use block is present, else ``"end_turn"``.
            model: the model to report; None reports the one requested.
        """
        events = [_message_start(usage, model, initial_delay)]
        for index, block in enumerate(content):
            events.extend(_block_events(index, block, chunks, delay))
        if stop_reason is None:
            stop_reason = "tool_use" if any(b.get("type") == "tool_use" for b in content) else "end_turn"
        events.extend(_message_end(usage, stop_reason))
        return cls(events=tuple(events), estimate_usage=usage is None, model=model)

    @classmethod
    def text(
        cls,
        text: str,
        *,
        chunks: int = 1,
        delay: float = 0.0,
        initial_delay: float = 0.0,
        usage: Usage | None = None,
        stop_reason: str = "end_turn",
        model: str | None = None,
    ) -> ScriptedTurn:
        """A plain text reply streamed as ``chunks`` deltas, ``delay`` seconds apart."""
        return cls.reply(
            [{"type": "text", "text": text}],
            chunks=chunks,
            delay=delay,
            initial_delay=initial_delay,
            usage=usage,
            stop_reason=stop_reason,
            model=model,
        )

    @classmethod
    def tool_use(
        cls,
        name: str,
        input: Mapping[str, Any],
        *,
        id: str | None = None,
        text: str | None = None,
        thinking: str | None = None,
        chunks: int = 1,
        delay: float = 0.0,
        usage: Usage | None = None,
        model: str | None = None,
    ) -> ScriptedTurn:
        """A reply asking for one tool call, optionally after some thinking and text.

        The tool input is streamed as JSON text deltas (``input_json_delta``), as the API does.
        """
        content: list[Mapping[str, Any]] = []
        if thinking is not None:
            content.append({"type": "thinking", "thinking": thinking, "signature": _SIGNATURE})
        if text is not None:
            content.append({"type": "text", "text": text})
        tool_id = id or f"toolu_scripted_{name}"
        content.append({"type": "tool_use", "id": tool_id, "name": name, "input": input})
        return cls.reply(content, chunks=chunks, delay=delay, usage=usage, model=model)

    @classmethod
    def malformed_tool_use(
        cls,
        name: str,
        arguments: Any,
        *,
        id: str | None = None,
        stop_reason: str = "tool_use",
        usage: Usage | None = None,
    ) -> ScriptedTurn:
        """A tool call whose input arrives exactly as ``arguments``, right or wrong.

        A string is streamed as the call's JSON text as it is: ``'{"pattern": "*.tm'`` is input cut off
        mid-way, ``""`` no input at all, ``"[1]"`` JSON that is not an object. Any other value is sent
        where the API wants that text (``partial_json`` of the Messages API, ``function.arguments`` of
        Chat Completions), the way a broken server sends an object. With ``stop_reason="max_tokens"`` the
        reply stops there, as when the model ran out of tokens inside the call (``finish_reason: length``
        on `FakeOpenAIServer`).
        """
        tool_id = id or f"toolu_scripted_{name}"
        start = {"type": "tool_use", "id": tool_id, "name": name, "input": {}}
        events = [
            _message_start(usage, None, 0.0),
            ScriptedEvent({"type": "content_block_start", "index": 0, "content_block": start}),
        ]
        if arguments != "":
            delta = {"type": "input_json_delta", "partial_json": arguments}
            events.append(ScriptedEvent({"type": "content_block_delta", "index": 0, "delta": delta}))
        events.append(ScriptedEvent({"type": "content_block_stop", "index": 0}))
        events.extend(_message_end(usage, stop_reason))
        return cls(events=tuple(events), estimate_usage=usage is None)

    @classmethod
    def thinking(
        cls,
        thinking: str,
        text: str,
        *,
        pause: float = 0.0,
        ping_every: float = 0.05,
        chunks: int = 2,
        delay: float = 0.0,
        usage: Usage | None = None,
        model: str | None = None,
    ) -> ScriptedTurn:
        """Extended thinking, then text, with an optional long pause in the middle of the thinking.

        The ``pause`` seconds of silence are filled by a ``ping`` event every ``ping_every`` seconds, like
        the API during a long think. A guard whose inter-chunk timeout is longer than ``ping_every`` must
        not abort this turn, however long ``pause`` is (short of the total timeout).
        """
        turn = cls.reply(
            [
                {"type": "thinking", "thinking": thinking, "signature": _SIGNATURE},
                {"type": "text", "text": text},
            ],
            chunks=max(chunks, 2),
            delay=delay,
            usage=usage,
            model=model,
        )
        if pause <= 0:
            return turn
        if not ping_every > 0:
            raise ValueError(f"ping_every must be > 0, got {ping_every!r}")
        pings = [ScriptedEvent(_PING, ping_every)] * math.ceil(pause / ping_every)
        # After the first thinking delta: the model "thinks" silently, the API keeps pinging.
        first_delta = next(
            i for i, e in enumerate(turn.events) if e.event.get("type") == "content_block_delta"
        )
        events = (*turn.events[: first_delta + 1], *pings, *turn.events[first_delta + 1 :])
        return replace(turn, events=events)

    @classmethod
    def stall(
        cls,
        text: str = "This reply will never finish",
        *,
        after_chunks: int = 2,
        chunks: int | None = None,
        delay: float = 0.0,
        initial_delay: float = 0.0,
    ) -> ScriptedTurn:
        """A text reply that stops after ``after_chunks`` deltas and then sends nothing, forever.

        With ``after_chunks=0`` the stream stalls right after ``message_start``.
        """
        chunks = chunks or max(after_chunks + 1, 3)
        full = cls.text(text, chunks=chunks, delay=delay, initial_delay=initial_delay)
        # message_start, content_block_start, then the first deltas.
        kept = full.events[: 2 + after_chunks] if after_chunks > 0 else full.events[:1]
        return replace(full, events=kept, after="stall")

    @classmethod
    def trickle(cls, interval: float = 0.01, *, initial_delay: float = 0.0) -> ScriptedTurn:
        """``message_start``, then a ``ping`` every ``interval`` seconds forever.

        Every clock but the total timeout is satisfied, so only that one can end it.
        """
        return cls(
            events=(_message_start(None, None, initial_delay),),
            after="trickle",
            trickle_interval=interval,
            estimate_usage=True,
        )

    @classmethod
    def never_answer(cls) -> ScriptedTurn:
        """Accept the request and never answer: no headers, no event (the connect timeout's case)."""
        return cls(answer=False)

    @classmethod
    def http_error(
        cls,
        status: int,
        *,
        retry_after: float | None = None,
        error_type: str | None = None,
        message: str | None = None,
    ) -> ScriptedTurn:
        """An HTTP error answer: 429 (with ``retry_after``), 529, 500, 400, 401, 403 ...

        `ScriptedLLM` raises what the Anthropic adapter would raise for it (`error_for_status`).
        """
        if not 400 <= status <= 599:
            raise ValueError(f"an HTTP error status is 400-599, got {status}")
        return cls(
            status=status,
            error_type=error_type or _DEFAULT_ERROR_TYPES.get(status, "api_error" if status >= 500 else None),
            error_message=message or _DEFAULT_ERROR_MESSAGES.get(status, f"scripted HTTP {status}"),
            retry_after=retry_after,
        )

    @classmethod
    def raw(
        cls, body: str, *, content_type: str = "text/html; charset=utf-8", status: int = 200
    ) -> ScriptedTurn:
        """Answer with this body as it is, not a stream: a proxy's login page, a JSON body, a 502 page.

        The fake servers send it with ``status`` and ``content_type``; `ScriptedLLM` raises what the
        adapters raise for it: a `PermanentError` naming the content type for a 200 (no retry can make
        it a stream), `error_for_status` of the status otherwise.
        """
        if not 200 <= status <= 599:
            raise ValueError(f"an HTTP status is 200-599, got {status}")
        return cls(body=body, content_type=content_type, status=status)

    @classmethod
    def error(cls, exc: BaseException) -> ScriptedTurn:
        """Raise ``exc`` from `ScriptedLLM.complete` (not usable with the fake HTTP server)."""
        return cls(exception=exc)

    @classmethod
    def from_reply(cls, reply: LLMReply, *, chunks: int = 1, delay: float = 0.0) -> ScriptedTurn:
        """Replay a recorded `LLMReply` (``LLMReply.from_json`` of a journal entry, say)."""
        return cls.reply(
            reply.content,
            chunks=chunks,
            delay=delay,
            usage=reply.usage,
            stop_reason=reply.stop_reason,
            model=reply.model or None,
        )

    # --- replay -----------------------------------------------------------------------------------

    def stream_events(
        self, *, model: str, messages: Sequence[Mapping[str, Any]]
    ) -> tuple[ScriptedEvent, ...]:
        """The events to send for a request: the reported model and, if asked, estimated usage filled in."""
        reported = self.model or model
        input_tokens = estimate_tokens(_dumps(messages)) if self.estimate_usage else None
        output_tokens = estimate_tokens(output_text(self.events)) if self.estimate_usage else None
        return tuple(_patched(e, reported, input_tokens, output_tokens) for e in self.events)


_DEFAULT_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
_DEFAULT_ERROR_MESSAGES = {
    400: "scripted invalid request",
    401: "invalid x-api-key",
    403: "scripted permission error",
    429: "scripted rate limit",
    500: "scripted internal server error",
    529: "Overloaded",
}


def _message_start(usage: Usage | None, model: str | None, delay: float) -> ScriptedEvent:
    usage = usage or Usage()
    message: dict[str, Any] = {
        "id": "msg_scripted",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {
            "input_tokens": usage.input_tokens,
            "output_tokens": 1,
            "cache_creation_input_tokens": usage.cache_creation_input_tokens,
            "cache_read_input_tokens": usage.cache_read_input_tokens,
        },
    }
    return ScriptedEvent({"type": "message_start", "message": message}, delay)


def _message_end(usage: Usage | None, stop_reason: str) -> list[ScriptedEvent]:
    output_tokens = usage.output_tokens if usage is not None else 0
    return [
        ScriptedEvent(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": output_tokens},
            }
        ),
        ScriptedEvent({"type": "message_stop"}),
    ]


def _block_events(index: int, block: Mapping[str, Any], chunks: int, delay: float) -> list[ScriptedEvent]:
    kind = block.get("type")
    if kind == "text":
        start: dict[str, Any] = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": part} for part in _split(str(block.get("text", "")), chunks)]
    elif kind == "thinking":
        start = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [
            {"type": "thinking_delta", "thinking": part}
            for part in _split(str(block.get("thinking", "")), chunks)
        ]
        deltas.append({"type": "signature_delta", "signature": str(block.get("signature") or _SIGNATURE)})
    elif "input" in block:
        start = {**block, "input": {}}
        raw = _dumps(block.get("input") or {})
        deltas = [{"type": "input_json_delta", "partial_json": part} for part in _split(raw, chunks)]
    else:
        start, deltas = dict(block), []
    events = [ScriptedEvent({"type": "content_block_start", "index": index, "content_block": start})]
    events.extend(
        ScriptedEvent({"type": "content_block_delta", "index": index, "delta": delta}, delay)
        for delta in deltas
    )
    events.append(ScriptedEvent({"type": "content_block_stop", "index": index}))
    return events


def _split(text: str, chunks: int) -> list[str]:
    if not text:
        return []
    count = max(1, min(chunks, len(text)))
    size, extra = divmod(len(text), count)
    parts, start = [], 0
    for i in range(count):
        end = start + size + (1 if i < extra else 0)
        parts.append(text[start:end])
        start = end
    return parts


def output_text(events: Iterable[ScriptedEvent]) -> str:
    """The text and thinking a turn's events carry, as its estimated usage counts them."""
    parts = []
    for scripted in events:
        delta = scripted.event.get("delta")
        if scripted.event.get("type") == "content_block_delta" and isinstance(delta, Mapping):
            parts.append(str(delta.get("text") or delta.get("thinking") or delta.get("partial_json") or ""))
    return "".join(parts)


def _patched(
    scripted: ScriptedEvent, model: str, input_tokens: int | None, output_tokens: int | None
) -> ScriptedEvent:
    event = scripted.event
    kind = event.get("type")
    if kind == "message_start":
        message: dict[str, Any] = dict(event.get("message") or {})
        message["model"] = message.get("model") or model
        if input_tokens is not None:
            message["usage"] = {**(message.get("usage") or {}), "input_tokens": input_tokens}
        return ScriptedEvent({**event, "message": message}, scripted.delay)
    if kind == "message_delta" and output_tokens is not None:
        return ScriptedEvent({**event, "usage": {"output_tokens": output_tokens}}, scripted.delay)
    return scripted


def _dumps(value: Any) -> str:
    return orjson.dumps(value, default=str).decode()


@dataclass(frozen=True, slots=True)
class ScriptedRequest:
    """One call a `ScriptedLLM` received."""

    model: str
    messages: tuple[Mapping[str, Any], ...]
    max_tokens: int
    params: Mapping[str, Any] = field(default_factory=dict)


class ScriptedLLM:
    """An `LLMClient` that answers each ``complete`` call with the next `ScriptedTurn`.

    Args:
        turns: the script, in call order; or a mapping ``{(step, call): turn}`` answered by where each
            call sits in the job (outside a step, the mapping's turns are played in key order). A plain
            string stands for ``ScriptedTurn.text(string)``.
        cycle: start the script over when it runs out, instead of raising `ScriptExhausted`.
        prices: the price table for ``LLMReply.cost_usd`` (default `PriceTable.default`; the reported
            model is the requested one unless the turn names another).
        timeouts: the stream timeouts when a call passes none (default: ``AGENTLIFE_LLM_*`` variables).
        env: where to read those variables (default `os.environ`).

    Attributes:
        calls: how many times ``complete`` was called (failed calls included).
        requests: every call's model, messages, max_tokens and other parameters, in order.
    """

    streams_events = True
    #: ``gen_ai.provider.name`` of its calls: a script, not a provider.
    provider = "scripted"

    @overload
    def __init__(
        self,
        turns: Mapping[tuple[int, int], ScriptedTurn | str],
        *,
        cycle: bool = False,
        prices: PriceTable | None = None,
        timeouts: StreamTimeouts | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None: ...

    @overload
    def __init__(
        self,
        turns: Iterable[ScriptedTurn | str] = (),
        *,
        cycle: bool = False,
        prices: PriceTable | None = None,
        timeouts: StreamTimeouts | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None: ...

    def __init__(
        self,
        turns: Iterable[ScriptedTurn | str] | Mapping[tuple[int, int], ScriptedTurn | str] = (),
        *,
        cycle: bool = False,
        prices: PriceTable | None = None,
        timeouts: StreamTimeouts | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.turns: list[ScriptedTurn] = []
        self.cycle = cycle
        self.prices = prices if prices is not None else PriceTable.default()
        self.timeouts = (
            timeouts if timeouts is not None else stream_timeouts_from_env(os.environ if env is None else env)
        )
        self.calls = 0
        self.requests: list[ScriptedRequest] = []
        # The next turn to play; a call that finds the script exhausted does not move it.
        self._position = 0
        self.by_call: dict[tuple[int, int], ScriptedTurn] = {}
        if isinstance(turns, Mapping):
            self.by_call = {key: _as_turn(turn) for key, turn in sorted(turns.items())}
            self.add(*self.by_call.values())
        else:
            self.add(*turns)

    def __repr__(self) -> str:
        return f"ScriptedLLM(turns={len(self.turns)}, calls={self.calls}, cycle={self.cycle})"

    def add(self, *turns: ScriptedTurn | str) -> None:
        """Append turns to the script."""
        self.turns.extend(_as_turn(t) for t in turns)

    async def complete(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        max_tokens: int,
        timeouts: StreamTimeouts | None = None,
        on_event: OnEvent | None = None,
        **params: Any,
    ) -> LLMReply:
        """Replay the next turn (or the turn of this call's step and number) through the stream guard.

        Raises:
            LLMTimeout: the turn stalls, trickles or never answers past ``timeouts``.
            TransientError | PermanentError | LLMConfigurationError: an `ScriptedTurn.http_error` turn.
            ScriptExhausted: no turn left and ``cycle`` is off.
            BaseException: whatever an `ScriptedTurn.error` turn holds.
        """
        self.calls += 1
        self.requests.append(ScriptedRequest(model, tuple(messages), max_tokens, dict(params)))
        turn = self._next_turn()
        if turn.exception is not None:
            raise turn.exception
        if turn.body is not None and turn.status == 200:
            raise PermanentError(
                f"the model server answered 200 with {turn.content_type or 'no content type'}, not a "
                "stream of SSE (Server-Sent Events)"
            )
        if turn.status != 200:
            raise error_for_status(
                turn.status,
                error_type=turn.error_type,
                message=turn.error_message if turn.body is None else turn.body[:200],
                retry_after=turn.retry_after,
            )
        return await collect_reply(
            _replay(turn, turn.stream_events(model=model, messages=messages)),
            timeouts or self.timeouts,
            prices=self.prices,
            model=model,
            on_event=on_event,
        )

    async def aclose(self) -> None:
        """Nothing to release."""

    def _next_turn(self) -> ScriptedTurn:
        address = CURRENT_CALL.get()
        if self.by_call and address is not None:
            turn = self.by_call.get((address.step, address.call))
            if turn is None:
                raise ScriptExhausted(
                    f"ScriptedLLM has no turn for step {address.step}, call {address.call} "
                    f"(scripted: {sorted(self.by_call)})"
                )
            return turn
        position = self._position
        if position >= len(self.turns) and not (self.cycle and self.turns):
            raise ScriptExhausted(
                f"ScriptedLLM has {len(self.turns)} scripted turn(s) and got call #{self.calls}: "
                "add turns (ScriptedLLM.add) or pass cycle=True"
            )
        self._position += 1
        return self.turns[position % len(self.turns)]


def _as_turn(turn: ScriptedTurn | str) -> ScriptedTurn:
    return ScriptedTurn.text(turn) if isinstance(turn, str) else turn


async def _replay(turn: ScriptedTurn, events: Sequence[ScriptedEvent]) -> AsyncIterator[Mapping[str, Any]]:
    if not turn.answer:
        await anyio.sleep_forever()
    for scripted in events:
        if scripted.delay > 0:
            await anyio.sleep(scripted.delay)
        yield scripted.event
    if turn.after == "stall":
        await anyio.sleep_forever()
    elif turn.after == "trickle":
        while True:
            await anyio.sleep(turn.trickle_interval)
            yield _PING
