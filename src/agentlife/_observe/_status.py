"""The status board: what the agent's loop publishes and the probe thread reads.

The agent's event loop writes (state, step, loop ticks, heartbeat results); the probe server's thread
reads snapshots. Writes are single attribute stores under a lock, so a wedged agent loop can never hold
the probe thread up: the probe answers from the last values written, and the loop's *silence* is itself
the signal that it is blocked.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from agentlife._state import State

__all__ = ["HealthVerdict", "StatusBoard", "StatusSnapshot"]


@dataclass(frozen=True, slots=True)
class StatusSnapshot:
    """A consistent copy of the board, safe to read from any thread."""

    job_id: str
    agent_id: str
    attempt: int
    pod_name: str
    state: State
    step: int | None
    started_monotonic: float
    loop_tick_monotonic: float | None
    loop_lag_seconds: float
    blocked_threshold_seconds: float
    probe_port: int | None
    heartbeats: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: In a worker (``python -m agentlife worker``): its own state (``idle``, ``busy``, ``draining``,
    #: ``stopping``), jobs run, the current job and the runnable jobs per agent; None in a one-job process.
    worker: dict[str, Any] | None = None
    #: Every job this process is running, by job id: its agent, attempt, state and step (one entry in a
    #: one-job process, up to ``--concurrency`` in a worker).
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: With rate limits configured: per bucket, this process's waits for capacity (calls waiting now,
    #: seconds waited) and what providers taught it; None without limits.
    rate_limits: dict[str, dict[str, Any]] | None = None

    def loop_silence(self, now: float | None = None) -> float:
        """Seconds since the agent's loop last proved it was running (0 before the sampler starts)."""
        if self.loop_tick_monotonic is None:
            return 0.0
        return max(0.0, (time.monotonic() if now is None else now) - self.loop_tick_monotonic)

    def to_json(self) -> dict[str, Any]:
        """The body of ``/status``: no secret is ever stored on the board, so none can leak here."""
        return {
            "job_id": self.job_id,
            "agent_id": self.agent_id,
            "attempt": self.attempt,
            "pod_name": self.pod_name,
            "state": self.state.value,
            "step": self.step,
            "uptime_seconds": round(time.monotonic() - self.started_monotonic, 3),
            "loop_lag_seconds": round(self.loop_lag_seconds, 6),
            "loop_silence_seconds": round(self.loop_silence(), 3),
            "probe_port": self.probe_port,
            "pid": os.getpid(),
            "heartbeats": self.heartbeats,
            "jobs": [{"job_id": job_id, **fields} for job_id, fields in self.jobs.items()],
            **({} if self.worker is None else {"worker": self.worker}),
            **({} if self.rate_limits is None else {"rate_limits": self.rate_limits}),
        }


@dataclass(frozen=True, slots=True)
class HealthVerdict:
    """An HTTP probe answer: status code and a one-line body."""

    ok: bool
    reason: str

    @property
    def status(self) -> int:
        """200 when ok, else 503."""
        return 200 if self.ok else 503


