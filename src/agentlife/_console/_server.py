"""The console's aiohttp application: routes, the store it reads, the security rules and ``serve``.

Read-only unless started with an action token. An action is a POST of a form carrying that token
(compared in constant time), refused unless the browser says it comes from the console's own page
(``Sec-Fetch-Site: same-origin`` when sent, ``Origin`` when sent), and made through the same store calls
and rules as the ``job`` commands, so a page can do nothing the command line could not. It is acknowledged
only once the store at the configured path recorded it (`ConsoleStore.confirm`), and the page it
redirects to says what the store then holds in a flash signed with a key derived from the token: a
crafted ``?done=`` link shows nothing. Every response carries a CSP that allows only the console's own
script and stylesheet, and ``frame-ancestors 'none'``. A request the console cannot serve gets a page
that says why with its status: 400 for a malformed one, 404 for an unknown job, 409 for an action the
job's status does not allow, 503 when the store cannot be reached (opened again on the next request),
never a traceback. Every text a page shows from the store goes through the console's one `Masker`.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import hmac
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import anyio
from aiohttp import web

from agentlife._console._actor import request_actor
from agentlife._console._api import Api, add_routes, same_origin
from agentlife._console._batchpage import batch_confirm, batch_outcome
from agentlife._console._data import (
    MAX_ID,
    BadRequest,
    Cursors,
    list_jobs,
    load_job,
    parse_list_query,
    row_version,
)
from agentlife._console._journals import journal_path, stream_journal
from agentlife._console._openapi import PREFIX
from agentlife._console._ops import ConsoleClients, OutputFollower
from agentlife._console._proxy import ProxyConfig, forwarded_origin, proxy_config, rebase
from agentlife._console._render import FLASHES, error_page, job_page, list_page, overview_page, plain_page
from agentlife._console._sse import Fanout, SseLimits
from agentlife._console._store import ConsoleStore, NotRecorded
from agentlife._console._timeline import build_timeline
from agentlife._exceptions import ConfigError, JobNotFound, JobStateConflict, StoreError, describe_error
from agentlife._jobs._approve import approve_parked
from agentlife._jobs._batch import BATCH_ACTIONS, Selection, act_on_each, select_jobs, selection_digest
from agentlife._jobs._mask import masker_for
from agentlife._jobs._pause import pause_job, resume_job
from agentlife._jobs._reason import check_reason
from agentlife.constants import Constants
from agentlife.stores import JobStatus, OperatorStore
from agentlife.stores._childjobs import cancel_with_children
from agentlife.stores._prune import pruned_message

__all__ = ["FANOUT", "ConsoleConfig", "create_app", "proxy_config", "serve"]

log = logging.getLogger("agentlife.console")

#: The overview counts the jobs that ended within this many seconds.
OVERVIEW_WINDOW = 3600.0
#: The longest query string served; a longer one is refused (414) before anything parses it.
MAX_QUERY = 4096
#: The largest action form accepted.
MAX_FORM = 64 * 1024
#: The header a script may carry the token in instead of the form's ``token`` field.
TOKEN_HEADER = "X-Agentlife-Token"
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self';"
    " form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_HEADERS = {
    "Content-Security-Policy": _CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # not no-referrer: with it a browser sends "Origin: null" on its own form posts, and the check fails
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-store",
}
#: The application's `Fanout` (the event streams' followers), for a test to count them.
FANOUT = web.AppKey("fanout", Fanout)
_STATIC = {"console.css": "text/css", "console.js": "text/javascript"}
_ACTIONS = frozenset(FLASHES)
_STATUSES = frozenset(str(s) for s in JobStatus)


@dataclass(frozen=True, slots=True)
class ConsoleConfig:
    """What ``console`` serves: the store's URL, where to listen, the action token (None: read-only).

    ``data_dir`` holds the session journals (default: ``AGENTLIFE_DATA_DIR``, as for ``job show``).
    ``actor_header``: the header the proxy in front sets to the person acting, trusted for the actor of
    every action (`request_actor`); None: no header is trusted.
    """

    url: str
    host: str = "127.0.0.1"
    port: int = 8765
    token: str | None = None
    data_dir: Path | None = None
    events: SseLimits = field(default_factory=SseLimits)
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    """The base path it is served under and the peers whose forwarded headers count (`ProxyConfig`)."""
    actor_header: str | None = None


class _Console:
    def __init__(self, config: ConsoleConfig) -> None:
        self.config = config
        self.actions = config.token is not None
        self.store = ConsoleStore(config.url)
        # The token's variable is named like a secret, and the URL's password is found in it: both masked.
        self.masker = masker_for(os.environ, config.url)
        self.cursors = Cursors()
        self.flashes = _Flashes(config.token) if config.token is not None else None
        self.data_dir = config.data_dir or Path(os.environ.get("AGENTLIFE_DATA_DIR") or ".agentlife")
        # The overview's stale heartbeat is the reaper's: heartbeat.zombie_after_seconds, as this
        # environment sets it (AGENTLIFE_HEARTBEAT_ZOMBIE_AFTER_SECONDS, 300 s by default).
        self.stale_after = Constants.from_env(os.environ).heartbeat.zombie_after_seconds
        files = resources.files("agentlife._console").joinpath("static")
        self.static = {name: files.joinpath(name).read_bytes() for name in _STATIC}

    def page(self, status: int, title: str, message: str) -> web.Response:
        text = error_page(status, title, self.masker.text(message, 2000), actions=self.actions)
        return web.Response(status=status, text=text, content_type="text/html")

    # -- pages ------------------------------------------------------------------------------------------

    async def index(self, request: web.Request) -> web.Response:
        query = parse_list_query(request.query, self.cursors)
        result = await list_jobs(await self.store.get(), query, self.masker, self.cursors)
        shown = functools.partial(self.masker.text, limit=2000)
        text = list_page(query, result, actions=self.actions, now=time.time(), mask=shown)
        return web.Response(text=text, content_type="text/html")

    async def job(self, request: web.Request) -> web.Response:
        job_id = _job_id(request.query.get("id"))
        now = time.time()
        store = await self.store.get()
        view = await load_job(store, job_id, self.data_dir, self.masker, now)
        if view is None:
            tomb = await store.pruned_job(job_id)  # a pruned id says so, and when
            if tomb is not None:
                said = pruned_message(job_id, tomb)
                return self.page(404, "Pruned", f"{said[:1].upper()}{said[1:]}.")
            return self.page(404, "Not Found", f"There is no job {job_id!r} in this store.")
        done = request.query.get("done")
        flash = self.flashes.read(job_id, done) if self.flashes is not None and done else None
        timeline = build_timeline(view.sessions, view.row.error, view.live)
        shown = functools.partial(self.masker.text, limit=2000)
        text = job_page(view, timeline, actions=self.actions, flash=flash, now=now, mask=shown)
        return web.Response(text=text, content_type="text/html")

    async def overview(self, request: web.Request) -> web.Response:
        store = await self.store.get()
        found = await store.job_overview(self.stale_after, OVERVIEW_WINDOW)
        shown = functools.partial(self.masker.text, limit=2000)
        text = overview_page(found, actions=self.actions, now=time.time(), mask=shown)
        return web.Response(text=text, content_type="text/html")

    async def journal(self, request: web.Request) -> web.StreamResponse:
        job_id = _job_id(request.query.get("id"))
        path = journal_path(self.data_dir, job_id, request.query.get("session") or "")
        return await stream_journal(request, path, self.masker, _HEADERS)

    async def state(self, request: web.Request) -> web.Response:
        job_id = _job_id(request.query.get("id"))
        row = await (await self.store.get()).get_job(job_id)
        if row is None:
            return web.json_response({"error": "no such job"}, status=404)
        return web.json_response({"status": self.masker.text(row.status, 100), "version": row_version(row)})

    async def static_file(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.static:
            return self.page(404, "Not Found", "There is no such file.")
        return web.Response(body=self.static[name], content_type=_STATIC[name], charset="utf-8")

    # -- actions ----------------------------------------------------------------------------------------

    async def batch(self, request: web.Request) -> web.StreamResponse:
        """Every job the list's filter matches: select and show the count, then act on that count."""
        form, refused = await self._action_form(request)
        if refused is not None:
            return refused
        action = form.get("action")
        if action not in BATCH_ACTIONS:
            raise BadRequest("action must be one of " + ", ".join(sorted(BATCH_ACTIONS)))
        status, agent = _text(form.get("status")) or None, _text(form.get("agent")) or None
        if status is None and agent is None:
            raise BadRequest("a batch needs a filter: a status or an agent")
        actor = request_actor(request, self.config.actor_header, self.config.proxy)
        store = await self.store.get()
        try:
            ids = await select_jobs(store, BATCH_ACTIONS[str(action)], Selection(status, agent))
        except ConfigError as exc:
            raise BadRequest(str(exc)) from None
        shown = functools.partial(self.masker.text, limit=2000)
        expect = _text(form.get("expect"))
        if not expect:
            main = batch_confirm(str(action), status, agent, ids, shown)
            return web.Response(text=plain_page("Confirm", main, actions=True), content_type="text/html")
        if expect != str(len(ids)) or _text(form.get("digest")) != selection_digest(ids):
            return self.page(
                409,
                "Conflict",
                f"The filter now matches {len(ids)} jobs, not the {expect} confirmed: look again.",
            )
        reason = _reason(_text(form.get("reason"))) or None
        report = await act_on_each(store, BATCH_ACTIONS[str(action)], ids, actor=actor, reason=reason)
        await self.store.confirm(store)
        log.info("console: %s", self.masker.text(f"{report.summary()} by {actor}", 500))
        return web.Response(
            text=plain_page("Done", batch_outcome(report, shown), actions=True), content_type="text/html"
        )

    async def _action_form(self, request: web.Request) -> tuple[Any, web.Response | None]:
        """The posted form of an action, or the page refusing it (actions off, another origin, no token)."""
        if self.config.token is None:
            return None, self.page(403, "Forbidden", "Actions are off: the console was started without them.")
        if not same_origin(request):
            return None, self.page(
                403, "Forbidden", "Actions are only accepted from the console's own pages."
            )
        if request.content_type != "application/x-www-form-urlencoded":
            return None, self.page(
                415, "Unsupported Media Type", "An action is a form (x-www-form-urlencoded)."
            )
        form = await request.post()
        given = request.headers.get(TOKEN_HEADER) or form.get("token")
        if not isinstance(given, str) or not hmac.compare_digest(
            given.encode("utf-8", "surrogatepass"), self.config.token.encode("utf-8", "surrogatepass")
        ):
            return None, self.page(403, "Forbidden", "A valid console token is required for an action.")
        return form, None

    async def action(self, request: web.Request) -> web.StreamResponse:
        if self.config.token is None:
            return self.page(403, "Forbidden", "Actions are off: the console was started without them.")
        if not same_origin(request):
            return self.page(403, "Forbidden", "Actions are only accepted from the console's own pages.")
        if request.content_type != "application/x-www-form-urlencoded":
            return self.page(415, "Unsupported Media Type", "An action is a form (x-www-form-urlencoded).")
        form = await request.post()
        given = request.headers.get(TOKEN_HEADER) or form.get("token")
        if not isinstance(given, str) or not hmac.compare_digest(
            given.encode("utf-8", "surrogatepass"), self.config.token.encode("utf-8", "surrogatepass")
        ):
            return self.page(403, "Forbidden", "A valid console token is required for an action.")
        action, job_id = form.get("action"), _job_id(_text(form.get("id")))
        if action not in _ACTIONS:
            raise BadRequest("action must be one of " + ", ".join(sorted(_ACTIONS)))
        actor = request_actor(request, self.config.actor_header, self.config.proxy)
        status = await self._act(str(action), job_id, form, actor)
        shown = self.masker.text(job_id, 200), self.masker.text(actor, 200)
        log.info("console: %s of job %s by %s: %s", action, *shown, status)
        assert self.flashes is not None  # actions need the token, and the token makes the flashes
        done = self.flashes.sign(job_id, str(action), status)
        raise web.HTTPSeeOther(f"{self.config.proxy.base_path}/job?{urlencode({'id': job_id, 'done': done})}")

    async def _act(self, action: str, job_id: str, form: Any, actor: str) -> str:
        """Make the action; the job's status as the store at the configured path then records it."""
        store = await self.store.get()
        await self._write(store, action, job_id, form, actor)
        row = await store.get_job(job_id)
        await self.store.confirm(store)  # the write and the read went to the store the others use
        if row is None:
            raise JobNotFound(f"job {job_id} is gone from the store")
        return self.masker.text(row.status, 100)

    async def _write(self, store: OperatorStore, action: str, job_id: str, form: Any, actor: str) -> None:
        if action == "approve":
            # The page always says which call it showed ("" for none): a form without it is not the page's.
            if "call" not in form:
                raise web.HTTPBadRequest(text="An approval names the call the page showed (its call field).")
            call = _text(form.get("call")) or None
            await approve_parked(store, job_id, call, given_by="the page", shown=True, actor=actor)
        elif action == "retry":
            await store.retry(job_id, actor=actor)
        elif action == "reject":
            reason = _reason(_text(form.get("reason"))) or "approval rejected"
            await store.reject(job_id, reason, actor=actor)
        elif action == "pause":
            await _paused(pause_job(store, job_id, _reason(_text(form.get("reason"))) or None, actor))
        elif action == "resume":
            await _paused(resume_job(store, job_id, actor))
        else:  # as `job cancel`: the job, then its children that were not started detached
            reason = _reason(_text(form.get("reason"))) or "cancelled by an operator"
            await cancel_with_children(store, job_id, reason, actor=actor)


