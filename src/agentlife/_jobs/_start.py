"""Creating a job row: the one implementation ``job create`` and `agentlife.Client.start` share.

Both check what they were given the same way (the agent id a worker could take, the job id's pattern, a
payload both stores keep exactly and at most `MAX_CHILD_PAYLOAD_BYTES` of JSON) before the store is
touched, so bad input writes nothing. They differ only in what an existing row means: for ``job create``
(``exclusive``) a conflict, of racing creators exactly one told it created the job; for a client's start an
answer, when the row is the same job (same agent, same payload), so that a start retried after a timeout
creates one job and returns it.
"""

from __future__ import annotations

import math
import secrets
import time
from typing import Any

from agentlife._config import validate_agent_id, validate_job_id
from agentlife._exceptions import ConfigError, JobStateConflict
from agentlife._jobrefs import check_child_payload
from agentlife.stores import JobRecord, OperatorStore

__all__ = ["check_start", "create_job", "new_job_id", "same_json"]


def new_job_id() -> str:
    """``job-<UTC time>-<8 hex digits>``: the id of a job created without one."""
    return f"job-{time.strftime('%Y%m%d%H%M%S', time.gmtime())}-{secrets.token_hex(4)}"


def check_start(agent_id: object, payload: Any, job_id: object, what: str) -> tuple[str, str]:
    """(agent id, job id) when a job may be created from these, else `ConfigError` in one line.

    ``job_id`` None makes a new id (`new_job_id`); ``what`` names the payload in the messages.
    """
    if not isinstance(agent_id, str):
        raise ConfigError(f"the agent id must be a string, got {type(agent_id).__name__}")
    validate_agent_id(agent_id)
    if job_id is None:
        job_id = new_job_id()
    elif not isinstance(job_id, str):
        raise ConfigError(f"the job id must be a string, got {type(job_id).__name__}")
    validate_job_id(job_id)
    check_child_payload(payload, what)
    return agent_id, job_id


async def create_job(
    store: OperatorStore,
    job_id: str,
    agent_id: str,
    payload: Any,
    budget: dict[str, Any] | None = None,
    *,
    exclusive: bool,
    concurrency_key: str | None = None,
    priority: int = 0,
) -> JobRecord:
    """Create the PENDING row (arguments checked by `check_start`); the row.

    ``concurrency_key`` and ``priority`` are checked by the store (`ConfigError`, nothing written).

    Raises:
        JobStateConflict: the row exists and ``exclusive``, or it is another job (another agent, another
            payload, or a payload the store cannot read back).
    """
    row = await store.create_job(
        job_id,
        agent_id,
        payload,
        budget,
        exclusive=exclusive,
        concurrency_key=concurrency_key,
        priority=priority,
    )
    if exclusive:  # the store raised unless this call inserted the row
        return row
    if "payload" in row.unreadable:
        raise JobStateConflict(f"job {job_id} already exists and its stored payload cannot be read")
    if row.agent_id != agent_id or not same_json(row.payload, payload):
        # Neither payload is echoed: either may hold what the caller would not log.
        theirs = "agent" if row.agent_id != agent_id else "payload"
        raise JobStateConflict(f"job {job_id} already exists with another {theirs} ({row.status})")
    return row


def same_json(stored: Any, given: Any) -> bool:
    """Whether ``stored`` (a payload as the store gives it back) is the JSON value ``given``.

    Numbers compare by value (PostgreSQL's ``jsonb`` gives ``1e300`` back as an integer, ``1.50`` as
    ``1.5``), never a boolean as a number; objects whatever their key order.
    """
    if isinstance(given, bool) or isinstance(stored, bool):
        return type(given) is type(stored) and given == stored
    if isinstance(given, int | float) and isinstance(stored, int | float):
        if isinstance(given, float) or isinstance(stored, float):
            return math.isclose(float(stored), float(given), rel_tol=1e-15, abs_tol=0.0)
        return bool(stored == given)
    if isinstance(given, dict) and isinstance(stored, dict):
        return given.keys() == stored.keys() and all(same_json(stored[k], given[k]) for k in given)
    if isinstance(given, list) and isinstance(stored, list):
        return len(given) == len(stored) and all(same_json(s, g) for s, g in zip(stored, given, strict=True))
    return type(given) is type(stored) and bool(given == stored)
