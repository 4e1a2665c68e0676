"""The process-level services around a job: journal, probe server, heartbeats, telemetry, logs, memory.

Started during boot, closed during cleanup one at a time (a failure leaves the rest still closed), each
inside the cleanup budget.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.to_thread

from agentlife._config import Settings
from agentlife._exceptions import (
    AttemptFenced,
    BootFailure,
    ConfigError,
)
from agentlife._journal._writer import Journal, contained_session_dir
from agentlife._logging import process_logging
from agentlife._observe._job_heartbeat import JobHeartbeat
from agentlife._observe._lag import run_lag_monitor
from agentlife._runtime._base import Outcome
from agentlife._state import State
from agentlife._step._host import Booted

if TYPE_CHECKING:
    from agentlife._memory import QdrantMemory

from agentlife._runtime._base import RuntimeBase

log = logging.getLogger("agentlife.runtime")


class ServicesMixin(RuntimeBase):
    """Boot-time services and their orderly close."""

    def _modules_to_preload(self, settings: Settings) -> list[str]:
        modules: list[str] = []
        if settings.control_plane_url:
            modules.append("httpx")
        if self.env.get("ANTHROPIC_API_KEY"):
            modules.append("anthropic")
        if settings.qdrant_url or (settings.data_dir / "qdrant").exists():
            modules.append("qdrant_client")
        return modules

    def _open_journal(self, settings: Settings) -> Journal:
        try:
            session_dir = contained_session_dir(settings.data_dir, settings.job_id)
        except ConfigError as exc:
            raise BootFailure(f"configuration error: {exc}") from None
        journal = Journal.create(session_dir, settings.attempt, redactor=self.redactor)
        journal.append(
            "SESSION_STARTED",
            job_id=settings.job_id,
            agent_id=settings.agent_id,
            attempt=settings.attempt,
            pid=os.getpid(),
            pod_name=self.redactor.redact(settings.pod_name),
            previous_exit_code=settings.previous_exit_code,
        )
        return journal

    def _start_services(self, services: anyio.abc.TaskGroup, settings: Settings, journal: Journal) -> None:
        services.start_soon(journal.run_periodic_flush, 1.0)
        services.start_soon(run_lag_monitor, self.board, settings.constants.probe.lag_interval_seconds)
        if settings.control_plane_url:
            from agentlife._observe._heartbeat import SseHeartbeat

            hb = settings.constants.heartbeat
            self._heartbeat = SseHeartbeat(
                settings.control_plane_url,
                settings.control_plane_token,
                agent_id=settings.agent_id,
                job_id=settings.job_id,
                pod_name=settings.pod_name,
                interval=hb.sse_interval_seconds,
                snapshot_metrics=self._heartbeat_metrics,
                board=self.board,
                reconnect_initial=hb.reconnect_initial_seconds,
                reconnect_max=hb.reconnect_max_seconds,
                redactor=self.redactor,
            )
            services.start_soon(self._heartbeat.run)

    def _start_job_heartbeat(self, services: anyio.abc.TaskGroup, booted: Booted) -> None:
        s = booted.settings
        beat = JobHeartbeat(
            booted.store,
            s.job_id,
            s.attempt,
            s.constants.heartbeat.job_interval_seconds,
            self.board,
            on_fenced=self._fenced_out,
            redactor=self.redactor,
        )
        services.start_soon(beat.run)

    def _fenced_out(self, exc: AttemptFenced) -> None:
        """A later attempt owns the job: stop the step loop now, exit 1, never write the row again."""
        log.error("fenced: %s; stopping the step loop", exc)
        self._fenced = exc
        if self._step_scope is not None:
            self._step_scope.cancel()

    def _start_probe_server(self) -> None:
        if not self.options.probes:
            return
        host = self.env.get("AGENTLIFE_HEALTH_HOST") or "0.0.0.0"
        raw_port = (self.env.get("AGENTLIFE_HEALTH_PORT") or "8086").strip()
        if raw_port.lower() == "off":
            return
        try:
            port = int(raw_port)
        except ValueError:
            return  # Settings reports the bad value as a configuration error right after this
        from agentlife._observe._probes import ProbeServer

        threshold = self.constants.probe.blocked_threshold_seconds
        self._probe_server = ProbeServer(
            self.board, host, port, blocked_threshold=threshold, redactor=self.redactor
        )
        self._probe_server.start()

    async def open_memory(self, settings: Settings) -> QdrantMemory:
        """The memory client, opened on first use (its import overlapped boot on the preload thread)."""
        from agentlife._memory import QdrantMemory, collection_name

        if self.memory is None:
            budget = self.constants.hydration.memory_timeout_seconds
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

    async def _cleanup(self, outcome: Outcome) -> None:
        """Flush and close everything inside the cleanup budget, shielded from cancellation."""
        budget = self.constants.drain.cleanup_budget_seconds
        if not self.draining:
            self._arm_hard_exit(budget, outcome.exit_code)  # the work is settled: keep its exit code
        with anyio.move_on_after(budget, shield=True) as scope:
            await self._close_resources()
        if scope.cancelled_caught:
            log.error("cleanup exceeded its %gs budget; exiting anyway", budget)
        if self._drain_started is not None:
            self.telemetry.drain(self.drain_reason or outcome.reason, time.monotonic() - self._drain_started)
        if self.state is not State.TERMINATED:
            self.machine.move(State.TERMINATED, outcome.reason)
        if self.journal is not None:
            self.journal.append(
                "SESSION_ENDED", exit_code=outcome.exit_code, reason=self.redactor.redact(outcome.reason)
            )
            with anyio.move_on_after(budget, shield=True):
                await quietly("journal close", self.journal.aclose())
        await self._close_heartbeat()
        if not self.owns_process:
            return
        with anyio.move_on_after(min(2.0, budget), shield=True):
            await quietly("telemetry shutdown", self.telemetry.ashutdown(min(2.0, budget)))
        if self._probe_server is not None:
            await quietly("probe server stop", anyio.to_thread.run_sync(self._probe_server.stop))

    async def _close_resources(self) -> None:
        """One at a time, so a failure leaves the rest still closed (no gather of half-closed state)."""
        if self.journal is not None:
            await quietly("journal flush", self.journal.flush(fsync=True))
        if self._llm_client is not None:
            await quietly("LLM client close", self._llm_client.aclose())
        if self.memory is not None:
            await quietly("memory close", self.memory.aclose())
        if self.mcp_tools is not None:
            grace = self.constants.drain.cleanup_budget_seconds / 2
            await quietly("MCP servers close", self.mcp_tools.aclose(grace))
        if self.store is not None and self.owns_process:
            await quietly("store close", self.store.close())

    async def _close_heartbeat(self) -> None:
        if self._heartbeat is None:
            return
        with anyio.move_on_after(min(1.0, self.constants.drain.cleanup_budget_seconds / 4), shield=True):
            await quietly("heartbeat flush", self._heartbeat.flush(1.0))
        with anyio.move_on_after(1.0, shield=True):
            await quietly("heartbeat close", self._heartbeat.aclose())

    def _heartbeat_metrics(self) -> dict[str, Any]:
        # rssMb and uptimeSeconds (from the kernel's process start) are the heartbeat stream's own.
        return {
            "stepsCompleted": self.stats.steps_completed,
            "llmCallsTotal": self.stats.llm_calls,
            "toolCallsTotal": self.stats.tool_calls,
        }

    def _log_context(self) -> dict[str, Any]:
        snap = self.board.snapshot()
        return {
            # Lines logged before the settings are read (the probe server's first) still name the job.
            "job_id": snap.job_id or self.options.job_id or self.env.get("AGENTLIFE_JOB_ID") or None,
            "agent_id": snap.agent_id or None,
            "attempt": snap.attempt or None,
            "state": snap.state.value,
            "step": snap.step,
        }

    def _logging(self) -> Any:
        return process_logging(
            self.env,
            enabled=self.options.json_logs,
            context=self._log_context,
            redactor=self.redactor,
            stream=self.options.log_stream,
        )


async def quietly(what: str, awaitable: Any) -> None:
    """Await a cleanup step; its failure is one log line, and the settled exit code stands."""
    try:
        await awaitable
    except Exception as exc:
        log.warning("%s failed: %s: %s", what, type(exc).__name__, exc)
