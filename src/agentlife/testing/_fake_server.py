"""What the fake model servers share: the HTTP server, the script, and the record of what happened.

`FakeAnthropicServer` and `FakeOpenAIServer` differ only in the wire format; both are driven by the same
`ScriptedTurn`s, answer each request with a turn picked the same way, and record the same things.

A script is either a list of turns, one per request in order, or a mapping ``{(step, call): turn}``. With
a mapping, a request carrying ``x-agentlife-invocation: {job_id}/{step}/{call}`` (every ``ctx.llm`` call
sends it) is answered by that call's turn, so a process that resumes a job mid-way gets the turns of where
the job is, and a re-sent request gets the same answer again; a request without the header gets the
mapping's turns in key order. A mapping value may be a list of turns: the n-th request of that call gets
the n-th (the last one repeats), so "stall, then answer" can be scripted for one call.

A `ScriptedTurn.raw` turn is answered with its body as it is (a proxy's HTML page with status 200, a 502
page), whatever the format the server speaks.

With ``limits=`` (`ProviderLimits`) the server enforces an account's limits per minute as the providers
do, with token buckets that refill continuously: a request past them gets a 429 in the provider's shape
(its error body, ``retry-after``, its rate-limit headers), and every answer carries the rate-limit headers.
``latency=(low, high)`` delays each answer by a uniform draw in that range, like a real API's time to
first token.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import orjson

from agentlife._llm._protocol import INVOCATION_HEADER
from agentlife._llm._scripted import ScriptedTurn, estimate_tokens, output_text

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["FakeModelServer", "FakeRequest", "ProviderLimits", "RateState", "Script", "TurnLike"]

_SECRET_HEADERS = frozenset({"x-api-key", "authorization", "proxy-authorization"})

TurnLike = ScriptedTurn | str
#: A list of turns, or turns addressed by ``(step, call)`` (a list there: one per request of that call).
Script = Iterable[TurnLike] | Mapping[tuple[int, int], TurnLike | Sequence[TurnLike]]
S = TypeVar("S", bound="FakeModelServer")


@dataclass(frozen=True, slots=True)
class FakeRequest:
    """One request a fake server received."""

    number: int
    """Its position, from 0."""
    path: str
    """The URL path (``/v1/messages``, ``/v1/chat/completions``)."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """The request headers, lower-cased, with credentials replaced by ``***``."""
    body: Mapping[str, Any] = field(default_factory=dict)
    """The JSON body (model, messages, max_tokens, stream ...)."""
    invocation: str | None = None
    """The ``x-agentlife-invocation`` header (``{job_id}/{step}/{call}``), or None."""


@dataclass(frozen=True, slots=True)
class ProviderLimits:
    """An account's limits per minute, as a fake server enforces them (None: not limited)."""

    requests_per_minute: int | None = None
    """Requests a minute (RPM)."""
    input_tokens_per_minute: int | None = None
    """Input tokens a minute (ITPM; the OpenAI fake reports them as its ``tokens``)."""
    output_tokens_per_minute: int | None = None
    """Output tokens a minute (OTPM)."""


@dataclass(frozen=True, slots=True)
class RateState:
    """One dimension of the account as a response reports it."""

    name: str
    """``requests``, ``input-tokens`` or ``output-tokens``."""
    limit: int
    """Its limit per minute."""
    remaining: int
    """What is left now."""
    reset_seconds: float
    """Seconds until it is full again."""


