"""Child jobs as a step sees them: `JobHandle` (what ``ctx.start_job`` returns) and `JobOutcome`.

Also the rules both the step and the stores apply: the id a child gets when the step names none
(`child_job_id`, derived from the starting call's invocation id, so a replayed start names the same row),
and the checks of what a step may pass (`check_child_agent`, `check_child_payload`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from agentlife._config import JOB_ID_PATTERN, validate_agent_id, validate_job_id, validate_payload
from agentlife._exceptions import ConfigError
from agentlife._replay import check_replayable

__all__ = [
    "MAX_CHILD_PAYLOAD_BYTES",
    "JobHandle",
    "JobOutcome",
    "check_child_agent",
    "check_child_payload",
    "child_job_id",
]

#: The largest payload (its JSON) a step may give a child job: it is a row's column, read at every claim.
MAX_CHILD_PAYLOAD_BYTES = 1024 * 1024
_MAX_ID = 128


@dataclass(frozen=True, slots=True)
class JobHandle:
    """A job started by ``ctx.start_job`` (a child: pass it to ``ctx.wait_for_jobs``) or `Client.start`.

    The handle of a child is the recorded result of the starting call: a resumed step gets the same handle
    back from the journal, and no second row is created. One from `Client.start` names no parent.
    """

    job_id: str
    """The child's job id (its row's key)."""
    agent_id: str
    """The agent that runs the child (a worker of that agent claims it)."""
    detached: bool = False
    """A detached child is not cancelled with its parent (``job cancel``)."""
    parent_id: str = ""
    """The job that started it."""
    invocation_id: str = ""
    """The starting call's invocation id (``{job_id}/{step}/{call}``)."""

    def to_json(self) -> dict[str, Any]:
        """The handle as the journal records it."""
        return {
            "job_id": self.job_id,
            "agent_id": self.agent_id,
            "detached": self.detached,
            "parent_id": self.parent_id,
            "invocation_id": self.invocation_id,
        }

    @classmethod
    def from_json(cls, value: Any) -> JobHandle:
        """A handle from its recorded form (`to_json`); `ConfigError` for anything else."""
        if isinstance(value, JobHandle):
            return value
        if not isinstance(value, dict) or not isinstance(value.get("job_id"), str):
            raise ConfigError(f"not a recorded job handle: {type(value).__name__}")
        return cls(
            job_id=value["job_id"],
            agent_id=str(value.get("agent_id", "")),
            detached=bool(value.get("detached", False)),
            parent_id=str(value.get("parent_id", "")),
            invocation_id=str(value.get("invocation_id", "")),
        )


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """How one child job stood when ``ctx.wait_for_jobs`` returned.

    After a wait that was not cut short every outcome is final (``finished`` is true). After a timeout, a
    child that had not finished has the status it had then (``PENDING``, ``RUNNING``, ``WAITING`` ...),
    ``result`` None and ``timed_out`` true; it goes on running.
    """

    job_id: str
    """The child's job id."""
    status: str
    """The child's status: ``COMPLETED``, ``FAILED`` or ``DEAD_LETTER`` when it finished."""
    result: Any = None
    """The child's ``Done`` result (JSON), or None."""
    error: str | None = None
    """For a child that did not complete: the last entry of its crash history, in one line; else None."""
    timed_out: bool = False
    """The wait's timeout came before this child finished."""

    @property
    def finished(self) -> bool:
        """Whether the child ended (COMPLETED, FAILED or DEAD_LETTER)."""
        return self.status in ("COMPLETED", "FAILED", "DEAD_LETTER")

    @property
    def ok(self) -> bool:
        """Whether the child COMPLETED."""
        return self.status == "COMPLETED"

    def to_json(self) -> dict[str, Any]:
        """The outcome as the journal records it."""
        return {
            "job_id": self.job_id,
            "status": self.status,
            "result": self.result,
            "error": self.error,
            "timed_out": self.timed_out,
        }

    @classmethod
    def from_json(cls, value: Any) -> JobOutcome:
        """An outcome from its recorded form (`to_json`)."""
        if not isinstance(value, dict):
            raise ConfigError(f"not a recorded job outcome: {type(value).__name__}")
        error = value.get("error")
        return cls(
            job_id=str(value.get("job_id", "")),
            status=str(value.get("status", "")),
            result=value.get("result"),
            error=None if error is None else str(error),
            timed_out=bool(value.get("timed_out", False)),
        )


def child_job_id(parent_id: str, step: int, call: int) -> str:
    """The id of the child that call ``call`` of step ``step`` starts: ``{parent_id}.{step}.{call}``.

    The same on every attempt. Distinct for distinct calls: the parent's id is all but the last two
    dot-separated parts. Past 128 characters the parent's id is shortened and a digest of it keeps it apart.
    """
    suffix = f".{step}.{call}"
    plain = f"{parent_id}{suffix}"
    if len(plain) <= _MAX_ID and JOB_ID_PATTERN.fullmatch(plain):
        return plain
    import hashlib  # not on the boot path: OpenSSL's start-up costs about 2 ms

    digest = hashlib.sha256(parent_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    keep = max(1, _MAX_ID - len(suffix) - len(digest) - 1)
    return validate_job_id(f"{parent_id[:keep]}.{digest}{suffix}")


def check_child_agent(agent_id: object) -> str:
    """``agent_id`` when a worker could take a job of it, else `ConfigError` in one line."""
    if not isinstance(agent_id, str):
        raise ConfigError(f"ctx.start_job: agent_id must be a string, got {type(agent_id).__name__}")
    return validate_agent_id(agent_id)


def check_child_payload(payload: Any, what: str = "ctx.start_job: the payload") -> None:
    """`ConfigError` unless ``payload`` is JSON the journal and the row can hold exactly.

    ``what`` names the payload in the message (a child's, or one `agentlife.Client.start` was given).
    """
    validate_payload(payload, what)
    try:
        check_replayable(payload, "the payload")
        data = orjson.dumps(payload)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{what} is not JSON the job row can hold: {exc}") from None
    if len(data) > MAX_CHILD_PAYLOAD_BYTES:
        raise ConfigError(f"{what} is {len(data)} bytes of JSON, more than {MAX_CHILD_PAYLOAD_BYTES}")
