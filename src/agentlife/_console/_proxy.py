"""The console behind a reverse proxy: the sub-path it is served under, and whose forwarded headers count.

``--base-path /ops/agentlife`` serves every page, form, static file, the live updates and the HTTP API under
that path, as the proxy passes it on (the proxy forwards the path unchanged, it does not strip it). Every
link a page holds is written under it (`rebase`), and so is every redirect. A base path is a path of plain
segments (letters, digits, ``-._~``): anything else (no leading ``/``, ``//``, ``.`` or ``..`` segments,
control, query, fragment or percent characters) is refused at start (`check_base_path`), so it can never
carry markup, a traversal or another origin into a page.

Forwarded headers (``X-Forwarded-Proto``, ``X-Forwarded-Host``, or RFC 7239's ``Forwarded: proto=..;
host=..``) are read only from a peer in ``--forwarded-allow-ips`` (addresses or networks, ``*`` for any),
as uvicorn and gunicorn do; from any other peer, and when the option is not given, they are ignored. They
say what origin the browser used (``https://public.host``), which the check of an action's ``Origin``
compares with; they never change the base path. The same trust (`ProxyConfig.trusts`) is the one any
other header set by the proxy (the actor's name, for one) is taken under.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from aiohttp import web

from agentlife._console._data import BadRequest
from agentlife._exceptions import ConfigError

__all__ = ["ProxyConfig", "check_base_path", "forwarded_origin", "parse_allow_ips", "rebase"]

#: The longest base path accepted.
MAX_BASE_PATH = 200
_SEGMENT = re.compile(r"[A-Za-z0-9._~-]+")
#: A forwarded host: a name or IPv4 address, or a bracketed IPv6 address, with an optional port.
_HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})|\[[0-9A-Fa-f:.]{2,45}\])(?::[0-9]{1,5})?")
#: The attributes of a page a path is written in: only the page's own markup ever starts one with ``/``
#: (every value from data is escaped, its quotes included, so ``href="/`` cannot come from data).
_LINK = re.compile(r'\b(href|src|action|formaction|data-live)="/')

_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    """Where the proxy serves the console, and which peers' forwarded headers count.

    ``base_path``: "" (the root) or a path checked by `check_base_path`, without a trailing ``/``.
    ``allow``: the networks a trusted proxy connects from (empty: no forwarded header is read);
    ``allow_any``: every peer is trusted (``--forwarded-allow-ips '*'``).
    """

    base_path: str = ""
    allow: tuple[_Network, ...] = ()
    allow_any: bool = False

    def trusts(self, peer: str | None) -> bool:
        """Whether the peer a request came from is a proxy whose headers count."""
        if self.allow_any:
            return True
        if not self.allow or not peer:
            return False
        try:
            address = ipaddress.ip_address(peer.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped  # an IPv4 peer of a dual-stack socket is that IPv4 address
        return any(address in network for network in self.allow)


def check_base_path(text: str) -> str:
    """The base path as served ("" for the root), or `ConfigError` saying what is wrong with it."""
    if text in ("", "/"):
        return ""
    if len(text) > MAX_BASE_PATH:
        raise ConfigError(f"--base-path must be at most {MAX_BASE_PATH} characters")
    if not text.startswith("/"):
        raise ConfigError("--base-path must start with '/' (e.g. /ops/agentlife)")
    path = text[:-1] if text.endswith("/") else text
    for segment in path[1:].split("/"):
        if segment in ("", ".", ".."):
            raise ConfigError("--base-path must not hold '//', '.' or '..' segments")
        if not _SEGMENT.fullmatch(segment):
            raise ConfigError(
                "--base-path may hold only letters, digits and '-._~' between its slashes"
                " (no query, fragment, percent or control characters)"
            )
    return path


def parse_allow_ips(text: str | None) -> tuple[tuple[_Network, ...], bool]:
    """``--forwarded-allow-ips``: (the networks, whether any peer is trusted); `ConfigError` for a bad one."""
    if text is None or not text.strip():
        return (), False
    networks: list[_Network] = []
    for item in text.split(","):
        item = item.strip()
        if item == "*":
            return (), True
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ConfigError(
                f"--forwarded-allow-ips: {item[:60]!r} is not an address, a network (10.0.0.0/8) or '*'"
            ) from None
    return tuple(networks), False


def forwarded_origin(request: web.Request, config: ProxyConfig) -> tuple[str, str] | None:
    """The (scheme, host) a trusted proxy says the browser used, or None (untrusted, or not said).

    The nearest proxy's value counts (the last of a list). Raises `BadRequest` for a trusted peer's
    header that is not one.
    """
    if not config.trusts(request.remote):
        return None
    proto = _last(request.headers.get("X-Forwarded-Proto"))
    host = _last(request.headers.get("X-Forwarded-Host"))
    forwarded = request.headers.get("Forwarded")
    if forwarded is not None and proto is None and host is None:
        proto, host = _rfc7239(forwarded)
    if proto is None and host is None:
        return None
    scheme = request.scheme if proto is None else proto.lower()
    if scheme not in ("http", "https"):
        raise BadRequest("the forwarded proto is neither http nor https")
    if host is not None and not _HOST.fullmatch(host):
        raise BadRequest("the forwarded host is not a host name with an optional port")
    return scheme, host if host is not None else request.host


def rebase(html: str, base_path: str) -> str:
    """``html`` with every path the page's own markup writes (``href="/..."``) under ``base_path``."""
    if not base_path:
        return html
    return _LINK.sub(lambda m: f'{m.group(1)}="{base_path}/', html)


def _last(value: str | None) -> str | None:
    if value is None:
        return None
    last = value.rsplit(",", 1)[-1].strip()
    return last or None


def _rfc7239(value: str) -> tuple[str | None, str | None]:
    """``proto`` and ``host`` of the last element of a ``Forwarded`` header."""
    proto = host = None
    for pair in value.rsplit(",", 1)[-1].split(";"):
        name, _, raw = pair.strip().partition("=")
        text = raw.strip().strip('"')
        if name.lower() == "proto":
            proto = text
        elif name.lower() == "host":
            host = text
    return proto, host
