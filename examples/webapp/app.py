"""An example web app in front of agentlife: start a research job, watch it work, answer it, get the result.

It is a product's backend as any language would write it: it talks to agentlife only through the HTTP API
the console serves (``python -m agentlife console --allow-actions``), with the console's token for writes,
and relays a job's event stream (Server-Sent Events) to the browser, whose ``EventSource`` reads it and
resumes it with ``Last-Event-ID`` after a dropped connection. Pages:

* ``/``: a form that starts a job (``POST /api/v1/jobs``);
* ``/jobs/<id>``: the job's progress (its ``progress`` events), the model's text as it is written (the
  ``delta`` events), a box for the answer the job waits for (``POST /api/v1/jobs/<id>/send``), and the
  result once it ends (``GET /api/v1/jobs/<id>/result``).

Run it (see README.md in this folder)::

    AGENTLIFE_API_URL=http://127.0.0.1:8765 AGENTLIFE_CONSOLE_TOKEN=... python app.py --port 8080
"""

from __future__ import annotations

import argparse
import asyncio
import html
import os
import re
import sys
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web

AGENT = "webapp-researcher"
#: A job id as agentlife allows it: the app never puts anything else in a URL.
JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
STATIC = Path(__file__).with_name("static")
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self';"
    " form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}
API = web.AppKey("api", httpx.AsyncClient)


def page(title: str, body: str, job_id: str = "") -> web.Response:
    """A page of the app (``body`` is HTML the app wrote; every value in it escaped)."""
    text = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><link rel='stylesheet' href='/static/webapp.css'></head>"
        f"<body data-job='{html.escape(job_id)}'><h1>{html.escape(title)}</h1>{body}"
        "<script src='/static/webapp.js'></script></body></html>"
    )
    return web.Response(text=text, content_type="text/html", headers=HEADERS)


def problem(answer: httpx.Response) -> str:
    """The one-line message of the API's JSON error."""
    try:
        return str(answer.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return f"the API answered {answer.status_code}"


def job_id_of(request: web.Request) -> str:
    job_id = request.match_info["job_id"]
    if not JOB_ID.fullmatch(job_id):
        raise web.HTTPNotFound(text="no such job")
    return job_id


def same_origin(request: web.Request) -> None:
    """Refuse a write a page of another site made (the browser says where a request comes from)."""
    origin = request.headers.get("Origin")
    if origin is not None and origin != f"{request.scheme}://{request.host}":
        raise web.HTTPForbidden(text="only this site's pages may do that")


async def index(request: web.Request) -> web.Response:
    form = (
        "<form method='post' action='/start'><label>Topic <input name='topic' maxlength='200' required"
        " value='why are there two tides a day'></label> <button type='submit'>Research it</button></form>"
    )
    return page("Research assistant", form)


async def start(request: web.Request) -> web.Response:
    same_origin(request)
    form = await request.post()
    topic = str(form.get("topic") or "").strip()[:200]
    api = request.app[API]
    answer = await api.post("/api/v1/jobs", json={"agent_id": AGENT, "payload": {"topic": topic}})
    if answer.status_code != 200:
        return page("Could not start", f"<p class='error'>{html.escape(problem(answer))}</p>")
    raise web.HTTPSeeOther(f"/jobs/{answer.json()['job_id']}")


async def job(request: web.Request) -> web.Response:
    job_id = job_id_of(request)
    body = (
        "<p>Status: <span id='status'>connecting</span></p>"
        "<progress id='percent' max='100' value='0'></progress> <span id='phase'></span>"
        "<h2>Draft, as it is written</h2><pre id='draft'></pre>"
        "<form id='ask' hidden><p id='question'></p><input id='answer' maxlength='200' required>"
        " <button type='submit'>Answer</button></form>"
        "<h2>Result</h2><pre id='result'></pre>"
    )
    return page(f"Job {job_id}", body, job_id)


async def events(request: web.Request) -> web.StreamResponse:
    """The job's events from the API, relayed byte for byte (``Last-Event-ID`` passed on)."""
    job_id = job_id_of(request)
    headers = {}
    if request.headers.get("Last-Event-ID"):
        headers["Last-Event-ID"] = request.headers["Last-Event-ID"]
    api = request.app[API]
    timeout = httpx.Timeout(10.0, read=None)  # the API sends a heartbeat while the job is quiet
    async with api.stream("GET", f"/api/v1/jobs/{job_id}/events", headers=headers, timeout=timeout) as up:
        if up.status_code != 200:
            await up.aread()
            return web.json_response({"error": problem(up)}, status=up.status_code)
        response = web.StreamResponse(headers={**HEADERS, "Content-Type": "text/event-stream"})
        await response.prepare(request)
        async for chunk in up.aiter_raw():
            await response.write(chunk)
        return response


async def answer(request: web.Request) -> web.Response:
    """Send the person's answer to the job: the event its ``wait_for_event("answer")`` takes."""
    same_origin(request)
    job_id = job_id_of(request)
    try:
        body: Any = await request.json()
    except ValueError:  # not JSON (or not UTF-8): the browser's page never sends that
        return web.json_response({"error": 'the answer must be JSON: {"text": ...}'}, status=400)
    text = body.get("text") if isinstance(body, dict) else None
    if not isinstance(text, str) or not text.strip():
        return web.json_response({"error": "the answer must hold some text"}, status=400)
    text = text[:200]
    api = request.app[API]
    sent = await api.post(f"/api/v1/jobs/{job_id}/send", json={"name": "answer", "payload": {"text": text}})
    if sent.status_code != 200:
        return web.json_response({"error": problem(sent)}, status=sent.status_code)
    return web.json_response({"sent": True})


async def result(request: web.Request) -> web.Response:
    """The job's result once it ended (the API waits up to 5 s for it)."""
    job_id = job_id_of(request)
    api = request.app[API]
    got = await api.get(f"/api/v1/jobs/{job_id}/result", params={"timeout": "5"}, timeout=15)
    if got.status_code == 200:
        return web.json_response({"result": got.json()["result"]})
    return web.json_response({"error": problem(got) if got.status_code != 202 else "not finished"})


def create_app(api_url: str, token: str) -> web.Application:
    """The app, talking to the console's API at ``api_url`` with ``token`` for its writes."""
    app = web.Application(client_max_size=16 * 1024)

    async def client(app: web.Application) -> Any:
        auth = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=api_url, headers=auth, timeout=15) as http:
            app[API] = http
            yield

    app.cleanup_ctx.append(client)
    app.router.add_get("/", index)
    app.router.add_post("/start", start)
    app.router.add_get("/jobs/{job_id}", job)
    app.router.add_get("/jobs/{job_id}/events", events)
    app.router.add_post("/jobs/{job_id}/answer", answer)
    app.router.add_get("/jobs/{job_id}/result", result)
    app.router.add_static("/static", STATIC)
    return app


async def serve(host: str, port: int, api_url: str, token: str) -> None:
    runner = web.AppRunner(create_app(api_url, token), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        bound = runner.addresses[0]
        print(f"webapp at http://{bound[0]}:{bound[1]}/", flush=True)
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()
    api_url = os.environ.get("AGENTLIFE_API_URL", "http://127.0.0.1:8765")
    token = os.environ.get("AGENTLIFE_CONSOLE_TOKEN", "")
    if not token:
        print("set AGENTLIFE_CONSOLE_TOKEN to the console's token", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(args.host, args.port, api_url, token))
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
