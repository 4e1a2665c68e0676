"""Tools from Model Context Protocol servers, as ordinary tools of the journaled, replayed call path.

`MCPServer` is a server's configuration (``MCPServer.stdio(...)``, ``MCPServer.http(...)``), usable where
tools are: ``ToolAgent.tools``, ``ctx.llm.complete(tools=[...])``, ``ctx.run_tool_calls(tools=[...])``,
and ``ctx.call_tool(server.tool("name"), ...)``. The runtime starts an agent's servers during hydration
(`MCPTools.start`) and each MCP tool becomes an `MCPToolSpec`: a `ToolSpec` whose definition is the
server's own (name, description, JSON Schema), whose arguments are checked against that schema
(``jsonschema``, loaded when first needed), and whose side effects come from the tool's annotations,
overridable per tool. From there on it is an ordinary tool: timeouts, write-ahead journal, replay with
digest checks, ``verify`` for a pending call, retries, approvals and policy.

The live servers of a job are found through a context variable the runtime sets for the job's task, so
two jobs of one worker never share a server process.
"""

from __future__ import annotations

import contextvars
import hashlib
import math
import re
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Literal

import orjson

from agentlife._exceptions import ConfigError, MCPToolError
from agentlife._mcp._schema import checker, short, validator_for
from agentlife._replay import utf8_safe
from agentlife._schema import RUNTIME_PARAMETERS
from agentlife._tools import ToolSpec

if TYPE_CHECKING:
    from agentlife._mcp._client import MCPConnection
    from agentlife._redact import Redactor

__all__ = [
    "CURRENT_MCP",
    "MCPServer",
    "MCPToolOptions",
    "MCPToolRef",
    "MCPToolSpec",
    "build_specs",
    "label_of",
    "live_tool_specs",
    "plan_names",
    "resolve_tool_ref",
    "tool_digest",
]

