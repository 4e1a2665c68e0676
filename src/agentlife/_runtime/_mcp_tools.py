"""The optional hydration step that starts a job's MCP servers, and the live tools it leaves behind.

`start_mcp_servers` runs after the memory fetch when the agent lists servers (``ToolAgent.tools`` or
``AgentProcess.mcp_servers``): each server is started within its ``start_timeout``, its tool list is
fetched once for the attempt and journaled (``MCP_TOOLS``: the offered names and a digest each), and
compared with the list the previous attempt recorded. A list that changed while the resumed step has
recorded calls is a replay mismatch of the offered tools: ``replay_mismatch = "fail"`` stops the attempt
(exit 1), ``"rerun"`` runs the step afresh (pending side-effecting calls still go through ``verify``).
A server that cannot start stops hydration with one line naming it (exit 1; the job row is untouched,
so the next attempt tries again).

A side-effecting call over HTTP that the journal holds as pending may still be running on its server
(which finishes a call whatever became of its client): its deadline, from the recorded start and the
tool's timeout, is handed to the connection, so its ``verify`` decides only once the server is done.

`MCPTools` is what steps reach through `CURRENT_MCP`: the tool specs of each server, and the close of
every server in cleanup, one at a time.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import orjson

from agentlife._exceptions import BootFailure, ConfigError, MCPServerUnavailable, ReplayMismatch
from agentlife._journal._recovery import BadLine, read_events
from agentlife._journal._writer import list_sessions, session_of
from agentlife._mcp._client import MCPConnection
from agentlife._mcp._server import (
    CURRENT_MCP,
    MCPServer,
    MCPToolSpec,
    build_specs,
    label_of,
    plan_names,
    tool_digest,
)

if TYPE_CHECKING:
    from agentlife._agent import AgentProcess
    from agentlife._journal._recovery import ReplayMap
    from agentlife._journal._steprecords import StepJournal
    from agentlife._observe._telemetry_facade import TelemetryFacade
    from agentlife._redact import Redactor
    from agentlife._step._host import Booted
    from agentlife.constants import Constants

__all__ = ["MCPTools", "check_changed_tools", "declared_servers", "start_mcp_servers"]

log = logging.getLogger("agentlife.mcp")

#: How far into an earlier session file the previous tool lists are looked for (they come before step 0).
_HEAD_EVENTS = 400
#: What `MCPConnection.settle` adds to a deadline (scaled): the clocks of two pods under NTP differ by
#: milliseconds, and the request reached the server after its start was journaled.
_CLOCK_MARGIN_SECONDS = 1.0
#: How many of the tools left out are logged and journaled one by one (a hostile listing may hold many).
_SKIPPED_SHOWN = 20


def declared_servers(agent: AgentProcess) -> list[MCPServer]:
    """The servers of ``agent.tools`` and ``agent.mcp_servers``, each configuration once, in order."""
    found: dict[tuple[Any, ...], MCPServer] = {}
    for item in [*_items(getattr(agent, "tools", ())), *_items(getattr(agent, "mcp_servers", ()))]:
        if isinstance(item, MCPServer):
            found.setdefault(item.key, item)
    return list(found.values())


def _items(value: Any) -> Iterable[Any]:
    return value if isinstance(value, (list, tuple)) else ()


class MCPTools:
    """The live MCP servers of one job and the tools they serve."""

    def __init__(self, servers: Sequence[MCPServer] = (), replay_mismatch: str = "fail") -> None:
        self.servers = list(servers)
        self.replay_mismatch = replay_mismatch
        self._connections: dict[tuple[Any, ...], MCPConnection] = {}
        self._specs: dict[tuple[Any, ...], list[MCPToolSpec]] = {}
        # By the name the server lists: a call finds its tool in one lookup, however long the list.
        self._by_name: dict[tuple[Any, ...], dict[str, MCPToolSpec]] = {}
        self._skipped: dict[tuple[Any, ...], dict[str, str]] = {}

    @classmethod
    def for_agent(cls, agent: AgentProcess) -> MCPTools | None:
        """The (not yet started) servers ``agent`` lists; None when it lists none."""
        servers = declared_servers(agent)
        return cls(servers, agent.replay_mismatch) if servers else None

    async def hydrate(
        self,
        booted: Booted,
        services: anyio.abc.TaskGroup,
        replay: ReplayMap | None,
        records: StepJournal,
        *,
        redactor: Redactor,
        telemetry: TelemetryFacade,
    ) -> None:
        """The hydration step: start the servers for this job's task, check their lists against the last.

        ``records`` is the steps' journal: the lists go to the store with the step's records, and the last
        lists come from there too, so an attempt on another pod compares with what the job last saw.
        """
        CURRENT_MCP.set(self)  # this job's task (and the steps it runs) see this job's servers
        changed = await start_mcp_servers(
            self.servers,
            services=services,
            journal=records,
            session_dir=booted.settings.session_dir,
            redactor=redactor,
            telemetry=telemetry,
            tools=self,
        )
        # Before a "rerun" voids the records: a voided pending call is still put to its verify.
        self.await_pending_calls(replay, booted.settings.constants)
        check_changed_tools(
            changed,
            replay,
            policy=self.replay_mismatch,
            journal=records,
            job_id=booted.settings.job_id,
        )

    def await_pending_calls(self, replay: ReplayMap | None, constants: Constants) -> None:
        """Give each HTTP connection the deadlines of its pending side-effecting calls (see `settle`).

        A call's deadline is its recorded start plus the tool's timeout; a start that is missing, or later
        than now (a clock set back, a journal written by hand), counts as now, so the wait is never longer
        than the timeout.
        """
        now = time.time()
        for connection in self._connections.values():
            connection.clock_margin = _CLOCK_MARGIN_SECONDS * constants.time_scale
        if replay is None:
            return
        by_name = {
            spec.name: (spec, self._connections[key]) for key, specs in self._specs.items() for spec in specs
        }
        for record in replay.tools.values():
            found = by_name.get(record.tool or "")
            if record.status != "pending" or record.invocation_id is None or found is None:
                continue
            spec, connection = found
            if connection.server.transport != "http" or not spec.side_effects or spec.verify is None:
                continue
            timeout = (
                spec.timeout * constants.time_scale
                if spec.timeout is not None
                else constants.tool_timeout(spec.name)
            )  # as the call path reckons it
            started = record.started if record.started is not None and record.started <= now else now
            connection.deadlines[record.invocation_id] = started + timeout

    def knows(self, server: MCPServer) -> bool:
        """Whether ``server`` was started for this job."""
        return server.key in self._specs

    def specs_of(self, server: MCPServer) -> list[MCPToolSpec]:
        """The tools of ``server``, as offered to the model."""
        return self._specs[server.key]

    def spec_named(self, server: MCPServer, name: str) -> MCPToolSpec:
        """The tool ``name`` (as the server lists it) of ``server``; `ConfigError` if it has none."""
        spec = self._by_name[server.key].get(name)
        if spec is not None:
            return spec
        label = self._connections[server.key].label  # with the name the server gave itself
        reason = self._skipped[server.key].get(name)
        if reason is not None:
            raise ConfigError(f"MCP tool {name} of {label} is not available: {reason}")
        specs = self._specs[server.key]
        known = ", ".join(s.mcp_name for s in specs[:20]) + (
            f" and {len(specs) - 20} more" if len(specs) > 20 else ""
        )
        raise ConfigError(f"MCP server {label} has no tool {name!r} (its tools: {known or 'none'})")

    def add(
        self, server: MCPServer, connection: MCPConnection, specs: list[MCPToolSpec], skipped: dict[str, str]
    ) -> None:
        """Record a started server."""
        self._connections[server.key] = connection
        self._specs[server.key] = specs
        self._by_name[server.key] = {spec.mcp_name: spec for spec in specs}
        self._skipped[server.key] = skipped

    async def aclose(self, grace: float) -> None:
        """Close every server, one at a time (a failure leaves the others still closed)."""
        for connection in reversed(list(self._connections.values())):
            try:
                await connection.aclose(grace)
            except Exception as exc:
                log.warning("MCP server %s: close failed: %s: %s", connection.label, type(exc).__name__, exc)


async def start_mcp_servers(
    servers: Sequence[MCPServer],
    *,
    services: anyio.abc.TaskGroup,
    journal: StepJournal,
    session_dir: Path,
    redactor: Redactor,
    telemetry: TelemetryFacade,
    tools: MCPTools,
) -> list[str]:
    """Start ``servers`` into ``tools``; the names of the servers whose tool list changed since last attempt.

    Raises:
        BootFailure: a server did not start, or two servers have the same name.
    """
    started = time.monotonic()
    listings: list[tuple[MCPServer, MCPConnection, str, list[dict[str, Any]]]] = []
    for server in servers:
        connection = MCPConnection(server, services, redactor, server.start_timeout)
        # Recorded before it starts, so cleanup stops a server whose start a drain interrupted.
        tools.add(server, connection, [], {})
        try:
            listing = await connection.start()
        except MCPServerUnavailable as exc:
            raise BootFailure(str(exc)) from None
        name = _unique_name(server, listing.server_name, [n for _, _, n, _ in listings])
        connection.label = label_of(server, name)
        listings.append((server, connection, name, listing.tools))
    plans = plan_names([(name, listed) for _, _, name, listed in listings])
    previous = _previous_digests(session_dir, journal)
    changed = []
    for (server, connection, name, _), (admissible, names, left_out) in zip(listings, plans, strict=True):
        specs, bad_schemas = build_specs(server, name, admissible, names, connection)
        skipped = [*left_out, *bad_schemas]
        _log_skipped(connection.label, skipped)
        _warn_unverified(server, connection.label, specs)
        tools.add(server, connection, specs, dict(skipped))
        listed_by_name = {str(t["name"]): t for t in admissible}
        digests = {spec.name: tool_digest(listed_by_name[spec.mcp_name]) for spec in specs}
        digest = _list_digest(digests)
        journal.append(
            "MCP_TOOLS",
            server=name,
            transport=server.transport,
            target=redactor.redact(connection.label),
            digest=digest,
            tools=digests,
            skipped=[{"tool": t, "reason": r} for t, r in skipped[:_SKIPPED_SHOWN]],
            skipped_total=len(skipped),
            step=journal.resume_step,  # kept with the records of the step this attempt resumed
        )
        log.info("MCP server %s: %s tools (%s)", connection.label, len(specs), digest)
        if name in previous and previous[name]["digest"] != digest:
            _report_change(journal, name, previous[name], digests, digest)
            changed.append(name)
        await anyio.lowlevel.checkpoint()  # a long listing holds the loop for one server at a time
    telemetry.hydration_phase("mcp", time.monotonic() - started)
    return changed


def check_changed_tools(
    changed: list[str], replay: ReplayMap | None, *, policy: str, journal: StepJournal, job_id: str
) -> None:
    """A changed tool list under a resumed step with recorded calls is a replay mismatch of its tools."""
    if not changed or replay is None or replay.empty:
        return
    invocation_id = f"{job_id}/{replay.step}/0"
    recorded, current = (
        f"the tools of MCP server {', '.join(changed)} as listed by the previous attempt",
        ("the tools it lists now"),
    )
    if policy != "rerun":
        raise ReplayMismatch(invocation_id, recorded, current)
    replay.discard_from(0)
    journal.append(
        "REPLAY_DISCARDED",
        step=replay.step,
        call=0,
        invocation_id=invocation_id,
        recorded=recorded,
        current=current,
    )
    log.warning("MCP tool lists changed (%s): running step %s afresh", ", ".join(changed), replay.step)


def _log_skipped(label: str, skipped: list[tuple[str, str]]) -> None:
    """One ERROR line per reason (a reason shared by many tools, such as the limit, is one line)."""
    by_reason: dict[str, list[str]] = {}
    for tool, reason in skipped:
        by_reason.setdefault(reason, []).append(tool)
    for n, (reason, tools) in enumerate(by_reason.items()):
        if n == _SKIPPED_SHOWN:
            log.error(
                "MCP server %s: %s more tools left out", label, sum(map(len, list(by_reason.values())[n:]))
            )
            return
        if len(tools) == 1:
            log.error("MCP server %s: tool %s left out: %s", label, tools[0], reason)
        else:
            shown = ", ".join(tools[:5]) + (", ..." if len(tools) > 5 else "")
            log.error("MCP server %s: %s tools left out: %s (%s)", label, len(tools), reason, shown)


def _warn_unverified(server: MCPServer, label: str, specs: list[MCPToolSpec]) -> None:
    """One WARNING for an HTTP server's tools with side effects and neither ``verify`` nor idempotence.

    Such a call cut off by a crash runs again on the next attempt (the documented at-least-once), and an
    HTTP server finishes the first one all the same: the effect happens twice unless the server itself
    refuses a second call with the same invocation id.
    """
    if server.transport != "http":
        return
    names = [
        spec.mcp_name for spec in specs if spec.side_effects and spec.verify is None and not spec.idempotent
    ]
    if names:
        shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
        log.warning(
            "MCP server %s: %s with side effects and no verify (%s): a call cut off by a crash runs again on "
            "the next attempt while the server may finish the first one; unless the server refuses a second "
            'call with the same _meta["agentlife/invocation_id"], give each a verify with with_tool(...)',
            label,
            "a tool" if len(names) == 1 else f"{len(names)} tools",
            shown,
        )


def _list_digest(digests: dict[str, str]) -> str:
    return hashlib.sha256(orjson.dumps(digests, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def _unique_name(server: MCPServer, reported: str, taken: list[str]) -> str:
    base = server.name or "".join(c if c.isalnum() or c in "_-" else "_" for c in reported)[:32] or "mcp"
    if server.name is not None and server.name in taken:
        raise BootFailure(f"two MCP servers are named {server.name!r}: give each its own name=")
    name, n = base, 2
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    return name


def _report_change(
    journal: StepJournal, name: str, before: dict[str, Any], now: dict[str, str], digest: str
) -> None:
    old: dict[str, str] = before.get("tools") or {}
    added = sorted(now.keys() - old.keys())
    removed = sorted(old.keys() - now.keys())
    changed = sorted(k for k in now.keys() & old.keys() if now[k] != old[k])
    journal.append(
        "MCP_TOOLS_CHANGED",
        server=name,
        recorded=before["digest"],
        current=digest,
        added=added,
        removed=removed,
        changed=changed,
    )
    log.warning(
        "MCP server %s: its tool list changed since the previous attempt (%s -> %s): added %s, removed %s, "
        "changed %s",
        name,
        before["digest"],
        digest,
        added or "none",
        removed or "none",
        changed or "none",
    )


def _previous_digests(session_dir: Path, journal: StepJournal) -> dict[str, dict[str, Any]]:
    """Each server's ``MCP_TOOLS`` record of the last attempt to list the tools, this pod's or the store's.

    The store holds the lists of every attempt whose step records reached it, whichever pod it ran on; this
    pod's session files may hold a later one's (its records not yet stored when it died). The newer of the
    two, by attempt and session, is the one to compare with.
    """
    local, local_writer = _previous_in_session_files(session_dir, exclude=journal.journal.path)
    stored: dict[tuple[int, int], dict[str, dict[str, Any]]] = {}
    for (attempt, session, _), event in journal.stored_events("MCP_TOOLS"):
        if _is_listing(event):
            stored.setdefault((attempt, session), {}).setdefault(event["server"], event)
    if not stored:
        return local
    newest = max(stored)
    if local and local_writer is not None and local_writer >= newest:
        return local
    return stored[newest]


def _is_listing(event: Mapping[str, Any]) -> bool:
    return (
        isinstance(event.get("server"), str)
        and isinstance(event.get("digest"), str)
        and isinstance(event.get("tools"), dict)
    )


def _previous_in_session_files(
    session_dir: Path, *, exclude: Path
) -> tuple[dict[str, dict[str, Any]], tuple[int, int] | None]:
    """Each server's ``MCP_TOOLS`` record in the newest earlier session file with any, and that file's writer.

    Every earlier file is looked at, newest first, however many attempts in a row never listed the tools
    (a server that would not start, a store that was down): the first file with a record ends the search.
    Only the head of each file is read (the records come before the first step), so the cost does not
    grow with the journal; a file that cannot be read is skipped.
    """
    found: dict[str, dict[str, Any]] = {}
    sessions = [p for p in list_sessions(session_dir) if p != exclude]
    for path in reversed(sessions):
        try:
            for n, event in enumerate(read_events(path)):
                if n >= _HEAD_EVENTS or (not isinstance(event, BadLine) and event["type"] == "STEP_STARTED"):
                    break
                if isinstance(event, BadLine) or event["type"] != "MCP_TOOLS":
                    continue
                if _is_listing(event):
                    found.setdefault(event["server"], event)
        except OSError:
            continue
        if found:
            return found, session_of(path)
    return found, None
