"""One live connection to an MCP server, through the official ``mcp`` SDK (imported here, when used).

`MCPConnection` owns the server for one job: ``start`` runs the SDK's transport (a child process for
stdio, Streamable HTTP otherwise) and ``ClientSession`` in a task of the job's service task group, so
their cancel scopes live and die in one task whatever the step does; ``call`` sends ``tools/call`` from
the step's task with the invocation id (and the time the call is given up) in ``_meta``; ``aclose`` ends
the owner task, which closes the session and stops the process (stdin closed, then SIGTERM and SIGKILL
to its process group).

A stdio server found exited before a call is restarted once and gets the call; one that goes away during
a call (or an HTTP session that drops) fails it with `MCPServerUnavailable`, a transient error, and is
restarted once at its next call. Once the restart is used up (or failed), its calls fail with
`MCPToolError`: no retry can bring it back within the attempt.

A call over HTTP cut off on the client's side (a crash of the agent, a dropped connection) may still run
on the server, which finishes what it started. `settle` waits until such a call is past the deadline it
was sent with before its ``verify`` decides whether the effect happened.

A stdio server must not outlive the agent, nor anything it started in its process group. On Linux the
server is started through a few lines of Python (`_LAUNCHER`) that ask the kernel to SIGKILL it when the
agent dies (``PR_SET_PDEATHSIG``) and then ``exec`` the server's command, so the server keeps its pid.
That pid is also its process group's id (the SDK starts each server in a session of its own); it is
registered with `agentlife._children` while the server runs, and the hard exit kills those groups just
before ``os._exit``. When the server exits (at the end of its input, by its own crash, or stopped by the
SDK), whatever it left in its group is killed at once (``pidfd``), since the SDK signals the group only
when the server itself outlives its input. A server that is a wrapper (``npx``, ``uvx``) dies by the death
signal on a SIGKILL of the agent, but what it started lives on until its stdin reaches end of file.

What a server sends is masked like everything else agentlife records, with the secret values of its own
headers and environment added to the process's (`server_redactor`): a result that echoes its
credentials reaches neither the model nor the journal.
"""

from __future__ import annotations

import contextvars
import errno
import json
import logging
import math
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from agentlife._children import end_group, register_group
from agentlife._exceptions import MCPServerUnavailable, MCPToolError, describe_error, leaf_exceptions
from agentlife._mcp._server import MAX_TOOLS
from agentlife._redact import Redactor

if TYPE_CHECKING:
    from agentlife._mcp._server import MCPServer

__all__ = [
    "DEADLINE_META_KEY",
    "INVOCATION_META_KEY",
    "MCPConnection",
    "ToolListing",
    "server_error",
    "server_redactor",
]

log = logging.getLogger("agentlife.mcp")