Verify = Callable[[str], Awaitable[Any]]
_NAME_OK = re.compile(r"[^A-Za-z0-9_-]")
_MAX_NAME = 64
#: The most tools offered from one server, and the largest listing of one tool (name, schemas ...).
MAX_TOOLS = 1000
MAX_TOOL_BYTES = 100_000
DEFAULT_MAX_RESULT_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class MCPToolOptions:
    """What the user says about one MCP tool, over what its annotations say (None: keep theirs)."""

    side_effects: bool | None = None
    verify: Verify | None = None
    timeout: float | None = None
    retries: int | None = None
    restricted: bool | None = None


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class MCPServer:
    """An MCP server whose tools an agent may call; build it with `stdio` or `http`.

    The runtime starts the servers listed in ``ToolAgent.tools`` or ``AgentProcess.mcp_servers`` during
    hydration, fetches their tool lists once per attempt, and closes them in cleanup.

    Example:
        >>> tracker = MCPServer.stdio("python", ["tracker_server.py"]).with_tool(
        ...     "create_issue", verify=find_issue
        ... )
    """

    transport: Literal["stdio", "http"]
    """How the runtime reaches the server: a child process over stdin/stdout, or Streamable HTTP."""
    command: str | None = None
    """The program a stdio server runs (looked up on ``PATH``)."""
    args: tuple[str, ...] = ()
    """The stdio server's arguments."""
    env: Mapping[str, str] | None = field(default=None, repr=False)
    """Variables added to the stdio server's environment (never logged)."""
    url: str | None = None
    """The Streamable HTTP endpoint of an HTTP server."""
    headers: Mapping[str, str] | None = field(default=None, repr=False)
    """HTTP headers sent with every request, such as authorization (never logged)."""
    name: str | None = None
    """The prefix of its tools' names where two servers offer the same name (default: the server's own)."""
    timeout: float | None = None
    """Seconds per call (default: the per-tool table of `agentlife.constants`)."""
    start_timeout: float = 30.0
    """Seconds for the server to start, answer ``initialize`` and list its tools."""
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES
    """A call whose result is larger fails, back to the model as an error."""
    tool_options: Mapping[str, MCPToolOptions] = field(default_factory=dict, repr=False)
    """Per-tool overrides of the annotations, by tool name (see `with_tool`)."""

    def __repr__(self) -> str:
        # The dataclass's own, but an HTTP server's URL as it may be logged: a password in it
        # (``user:pass@``) or a key in its query is a secret like a header.
        shown = []
        for f in fields(self):
            if f.repr:
                value = getattr(self, f.name)
                if f.name == "url" and isinstance(value, str):
                    value = _bare_url(value)
                shown.append(f"{f.name}={value!r}")
        return f"{type(self).__name__}({', '.join(shown)})"

    @classmethod
    def stdio(
        cls,
        command: str,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        *,
        name: str | None = None,
        timeout: float | None = None,
        start_timeout: float = 30.0,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
    ) -> MCPServer:
        """A server the runtime starts as a child process and talks to over stdin/stdout.

        Args:
            command: the program (looked up on ``PATH``).
            args: its arguments.
            env: variables added to the SDK's safe default environment (secrets stay out of logs).
            name: the prefix of its tools' names where two servers offer the same name (default: the
                name the server gives itself).
            timeout: seconds per call (default: the per-tool table of `agentlife.constants`).
            start_timeout: seconds for the process to start, answer ``initialize`` and list its tools.
            max_result_bytes: a call whose result is larger fails (back to the model as an error).
        """
        if not isinstance(command, str) or not command.strip() or "\0" in command:
            raise ConfigError(f"MCP server command must be a non-empty string, got {command!r}")
        if isinstance(args, str) or any(not isinstance(a, str) or "\0" in a for a in args):
            raise ConfigError("MCP server args must be a sequence of strings without NUL")
        _check_strings("env", env)
        server = cls("stdio", command=command, args=tuple(args), env=dict(env) if env else None, name=name)
        return server._with_limits(timeout, start_timeout, max_result_bytes)

    @classmethod
    def http(
        cls,
        url: str,
        headers: Mapping[str, str] | None = None,
        *,
        name: str | None = None,
        timeout: float | None = None,
        start_timeout: float = 30.0,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
    ) -> MCPServer:
        """A server reached over Streamable HTTP; ``headers`` (auth) are sent, never logged or journaled.

        Args:
            url: the MCP endpoint, ``http://`` or ``https://``.
            headers: sent with every request (``Authorization`` ...).
            name: see `stdio`.
            timeout: see `stdio`.
            start_timeout: seconds to connect, ``initialize`` and list the tools.
            max_result_bytes: see `stdio`.
        """
        if not isinstance(url, str) or not re.match(r"^https?://[^\s/]+", url):
            raise ConfigError("MCP server url must start with http:// or https:// and name a host")
        _check_strings("headers", headers)
        if headers and any("\r" in k + v or "\n" in k + v for k, v in headers.items()):
            raise ConfigError("MCP server headers must not contain line breaks")
        server = cls("http", url=url, headers=dict(headers) if headers else None, name=name)
        return server._with_limits(timeout, start_timeout, max_result_bytes)

    def _with_limits(self, timeout: float | None, start_timeout: float, max_result_bytes: int) -> MCPServer:
        if self.name is not None and (not isinstance(self.name, str) or not _NAME_OK.sub("", self.name)):
            raise ConfigError(f"MCP server name must hold letters, digits, _ or -, got {self.name!r}")
        for what, value in (("timeout", timeout), ("start_timeout", start_timeout)):
            if value is not None and not _seconds(value):
                raise ConfigError(f"MCP server {what} must be a finite number of seconds > 0, got {value!r}")
        if (
            isinstance(max_result_bytes, bool)
            or not isinstance(max_result_bytes, int)
            or max_result_bytes < 1
        ):
            raise ConfigError(
                f"MCP server max_result_bytes must be a whole number >= 1, got {max_result_bytes!r}"
            )
        return replace(
            self, timeout=timeout, start_timeout=float(start_timeout), max_result_bytes=max_result_bytes
        )

    def with_tool(
        self,
        tool: str,
        *,
        side_effects: bool | None = None,
        verify: Verify | None = None,
        timeout: float | None = None,
        retries: int | None = None,
        restricted: bool | None = None,
    ) -> MCPServer:
        """This server with one tool's behaviour overridden (its annotations say the rest).

        Args:
            tool: the tool's name as the server lists it.
            side_effects: False for read-only (re-run on resume), True for write-ahead, at most once.
            verify: ``async verify(invocation_id)`` for a call found pending after a crash: the call's
                result when the effect already happened, or `NOT_DONE` to run it again.
            timeout: seconds for this tool's calls.
            retries: as for ``@tool``.
            restricted: needs an approved job and ``check_policy``.
        """
        if timeout is not None and not _seconds(timeout):
            raise ConfigError(f"MCP tool timeout must be a finite number of seconds > 0, got {timeout!r}")
        if retries is not None and (isinstance(retries, bool) or not isinstance(retries, int) or retries < 0):
            raise ConfigError(f"MCP tool retries must be a whole number >= 0, got {retries!r}")
        options = MCPToolOptions(side_effects, verify, timeout, retries, restricted)
        return replace(self, tool_options={**self.tool_options, tool: options})

    def tool(self, name: str) -> MCPToolRef:
        """A handle for ``ctx.call_tool(server.tool("create_issue"), title=...)``."""
        return MCPToolRef(self, name)

    @property
    def label(self) -> str:
        """How messages name the server: its name and target (an URL without query or credentials)."""
        return label_of(self, self.name)

    @property
    def key(self) -> tuple[Any, ...]:
        """What identifies the server within a job (equal configurations share one live session)."""
        return (self.transport, self.command, self.args, self.url, self.name)


