"""A small reverse proxy for the console's tests, as nginx or an ingress would stand in front of it.

``python tests/revproxy.py --upstream http://127.0.0.1:PORT --prefix /ops/agentlife [--cert C --key K]
[--user NAME]`` listens on a free port of 127.0.0.1 (over TLS when given a certificate), prints
``proxy at URL`` and forwards every request under ``--prefix`` to the upstream with its path unchanged,
streaming the answer back (an event stream included), without following redirects. It sets what a proxy
sets: ``X-Forwarded-Proto`` (``https`` behind TLS), ``X-Forwarded-Host`` (the host the browser asked
for), ``X-Forwarded-For`` and, with ``--user``, ``X-Forwarded-User``; the same headers sent by the client
are dropped first, as a proxy must. A path outside the prefix is answered 404 by the proxy itself.
"""

from __future__ import annotations

import argparse
import asyncio
import ssl

import aiohttp
from aiohttp import web

#: Headers that belong to one connection, never forwarded.
HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
SET = ("x-forwarded-proto", "x-forwarded-host", "x-forwarded-for", "x-forwarded-user", "forwarded")


def make_app(upstream: str, prefix: str, user: str | None, tls: bool) -> web.Application:
    session: list[aiohttp.ClientSession] = []

    async def forward(request: web.Request) -> web.StreamResponse:
        if request.path != prefix and not request.path.startswith(prefix + "/"):
            return web.Response(status=404, text="not behind this proxy")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP and k.lower() not in SET}
        headers["X-Forwarded-Proto"] = "https" if tls else "http"
        headers["X-Forwarded-Host"] = request.host
        headers["X-Forwarded-For"] = request.remote or ""
        if user is not None:
            headers["X-Forwarded-User"] = user
        body = await request.read()
        async with session[0].request(
            request.method,
            upstream + request.rel_url.raw_path_qs,
            headers=headers,
            data=body or None,
            allow_redirects=False,
        ) as answer:
            response = web.StreamResponse(status=answer.status, reason=answer.reason)
            for name, value in answer.headers.items():
                if name.lower() not in HOP:
                    response.headers.add(name, value)
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def client(app: web.Application):  # type: ignore[no-untyped-def]
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as http:
            session.append(http)
            yield

    app = web.Application()
    app.cleanup_ctx.append(client)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


async def serve(args: argparse.Namespace) -> None:
    context = None
    if args.cert:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(args.cert, args.key)
    runner = web.AppRunner(
        make_app(args.upstream, args.prefix, args.user, context is not None), access_log=None
    )
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = runner.addresses[0][1]
    scheme = "https" if context else "http"
    print(f"proxy at {scheme}://127.0.0.1:{port}{args.prefix}/", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--cert")
    parser.add_argument("--key")
    parser.add_argument("--user")
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