class StatusBoard:
    """Shared, lock-protected status of one agent process."""

    def __init__(
        self,
        *,
        job_id: str,
        agent_id: str,
        attempt: int,
        pod_name: str = "",
        blocked_threshold_seconds: float = 5.0,
    ) -> None:
        self._lock = threading.Lock()
        self._snap = StatusSnapshot(
            job_id=job_id,
            agent_id=agent_id,
            attempt=attempt,
            pod_name=pod_name,
            state=State.BOOTING,
            step=None,
            started_monotonic=time.monotonic(),
            loop_tick_monotonic=None,
            loop_lag_seconds=0.0,
            blocked_threshold_seconds=blocked_threshold_seconds,
            probe_port=None,
        )
        #: Liveness signal from the store ("pool has a free connection"); set once the store is open.
        self.store_has_free_connection: Callable[[], bool] | None = None
        #: Renders ``/metrics``; set by telemetry once it is configured. None from it: serve the core gauges.
        self.metrics_text: Callable[[], str | None] | None = None
        #: Set while telemetry is not built yet: blocks (bounded) until it is. The probe server calls it off
        #: its loop before rendering ``/metrics``, so a scrape that waits for it never delays ``/healthz``.
        self.metrics_ready: Callable[[], object] | None = None

    def snapshot(self) -> StatusSnapshot:
        """A consistent copy."""
        with self._lock:
            return self._snap

    def update(self, **changes: Any) -> None:
        """Replace fields of the snapshot (``state=``, ``step=``, ``probe_port=`` ...)."""
        with self._lock:
            self._snap = replace(self._snap, **changes)

    def update_worker(self, **changes: Any) -> None:
        """Replace fields of the worker's part of the snapshot (a worker process only)."""
        with self._lock:
            self._snap = replace(self._snap, worker={**(self._snap.worker or {}), **changes})

    def update_job(self, job_id: str, /, **changes: Any) -> None:
        """Replace fields of one running job's entry in the table ``/status`` lists (adding it if new)."""
        with self._lock:
            jobs = dict(self._snap.jobs)
            jobs[job_id] = {**jobs.get(job_id, {}), **changes}
            self._snap = replace(self._snap, jobs=jobs)

    def remove_job(self, job_id: str) -> None:
        """The job ended: it leaves the table."""
        with self._lock:
            if job_id in self._snap.jobs:
                jobs = dict(self._snap.jobs)
                del jobs[job_id]
                self._snap = replace(self._snap, jobs=jobs)

    def tick(self, lag_seconds: float) -> None:
        """Called by the lag sampler on the agent's loop: the loop is alive, with this much drift."""
        with self._lock:
            self._snap = replace(
                self._snap, loop_tick_monotonic=time.monotonic(), loop_lag_seconds=lag_seconds
            )

    def record_heartbeat(self, kind: str, *, ok: bool, error: str | None = None, failures: int = 0) -> None:
        """Remember the last result of the ``sse`` or ``job`` heartbeat for ``/status``."""
        entry: dict[str, Any] = {"ok": ok, "at": time.time(), "failures": failures}
        if error is not None:
            entry["error"] = error
        with self._lock:
            heartbeats = dict(self._snap.heartbeats)
            heartbeats[kind] = entry
            self._snap = replace(self._snap, heartbeats=heartbeats)

    def health(self, now: float | None = None) -> HealthVerdict:
        """``/healthz``: alive unless terminated, the loop is blocked, or the store pool is exhausted.

        DRAINING stays healthy on purpose: a liveness failure during a drain would get the pod killed
        in the middle of saving its work.
        """
        snap = self.snapshot()
        if snap.state is State.TERMINATED:
            return HealthVerdict(False, "TERMINATED")
        silence = snap.loop_silence(now)
        if silence >= snap.blocked_threshold_seconds:
            return HealthVerdict(False, f"event loop blocked for {silence:.1f}s")
        store_free = self.store_has_free_connection
        if store_free is not None and snap.state is not State.DRAINING:
            try:
                free = store_free()
            except Exception:
                free = False
            if not free:
                return HealthVerdict(False, "store pool has no free connection")
        return HealthVerdict(True, "ok")

    def readiness(self) -> HealthVerdict:
        """``/readyz``: ready in READY and EXECUTING only; a worker while it can take a job.

        A worker is ready when it is idle and its last claim worked: one whose claims fail (the store is
        down) is as unable to take a job as a busy one.
        """
        snap = self.snapshot()
        if snap.worker is not None:
            worker_state = str(snap.worker.get("state"))
            if worker_state == "idle" and snap.worker.get("claim_error"):
                # Idle but unable to take a job: the last claim failed (the store is down, say).
                return HealthVerdict(False, "store unavailable")
            return HealthVerdict(worker_state == "idle", "ok" if worker_state == "idle" else worker_state)
        state = snap.state
        if state in (State.READY, State.EXECUTING):
            return HealthVerdict(True, "ok")
        return HealthVerdict(False, state.value)