@dataclass(frozen=True, slots=True)
class MCPToolRef:
    """One tool of one server, for ``ctx.call_tool``; resolved to the job's live tool when called."""

    server: MCPServer
    name: str


@dataclass(frozen=True, slots=True)
class MCPToolSpec(ToolSpec[..., Any]):
    """A tool served by an MCP server: a `ToolSpec` the ordinary call path runs, plus where it lives."""

    server_name: str = ""
    mcp_name: str = ""
    idempotent: bool = False

    @property
    def max_tries(self) -> int | None:
        """As for `ToolSpec`, except that an ``idempotentHint`` tool retries within the budgets."""
        if self.retries is None and self.idempotent:
            return None
        return ToolSpec.max_tries.fget(self)  # type: ignore[attr-defined,no-any-return]


#: The live MCP tools of the job running in this task (set by the runtime during hydration).
CURRENT_MCP: contextvars.ContextVar[Any] = contextvars.ContextVar("agentlife_mcp", default=None)


def label_of(server: MCPServer, name: str | None) -> str:
    """How messages name ``server`` once it is known as ``name`` (the name it gave itself)."""
    target = server.command if server.transport == "stdio" else _bare_url(server.url or "")
    return f"{name} ({server.transport}: {target})" if name else f"({server.transport}: {target})"


def live_tool_specs(item: Any) -> list[ToolSpec[..., Any]] | None:
    """The job's tools for an `MCPServer` in a ``tools=[...]`` list; None for anything else."""
    if not isinstance(item, MCPServer):
        return None
    return list(_current(item).specs_of(item))


def resolve_tool_ref(item: Any) -> Any:
    """The job's tool for an `MCPToolRef`; anything else unchanged."""
    if not isinstance(item, MCPToolRef):
        return item
    return _current(item.server).spec_named(item.server, item.name)


def _current(server: MCPServer) -> Any:
    tools = CURRENT_MCP.get()
    if tools is None or not tools.knows(server):
        raise ConfigError(
            f"MCP server {server.label} is not running for this job: list it in ToolAgent.tools or "
            "AgentProcess.mcp_servers so the runtime starts it during hydration"
        )
    return tools


# -- from the server's listing to tool specs ------------------------------------------------------------


