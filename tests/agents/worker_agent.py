"""An agent for the worker tests (``test_worker.py``, ``test_worker_chaos.py``), driven by environment.

Every trace goes to append-only files in ``WORKER_DIR``, written with ``fsync`` so a SIGKILL cannot lose one:

- ``steps``: ``job attempt step pid instance jobs_seen unix_time`` per step, where ``instance`` numbers the
  agent instances this process built and ``jobs_seen`` counts the jobs this instance has seen (1 when fresh);
- ``effects``: ``invocation job attempt pid`` each time the side-effecting tool really runs (with ``verify``,
  so a resumed job never runs it twice).

``WORKER_STEPS`` (default 2) steps per job, ``WORKER_STEP_SECONDS`` (default 0.01) of sleep per step,
``WORKER_TOOL=1`` one tool call per step, ``WORKER_RESTRICTED=1`` a restricted call (approval needed) in the
first step, ``WORKER_GATE=1`` each job's first step touches
``waiting-{job}-{attempt}`` and waits for the file ``gate-{job}``, ``WORKER_CRASH_JOB`` a job id whose
every step raises ``RuntimeError``, ``WORKER_LOG_LINES`` log lines per step naming the job in the message,
each followed by a yield to the loop (so the lines of concurrent jobs interleave).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import anyio

from agentlife import NOT_DONE, AgentProcess, Done, StepContext, tool


def _dir() -> Path:
    return Path(os.environ["WORKER_DIR"])


def _append(name: str, line: str) -> None:
    fd = os.open(_dir() / name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _effects() -> set[str]:
    path = _dir() / "effects"
    return {line.split()[0] for line in path.read_text().splitlines() if line} if path.exists() else set()


async def _verify(invocation_id: str) -> Any:
    return f"done:{invocation_id}" if invocation_id in _effects() else NOT_DONE


class WorkerAgent(AgentProcess):
    """A small job whose every step and side effect leaves a trace, and which knows if it was reused."""

    agent_id = "worker-agent"
    built = 0

    def __init__(self) -> None:
        super().__init__()
        type(self).built += 1
        self.instance = type(self).built
        self.jobs_seen: list[str] = []

    async def step(self, ctx: StepContext) -> Done | None:
        if ctx.job.id not in self.jobs_seen:
            self.jobs_seen.append(ctx.job.id)
        job, attempt = ctx.job.id, ctx.job.attempt
        pid = os.getpid()
        seen = len(self.jobs_seen)
        _append("steps", f"{job} {attempt} {ctx.step} {pid} {self.instance} {seen} {time.time()}")
        for i in range(int(os.environ.get("WORKER_LOG_LINES", "0"))):
            logging.getLogger("worker_agent").info("own line of %s %s %s %s", job, attempt, ctx.step, i)
            await anyio.sleep(0)
        if job == os.environ.get("WORKER_CRASH_JOB"):
            raise RuntimeError(f"poison job {job}")
        if ctx.step == 0 and os.environ.get("WORKER_GATE") == "1":
            _dir().joinpath(f"waiting-{job}-{attempt}").touch()
            while not _dir().joinpath(f"gate-{job}").exists():
                await anyio.sleep(0.01)
        if ctx.step == 0 and os.environ.get("WORKER_RESTRICTED") == "1":

            async def deploy() -> str:
                _append("deploys", f"{job} {attempt} {pid}")
                return "deployed"

            await ctx.call_tool(tool(name="deploy", restricted=True, side_effects=False)(deploy))
        if os.environ.get("WORKER_TOOL") == "1":

            async def effect(invocation_id: str) -> str:
                _append("effects", f"{invocation_id} {job} {attempt} {pid}")
                return f"done:{invocation_id}"

            await ctx.call_tool(tool(name="effect", verify=_verify)(effect))
        await anyio.sleep(float(os.environ.get("WORKER_STEP_SECONDS", "0.01")))
        ctx.state["steps"] = ctx.state.get("steps", 0) + 1
        if ctx.step + 1 >= int(os.environ.get("WORKER_STEPS", "2")):
            return Done(result={"instance": self.instance, "jobs_seen": list(self.jobs_seen)})
        return None
