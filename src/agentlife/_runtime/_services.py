"""What one job opens around its steps: session journal, heartbeats, memory, MCP servers, LLM client, store.

`JobServices` opens each during boot and hydration and closes them in cleanup one at a time (a failure
leaves the rest still closed), each inside the cleanup budget. What outlives the job (the probe server,
the telemetry, a worker's store) belongs to the process (`ProcessShell`) and is not closed here.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.to_thread

from agentlife._agent import AgentProcess
from agentlife._config import Settings
from agentlife._exceptions import AttemptFenced, BootFailure, ConfigError, StoreUnavailable
from agentlife._journal._writer import Journal, contained_session_dir
from agentlife._observe._job_heartbeat import JobHeartbeat
from agentlife._output._deltas import DeltaBuffer
from agentlife._preload import Preloader
from agentlife._providers import PROVIDERS
from agentlife._redact import Redactor
from agentlife._runtime._events import JobEvents
from agentlife._runtime._process import quietly
from agentlife._state import State, Transition
from agentlife._step._host import Booted
from agentlife._tools import loaded_mcp
from agentlife.constants import Constants
from agentlife.stores import store_from_url

if TYPE_CHECKING:
    from agentlife._llm._protocol import LLMClient
    from agentlife._memory import QdrantMemory
    from agentlife._runtime._mcp_tools import MCPTools
    from agentlife.stores import JobStore

__all__ = ["JobServices", "mcp_tools_for"]

log = logging.getLogger("agentlife.runtime")


class JobServices:
    """The job's own services, opened as boot and hydration need them and closed in cleanup.

    Args:
        agent: the agent (its embedder, for the memory client).
        env: the environment (which optional modules to preload).
        redactor: masks secrets in what the services record.
        events: the job's events (its transitions go to the journal and the heartbeat stream).
        lent_store: a worker's open store, lent for the job (never closed here); None: the job opens its own.
    """

    def __init__(
        self,
        agent: AgentProcess,
        env: Mapping[str, str],
        redactor: Redactor,
        events: JobEvents,
        lent_store: JobStore | None = None,
    ) -> None:
        self.agent, self.env, self.redactor, self.events = agent, env, redactor, events
        self.lent_store = lent_store
        self.journal: Journal | None = None
        self.store: JobStore | None = None
        self.memory: QdrantMemory | None = None
        self.mcp_tools: MCPTools | None = None
        self.llm: LLMClient | None = None
        self._preloader: Preloader | None = None
        self._heartbeat: Any = None
        #: The job heartbeat's scope: cancelled first in cleanup, so that no beat reaches a closing store.
        self._job_beat: anyio.CancelScope | None = None

    def preload(self, settings: Settings) -> None:
        """Import the optional clients this job will use on a thread, overlapping boot."""
        modules: list[str] = []
        if settings.control_plane_url:
            modules.append("httpx")
        provider = PROVIDERS[settings.llm_provider]
        if provider.key_variable is None or self.env.get(provider.key_variable):
            modules.extend(provider.preload)
        if settings.qdrant_url or (settings.data_dir / "qdrant").exists():
            modules.append("qdrant_client")
        self._preloader = Preloader(modules).start()

    def open_journal(self, settings: Settings) -> Journal:
        """This attempt's session journal, with its first event; every transition is journaled from now."""
        try:
            session_dir = contained_session_dir(settings.data_dir, settings.job_id)
        except ConfigError as exc:
            raise BootFailure(f"configuration error: {exc}") from None
        journal = self.journal = Journal.create(session_dir, settings.attempt, redactor=self.redactor)
        journal.append(
            "SESSION_STARTED",
            job_id=settings.job_id,
            agent_id=settings.agent_id,
            attempt=settings.attempt,
            pid=os.getpid(),
            pod_name=self.redactor.redact(settings.pod_name),
            previous_exit_code=settings.previous_exit_code,
        )
        self.events.add_sink(self._journal_transition)
        return journal

    def _journal_transition(self, transition: Transition) -> None:
        if self.journal is not None:
            self.journal.append(
                "LIFECYCLE",
                **{"from": transition.source.value, "to": transition.target.value},
                reason=self.redactor.redact(transition.reason),
            )

    async def open_store(self, settings: Settings) -> JobStore:
        """The lent store, or this process's own connection (closed in cleanup)."""
        if self.lent_store is not None:
            self.store = self.lent_store
            return self.store
        store = store_from_url(settings.resolved_database_url)
        try:
            await store.open()  # bounded by the store's own connect timeout and tries
        except StoreUnavailable as exc:
            raise BootFailure(f"store unreachable: {self.redactor.redact(str(exc))}") from None
        self.store = store
        return store

    def start(self, tasks: anyio.abc.TaskGroup, settings: Settings, journal: Journal) -> None:
        """The journal's periodic flush and, with a control plane, the SSE heartbeat."""
        tasks.start_soon(journal.run_periodic_flush, 1.0)
        if settings.control_plane_url:
            from agentlife._observe._heartbeat import SseHeartbeat

            hb = settings.constants.heartbeat
            self._heartbeat = heartbeat = SseHeartbeat(
                settings.control_plane_url,
                settings.control_plane_token,
                agent_id=settings.agent_id,
                job_id=settings.job_id,
                pod_name=settings.pod_name,
                interval=hb.sse_interval_seconds,
                snapshot_metrics=self._heartbeat_metrics,
                board=self.events.board.board,
                progress=self._heartbeat_progress,
                reconnect_initial=hb.reconnect_initial_seconds,
                reconnect_max=hb.reconnect_max_seconds,
                redactor=self.redactor,
            )
            self.events.add_sink(heartbeat.push_lifecycle)
            tasks.start_soon(heartbeat.run)

    def start_job_tasks(
        self, tasks: anyio.abc.TaskGroup, booted: Booted, on_fenced: Callable[[AttemptFenced], None]
    ) -> DeltaBuffer:
        """The claimed job's own tasks: its row's heartbeat and the buffer of model text for its followers.

        ``on_fenced`` is called when a later attempt owns the row.
        """
        self._start_job_heartbeat(tasks, booted, on_fenced)
        return self._start_deltas(tasks, booted)

    def _start_job_heartbeat(
        self, tasks: anyio.abc.TaskGroup, booted: Booted, on_fenced: Callable[[AttemptFenced], None]
    ) -> None:
        s = booted.settings
        beat = JobHeartbeat(
            booted.store,
            s.job_id,
            s.attempt,
            s.constants.heartbeat.job_interval_seconds,
            self.events.board.board,
            on_fenced=on_fenced,
            redactor=self.redactor,
        )
        scope = self._job_beat = anyio.CancelScope()

        async def beat_until_cleanup() -> None:
            with scope:
                await beat.run(beat_now=False)  # the claim has just set heartbeat_at

        tasks.start_soon(beat_until_cleanup)

    def _start_deltas(self, tasks: anyio.abc.TaskGroup, booted: Booted) -> DeltaBuffer:
        store, job_id = booted.store, booted.settings.job_id

        async def send(payloads: Sequence[str]) -> None:
            await store.send_deltas(job_id, payloads)

        deltas = DeltaBuffer(send, self.redactor, can_send=store.has_free_connection)
        tasks.start_soon(deltas.run)
        return deltas

    async def open_memory(self, settings: Settings) -> QdrantMemory:
        """The memory client, opened on first use (its import overlapped boot on the preload thread)."""
        from agentlife._memory import QdrantMemory, collection_name

        if self.memory is None:
            budget = settings.constants.hydration.memory_timeout_seconds
            if self._preloader is not None:
                await anyio.to_thread.run_sync(
                    self._preloader.wait, "qdrant_client", 10.0, abandon_on_cancel=True
                )
            self.memory = QdrantMemory(
                url=settings.qdrant_url,
                path=settings.data_dir / "qdrant",
                collection=collection_name(settings.agent_id),
                embedder=self.agent.make_embedder(),
                # Its calls run on worker threads a cancel scope cannot stop: bound each by what is left of
                # the memory budget (qdrant-client's own 5 s would outlast a scaled budget).
                timeout=min(budget, max(0.0, anyio.current_effective_deadline() - anyio.current_time())),
            )
        return self.memory

    async def close_resources(self, constants: Constants) -> None:
        """One at a time, so a failure leaves the rest still closed (no gather of half-closed state)."""
        if self._job_beat is not None:  # the job is over: a beat during the store's close would fail, warn
            self._job_beat.cancel()
        if self.journal is not None:
            await quietly("journal flush", self.journal.flush(fsync=True))
        if self.llm is not None:
            await quietly("LLM client close", self.llm.aclose())
        if self.memory is not None:
            await quietly("memory close", self.memory.aclose())
        if self.mcp_tools is not None:
            grace = constants.drain.cleanup_budget_seconds / 2
            await quietly("MCP servers close", self.mcp_tools.aclose(grace))
        if self.store is not None and self.store is not self.lent_store:
            await quietly("store close", self.store.close())

    async def end_session(self, exit_code: int, reason: str, constants: Constants) -> None:
        """``SESSION_ENDED`` journaled and the journal closed, then the heartbeat stream's last word."""
        budget = constants.drain.cleanup_budget_seconds
        if self.journal is not None:
            self.journal.append("SESSION_ENDED", exit_code=exit_code, reason=self.redactor.redact(reason))
            with anyio.move_on_after(budget, shield=True):
                await quietly("journal close", self.journal.aclose())
        if self._heartbeat is not None:
            with anyio.move_on_after(min(1.0, budget / 4), shield=True):
                await quietly("heartbeat flush", self._heartbeat.flush(1.0))
            with anyio.move_on_after(1.0, shield=True):
                await quietly("heartbeat close", self._heartbeat.aclose())

    def _heartbeat_progress(self) -> tuple[State, int | None]:
        # This job's own state and step (its board entry), not the process's: a worker runs several.
        step = self.events.board.log_fields.get("step")
        return self.events.state, step if isinstance(step, int) else None

    def _heartbeat_metrics(self) -> dict[str, Any]:
        # rssMb and uptimeSeconds (from the kernel's process start) are the heartbeat stream's own.
        stats = self.events.stats
        return {
            "stepsCompleted": stats.steps_completed,
            "llmCallsTotal": stats.llm_calls,
            "toolCallsTotal": stats.tool_calls,
        }


def mcp_tools_for(agent: AgentProcess) -> MCPTools | None:
    """The agent's MCP servers, not yet started; None (and nothing of MCP imported) when it lists none."""
    listed = (getattr(agent, "tools", ()), getattr(agent, "mcp_servers", ()))  # a property may make one now
    if loaded_mcp() is None or not any(listed):  # no `MCPServer` was ever made: the agent lists none
        return None
    from agentlife._runtime._mcp_tools import MCPTools

    return MCPTools.for_agent(agent)