#: The ``_meta`` key that carries the invocation id (an idempotency key for servers that take one).
INVOCATION_META_KEY = "agentlife/invocation_id"
#: The ``_meta`` key that carries when agentlife gives the call up (Unix seconds): a server that has not
#: done the call's effect by then should not do it.
DEADLINE_META_KEY = "agentlife/deadline"
_CONNECTION_CLOSED = -32000
#: How long a call that lost its stdio server waits to hear the server's exit code, for its message.
_EXIT_HEARD_WITHIN = 0.5
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
        redactor: masks secrets in what is logged or raised; the server's own secrets are added to it.
        start_timeout: seconds for the process or connection, ``initialize`` and ``tools/list``.

    Attributes:
        label: how messages name the server (its name once the server gave one).
        deadlines: invocation id -> when a call that may still run on the server is given up (Unix
            seconds): what `settle` waits for. Kept for the calls ``verify`` may be asked about, until
            they succeed.
        clock_margin: seconds `settle` adds, for the clocks of two machines and the request's transit.
    """

    def __init__(
        self, server: MCPServer, services: anyio.abc.TaskGroup, redactor: Redactor, start_timeout: float
    ) -> None:
        self.server = server
        self.services = services
        self.redactor = server_redactor(redactor, server)
        self.start_timeout = start_timeout
        self.label = server.label
        self.restarts_left = 1
        self.deadlines: dict[str, float] = {}
        self.clock_margin = 1.0
        self.noise_lines = 0
        self._session: Any = None
        self._process: Any = None
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

            _OWNER.set(self)  # seen by the SDK's reader task, started from this one
            transport = self._transport()
            # The watcher of the server's exit outlives the transport: it is there when the SDK stops it.
            async with anyio.create_task_group() as watcher:
                try:
                    async with transport as streams:
                        process = self._process = _server_process(transport)
                        if process is not None:
                            group = process.pid
                            register_group(group)
                            watcher.start_soon(_end_group_on_exit, process.pid)
                        async with ClientSession(_LenientReader(streams[0], self), streams[1]) as session:
                            with anyio.fail_after(self.start_timeout):
                                init = await session.initialize()
                                tools = await _list_all_tools(session)
                            info = getattr(init, "server_info", None) or getattr(init, "serverInfo", None)
                            self._session = mine = session
                            started = True
                            task_status.started(ToolListing(str(getattr(info, "name", "") or ""), tools))
                            await closing.wait()
                finally:
                    # The transport has stopped the server (or never started it): what it left in its
                    # group goes now, if the watcher did not see it end.
                    if group is not None:
                        end_group(group)
                    watcher.cancel_scope.cancel()
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

    async def call(
        self, tool: str, arguments: dict[str, Any], invocation_id: str, *, settled: bool = False
    ) -> Any:
        """``tools/call``; returns the SDK's ``CallToolResult``.

        ``settled``: should the call fail, its ``verify`` will `settle` first (its deadline is kept).

        Raises:
            MCPServerUnavailable: the server went away during the call (restarted for the next call).
            MCPToolError: the server refused the call, sent a result the SDK could not accept, or is gone
                for the rest of the attempt (its one restart used up).
        """
        session = await self._live_session()
        meta: dict[str, Any] = {INVOCATION_META_KEY: invocation_id}
        deadline = _deadline_now()
        if deadline is not None:
            meta[DEADLINE_META_KEY] = round(deadline, 3)
            if settled:  # the server may go on with it should this end here: see settle
                self.deadlines[invocation_id] = deadline
        try:
            result = await session.call_tool(tool, arguments, meta=meta)
        except Exception as exc:
            if _connection_lost(exc) or self._session is not session:
                self._session = None
                why = await self._exit_said() or self._describe(exc)
                raise MCPServerUnavailable(
                    f"MCP server {self.label} went away during {tool}: {why}"
                ) from None
            raise MCPToolError(f"MCP server {self.label}, tool {tool}: {self._describe(exc)}") from None
        self.deadlines.pop(invocation_id, None)
        return result

    async def settle(self, invocation_id: str) -> None:
        """Wait until a call of ``invocation_id`` that may still run on the server is past its deadline.

        Over HTTP a call cut off on this side (the agent killed, the connection dropped) goes on on the
        server, which may do its effect after ``verify`` looked and found nothing. By the deadline the call
        was sent with, the server has finished it or given it up (what a server must do, see the docs),
        so ``verify`` then sees the effect if there is one.
        """
        deadline = self.deadlines.pop(invocation_id, None)
        if deadline is None:
            return
        wait = deadline + self.clock_margin - time.time()
        if wait > 0:
            log.info(
                "MCP server %s: call %s may still run there: waiting %.1fs, past its deadline, before verify",
                self.label,
                invocation_id,
                wait,
            )
            await anyio.sleep(wait)

    async def _live_session(self) -> Any:
        session = self._session
        if session is not None and not self._exited():  # the common case, without the lock's checkpoints
            return session
        async with self._lock:
            if self._session is not None and not self._exited():
                return self._session
            if self._session is not None:  # its process ended while no call was in flight
                self._session = None
                self._gone_reason = f"{self._exit_code_said()} before the call"
            reason = self._gone_reason or "its connection closed"
            if self.restarts_left <= 0:
                raise MCPToolError(
                    f"MCP server {self.label} is gone ({reason}) and was already restarted once: its tools "
                    "fail for the rest of this attempt"
                )
            log.warning("MCP server %s is gone (%s): restarting it once", self.label, reason)
            await self.aclose(2.0)
            try:
                await self.start()
            except MCPServerUnavailable as exc:
                raise MCPToolError(
                    f"{exc} (restarted after it was gone: {reason}): its tools fail for the rest of this "
                    "attempt"
                ) from None
            finally:
                # A restart cut short by the call's timeout or a drain was not one: the next call tries it.
                if self._session is not None or not _being_cancelled():
                    self.restarts_left -= 1
            return self._session

    def _exited(self) -> bool:
        """Whether the stdio server's process has ended (always False over HTTP)."""
        return self._process is not None and self._process.returncode is not None

    async def _exit_said(self) -> str | None:
        """How the stdio server ended, when it did: its exit is heard a moment after its pipe closes."""
        if self._process is None:
            return None
        with anyio.move_on_after(_EXIT_HEARD_WITHIN):
            while self._process.returncode is None:
                await anyio.sleep(0.01)
        return self._exit_code_said()

    def _exit_code_said(self) -> str | None:
        code = self._process.returncode if self._process is not None else None
        return None if code is None else f"it exited with code {code}"

    def _describe(self, exc: BaseException) -> str:
        return server_error(exc, self.redactor.redact)


