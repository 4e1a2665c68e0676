"""An example agent to copy: it asks a person a question and waits, durably, for the answer.

From ``examples/``, on the embedded defaults (SQLite under ``.agentlife/``)::

    python -m agentlife run ask_a_person_agent:DeployGate --job-id deploy-7 \
        --payload '{"service": "billing", "version": "2.4.1"}'
    # posts the question, parks the job WAITING for the event "answer", exits 0: no process waits
    python -m agentlife job show deploy-7          # waits for   event 'answer' until ...
    python -m agentlife job send deploy-7 answer --payload '{"approve": true, "by": "ana"}'
    python -m agentlife run ask_a_person_agent:DeployGate --job-id deploy-7
    # resumes at the wait with the answer, deploys once, COMPLETED

With a worker pool (``python -m agentlife worker ask_a_person_agent:DeployGate``) the second ``run`` is not
needed: the send makes the job runnable and a worker resumes it.

What it shows:

* ``ctx.wait_for_event`` with a timeout of two days: the wait is journaled, the process exits while it
  waits, and a resumed step replays the question (posted once) and returns the answer;
* side-effecting tools keyed by their invocation id (``post_question``, ``deploy``), so a crash at any
  point posts the question once and deploys once;
* a timeout as an outcome: no answer within the time ends the job FAILED with a reason.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from agentlife import NOT_DONE, AgentProcess, Done, StepContext, tool

#: How long the person has to answer (``ANSWER_TIMEOUT_SECONDS`` overrides: two days).
ANSWER_TIMEOUT_SECONDS = float(os.environ.get("ANSWER_TIMEOUT_SECONDS", 2 * 24 * 3600))


def _outbox() -> Path:
    return Path(os.environ.get("AGENTLIFE_DATA_DIR", ".agentlife"))


def _posted(name: str, invocation_id: str) -> Any:
    """The line of ``name`` keyed by ``invocation_id``, else `NOT_DONE`: the proof an effect happened."""
    path = _outbox() / name
    lines = path.read_text().splitlines() if path.exists() else []
    found = [json.loads(line) for line in lines if json.loads(line)["key"] == invocation_id]
    return found[0] if found else NOT_DONE


def _append(name: str, record: dict[str, Any]) -> dict[str, Any]:
    path = _outbox() / name
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
        os.fsync(fd)  # durable before the tool returns: verify must find it after a crash
    finally:
        os.close(fd)
    return record


async def _question_posted(invocation_id: str) -> Any:
    return _posted("questions.jsonl", invocation_id)


async def _deployed(invocation_id: str) -> Any:
    return _posted("deployments.jsonl", invocation_id)


@tool(verify=_question_posted)
async def post_question(question: str, job_id: str, invocation_id: str) -> dict[str, Any]:
    """Post the question where a person sees it (here a file; in real life Slack, email or a ticket)."""
    how = f'python -m agentlife job send {job_id} answer --payload \'{{"approve": true, "by": "you"}}\''
    return _append("questions.jsonl", {"key": invocation_id, "question": question, "answer_with": how})


@tool(verify=_deployed)
async def deploy(service: str, version: str, invocation_id: str) -> dict[str, Any]:
    """Deploy ``version`` of ``service``: the effect that must happen once, and only when approved."""
    return _append("deployments.jsonl", {"key": invocation_id, "service": service, "version": version})


class DeployGate(AgentProcess):
    """Asks whether to deploy, waits up to two days for the answer, deploys once if approved."""

    agent_id = "deploy-gate"

    async def step(self, ctx: StepContext) -> Done | None:
        service, version = ctx.job.payload["service"], ctx.job.payload["version"]
        await ctx.call_tool(post_question, question=f"Deploy {service} {version}?", job_id=ctx.job.id)
        answer = await ctx.wait_for_event("answer", timeout=ANSWER_TIMEOUT_SECONDS)
        if answer is None:
            return Done({"outcome": "no answer"}, status="FAILED", reason="no answer within the time")
        if not isinstance(answer, dict) or answer.get("approve") is not True:
            reason = answer.get("reason", "declined") if isinstance(answer, dict) else "declined"
            return Done({"outcome": "declined", "reason": str(reason)})
        await ctx.call_tool(deploy, service=service, version=version)
        return Done({"outcome": "deployed", "version": version, "approved_by": str(answer.get("by", "?"))})