class _Flashes:
    """The ``done`` parameter of the page an action redirects to: what the store recorded, signed.

    The key is derived from the action token, so every console replica started with the same token
    reads the flashes of the others, and no one without it can make one: a crafted ``?done=approve``
    shows nothing. It names the action, the status the store held right after it and when.
    """

    def __init__(self, token: str) -> None:
        secret = token.encode("utf-8", "surrogatepass")
        self._key = hmac.new(secret, b"agentlife console flash", hashlib.sha256).digest()

    def sign(self, job_id: str, action: str, status: str) -> str:
        """The ``done`` value saying the store recorded ``action`` on ``job_id``, leaving it ``status``."""
        fields = f"{action}.{status}.{int(time.time())}"
        return f"{fields}.{self._mac(job_id, fields)}"

    def read(self, job_id: str, done: str) -> str | None:
        """The flash a ``done`` value made by `sign` for ``job_id`` says, or None for any other."""
        fields, _, mac = done.rpartition(".")
        parts = fields.split(".")
        if len(parts) != 3 or not hmac.compare_digest(mac, self._mac(job_id, fields)):
            return None
        action, status, at = parts
        if action not in FLASHES or status not in _STATUSES or not at.isdigit():
            return None
        when = time.strftime("%H:%M:%S UTC", time.gmtime(min(int(at), 2**33)))
        return f"{FLASHES[action]} The store recorded it at {when}; the job was then {status}."

    def _mac(self, job_id: str, fields: str) -> str:
        message = f"{job_id}\x00{fields}".encode("utf-8", "surrogatepass")
        digest = hmac.new(self._key, message, hashlib.sha256).digest()[:18]
        return base64.urlsafe_b64encode(digest).decode()


