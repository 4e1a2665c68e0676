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
import hmac
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import orjson
from aiohttp import web

from agentlife._console._data import MAX_ID, BadRequest, Cursors
from agentlife._console._openapi import (
    DEFAULT_WAIT,
    MAX_LIMIT,
    MAX_REASON,
    MAX_WAIT,
    PREFIX,
    ROUTES,
    STATUSES,
    openapi,
)
from agentlife._console._ops import Detail, Operations, Started
from agentlife._console._sse import Fanout, FellBehind, Frame, SseLimits, StreamLimit, comment, retry
from agentlife._console._store import NotRecorded
from agentlife._exceptions import ConfigError, JobNotFound, JobStateConflict, StoreError, describe_error
from agentlife._jobs._mask import Masker
from agentlife.stores import JobRecord, JobStatus

__all__ = ["MAX_BODY", "Api", "ApiError", "add_routes", "same_origin"]

log = logging.getLogger("agentlife.console")

#: The largest request body accepted (a job's payload, an event's).
MAX_BODY = 1024 * 1024
_ENDED = {"FAILED": "job_failed", "DEAD_LETTER": "job_dead_letter"}


class ApiError(Exception):
    """An answer other than success: its status, a short code and one line saying why."""

    def __init__(self, status: int, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.extra = status, code, message, extra


_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Api:
    """The routes' handlers over the `Operations` they call; one per console."""

    def __init__(
        self,
        ops: Operations,
        masker: Masker,
        token: str | None,
        fanout: Callable[[], Fanout],
        limits: SseLimits,
    ) -> None:
        self.ops, self.masker, self.token = ops, masker, token
        self.fanout, self.limits = fanout, limits
        self.cursors = Cursors()

    # -- reads --------------------------------------------------------------------------------------------

    async def document(self, request: web.Request) -> web.StreamResponse:
        return _json(openapi())

    async def list_jobs(self, request: web.Request) -> web.StreamResponse:
        query = request.query
        status = query.get("status") or None
        if status is not None and status not in STATUSES:
            raise BadRequest("status must be one of " + ", ".join(sorted(STATUSES)))
        agent = _id(query.get("agent"), "agent") if query.get("agent") else None
        limit = _integer(query.get("limit"), "limit", 1, MAX_LIMIT, 50)
        after = self.cursors.decode(query["after"]) if query.get("after") else None
        rows = await self.ops.list(status, agent, limit + 1, after)
        page = rows[:limit]
        cursor = self.cursors.encode(page[-1]) if len(rows) > limit and page else None
        return _json({"jobs": [self._job(row) for row in page], "next_cursor": cursor})

    async def get(self, request: web.Request) -> web.StreamResponse:
        job_id = _path_id(request)
        detail = await self.ops.get(job_id)
        if detail is None:
            raise JobNotFound(f"there is no job {job_id!r}")
        return _json(self._job(detail.row, detail))

    async def result(self, request: web.Request) -> web.StreamResponse:
        job_id = _path_id(request)
        timeout = _seconds(request.query.get("timeout"), "timeout", MAX_WAIT, DEFAULT_WAIT)
        row = await self.ops.result(job_id, timeout)
        if row is None:
            now = await self.ops.get(job_id)
            shown = self._job(now.row) if now is not None else None
            return _json(shown, status=202)
        if row.status != JobStatus.COMPLETED:
            crash = self.masker.value(row.error[-1]) if row.error else None
            code = _ENDED.get(row.status, "job_failed")
            raise ApiError(409, code, f"job {job_id} ended {row.status}", job=self._job(row), crash=crash)
        return _json(self._job(row))

    # -- writes -------------------------------------------------------------------------------------------

    async def start(self, request: web.Request) -> web.StreamResponse:
        body = await _body(request, {"agent_id", "payload", "job_id"})
        agent_id = _field(body, "agent_id", required=True)
        job_id = _field(body, "job_id")
        started: Started = await self.ops.start(agent_id, body.get("payload"), job_id)
        return _json(self._job(started.row), status=201 if started.created else 200)

    async def send(self, request: web.Request) -> web.StreamResponse:
        job_id = _path_id(request)
        body = await _body(request, {"name", "payload"})
        name = _field(body, "name", required=True)
        if not name.isprintable():
            raise BadRequest("an event name is printable text on one line")
        seq = await self.ops.send(job_id, name, body.get("payload"))
        return _json({"job_id": self.masker.text(job_id, MAX_ID), "name": self.masker.text(name), "seq": seq})

    async def approve(self, request: web.Request) -> web.StreamResponse:
        job_id = _path_id(request)
        body = await _body(request, {"call"})
        if "call" not in body:
            raise BadRequest("an approval names the call it approves: call (null when the job names none)")
        return _json(self._job(await self.ops.approve(job_id, _field(body, "call"))))

    async def reject(self, request: web.Request) -> web.StreamResponse:
        job_id = _path_id(request)
        reason = _reason(await _body(request, {"reason"})) or "approval rejected"
        return _json(self._job(await self.ops.reject(job_id, reason)))

    async def cancel(self, request: web.Request) -> web.StreamResponse:
        job_id = _path_id(request)
        reason = _reason(await _body(request, {"reason"})) or "cancelled by an operator"
        return _json(self._job(await self.ops.cancel(job_id, reason)))

    async def retry(self, request: web.Request) -> web.StreamResponse:
        job_id = _path_id(request)
        await _body(request, set())
        return _json(self._job(await self.ops.retry(job_id)))

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
        if after is not None:
            if len(after) > 1024 or not after.isprintable():
                raise BadRequest("the cursor is not one of this job's events (Last-Event-ID or ?after=)")
            self.ops.check_cursor(job_id, after)
        if await self.ops.get(job_id) is None:
            raise JobNotFound(f"there is no job {job_id!r}")
        try:
            async with self.fanout().stream(job_id, after) as frames:
                response = web.StreamResponse(headers=_SSE_HEADERS)
                await response.prepare(request)
                await self._send(response, retry(self.limits.retry_ms))
                await self._pump(response, frames)
                return response
        except StreamLimit as exc:
            raise ApiError(503, "too_many_streams", str(exc)) from None

    async def _pump(self, response: web.StreamResponse, frames: AsyncIterator[Frame]) -> None:
        """Write frames as they come, a heartbeat when quiet; end on the job's end, a lag or a deaf client.

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

        try:
            async with anyio.create_task_group() as tasks, receive:
                tasks.start_soon(read)
                await self._write_frames(response, receive)
                tasks.cancel_scope.cancel()
        except (TimeoutError, ConnectionError) as exc:
            log.info("console: an event stream's client went away: %s", type(exc).__name__)
            return
        finally:
            await frames.aclose()  # type: ignore[attr-defined]
        if failure:
            await self._say_failed(response, failure[0])

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

    def _job(self, row: JobRecord, detail: Detail | None = None) -> dict[str, Any]:
        shown = self.masker.row(row)
        job: dict[str, Any] = {
            "id": shown.id,
            "agent_id": shown.agent_id,
            "status": shown.status,
            "attempt": _number(row.attempt),
            "payload": shown.payload,
            "result": shown.result,
            "budget": shown.token_budget,
            "used": shown.tokens_consumed,
            "errors": shown.error[-20:],
            "updated_at": _number(row.updated_at),
            "unreadable": shown.unreadable,
        }
        if detail is not None:
            job["approval"] = self.masker.value(dict(detail.approval)) if detail.approval else None
            job["waiting_for"] = self.masker.value(dict(detail.waiting_for)) if detail.waiting_for else None
        return job

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


def add_routes(app: web.Application, api: Api) -> None:
    """Serve every route of `ROUTES` (and nothing else) under `PREFIX`."""
    for route in ROUTES:
        handler = getattr(api, route.op)
        app.router.add_route(
            route.method, PREFIX + route.path, _authorized(api, handler) if route.write else handler
        )


def _authorized(api: Api, handler: _Handler) -> _Handler:
    async def write(request: web.Request) -> web.StreamResponse:
        api.authorize(request)  # before the body is read: a request without the token reads nothing
        return await handler(request)

    return write


def same_origin(request: web.Request) -> bool:
    """False unless a browser, when it says, says the request came from the console's own page."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site != "same-origin":
        return False
    origin = request.headers.get("Origin")
    return origin is None or origin == f"{request.scheme}://{request.host}"


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


def _field(body: dict[str, Any], name: str, *, required: bool = False) -> Any:
    """The string ``name`` of a body (None when absent or null); `BadRequest` for any other value."""
    value = body.get(name)
    if value is None:
        if required:
            raise BadRequest(f"{name} is required")
        return None
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{name} must be a non-empty string")
    if len(value) > MAX_ID or "\x00" in value:
        raise BadRequest(f"{name} is at most {MAX_ID} characters, without NUL")
    return value


def _reason(body: dict[str, Any]) -> str:
    value = (_field(body, "reason") or "").strip()
    if len(value) > MAX_REASON or not value.isprintable():
        raise BadRequest(f"the reason is printable text on one line of at most {MAX_REASON} characters")
    return value


def _path_id(request: web.Request) -> str:
    return _id(request.match_info["job_id"], "job id")


def _id(value: str | None, what: str) -> str:
    if not value or len(value) > MAX_ID or "\x00" in value:
        raise BadRequest(f"a {what} is 1 to {MAX_ID} characters, without NUL")
    return value


def _integer(text: str | None, name: str, low: int, high: int, default: int) -> int:
    if text is None or text == "":
        return default
    if not text.isdigit() or len(text) > 9 or not low <= int(text) <= high:
        raise BadRequest(f"{name} must be a whole number from {low} to {high}")
    return int(text)


def _seconds(text: str | None, name: str, high: float, default: float) -> float:
    if text is None or text == "":
        return default
    try:
        value = float(text)
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
