"""One live connection to an MCP server, through the official ``mcp`` SDK (imported here, when used).

`MCPConnection` owns the server for one job: ``start`` runs the SDK's transport (a child process for
stdio, Streamable HTTP otherwise) and ``ClientSession`` in a task of the job's service task group, so
their cancel scopes live and die in one task whatever the step does; ``call`` sends ``tools/call`` from
the step's task with the invocation id in ``_meta``; ``aclose`` ends the owner task, which closes the
session and stops the process (stdin closed, then SIGTERM and SIGKILL to its process group).

A server found gone (its process exited, its connection closed) is restarted once, at its next call;
the call that found it gone fails with `MCPServerUnavailable`, a transient error, so the usual retry
rules decide whether it runs again (never for a side-effecting tool without ``verify``).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from agentlife._exceptions import MCPServerUnavailable, MCPToolError

if TYPE_CHECKING:
    from agentlife._mcp._server import MCPServer
    from agentlife._redact import Redactor

__all__ = ["INVOCATION_META_KEY", "MCPConnection", "ToolListing"]

log = logging.getLogger("agentlife.mcp")

#: The ``_meta`` key that carries the invocation id (an idempotency key for servers that take one).
INVOCATION_META_KEY = "agentlife/invocation_id"
_CONNECTION_CLOSED = -32000
_MAX_MESSAGE = 500
_MAX_PAGES = 100


@dataclass(slots=True)
class ToolListing:
    """What ``initialize`` and ``tools/list`` said: the server's name and its tools as wire dicts."""

    server_name: str
    tools: list[dict[str, Any]] = field(default_factory=list)