def _text(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadRequest("a form field is not text")
    return value


def _job_id(value: str | None) -> str:
    if not value:
        raise BadRequest("a job id is required (?id=...)")
    if len(value) > MAX_ID or "\x00" in value:
        raise BadRequest(f"a job id is at most {MAX_ID} characters, without NUL")
    return value


async def _paused(action: Awaitable[Any]) -> None:
    """A pause or resume; a bad actor or reason is the form's error (400), not the store's."""
    try:
        await action
    except ConfigError as exc:
        raise BadRequest(str(exc)) from None


def _reason(value: str) -> str:
    try:
        return check_reason(value)
    except ConfigError as exc:
        raise BadRequest(str(exc)) from None


# -- the application -----------------------------------------------------------------------------------------

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def create_app(config: ConsoleConfig) -> web.Application:
    """The console as an aiohttp application (the store opens on the first request)."""
    console = _Console(config)
    clients = ConsoleClients(console.store, console.masker)
    follower = OutputFollower(console.store, console.masker)
    fanouts: list[Fanout] = []
    api = Api(clients, follower, console.masker, config.token, lambda: fanouts[0], config.events)
    api.actor_header, api.proxy = config.actor_header, config.proxy

    base = config.proxy.base_path
    api_prefix = base + PREFIX

    @web.middleware
    async def guard(request: web.Request, handler: _Handler) -> web.StreamResponse:
        seen = functools.partial(_as_forwarded, handler, config.proxy)
        if request.path == api_prefix or request.path.startswith(api_prefix + "/"):
            response = await api.answer(request, seen)
        else:
            response = await _rebased(base, _answer(console, request, seen))
        if not response.prepared:  # an event stream sent its own headers already
            response.headers.update(_HEADERS)
        return response

    app = web.Application(middlewares=[guard], client_max_size=MAX_FORM)
    app.router.add_get(base + "/", console.index)
    app.router.add_get(base + "/job", console.job)
    app.router.add_get(base + "/job/state", console.state)
    app.router.add_get(base + "/job/journal", console.journal)
    app.router.add_get(base + "/overview", console.overview)
    app.router.add_post(base + "/job/action", console.action)
    app.router.add_post(base + "/jobs/batch", console.batch)
    app.router.add_get(base + "/static/{name}", console.static_file)
    if base:
        app.router.add_get(base, _to_index)
    add_routes(app, api, base)

    async def followers(app: web.Application) -> AsyncIterator[None]:
        # The event streams' followers run here, and end with the application.
        async with anyio.create_task_group() as tasks:
            fanouts.append(Fanout(follower.follow, config.events, tasks))
            app[FANOUT] = fanouts[0]
            yield
            tasks.cancel_scope.cancel()

    async def close(_: web.Application) -> None:
        await clients.close()
        await console.store.drop()

    app.cleanup_ctx.append(followers)
    app.on_cleanup.append(close)
    return app


async def _as_forwarded(handler: _Handler, proxy: ProxyConfig, request: web.Request) -> web.StreamResponse:
    """The handler's answer to ``request`` as the browser made it: the origin a trusted proxy forwarded."""
    origin = forwarded_origin(request, proxy)  # BadRequest for a trusted proxy's malformed header
    if origin is not None:
        request = request.clone(scheme=origin[0], host=origin[1])
    return await handler(request)


async def _rebased(base: str, answer: Awaitable[web.StreamResponse]) -> web.StreamResponse:
    """A page's answer with its links and redirects under the base path."""
    try:
        response = await answer
    except web.HTTPRedirection as exc:
        location = exc.headers.get("Location", "")
        if base and location.startswith("/") and not location.startswith(base + "/"):
            exc.headers["Location"] = base + location
        raise
    if base and isinstance(response, web.Response) and response.content_type == "text/html" and response.text:
        response.text = rebase(response.text, base)
    return response


async def _to_index(request: web.Request) -> web.StreamResponse:
    raise web.HTTPMovedPermanently(request.path + "/")


async def _answer(console: _Console, request: web.Request, handler: _Handler) -> web.StreamResponse:
    """The handler's response, or the page that says why there is none."""
    if len(request.query_string) > MAX_QUERY:
        return console.page(414, "URI Too Long", f"The query string is longer than {MAX_QUERY} characters.")
    try:
        return await handler(request)
    except BadRequest as exc:
        return console.page(400, "Bad Request", str(exc))
    except JobNotFound as exc:
        return console.page(404, "Not Found", str(exc))
    except JobStateConflict as exc:
        return console.page(409, "Conflict", str(exc))
    except web.HTTPRedirection:
        raise
    except web.HTTPException as exc:
        return console.page(exc.status, exc.reason, exc.text or exc.reason)
    except NotRecorded as exc:
        log.warning("console: an action was not recorded: %s", console.masker.text(str(exc), 500))
        return console.page(503, "Store Unavailable", f"The action was not recorded: {exc}")
    except (StoreError, OSError, ConfigError) as exc:
        await console.store.drop()
        log.warning("console: the store failed: %s", console.masker.text(describe_error(exc), 2000))
        return console.page(503, "Store Unavailable", f"The job store cannot be read: {describe_error(exc)}")
    except Exception as exc:  # a bug: one line in the log, a page without a traceback
        log.error("console: internal error: %s", console.masker.text(describe_error(exc), 2000))
        return console.page(500, "Internal Error", "The console failed on this request; see its log.")


def serve(config: ConsoleConfig) -> int:
    """Serve until a signal ends the process (the CLI's handlers exit 143 or 130)."""
    return asyncio.run(_serve(config))


async def _serve(config: ConsoleConfig) -> int:
    runner = web.AppRunner(create_app(config), access_log=None, handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, config.host, config.port)
        try:
            await site.start()
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}"
            ) from None
        host, port = runner.addresses[0][:2]
        mode = "actions allowed" if config.token is not None else "read-only"
        where = f"http://{_url_host(host)}:{port}{config.proxy.base_path}/"
        print(f"agentlife console at {where} ({mode})", flush=True)
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
    return 0


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
