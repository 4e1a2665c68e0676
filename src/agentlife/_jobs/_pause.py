"""``job pause`` / ``job resume``: the checks the command line, the console and the client share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentlife._exceptions import ConfigError
from agentlife._jobs._actor import check_actor, default_actor
from agentlife._jobs._reason import check_reason
from agentlife.stores import JobRecord, JobStatus, OperatorStore

__all__ = ["DEFAULT_PAUSE_REASON", "pause_job", "pause_of", "resume_job"]

#: The reason recorded when none is given.
DEFAULT_PAUSE_REASON = "paused by an operator"
#: The crash-history entries of a pause, and those that end one.
_PAUSES = ("Paused", "PauseRequested")
_ENDS = ("Resumed", "Cancelled", "ApprovalRejected")


async def pause_job(
    store: OperatorStore, job_id: str, reason: str | None = None, actor: str | None = None
) -> JobRecord:
    """Pause ``job_id`` (`OperatorStore.pause`) with a checked reason and actor (default: this user@host).

    Raises:
        ConfigError: the reason or the actor is not one printable line of bounded length.
        JobNotFound, JobStateConflict: no such job, or its status does not allow a pause.
    """
    why = check_reason(reason if reason is not None else DEFAULT_PAUSE_REASON) or DEFAULT_PAUSE_REASON
    return await store.pause(job_id, reason=why, actor=_actor(actor))


async def resume_job(store: OperatorStore, job_id: str, actor: str | None = None) -> JobRecord:
    """Resume ``job_id`` (`OperatorStore.resume`) with a checked actor (default: this user@host).

    Raises:
        ConfigError: the actor is not one printable line of bounded length.
        JobNotFound, JobStateConflict: no such job, or it is not paused.
    """
    return await store.resume(job_id, actor=_actor(actor))


def pause_of(row: JobRecord) -> dict[str, Any] | None:
    """The pause in force on the row (``reason``, ``actor``, ``at``, ``requested``), or None.

    Read from the crash history: the last pause recorded, unless a resume, a cancel or a retry came after it.
    A RUNNING row's pause is a request (``requested``: the job stops at its next step boundary).
    """
    if row.status not in (JobStatus.PAUSED, JobStatus.RUNNING):
        return None
    for entry in reversed(row.error):
        if not isinstance(entry, Mapping):
            continue
        kind = entry.get("error_class")
        if kind in _ENDS or entry.get("event") == "retry":
            return None
        if kind in _PAUSES:
            requested = row.status == JobStatus.RUNNING
            if requested and kind != "PauseRequested":
                return None
            return {
                "reason": entry.get("message"),
                "actor": entry.get("actor"),
                "at": entry.get("at"),
                "requested": requested,
            }
    return {"reason": None, "actor": None, "at": None, "requested": False} if row.status == "PAUSED" else None


def _actor(actor: str | None) -> str:
    try:
        return default_actor() if actor is None else check_actor(actor)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