def tool_digest(tool: Mapping[str, Any]) -> str:
    """A short digest of one tool's listing (name, description, schemas, annotations)."""
    wanted = {k: tool.get(k) for k in ("name", "description", "inputSchema", "outputSchema", "annotations")}
    return hashlib.sha256(orjson.dumps(wanted, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def offered_name(server_name: str, tool: str, collides: bool) -> str:
    """The name the model sees: the tool's, prefixed by the server's where two servers share it.

    Made to fit the providers' ``[A-Za-z0-9_-]{1,64}``: other characters become ``_``, and a longer name
    is cut and given a hash of the whole.
    """
    name = f"{server_name}__{tool}" if collides else tool
    name = _NAME_OK.sub("_", name)
    if len(name) > _MAX_NAME:
        name = f"{name[: _MAX_NAME - 9]}_{_hash(name)}"
    return name


def plan_names(
    listings: Sequence[tuple[str, Sequence[Mapping[str, Any]]]],
) -> list[tuple[list[Mapping[str, Any]], dict[str, str], list[tuple[str, str]]]]:
    """For each server's ``(name, listing)``: the tools it may offer, their offered names, those left out.

    A tool is left out, with why, when it has no name, is listed twice by its server, comes after the
    first `MAX_TOOLS` of its server, or its listing is over `MAX_TOOL_BYTES` or not valid Unicode. Two tools
    whose offered names still coincide (``a b`` and ``a_b``; ``srv__x`` and tool ``x`` of server ``srv``)
    each get a hash of their server's and their own name, so every offered name is unique and stays the
    same from one attempt to the next.
    """
    kept: list[list[Mapping[str, Any]]] = []
    skipped: list[list[tuple[str, str]]] = []
    for _server, listing in listings:
        tools, left_out = _admissible(listing)
        kept.append(tools)
        skipped.append(left_out)
    counts = Counter(str(t["name"]) for tools in kept for t in tools)
    offered = [
        {str(t["name"]): offered_name(server, str(t["name"]), counts[str(t["name"])] > 1) for t in tools}
        for (server, _), tools in zip(listings, kept, strict=True)
    ]
    clashes = Counter(name for names in offered for name in names.values())
    for (server, _), names in zip(listings, offered, strict=True):
        for tool, name in names.items():
            if clashes[name] > 1:
                names[tool] = f"{name[: _MAX_NAME - 9]}_{_hash(server + chr(0) + tool)}"
    return [(tools, names, left_out) for tools, names, left_out in zip(kept, offered, skipped, strict=True)]


def _admissible(
    listing: Sequence[Mapping[str, Any]],
) -> tuple[list[Mapping[str, Any]], list[tuple[str, str]]]:
    tools: list[Mapping[str, Any]] = []
    skipped: list[tuple[str, str]] = []
    seen: set[str] = set()
    for tool in listing:
        name = tool.get("name")
        shown = utf8_safe(str(name))[: _MAX_NAME * 2] if isinstance(name, str) else repr(name)[:_MAX_NAME]
        if not isinstance(name, str) or not name.strip():
            skipped.append((shown, "it has no name"))
        elif name in seen:
            skipped.append((shown, "its server lists it twice"))
        elif len(tools) >= MAX_TOOLS:
            skipped.append((shown, f"its server lists more than {MAX_TOOLS} tools"))
        else:
            reason = _too_big(tool)
            if reason:
                skipped.append((shown, reason))
            else:
                seen.add(name)
                tools.append(tool)
    return tools, skipped


def _too_big(tool: Mapping[str, Any]) -> str | None:
    try:
        size = len(orjson.dumps(tool))
    except (TypeError, orjson.JSONEncodeError):
        return "its listing is not valid Unicode text"
    if size > MAX_TOOL_BYTES:
        return f"its listing is {size} bytes, over {MAX_TOOL_BYTES}"
    return None


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def build_specs(
    server: MCPServer,
    server_name: str,
    listing: Iterable[Mapping[str, Any]],
    names: Mapping[str, str],
    connection: MCPConnection,
) -> tuple[list[MCPToolSpec], list[tuple[str, str]]]:
    """The tool specs of one server's admissible tools (named by ``names``), and those left out with why."""
    specs: list[MCPToolSpec] = []
    skipped: list[tuple[str, str]] = []
    for tool in listing:
        name = str(tool["name"])
        schema = tool.get("inputSchema")
        try:
            # What the model sends is checked without the runtime's parameters: they are filled in after.
            validator = validator_for(
                _without_runtime_parameters(schema) if isinstance(schema, dict) else schema
            )
        except ValueError as exc:
            skipped.append((utf8_safe(name), f"its input schema {exc}"))
            continue
        specs.append(_spec(server, server_name, tool, validator, names[name], connection))
    return specs, skipped


def _spec(
    server: MCPServer,
    server_name: str,
    tool: Mapping[str, Any],
    validator: Any,
    name: str,
    connection: MCPConnection,
) -> MCPToolSpec:
    mcp_name = str(tool["name"])
    options = server.tool_options.get(mcp_name, MCPToolOptions())
    hints = tool.get("annotations") or {}
    read_only = hints.get("readOnlyHint") is True
    side_effects = options.side_effects if options.side_effects is not None else not read_only
    schema = dict(tool.get("inputSchema") or {"type": "object"})
    takes_invocation_id = "invocation_id" in (schema.get("properties") or {})
    check = checker(name, validator)

    verify = options.verify
    if verify is not None and side_effects and server.transport == "http":
        # A call cut off here may go on on the server: its verify waits until that one is over.
        verify = _after_the_deadline(connection, verify)
    settled = verify is not options.verify

    async def call(invocation_id: str, **arguments: Any) -> Any:
        arguments = check(arguments)  # the checked JSON copy is what is sent
        if takes_invocation_id:  # a runtime parameter, as for native tools: the server gets the id
            arguments = {**arguments, "invocation_id": invocation_id}
        _label_span(server_name, mcp_name)
        result = await connection.call(mcp_name, arguments, invocation_id, settled=settled)
        return result_value(result, server_name, mcp_name, server.max_result_bytes, connection.redactor)

    call.__name__ = name
    spec = MCPToolSpec(
        fn=call,
        name=name,
        timeout=options.timeout if options.timeout is not None else server.timeout,
        side_effects=side_effects,
        restricted=bool(options.restricted),
        verify=verify,
        is_async=True,
        wants_invocation_id=True,
        retries=options.retries,
        server_name=server_name,
        mcp_name=mcp_name,
        idempotent=hints.get("idempotentHint") is True and options.side_effects is None,
    )
    description = str(tool.get("description") or tool.get("title") or "")
    spec._derived["definition"] = {
        "name": name,
        "description": description,
        "input_schema": _without_runtime_parameters(schema),
    }
    spec._derived["validate"] = check
    return spec


def _after_the_deadline(connection: MCPConnection, verify: Verify) -> Verify:
    """``verify``, asked once a call the server may still be running is past its deadline (over HTTP)."""

    async def verify_after_the_deadline(invocation_id: str) -> Any:
        await connection.settle(invocation_id)
        return await verify(invocation_id)

    return verify_after_the_deadline


def _label_span(server_name: str, tool: str) -> None:
    """Name the server and tool on the tool call's span (when telemetry is built, OpenTelemetry is loaded)."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is not None:
        trace.get_current_span().set_attributes({"mcp.server.name": server_name, "mcp.tool.name": tool})


def _without_runtime_parameters(schema: dict[str, Any]) -> dict[str, Any]:
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not RUNTIME_PARAMETERS & properties.keys():
        return schema
    out = dict(schema)
    out["properties"] = {k: v for k, v in properties.items() if k not in RUNTIME_PARAMETERS}
    if isinstance(schema.get("required"), list):
        out["required"] = [r for r in schema["required"] if r not in RUNTIME_PARAMETERS]
    return out


def result_value(
    result: Any, server_name: str, tool: str, max_bytes: int, redactor: Redactor | None = None
) -> Any:
    """What a tool call returns (and the journal keeps): the structured content, else the text.

    Content blocks other than text come back as their wire dicts. ``isError`` raises `MCPToolError`
    with the server's text; so does a result over ``max_bytes``. ``redactor`` masks the value and the
    error alike: a server that echoes its credentials gets them masked in either.
    """
    content = list(result.content or [])
    # Read from the blocks' attributes: a text result (the common case) costs no model_dump.
    texts = [str(getattr(b, "text", "")) for b in content if getattr(b, "type", None) == "text"]
    if result.is_error:
        message = short("\n".join(texts) or "the tool reported an error")
        if redactor is not None:
            message = redactor.redact(message)
        raise MCPToolError(f"MCP tool {tool} of {server_name} failed: {message}")
    structured = result.structured_content
    if structured is not None:
        value: Any = structured
    elif len(texts) == len(content):
        value = "\n".join(texts)
    else:
        value = [b.model_dump(by_alias=True, mode="json", exclude_none=True) for b in content]
    size = len(value.encode("utf-8", "surrogatepass")) if isinstance(value, str) else len(orjson.dumps(value))
    if size > max_bytes:
        raise MCPToolError(
            f"MCP tool {tool} of {server_name} returned {size / 1e6:.1f} MB, over the server's "
            f"max_result_bytes ({max_bytes} bytes)"
        )
    return value if redactor is None else redactor.redact_obj(value)


def _seconds(value: Any) -> bool:
    """A finite number of seconds > 0 (True is not one)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf


def _check_strings(what: str, mapping: Mapping[str, str] | None) -> None:
    if mapping is None:
        return
    if not isinstance(mapping, Mapping) or any(
        not isinstance(k, str) or not isinstance(v, str) or "\0" in k + v for k, v in mapping.items()
    ):
        raise ConfigError(f"MCP server {what} must map strings to strings (no NUL)")


def _bare_url(url: str) -> str:
    """The URL without credentials, query or fragment: what may be logged."""
    url = re.sub(r"^(https?://)[^/@]*@", r"\1", url)
    return re.split(r"[?#]", url, maxsplit=1)[0]