def _deadline_now() -> float | None:
    """When the calling scope gives up (its timeout, a drain's deadline), as Unix seconds; None: never."""
    remaining = anyio.current_effective_deadline() - anyio.current_time()
    return time.time() + remaining if math.isfinite(remaining) else None


async def _end_group_on_exit(pid: int) -> None:
    """Kill what the server left in its process group as soon as it exits (on Linux: its ``pidfd``)."""
    try:
        fd = os.pidfd_open(pid)
    except AttributeError:  # no pidfd here: the group is ended when the transport stops the server
        return
    except OSError:  # already gone
        end_group(pid)
        return
    try:
        await anyio.wait_readable(fd)
    finally:
        os.close(fd)
    end_group(pid)


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


#: The connection whose owner task started the SDK's tasks (its stdout reader among them).
_OWNER: contextvars.ContextVar[MCPConnection | None] = contextvars.ContextVar(
    "agentlife_mcp_owner", default=None
)
_SDK_PARSE_ERROR = "Failed to parse JSONRPC message from server"
_NOISE_LOGGED = 5


class _SdkParseErrors(logging.Filter):
    """The SDK logs each stdout line it cannot parse at ERROR, with a traceback quoting the line.

    For a server of ours, `_LenientReader` reads the line again and says what it was: the SDK's record
    is dropped.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != _SDK_PARSE_ERROR or _OWNER.get() is None


_SDK_FILTER = _SdkParseErrors()


def _quiet_sdk_parse_errors() -> None:
    sdk_log = logging.getLogger("mcp.client.stdio")
    if _SDK_FILTER not in sdk_log.filters:
        sdk_log.addFilter(_SDK_FILTER)


class _LenientReader:
    """The session's read stream, reading again the messages the SDK's parser refused.

    The SDK's parser refuses valid JSON it cannot hold (a string with a lone surrogate escape, which
    Python's ``json`` reads) and drops the message (a stdio line, an SSE event), so a call whose answer it
    was would wait for its whole timeout after the server did its effect. Such a message is read with
    Python's ``json`` and handed on; an answer to a request that still does not fit JSON-RPC fails that
    request at once; anything else (a banner, a stray ``print``) is skipped with one WARNING naming the
    server (the first few).
    """

    def __init__(self, stream: Any, connection: MCPConnection) -> None:
        self.stream, self.connection = stream, connection

    @property
    def last_context(self) -> Any:
        """The sender's context, when the SDK's stream carries one."""
        return getattr(self.stream, "last_context", None)

    async def receive(self) -> Any:
        item = await self.stream.receive()
        return self._reread(item) if isinstance(item, Exception) else item

    def __aiter__(self) -> _LenientReader:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def __aenter__(self) -> _LenientReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _reread(self, exc: Exception) -> Any:
        import mcp.types as types
        from mcp.shared.message import SessionMessage

        message = _json_of(exc)
        if not isinstance(message, dict) or not _answer_id(message):
            self._noise()
            return exc
        try:
            return SessionMessage(types.jsonrpc_message_adapter.validate_python(message, by_name=False))
        except Exception as invalid:  # whatever the parser says: that request fails, never the session
            why = self.connection.redactor.redact(_first_line(invalid))
        log.warning(
            "MCP server %s answered with a message that is not JSON-RPC: %s", self.connection.label, why
        )
        error = types.ErrorData(code=types.INTERNAL_ERROR, message=f"its answer is not JSON-RPC: {why}")
        return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=message["id"], error=error))

    def _noise(self) -> None:
        connection = self.connection
        connection.noise_lines += 1
        if connection.noise_lines > _NOISE_LOGGED:
            return
        more = "; further lines like it are not logged" if connection.noise_lines == _NOISE_LOGGED else ""
        what = "wrote a line on stdout" if connection.server.transport == "stdio" else "sent a message"
        log.warning("MCP server %s %s that is not JSON-RPC: ignored%s", connection.label, what, more)


def _json_of(exc: Exception) -> Any:
    """The message of a line the SDK refused, read with Python's ``json``; None when it is not JSON."""
    errors = getattr(exc, "errors", None)
    try:
        found = list(errors(include_url=False)) if callable(errors) else []
    except Exception:
        return None
    for error in found:
        if isinstance(error.get("input"), str):  # not JSON to the SDK's parser: the line itself
            try:
                return json.loads(error["input"])
            except (ValueError, RecursionError):
                return None
    # JSON, but not a message it accepts: the outermost object it looked at is the message.
    objects = [e for e in found if isinstance(e.get("input"), dict)]
    return min(objects, key=lambda e: len(e.get("loc") or ()))["input"] if objects else None