class MCPConnection:
    """The live session with one server, for one job: start, call, restart once, close.

    Args:
        server: the server's configuration.
        services: the task group the session's owner task runs in (the job's services).
        redactor: masks secrets (header values among them) in what is logged or raised.
        start_timeout: seconds for the process or connection, ``initialize`` and ``tools/list``.
    """

    def __init__(
        self, server: MCPServer, services: anyio.abc.TaskGroup, redactor: Redactor, start_timeout: float
    ) -> None:
        self.server = server
        self.services = services
        self.redactor = redactor
        self.start_timeout = start_timeout
        self.label = server.label
        self.restarts_left = 1
        self._session: Any = None
        self._closing: anyio.Event | None = None
        self._done: anyio.Event | None = None
        self._gone_reason: str | None = None
        self._lock = anyio.Lock()

    # -- starting and stopping ---------------------------------------------------------------------

    async def start(self) -> ToolListing:
        """Start the server and list its tools; `MCPServerUnavailable` with one clear line otherwise."""
        self._closing, self._done = anyio.Event(), anyio.Event()
        self._gone_reason = None
        try:
            listing: ToolListing = await self.services.start(self._own, self._closing, self._done)
        except Exception as exc:
            raise MCPServerUnavailable(
                f"MCP server {self.label} did not start: {self._describe(exc)}"
            ) from None
        return listing

    async def aclose(self, grace: float) -> None:
        """End the session and the server; returns within ``grace`` plus the SDK's kill escalation."""
        if self._closing is None or self._done is None:
            return
        self._closing.set()
        with anyio.move_on_after(grace, shield=True):
            await self._done.wait()
        self._session = None

    async def _own(
        self,
        closing: anyio.Event,
        done: anyio.Event,
        *,
        task_status: anyio.abc.TaskStatus[ToolListing] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """The owner task: enter the transport and session, report the listing, wait for the close."""
        started, mine = False, None
        try:
            from mcp.client.session import ClientSession

            async with self._transport() as streams, ClientSession(streams[0], streams[1]) as session:
                with anyio.fail_after(self.start_timeout):
                    init = await session.initialize()
                    tools = await _list_all_tools(session)
                info = getattr(init, "server_info", None) or getattr(init, "serverInfo", None)
                self._session = mine = session
                started = True
                task_status.started(ToolListing(str(getattr(info, "name", "") or ""), tools))
                await closing.wait()
        except Exception as exc:
            if not started:
                raise
            # After the start, nothing here may take the job's services down: the next call reports it.
            self._gone_reason = self._describe(exc)
            log.warning("MCP server %s: connection ended: %s", self.label, self._gone_reason)
        finally:
            # Only this owner's session: a restarted server's owner may already have set a new one.
            if self._session is mine:
                self._session = None
            done.set()

    def _transport(self) -> Any:
        server = self.server
        if server.transport == "stdio":
            from mcp.client.stdio import StdioServerParameters, stdio_client

            params = StdioServerParameters(
                command=server.command or "", args=list(server.args), env=dict(server.env or {}) or None
            )
            return stdio_client(params, errlog=sys.stderr)
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        client = create_mcp_http_client(headers=dict(server.headers or {}) or None)
        return _owning(client, streamable_http_client(server.url or "", http_client=client))

    # -- calls ------------------------------------------------------------------------------------------

    async def call(self, tool: str, arguments: dict[str, Any], invocation_id: str) -> Any:
        """``tools/call``; returns the SDK's ``CallToolResult``.

        Raises:
            MCPServerUnavailable: the server is gone (restarted for the next call when it may be).
            MCPToolError: the server refused the call or sent a result the SDK could not accept.
        """
        session = await self._live_session()
        try:
            return await session.call_tool(tool, arguments, meta={INVOCATION_META_KEY: invocation_id})
        except Exception as exc:
            if _connection_lost(exc) or self._session is not session:
                self._session = None
                raise MCPServerUnavailable(
                    f"MCP server {self.label} went away during {tool}: {self._describe(exc)}"
                ) from None
            raise MCPToolError(f"MCP server {self.label}, tool {tool}: {self._describe(exc)}") from None

    async def _live_session(self) -> Any:
        async with self._lock:
            if self._session is not None:
                return self._session
            reason = self._gone_reason or "its connection closed"
            if self.restarts_left <= 0:
                raise MCPServerUnavailable(
                    f"MCP server {self.label} is gone ({reason}) and was already restarted once"
                )
            log.warning("MCP server %s is gone (%s): restarting it once", self.label, reason)
            await self.aclose(2.0)
            try:
                await self.start()
            finally:
                # A restart cut short by the call's timeout or a drain was not one: the next call tries it.
                if self._session is not None or not _being_cancelled():
                    self.restarts_left -= 1
            return self._session

    def _describe(self, exc: BaseException) -> str:
        return self.redactor.redact(describe_error(exc))[:_MAX_MESSAGE]


async def _list_all_tools(session: Any) -> list[dict[str, Any]]:
    """Every page of ``tools/list``, as wire-format dicts (camelCase, as the server sent them)."""
    import mcp.types as types

    tools: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        result = await session.list_tools(params=params)
        tools.extend(t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in result.tools)
        cursor = getattr(result, "next_cursor", None)
        if not cursor:
            return tools
    raise MCPToolError(f"tools/list did not end after {_MAX_PAGES} pages")


def _being_cancelled() -> bool:
    import asyncio

    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _connection_lost(exc: BaseException) -> bool:
    if isinstance(exc, (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream)):
        return True
    if isinstance(exc, (ConnectionError, OSError)):
        return True
    error = getattr(exc, "error", None)
    if getattr(error, "code", None) == _CONNECTION_CLOSED:
        return True
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & {"TransportError", "NetworkError", "ConnectError", "RemoteProtocolError"})


def describe_error(exc: BaseException) -> str:
    """One line for an error from the SDK or its transports, unwrapping exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, FileNotFoundError):
        return f"command not found: {exc.filename or exc}"
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


class _owning:
    """Enter the HTTP client and then the transport; leave them in the reverse order."""

    def __init__(self, client: Any, transport: Any) -> None:
        self.client, self.transport = client, transport

    async def __aenter__(self) -> Any:
        await self.client.__aenter__()
        try:
            return await self.transport.__aenter__()
        except BaseException:
            await self.client.__aexit__(None, None, None)
            raise

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.transport.__aexit__(*exc)
        finally:
            await self.client.__aexit__(None, None, None)
