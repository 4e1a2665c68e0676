"""Who does an action in the console: a header the proxy in front sets, trusted only when configured.

With ``console --actor-header NAME`` (or ``AGENTLIFE_CONSOLE_ACTOR_HEADER``) the console is behind a proxy
that authenticates people and sets ``NAME`` (e.g. ``X-Forwarded-User``) on every request: the header's
value is the actor, and a write without it, with it twice, or with a value `check_actor` refuses is
refused (400) before anything changes; with ``--forwarded-allow-ips`` also given, a write from a peer
not in it is refused (403). Without it, a client could name anyone in any header, so no header
is read: the actor is ``console@`` and the remote address.
"""

from __future__ import annotations

from aiohttp import web

from agentlife._console._data import BadRequest
from agentlife._console._proxy import ProxyConfig
from agentlife._jobs._actor import check_actor

__all__ = ["request_actor"]


def request_actor(request: web.Request, header: str | None, proxy: ProxyConfig) -> str:
    """The actor of ``request``: the trusted ``header``'s value, else ``console@`` the remote address.

    With ``--forwarded-allow-ips`` given (``proxy.allow``), the header counts only from those peers: an
    action from any other peer is refused (403), for it did not come through the proxy.

    Raises:
        BadRequest: ``header`` is trusted and the request carries it not exactly once, or its value is
            not an actor (`check_actor`); the message does not echo the value.
        web.HTTPForbidden: the request came from a peer ``--forwarded-allow-ips`` does not name.
    """
    if header is None:
        return f"console@{request.remote or 'unknown'}"
    if (proxy.allow or proxy.allow_any) and not proxy.trusts(request.remote):
        raise web.HTTPForbidden(
            text=f"an action must come through the proxy that sets {header} (--forwarded-allow-ips)"
        )
    values = request.headers.getall(header, [])
    if len(values) != 1:
        raise BadRequest(f"an action needs exactly one {header} header (the console takes the actor from it)")
    try:
        return check_actor(values[0])
    except ValueError as exc:
        raise BadRequest(f"the {header} header is not an actor: {exc}") from None
