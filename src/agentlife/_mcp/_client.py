"""One live connection to an MCP server, through the official ``mcp`` SDK (imported here, when used).

`MCPConnection` owns the server for one job: ``start`` runs the SDK's transport (a child process for
stdio, Streamable HTTP otherwise) and ``ClientSession`` in a task of the job's service task group, so
their cancel scopes live and die in one task whatever the step does; ``call`` sends ``tools/call`` from
the step's task with the invocation id in ``_meta``; ``aclose`` ends the owner task, which closes the
session and stops the process (stdin closed, then SIGTERM and SIGKILL to its process group).

A server found gone (its process exited, its connection closed) is restarted once, at its next call;
the call that found it gone fails with `MCPServerUnavailable`, a transient error, so the usual retry
rules decide whether it runs again (never for a side-effecting tool without ``verify``).

A stdio server must not outlive the agent when the agent cannot stop it (the SDK's stop never runs after
a hard exit or a SIGKILL). On Linux the server is started through a few lines of Python (`_LAUNCHER`)
that ask the kernel to SIGKILL it when the agent dies (``PR_SET_PDEATHSIG``) and then ``exec`` the
server's command, so the server keeps its pid. That pid is also its process group's id (the SDK starts
each server in a session of its own); it is registered with `agentlife._children` while the server runs,
and the hard exit kills those groups just before ``os._exit``, with whatever the server started in them.
A server that is a wrapper (``npx``, ``uvx``) dies by the death signal on a SIGKILL of the agent, but
what it started lives on until its stdin reaches end of file.
"""

from __future__ import annotations

import contextvars
import errno
import logging
import os
import shutil
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from agentlife._children import forget_group, register_group
from agentlife._exceptions import MCPServerUnavailable, MCPToolError
from agentlife._mcp._server import MAX_TOOLS

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

#: Run as ``python -I -S -c _LAUNCHER AGENT_PID COMMAND ARGS...``: the server dies with the agent.
_LAUNCHER = """
import os, sys
agent, command = int(sys.argv[1]), sys.argv[2:]
try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
except Exception:
    pass
if os.getppid() != agent:  # the agent died before the line above took effect
    os._exit(1)
try:
    os.execvp(command[0], command)
except OSError as exc:
    sys.stderr.write(f"agentlife: cannot run MCP server {command[0]}: {exc}\\n")
    os._exit(127)
"""


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
        started, mine, group = False, None, None
        try:
            from mcp.client.session import ClientSession

            _NOISE.set(_Noise(self.label))  # seen by the SDK's reader task, started from this one
            transport = self._transport()
            async with transport as streams, ClientSession(streams[0], streams[1]) as session:
                group = _register_group(transport)
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
            # The transport has stopped the server (or it was never started): nothing left to kill.
            if group is not None:
                forget_group(group)
            # Only this owner's session: a restarted server's owner may already have set a new one.
            if self._session is mine:
                self._session = None
            done.set()

    def _transport(self) -> Any:
        server = self.server
        if server.transport == "stdio":
            from mcp.client.stdio import StdioServerParameters, stdio_client

            command, args = _found(server.command or "", server.env), list(server.args)
            if sys.platform.startswith("linux") and sys.executable:  # where there is a parent-death signal
                args = ["-I", "-S", "-c", _LAUNCHER, str(os.getpid()), command, *args]
                command = sys.executable
            # "replace": undecodable bytes on stdout make a line that is not JSON-RPC, which the SDK skips,
            # instead of ending the reader while `initialize` waits for its timeout.
            params = StdioServerParameters(
                command=command,
                args=args,
                env=dict(server.env or {}) or None,
                encoding_error_handler="replace",
            )
            _quiet_sdk_parse_errors()
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
        session = self._session
        if session is not None:  # the common case, without the lock's two checkpoints
            return session
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
        if not cursor or len(tools) > MAX_TOOLS:  # past the limit, more pages would only be left out
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


@dataclass(slots=True)
class _Noise:
    label: str
    lines: int = 0


#: The server whose stdout the SDK's reader task (started from the owner task) is reading.
_NOISE: contextvars.ContextVar[_Noise | None] = contextvars.ContextVar("agentlife_mcp_noise", default=None)
_SDK_PARSE_ERROR = "Failed to parse JSONRPC message from server"
_NOISE_LOGGED = 5


class _NotJsonRpc(logging.Filter):
    """A stdout line that is not JSON-RPC (a banner, a stray print): one WARNING naming the server.

    The SDK logs each at ERROR with the parser's traceback, which quotes the line. A server that prints
    many gets its first few logged, then one line saying the rest are not.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != _SDK_PARSE_ERROR:
            return True
        noise = _NOISE.get()
        label = noise.label if noise is not None else "(unknown)"
        count = 1
        if noise is not None:
            noise.lines += 1
            count = noise.lines
        if count > _NOISE_LOGGED:
            return False
        more = "; further lines like it are not logged" if count == _NOISE_LOGGED else ""
        record.msg = "MCP server %s wrote a line on stdout that is not JSON-RPC: ignored%s"
        record.args = (label, more)
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info, record.exc_text = None, None
        return True


_NOT_JSON_RPC = _NotJsonRpc()


def _quiet_sdk_parse_errors() -> None:
    sdk_log = logging.getLogger("mcp.client.stdio")
    if _NOT_JSON_RPC not in sdk_log.filters:
        sdk_log.addFilter(_NOT_JSON_RPC)


def _register_group(transport: Any) -> int | None:
    """Register the stdio server's process group (its pid: the SDK starts it in a session of its own).

    The SDK does not hand out the process it started: it is read from the suspended ``stdio_client``
    generator's frame. Should a version of the SDK name it otherwise, nothing is registered and the hard
    exit leaves the server to the parent-death signal and the end of its stdin.
    """
    frame = getattr(getattr(transport, "gen", None), "ag_frame", None)
    process = frame.f_locals.get("process") if frame is not None else None
    pid = getattr(process, "pid", None)
    if not isinstance(pid, int):
        return None
    register_group(pid)
    return pid


def _found(command: str, env: Any) -> str:
    """``command`` as given when it can be run; FileNotFoundError (one clear line) when it cannot.

    Looked up here, on the ``PATH`` the server gets, because through the launcher the SDK would only see
    the launcher start and the server's connection close.
    """
    path = (env or {}).get("PATH", os.environ.get("PATH", os.defpath))
    if shutil.which(command, path=path) is not None:
        return command
    if os.sep in command and os.path.isfile(command):
        raise PermissionError(errno.EACCES, "not executable", command)
    raise FileNotFoundError(errno.ENOENT, "command not found", command)


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
