"""``python -m agentlife console``: a read-only web console over the job store (actions on request).

The web application lives in ``agentlife._console``; this module only parses the command line, checks
what must be right before a socket is opened (a token when actions are allowed, a host and port that can
be bound) and starts it. aiohttp and the pages load only when the console runs.
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

from agentlife._config import database_url_from_env, validate_database_url
from agentlife._exceptions import ConfigError

__all__ = ["DEFAULT_PORT", "TOKEN_VARIABLE", "register"]

#: The port the console listens on by default.
DEFAULT_PORT = 8765
#: The environment variable holding the secret every action must carry.
TOKEN_VARIABLE = "AGENTLIFE_CONSOLE_TOKEN"
#: The environment variable naming the header trusted for the actor when --actor-header is not given.
ACTOR_HEADER_VARIABLE = "AGENTLIFE_CONSOLE_ACTOR_HEADER"
#: An HTTP header name (an RFC 9110 token), at most 100 characters.
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,100}")
#: A token shorter than this is refused: the token is all that stands between a browser tab and a job.
MIN_TOKEN_LENGTH = 16


def register(sub: Any) -> None:
    """Add ``console`` to the subcommands."""
    console = sub.add_parser(
        "console",
        help="serve a web console of jobs, conversations, timelines and approvals",
        description="Serve a web console over the job store: jobs, their timelines and conversations, "
        "and (with --allow-actions and AGENTLIFE_CONSOLE_TOKEN) approve, reject, cancel and retry.",
    )
    console.add_argument("--database-url", help="default: AGENTLIFE_DATABASE_URL or the embedded SQLite file")
    console.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    console.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT}; 0: any)"
    )
    console.add_argument(
        "--allow-actions",
        action="store_true",
        help=f"offer approve/reject/cancel/retry; each needs the token in {TOKEN_VARIABLE}",
    )
    console.add_argument(
        "--base-path",
        default="",
        help="serve under this path, as a reverse proxy forwards it (e.g. /ops/agentlife; default: the root)",
    )
    console.add_argument(
        "--forwarded-allow-ips",
        metavar="IPS",
        help="trust X-Forwarded-Proto/-Host and Forwarded only from these comma-separated addresses or "
        "networks ('*': any peer); default: forwarded headers are ignored",
    )
    console.add_argument(
        "--actor-header",
        metavar="NAME",
        help="trust this header, set by the proxy in front, as the person doing each action "
        f"(e.g. X-Forwarded-User; default: {ACTOR_HEADER_VARIABLE}, else none: console@ADDRESS)",
    )
    console.set_defaults(handler=_main)


def console_token(env: dict[str, str] | os._Environ[str], allow_actions: bool) -> str | None:
    """The action token when actions are allowed; `ConfigError` when it is missing or too short."""
    if not allow_actions:
        return None
    token = env.get(TOKEN_VARIABLE, "")
    if not token.strip():
        raise ConfigError(f"--allow-actions needs a token in {TOKEN_VARIABLE}")
    if len(token) < MIN_TOKEN_LENGTH or not token.isprintable():
        raise ConfigError(f"{TOKEN_VARIABLE} must be at least {MIN_TOKEN_LENGTH} printable characters")
    return token


def _main(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port {args.port} must be between 0 and 65535")
    if not args.host or len(args.host) > 255 or not args.host.isprintable():
        raise ConfigError("--host must be a host name or an address")
    if args.database_url:
        validate_database_url(args.database_url, "--database-url")
    url = args.database_url or database_url_from_env(os.environ)
    token = console_token(os.environ, args.allow_actions)
    from agentlife._console._server import ConsoleConfig, proxy_config, serve

    proxy = proxy_config(args.base_path, args.forwarded_allow_ips)
    header = actor_header(args.actor_header, os.environ)
    config = ConsoleConfig(
        url=url, host=args.host, port=args.port, token=token, proxy=proxy, actor_header=header
    )
    return serve(config)


def actor_header(given: str | None, env: dict[str, str] | os._Environ[str]) -> str | None:
    """``--actor-header``, else ``AGENTLIFE_CONSOLE_ACTOR_HEADER``, else None; `ConfigError` if no header."""
    name = given if given is not None else env.get(ACTOR_HEADER_VARIABLE) or None
    if name is not None and not _HEADER_NAME.fullmatch(name):
        raise ConfigError("--actor-header must be an HTTP header name (letters, digits, '-', at most 100)")
    return name
