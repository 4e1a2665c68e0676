"""The console's HTTP API: JSON routes under ``/api/v1/``, its event stream and its OpenAPI document.

`ROUTES` is the one table of what is served: `add_routes` adds each to the application and `openapi`
writes the document from it, so the two cannot disagree. Reads are open as the console's pages are; a
write (POST) needs ``Authorization: Bearer`` with the console's token (``AGENTLIFE_CONSOLE_TOKEN``,
compared in constant time), a console started with ``--allow-actions``, a JSON body of at most
`MAX_BODY` bytes, and, from a browser, the console's own origin. Every error is JSON with one message
and its status: 400 bad input, 401 no token, 403 a wrong token or writes off, 404, 405, 409 a conflict
with the job's status, 413, 415, 503 the store. Everything a response holds from the store is masked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hmac
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol

import anyio
import orjson
from aiohttp import web

from agentlife._client._client import Client
from agentlife._client._views import JobSnapshot, JobSummary
from agentlife._console._actor import request_actor
from agentlife._console._data import BadRequest
from agentlife._console._openapi import (
    DEFAULT_WAIT,
    MAX_LIMIT,
    MAX_WAIT,
    PREFIX,
    ROUTES,
    openapi,
)
from agentlife._console._ops import ConsoleClients
from agentlife._console._proxy import ProxyConfig
from agentlife._console._sse import Fanout, FellBehind, Frame, SseLimits, StreamLimit, comment, retry
from agentlife._console._store import NotRecorded
from agentlife._exceptions import (
    ConfigError,
    JobCancelled,
    JobDeadLettered,
    JobFailed,
    JobNotFound,
    JobStateConflict,
    ResultTimeout,
    StoreError,
    describe_error,
)
from agentlife._jobs._batch import selection_digest
from agentlife._jobs._mask import Masker
from agentlife.stores import JobStatus

__all__ = ["MAX_BODY", "Api", "ApiError", "add_routes", "same_origin"]

log = logging.getLogger("agentlife.console")

#: The largest request body accepted (a job's payload, an event's).
MAX_BODY = 1024 * 1024
_ENDED: dict[type[JobFailed], str] = {JobCancelled: "job_cancelled", JobDeadLettered: "job_dead_letter"}
#: The newest crash records a job's answer holds.
MAX_ERRORS = 20


class Follower(Protocol):
    """What a job's event stream reads: the job's events after a cursor, and the check of both."""

    async def check(self, job_id: str, after: str | None) -> int | None:
        """The order of ``after`` (`ConfigError` for a bad one, `JobNotFound` for no such job)."""

    def follow(self, job_id: str, after: str | None) -> AsyncIterator[Frame]:
        """The job's events after ``after`` (None: from its first), ending after its end."""