class _Buckets:
    """Token buckets per dimension that refill continuously (Anthropic's algorithm), on one clock."""

    _NAMES = ("requests", "input-tokens", "output-tokens")

    def __init__(self, limits: ProviderLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self._caps = (
            limits.requests_per_minute,
            limits.input_tokens_per_minute,
            limits.output_tokens_per_minute,
        )
        for cap in self._caps:
            if cap is not None and not cap >= 1:
                raise ValueError(f"a limit per minute must be >= 1, got {cap}")
        self._clock = clock
        self._levels = [float(cap or 0) for cap in self._caps]
        self._at = clock()

    def _refill(self) -> None:
        now = self._clock()
        elapsed, self._at = max(0.0, now - self._at), now
        for i, cap in enumerate(self._caps):
            if cap is not None:
                self._levels[i] = min(float(cap), self._levels[i] + cap * elapsed / 60.0)

    def admit(self, input_tokens: int) -> float:
        """Take one request of ``input_tokens``: 0 when admitted, else the seconds until it would be."""
        self._refill()
        need = (1.0, float(input_tokens), 1.0)
        wait = 0.0
        for i, cap in enumerate(self._caps):
            if cap is not None and self._levels[i] < min(need[i], cap):
                wait = max(wait, (min(need[i], cap) - self._levels[i]) * 60.0 / cap)
        if wait > 0:
            return wait
        for i, cap in enumerate(self._caps):
            if cap is not None and i < 2:
                self._levels[i] = max(0.0, self._levels[i] - need[i])
        return 0.0

    def spend(self, requests: int, input_tokens: int, output_tokens: int) -> None:
        """Capacity used by someone else (each level stops at 0)."""
        self._refill()
        for i, amount in enumerate((requests, input_tokens, output_tokens)):
            if self._caps[i] is not None:
                self._levels[i] = max(0.0, self._levels[i] - amount)

    def charge_output(self, tokens: int) -> None:
        """The output tokens of an answer, once known (the bucket may go to 0, never below)."""
        self._refill()
        if self._caps[2] is not None:
            self._levels[2] = max(0.0, self._levels[2] - tokens)

    def states(self) -> list[RateState]:
        """Each limited dimension as the rate-limit headers report it."""
        self._refill()
        return [
            RateState(name, cap, int(self._levels[i]), (cap - self._levels[i]) * 60.0 / cap)
            for i, (name, cap) in enumerate(zip(self._NAMES, self._caps, strict=True))
            if cap is not None
        ]


class NoTurn(Exception):
    """No scripted turn answers a request (the server sends a 400 that says so, never retried)."""


class FakeModelServer:
    """The common part of the fake model servers; subclasses speak a wire format.

    Args:
        script: the turns, as a list (one per request, in order; more with `enqueue`) or a mapping
            ``{(step, call): turn or [turns]}``; a string stands for ``ScriptedTurn.text(string)``.
        api_key: when set, requests without this key get a 401, like the real API.
        host: the address to listen on (loopback by default).
        port: the port (0: any free one; read `base_url`).
        default_turn: the answer when the script has none for a request (None: a 400 saying so).
        on_request: called with each `FakeRequest` as it arrives (the CLI's ``--requests-log``).
        limits: the account's limits per minute, enforced (None: none).
        latency: ``(low, high)`` seconds each answer waits before it starts (None: none).
    """

    #: The name in messages; the routes and the format come from the subclass.
    kind = "FakeModelServer"
    #: Appended to ``http://host:port`` in `base_url`.
    url_suffix = ""

    def __init__(
        self,
        script: Script = (),
        *,
        api_key: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        default_turn: TurnLike | None = None,
        on_request: Callable[[FakeRequest], None] | None = None,
        limits: ProviderLimits | None = None,
        latency: tuple[float, float] | None = None,
    ) -> None:
        self.requests: list[FakeRequest] = []
        self._buckets = _Buckets(limits) if limits is not None else None
        if latency is not None and not 0 <= latency[0] <= latency[1] < math.inf:
            raise ValueError(f"latency must be (low, high) with 0 <= low <= high, got {latency}")
        self._latency = latency
        #: How many requests got a 429 because they were past ``limits``.
        self.rate_limited = 0
        #: ``(monotonic time, input tokens, output tokens)`` of each answer admitted under ``limits``.
        self.admitted: list[tuple[float, int, int]] = []
        self._answer_headers: dict[int, dict[str, str]] = {}
        self._script: list[ScriptedTurn] = []
        self._by_call: dict[tuple[int, int], tuple[ScriptedTurn, ...]] = {}
        self._default = self._checked(default_turn) if default_turn is not None else None
        self._on_request = on_request
        self._api_key = api_key
        self._host = host
        self._port = port
        self._runner: web.AppRunner | None = None
        self._disconnected: list[int] = []
        self._completed: list[int] = []
        self._calls: Counter[tuple[int, int]] = Counter()
        # Made in start(): older anyio versions need a running event loop to create an Event.
        self._changed: anyio.Event | None = None
        self._stopping: anyio.Event | None = None
        if isinstance(script, Mapping):
            for key in sorted(script):
                value = script[key]
                turns = [value] if isinstance(value, (ScriptedTurn, str)) else list(value)
                if not turns:
                    raise ValueError(f"no turn for step {key[0]}, call {key[1]}")
                self._by_call[key] = tuple(self._checked(t) for t in turns)
                self._script.extend(self._by_call[key])
        else:
            self.enqueue(*script)

    # --- lifecycle --------------------------------------------------------------------------------

    async def __aenter__(self: S) -> S:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def _routes(self, app: web.Application) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        """Start listening (`base_url` is valid afterwards)."""
        if self._runner is not None:
            raise RuntimeError(f"{self.kind} is already started")
        from aiohttp import web

        self._changed, self._stopping = anyio.Event(), anyio.Event()
        app = web.Application()
        self._routes(app)
        # handler_cancellation: a client that hangs up cancels its handler, which is how we see it go.
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._port)
        await site.start()
        self._runner = runner
        self._port = int(runner.addresses[0][1])

    async def close(self) -> None:
        """Stop: hanging responses end, connections close (idempotent)."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        assert self._stopping is not None
        self._stopping.set()
        with anyio.move_on_after(5.0, shield=True):
            await runner.cleanup()

    @property
    def base_url(self) -> str:
        """The URL to point a client at (``http://127.0.0.1:PORT``, plus ``/v1`` for the OpenAI fake)."""
        if self._runner is None:
            raise RuntimeError(f"{self.kind} is not started")
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}{self.url_suffix}"

    # --- script and observations ------------------------------------------------------------------

    def enqueue(self, *turns: TurnLike) -> None:
        """Append turns to the script (one per future request without an addressed turn)."""
        self._script.extend(self._checked(turn) for turn in turns)

    @staticmethod
    def _checked(turn: TurnLike) -> ScriptedTurn:
        turn = ScriptedTurn.text(turn) if isinstance(turn, str) else turn
        if turn.exception is not None:
            raise TypeError("ScriptedTurn.error() cannot be sent over HTTP; use ScriptedTurn.http_error()")
        return turn

    @property
    def pending(self) -> int:
        """How many scripted turns are still unused by requests without an invocation header."""
        return len(self._script)

    @property
    def disconnects(self) -> int:
        """How many responses the client abandoned before they were complete (it closed the connection)."""
        return len(self._disconnected)

    @property
    def disconnected_requests(self) -> tuple[int, ...]:
        """The numbers of the requests whose client hung up, in the order it happened."""
        return tuple(self._disconnected)

    @property
    def completed(self) -> int:
        """How many responses were sent in full."""
        return len(self._completed)

    def spend(self, *, requests: int = 0, input_tokens: int = 0, output_tokens: int = 0) -> None:
        """Use the account's capacity as another client of it would (needs ``limits=``)."""
        if self._buckets is None:
            raise RuntimeError(f"{self.kind} has no limits to spend")
        self._buckets.spend(requests, input_tokens, output_tokens)

    def requests_by_invocation(self) -> dict[str, int]:
        """How many requests arrived per ``x-agentlife-invocation`` value: more than 1 means re-sent."""
        counts = Counter(r.invocation for r in self.requests if r.invocation is not None)
        return dict(counts)

    async def wait_for_disconnects(self, count: int = 1, *, timeout: float = 5.0) -> None:
        """Wait until at least ``count`` clients hung up.

        Raises:
            TimeoutError: not within ``timeout`` seconds.
        """
        await self._wait_until(lambda: len(self._disconnected) >= count, timeout)

    async def wait_for_requests(self, count: int = 1, *, timeout: float = 5.0) -> None:
        """Wait until at least ``count`` requests arrived.

        Raises:
            TimeoutError: not within ``timeout`` seconds.
        """
        await self._wait_until(lambda: len(self.requests) >= count, timeout)

    async def _wait_until(self, condition: Callable[[], bool], timeout: float) -> None:
        with anyio.fail_after(timeout):
            while not condition():
                if self._changed is None:
                    raise RuntimeError(f"{self.kind} is not started")
                await self._changed.wait()

    def _notify(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        if changed is not None:
            changed.set()

    def _is_stopping(self) -> bool:
        return self._stopping is not None and self._stopping.is_set()

    # --- serving ----------------------------------------------------------------------------------

    def _next_turn(self, request: FakeRequest) -> ScriptedTurn:
        address = _address(request.invocation)
        if self._by_call and address is not None:
            turns = self._by_call.get(address)
            if turns is None:
                raise NoTurn(
                    f"{self.kind}: no scripted turn for step {address[0]}, call {address[1]} "
                    f"(scripted: {sorted(self._by_call)})"
                )
            seen = self._calls[address]
            self._calls[address] += 1
            return turns[min(seen, len(turns) - 1)]
        if self._script:
            return self._script.pop(0)
        if self._default is not None:
            return self._default
        raise NoTurn(f"{self.kind}: no scripted turn left for request #{request.number}")

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        number = len(self.requests)
        body = await _json_body(request)
        invocation = request.headers.get(INVOCATION_HEADER)
        record = FakeRequest(number, request.path, _safe_headers(request.headers), body, invocation)
        self.requests.append(record)
        if self._on_request is not None:
            self._on_request(record)
        self._notify()
        try:
            if self._api_key is not None and not _authenticated(request.headers, self._api_key):
                return self._error(401, None, "invalid API key", None)
            try:
                turn = self._next_turn(record)
            except NoTurn as exc:
                return self._error(400, None, str(exc), None)
            if self._buckets is not None and turn.status == 200 and turn.body is None:
                refused = self._take_capacity(request, turn, body)
                if refused is not None:
                    return refused
            if self._latency is not None:
                await anyio.sleep(random.uniform(*self._latency))
            if turn.body is not None:
                response = _raw_response(turn)
            else:
                response = await self._respond(request, turn, body)
        except (asyncio.CancelledError, ConnectionError):
            if not self._is_stopping():
                self._disconnected.append(number)
                self._notify()
            raise
        self._completed.append(number)
        self._notify()
        return response

    def _take_capacity(
        self, request: web.Request, turn: ScriptedTurn, body: Mapping[str, Any]
    ) -> web.StreamResponse | None:
        """Admit the request under ``limits`` (its rate-limit headers kept for the answer), or its 429."""
        assert self._buckets is not None
        input_tokens = request_input_tokens(body)
        wait = self._buckets.admit(input_tokens)
        if wait > 0:
            self.rate_limited += 1
            return self._rate_limited(self._buckets.states(), wait, body)
        output_tokens = turn_output_tokens(turn)
        self._buckets.charge_output(output_tokens)
        self.admitted.append((time.monotonic(), input_tokens, output_tokens))
        self._answer_headers[id(request)] = self._rate_headers(self._buckets.states())
        return None

    def _headers_for(self, request: web.Request) -> dict[str, str]:
        """The rate-limit headers the answer to ``request`` carries (none without ``limits``)."""
        return self._answer_headers.pop(id(request), {})

    def _rate_headers(self, states: list[RateState]) -> dict[str, str]:
        """The provider's rate-limit headers for ``states``."""
        raise NotImplementedError

    def _rate_limited(
        self, states: list[RateState], wait: float, body: Mapping[str, Any]
    ) -> web.StreamResponse:
        """The provider's 429 for a request ``wait`` seconds early."""
        raise NotImplementedError

    async def _respond(
        self, request: web.Request, turn: ScriptedTurn, body: Mapping[str, Any]
    ) -> web.StreamResponse:
        raise NotImplementedError

    def _error(
        self, status: int, error_type: str | None, message: str | None, retry_after: float | None
    ) -> web.StreamResponse:
        raise NotImplementedError

    async def _hang(self) -> None:
        """Keep the connection open and silent until the client leaves (cancelling us) or the server stops."""
        assert self._stopping is not None
        await self._stopping.wait()

    async def _stopping_response(self) -> web.StreamResponse:
        from aiohttp import web

        await self._hang()
        return web.Response(status=503, text=f"{self.kind} is stopping")


def _raw_response(turn: ScriptedTurn) -> web.StreamResponse:
    """A `ScriptedTurn.raw` answer: the body as it is, whatever the wire format of the server."""
    from aiohttp import web

    assert turn.body is not None
    return web.Response(
        status=turn.status, body=turn.body.encode(), headers={"content-type": turn.content_type}
    )


def _address(invocation: str | None) -> tuple[int, int] | None:
    """``(step, call)`` of a ``{job_id}/{step}/{call}`` header value (a job id holds no ``/``)."""
    if not invocation:
        return None
    parts = invocation.rsplit("/", 2)
    if len(parts) != 3:
        return None
    try:
        return int(parts[1]), int(parts[2])
    except ValueError:
        return None


def _authenticated(headers: Mapping[str, str], api_key: str) -> bool:
    # The SDKs send the key as x-api-key or as a bearer token.
    return headers.get("x-api-key") == api_key or headers.get("authorization") == f"Bearer {api_key}"


def _safe_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): ("***" if k.lower() in _SECRET_HEADERS else v) for k, v in headers.items()}


async def _json_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    try:
        body = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        return {}
    return body if isinstance(body, dict) else {}


def request_input_tokens(body: Mapping[str, Any]) -> int:
    """The input tokens a fake counts for a request: the scripted usage's estimate of its messages."""
    return estimate_tokens(orjson.dumps(body.get("messages") or [], default=str).decode())


def turn_output_tokens(turn: ScriptedTurn) -> int:
    """The output tokens a fake counts for a turn's answer: what its usage reports (or estimates)."""
    if turn.estimate_usage:
        return estimate_tokens(output_text(turn.events))
    for scripted in turn.events:
        event = scripted.event
        usage = event.get("usage") if event.get("type") == "message_delta" else None
        if isinstance(usage, Mapping) and isinstance(usage.get("output_tokens"), int):
            return int(usage["output_tokens"])
    return 0