def _answer_id(message: dict[str, Any]) -> bool:
    """Whether ``message`` answers a request (a result or an error, with an id)."""
    request_id = message.get("id")
    good_id = isinstance(request_id, str | int) and not isinstance(request_id, bool)
    return good_id and ("result" in message or "error" in message)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return " ".join(text[:2])[:_MAX_MESSAGE] if text else type(exc).__name__


def _server_process(transport: Any) -> Any:
    """The stdio server's process (None over HTTP), read from the SDK's suspended ``stdio_client``.

    The SDK does not hand out the process it started. Should a version of the SDK name it otherwise,
    nothing is known of it: the hard exit leaves the server to the parent-death signal and the end of
    its stdin, and what it leaves in its group is not killed.
    """
    frame = getattr(getattr(transport, "gen", None), "ag_frame", None)
    process = frame.f_locals.get("process") if frame is not None else None
    return process if isinstance(getattr(process, "pid", None), int) else None


# -- the server's secrets --------------------------------------------------------------------------------

#: Header and variable names whose values are secrets (as for the process's own environment).
_SECRET_NAME = re.compile(r"(?i)auth|key|token(?!s)|secret|passw|credential|cookie")


def server_redactor(redactor: Redactor, server: MCPServer) -> Redactor:
    """``redactor`` that also masks the secret values of ``server``'s headers and environment.

    A value is secret when its name looks it (``Authorization``, ``X-Api-Key``, ``TRACKER_TOKEN`` ...);
    for ``Scheme credentials`` (``Bearer abc...``) the credentials alone are masked too.
    """
    secrets = list(_secret_values(server.headers)) + list(_secret_values(server.env))
    return _WithSecrets(redactor, secrets) if secrets else redactor


def _secret_values(mapping: Mapping[str, str] | None) -> Iterator[str]:
    for name, value in (mapping or {}).items():
        if _SECRET_NAME.search(name):
            yield value
            scheme, _, credentials = value.strip().partition(" ")
            if credentials.strip() and scheme.isalpha():
                yield credentials.strip()


class _WithSecrets(Redactor):
    """Masks its own secrets, then what ``host`` masks: one walk of a result does both."""

    def __init__(self, host: Redactor, secrets: list[str]) -> None:
        super().__init__(secrets)
        self.host = host

    def redact(self, text: str) -> str:
        return self.host.redact(super().redact(text))


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


def server_error(exc: BaseException, redact: Callable[[str], str]) -> str:
    """What went wrong with a server or a call to it, in one masked line.

    The SDK runs everything in task groups: the first error of a group is the one that ended it, and the
    rest are what that ending cancelled. A command that cannot be started and a timeout read as such;
    anything else as `describe_error` gives it.
    """
    first = leaf_exceptions(exc)[0]
    if isinstance(first, FileNotFoundError):
        return redact(f"command not found: {first.filename or first}")[:_MAX_MESSAGE]
    if isinstance(first, TimeoutError):
        return "timed out"
    return describe_error(first, redact=redact, limit=_MAX_MESSAGE)


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