class ApiError(Exception):
    """An answer other than success: its status, a short code and one line saying why."""

    def __init__(self, status: int, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.extra = status, code, message, extra


_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Api:
    """The routes' handlers: each calls one operation of `agentlife.Client`; one per console."""

    def __init__(
        self,
        clients: ConsoleClients,
        follower: Follower,
        masker: Masker,
        token: str | None,
        fanout: Callable[[], Fanout],
        limits: SseLimits,
    ) -> None:
        self.clients, self.follower, self.masker, self.token = clients, follower, masker, token
        self.fanout, self.limits = fanout, limits
        #: The header the proxy in front sets to the person acting (`request_actor`); None: trust none.
        self.actor_header: str | None = None
        #: The peers whose headers count (`ProxyConfig.trusts`).
        self.proxy = ProxyConfig()

    # -- reads --------------------------------------------------------------------------------------------

    async def document(self, request: web.Request) -> web.StreamResponse:
        return _json(openapi())

    async def list_jobs(self, request: web.Request) -> web.StreamResponse:
        query = request.query
        limit = _integer(query.get("limit"), "limit", 1, MAX_LIMIT, 50)
        client = await self.clients.get()
        page = await client.list(
            status=query.get("status") or None,
            agent_id=query.get("agent") or None,
            limit=limit,
            after=query.get("after") or None,
        )
        jobs = [self._shown(job) for job in page.jobs]
        return _json({"jobs": jobs, "next_cursor": page.next_cursor})

    async def get(self, request: web.Request) -> web.StreamResponse:
        job_id = _path_id(request)
        client = await self.clients.get()
        return _json(self._shown(await client.get(job_id)))

    async def result(self, request: web.Request) -> web.StreamResponse:
        job_id = _path_id(request)
        timeout = _seconds(request.query.get("timeout"), "timeout", MAX_WAIT, DEFAULT_WAIT)
        client = await self.clients.get()
        try:
            result = await client.result(job_id, timeout)
        except ResultTimeout as exc:
            return _json({"job_id": job_id, "status": self.masker.text(exc.status, 100)}, status=202)
        except JobFailed as exc:
            code = _ENDED.get(type(exc), "job_failed")
            last = self.masker.whole(exc.last_error) if exc.last_error is not None else None
            raise ApiError(
                409, code, str(exc), job_id=job_id, job_status=exc.status, last_error=last
            ) from None
        shown = {"job_id": job_id, "status": str(JobStatus.COMPLETED), "result": self.masker.whole(result)}
        return _json(shown)

    # -- writes -------------------------------------------------------------------------------------------

    async def start(self, request: web.Request) -> web.StreamResponse:
        body = await _body(request, {"agent_id", "payload", "job_id", "concurrency_key", "priority"})
        client = await self.clients.get()
        agent_id: Any = body.get("agent_id")  # the client checks each: a wrong type is its ConfigError
        handle = await client.start(
            agent_id,
            body.get("payload"),
            job_id=body.get("job_id"),
            concurrency_key=body.get("concurrency_key"),
            priority=body.get("priority", 0),
        )
        await self.clients.confirm(client)
        return _json(self._shown(await client.get(handle.job_id)))

    async def send(self, request: web.Request) -> web.StreamResponse:
        job_id = _path_id(request)
        body = await _body(request, {"name", "payload"})
        client = await self.clients.get()
        name: Any = body.get("name")
        seq = await client.send(job_id, name, body.get("payload"))
        await self.clients.confirm(client)
        return _json({"job_id": job_id, "name": self.masker.text(name, 200), "seq": seq})

    async def approve(self, request: web.Request) -> web.StreamResponse:
        job_id = _path_id(request)
        body = await _body(request, {"call"})
        actor = self.actor(request)
        client = await self.clients.get()
        return await self._acted(client, await client.approve(job_id, call=body.get("call"), actor=actor))

    async def reject(self, request: web.Request) -> web.StreamResponse:
        job_id, actor = _path_id(request), self.actor(request)
        reason = _reason(await _body(request, {"reason"}))
        client = await self.clients.get()
        return await self._acted(client, await client.reject(job_id, *reason, actor=actor))

    async def cancel(self, request: web.Request) -> web.StreamResponse:
        job_id, actor = _path_id(request), self.actor(request)
        reason = _reason(await _body(request, {"reason"}))
        client = await self.clients.get()
        return await self._acted(client, await client.cancel(job_id, *reason, actor=actor))

    async def retry(self, request: web.Request) -> web.StreamResponse:
        job_id, actor = _path_id(request), self.actor(request)
        await _body(request, set())
        client = await self.clients.get()
        return await self._acted(client, await client.retry(job_id, actor=actor))

    async def pause(self, request: web.Request) -> web.StreamResponse:
        job_id, actor = _path_id(request), self.actor(request)
        body = await _body(request, {"reason"})
        client = await self.clients.get()
        return await self._acted(client, await client.pause(job_id, *_reason(body), actor=actor))

    async def resume(self, request: web.Request) -> web.StreamResponse:
        job_id, actor = _path_id(request), self.actor(request)
        await _body(request, set())
        client = await self.clients.get()
        return await self._acted(client, await client.resume(job_id, actor=actor))

    async def rewind(self, request: web.Request) -> web.StreamResponse:
        job_id, actor = _path_id(request), self.actor(request)
        body = await _body(request, {"to_step", "as_job_id", "force", "reason"})
        force = body.get("force", False)
        if not isinstance(force, bool):
            raise ApiError(400, "bad_request", "force must be true or false")
        client = await self.clients.get()
        to_step: Any = body.get("to_step")  # the client checks it: anything but a step number is a 400
        job = await client.rewind(
            job_id,
            to_step,
            as_job_id=body.get("as_job_id"),
            force=force,
            reason=body.get("reason"),
            actor=actor,
        )
        return await self._acted(client, job)

    async def batch(self, request: web.Request) -> web.StreamResponse:
        action, actor = request.match_info["action"], self.actor(request)
        body = await _body(request, _BATCH_FIELDS)
        client = await self.clients.get()
        ids = await client.select(action, **_selection(body))
        shown = [self.masker.text(job_id, 200) for job_id in ids]
        digest = selection_digest(ids)
        answer: dict[str, Any] = {
            "action": action,
            "count": len(ids),
            "digest": digest,
            "job_ids": shown,
            "done": [],
        }
        if body.get("dry_run", False) is True:
            return _json({**answer, "skipped": []})
        expect, given = body.get("expect"), body.get("digest")
        if isinstance(expect, bool) or not isinstance(expect, int):
            raise ApiError(400, "bad_request", "expect must be the count the dry run answered")
        if given is not None and not isinstance(given, str):
            raise ApiError(400, "bad_request", "digest must be the text the dry run answered")
        if expect != len(ids) or (given is not None and given != digest):
            raise ApiError(
                409,
                "count_changed",
                f"the selection now names {len(ids)} jobs, not the {expect} confirmed (expect, digest): "
                "look again (dry_run) and confirm those jobs",
            )
        report = await client.act_many(action, ids, reason=body.get("reason") or None, actor=actor)
        await self.clients.confirm(client)
        done = [self.masker.text(job_id, 200) for job_id in report.done]
        skipped = [
            {"job_id": self.masker.text(j, 200), "reason": self.masker.text(r, 500)}
            for j, r in report.skipped
        ]
        return _json({**answer, "done": done, "skipped": skipped})

    def actor(self, request: web.Request) -> str:
        """Who makes this write (`request_actor`)."""
        return request_actor(request, self.actor_header, self.proxy)

    async def _acted(self, client: Client, job: JobSummary) -> web.StreamResponse:
        await self.clients.confirm(client)
        return _json(self._shown(job))

    def authorize(self, request: web.Request) -> None:
        """`ApiError` unless a write is allowed: writes on, the right token, the console's own origin."""
        if self.token is None:
            raise ApiError(
                403, "writes_off", "writes are off: the console was started without --allow-actions"
            )
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise ApiError(401, "token_missing", "a write needs the header Authorization: Bearer <token>")
        expected = self.token.encode("utf-8", "surrogatepass")
        if not hmac.compare_digest(given.strip().encode("utf-8", "surrogatepass"), expected):
            raise ApiError(403, "token_wrong", "the token is not the console's")
        if not same_origin(request):
            raise ApiError(403, "cross_origin", "a browser may write only from the console's own pages")

    # -- the event stream ---------------------------------------------------------------------------------

    async def events(self, request: web.Request) -> web.StreamResponse:
        job_id = _path_id(request)
        after = request.headers.get("Last-Event-ID") or request.query.get("after") or None
        if after is not None and (len(after) > 1024 or not after.isprintable()):
            raise BadRequest("the cursor is not one of this job's events (Last-Event-ID or ?after=)")
        seq = await self.follower.check(job_id, after)
        try:
            async with self.fanout().stream(job_id, after, seq) as frames:
                response = web.StreamResponse(headers=_SSE_HEADERS)
                await response.prepare(request)
                await self._send(response, retry(self.limits.retry_ms))
                read = await self._pump(response, frames)
                if not read and request.transport is not None:
                    # A client that does not read would hold the handler in the response's last write
                    # for ever: the connection is dropped instead.
                    request.transport.abort()
                return response
        except StreamLimit as exc:
            raise ApiError(503, "too_many_streams", str(exc)) from None

    async def _pump(self, response: web.StreamResponse, frames: AsyncIterator[Frame]) -> bool:
        """Write frames as they come, a heartbeat when quiet; end on the job's end, a lag or a deaf client.

        False when the client went away or stopped reading.

        The frames are read in a task of their own and handed over one at a time: a heartbeat's timeout
        then cancels only the wait for the next frame, never the iterator (which a cancel would end).
        """
        send, receive = anyio.create_memory_object_stream[Frame](0)
        failure: list[BaseException] = []

        async def read() -> None:
            async with send:
                try:
                    async for item in frames:
                        await send.send(item)
                except Exception as exc:  # the stream says so and ends; the client may rejoin
                    failure.append(exc)

        gone = False
        try:
            async with anyio.create_task_group() as tasks, receive:
                tasks.start_soon(read)
                try:
                    await self._write_frames(response, receive)
                except (TimeoutError, ConnectionError) as exc:  # a client that left or does not read
                    log.info("console: an event stream's client went away: %s", type(exc).__name__)
                    gone = True
                tasks.cancel_scope.cancel()
        finally:
            await frames.aclose()  # type: ignore[attr-defined]
        if failure and not gone:
            await self._say_failed(response, failure[0])
        return not gone

    async def _write_frames(self, response: web.StreamResponse, receive: Any) -> None:
        while True:
            item: Frame | None = None
            with anyio.move_on_after(self.limits.heartbeat):
                try:
                    item = await receive.receive()
                except anyio.EndOfStream:
                    return
            if item is None:
                await self._send(response, comment("keep-alive"))
                continue
            await self._send(response, item.encode())
            if item.last:
                return

    async def _say_failed(self, response: web.StreamResponse, exc: BaseException) -> None:
        if isinstance(exc, FellBehind):
            log.info("console: an event stream closed: %s", exc)
            note = "this stream fell behind; reconnect with Last-Event-ID"
        else:
            log.warning("console: an event stream failed: %s", self.masker.text(describe_error(exc), 500))
            note = "the job's events could not be read; reconnect with Last-Event-ID"
        with contextlib.suppress(TimeoutError, ConnectionError):
            await self._send(response, comment(note))

    async def _send(self, response: web.StreamResponse, chunk: bytes) -> None:
        with anyio.fail_after(self.limits.write_timeout):
            await response.write(chunk)

    # -- answers ------------------------------------------------------------------------------------------

    def _shown(self, job: JobSnapshot | JobSummary) -> dict[str, Any]:
        """A job's record as JSON, every value masked (its fields keep the client's names)."""
        fields = {f.name: _plain(getattr(job, f.name)) for f in dataclasses.fields(job)}
        fields["finished"] = job.finished
        if "errors" in fields:
            fields["errors"] = fields["errors"][-MAX_ERRORS:]
        # Masked, never cut: the store bounds what it keeps, and a client must get back what it stored.
        return {name: self.masker.whole(value) for name, value in fields.items()}

    async def answer(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        """The handler's response, or the JSON error that says why there is none."""
        try:
            return await handler(request)
        except ApiError as exc:
            return self.error(exc.status, exc.code, exc.message, exc.extra)
        except (BadRequest, ConfigError) as exc:
            return self.error(400, "bad_request", str(exc))
        except JobNotFound as exc:
            return self.error(404, "not_found", str(exc))
        except JobStateConflict as exc:
            return self.error(409, "conflict", str(exc))
        except web.HTTPException as exc:
            return self.error(exc.status, exc.reason.lower().replace(" ", "_"), exc.reason)
        except NotRecorded as exc:
            return self.error(503, "not_recorded", str(exc))
        except (StoreError, OSError) as exc:
            log.warning("console API: the store failed: %s", self.masker.text(describe_error(exc), 2000))
            return self.error(
                503, "store_unavailable", f"the job store cannot be read: {describe_error(exc)}"
            )
        except Exception as exc:  # a bug: one line in the log, a JSON answer without a traceback
            log.error("console API: internal error: %s", self.masker.text(describe_error(exc), 2000))
            return self.error(500, "internal", "the console failed on this request; see its log")

    def error(
        self, status: int, code: str, message: str, extra: dict[str, Any] | None = None
    ) -> web.Response:
        """The JSON error: ``{"error": {"status", "code", "message", ...}}``, masked."""
        body = {"status": status, "code": code, "message": self.masker.text(message, 2000), **(extra or {})}
        response = _json({"error": body}, status=status)
        if status == 401:
            response.headers["WWW-Authenticate"] = 'Bearer realm="agentlife"'
        return response


_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-store", "X-Accel-Buffering": "no"}


def add_routes(app: web.Application, api: Api, base: str = "") -> None:
    """Serve every route of `ROUTES` (and nothing else) under `PREFIX`, under the base path ``base``."""
    for route in ROUTES:
        handler = getattr(api, route.op)
        app.router.add_route(
            route.method, base + PREFIX + route.path, _authorized(api, handler) if route.write else handler
        )


def _authorized(api: Api, handler: _Handler) -> _Handler:
    async def write(request: web.Request) -> web.StreamResponse:
        api.authorize(request)  # before the body is read: a request without the token reads nothing
        return await handler(request)

    return write


def same_origin(request: web.Request) -> bool:
    """False unless a browser, when it says, says the request came from the console's own page.

    Each header counts only when sent once: a request carrying two ``Origin`` (or ``Sec-Fetch-Site``)
    headers is no browser's, and judging it by either one would let the other pass unseen.
    """
    sites, origins = request.headers.getall("Sec-Fetch-Site", []), request.headers.getall("Origin", [])
    if len(sites) > 1 or len(origins) > 1:
        return False
    if sites and sites[0] != "same-origin":
        return False
    return not origins or origins[0] == f"{request.scheme}://{request.host}"


# -- reading a request ---------------------------------------------------------------------------------------


async def _body(request: web.Request, allowed: set[str]) -> dict[str, Any]:
    """The JSON object a write carries (an empty body is ``{}``); 413, 415 or 400 for anything else."""
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise ApiError(413, "too_large", f"the body is over {MAX_BODY} bytes")
    raw = bytearray()
    while chunk := await request.content.read(65536):
        raw += chunk
        if len(raw) > MAX_BODY:
            raise ApiError(413, "too_large", f"the body is over {MAX_BODY} bytes")
    if not raw:
        body: Any = {}
    else:
        if request.content_type != "application/json":
            raise ApiError(415, "not_json", "the body must be JSON (Content-Type: application/json)")
        try:
            body = orjson.loads(bytes(raw))
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"the body is not JSON: {str(exc)[:200]}") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise BadRequest(
            f"unknown field {unknown[0][:100]!r}; allowed: {', '.join(sorted(allowed)) or 'none'}"
        )
    return body


_BATCH_FIELDS = {"ids", "status", "agent_id", "older_than", "limit", "dry_run", "expect", "digest", "reason"}


def _selection(body: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of `Client.select` a batch's body gives (the client checks each)."""
    if "dry_run" in body and not isinstance(body["dry_run"], bool):
        raise BadRequest("dry_run must be true or false")
    ids = body.get("ids")
    if ids is not None and (not isinstance(ids, list) or not all(isinstance(i, str) for i in ids)):
        raise BadRequest("ids must be a list of job ids")
    for name in ("status", "agent_id", "older_than"):
        if body.get(name) is not None and not isinstance(body[name], str):
            raise BadRequest(f"{name} must be text")
    status = body.get("status")
    selection: dict[str, Any] = {
        "status": status.upper() if isinstance(status, str) else None,
        "agent_id": body.get("agent_id"),
        "older_than": body.get("older_than"),
        "ids": ids,
    }
    if "limit" in body:
        selection["limit"] = body["limit"]
    return selection


def _reason(body: dict[str, Any]) -> tuple[Any, ...]:
    """The reason a body gives, as the client's argument (none given: the client's default)."""
    return () if body.get("reason") in (None, "") else (body["reason"],)


def _path_id(request: web.Request) -> str:
    """The job id of the path (the client checks it: a malformed one is a 400)."""
    return request.match_info["job_id"]


def _plain(value: Any) -> Any:
    """A record's value as JSON holds it: mappings as objects, tuples as arrays."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


def _integer(text: str | None, name: str, low: int, high: int, default: int) -> int:
    # Absent is the default; present but empty (``?limit=``, a template that rendered nothing) is an error.
    if text is None:
        return default
    if not (text.isascii() and text.isdigit()) or len(text) > 9 or not low <= int(text) <= high:
        raise BadRequest(f"{name} must be a whole number from {low} to {high}")
    return int(text)


def _seconds(text: str | None, name: str, high: float, default: float) -> float:
    if text is None:
        return default
    try:
        value = float(text) if text.isascii() else math.nan
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= high):
        raise BadRequest(f"{name} must be a number of seconds above 0 and at most {high:g}")
    return value


def _number(value: Any) -> float | int | None:
    """A number for JSON (a finite int or float), None for anything a row written by hand holds there."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value if abs(value) < 2**53 else None


def _json(value: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(value), status=status, content_type="application/json")
