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
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import orjson

from agentlife._llm._protocol import INVOCATION_HEADER
from agentlife._llm._scripted import ScriptedTurn

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["FakeModelServer", "FakeRequest", "Script", "TurnLike"]

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
    ) -> None:
        self.requests: list[FakeRequest] = []
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
