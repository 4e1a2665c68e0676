"""``job rewind``: start a job again from the checkpoint it had after step N, or fork it from there.

`plan_rewind` reads what the rewind needs and checks it: the step is one the checkpoint history holds (the
last `HISTORY_KEEP` checkpoints; a step out of reach is a one-line `RewindOutOfReach` naming the steps
that are reachable), and lists the side effects recorded after the step (`RecordedEffect`: they may
happen again, so the command asks for ``--yes``). `rewind_job` does it: one conditional store operation
(`OperatorStore.rewind`) against the attempt the plan read, so a worker or another operator acting first
makes it a `JobStateConflict` and nothing changes.

The checkpoint written is the history entry's document, re-encoded with a new checkpoint id: a parked
checkpoint resumes as running, and nothing approved at the parked call carries over.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from agentlife._checkpoint import CheckpointDoc
from agentlife._config import validate_job_id
from agentlife._exceptions import CheckpointCorrupt, ConfigError, JobNotFound
from agentlife._jobs._actor import check_actor
from agentlife._jobs._reason import check_reason
from agentlife._redact import Redactor
from agentlife.stores._base import HISTORY_KEEP, JobRecord, crc32
from agentlife.stores._prune import pruned_message
from agentlife.stores._rewind import KeptCheckpoint, RewindTarget

if TYPE_CHECKING:
    from agentlife.stores._roles import OperatorStore
    from agentlife.stores._steprecords import StepRecord

__all__ = ["RecordedEffect", "RewindOutOfReach", "RewindPlan", "parse_step", "plan_rewind", "rewind_job"]

_STEP = re.compile(r"[0-9]{1,9}")


class RewindOutOfReach(ConfigError):
    """The step is not one the job's checkpoint history holds (a usage error: nothing changed)."""


@dataclass(frozen=True, slots=True)
class RecordedEffect:
    """A side-effecting call recorded after the step rewound to: it may happen again."""

    step: int
    tool: str
    invocation_id: str
    at: float | None
    completed: bool


@dataclass(frozen=True, slots=True)
class RewindPlan:
    """What `rewind_job` writes, and what the operator confirms first."""

    job: JobRecord
    target: RewindTarget
    reachable: tuple[int, ...]
    effects: tuple[RecordedEffect, ...]


def parse_step(value: object) -> int:
    """A step number: a non-negative integer written in digits (``4``), else `RewindOutOfReach`."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**9:
        return value
    if isinstance(value, str) and _STEP.fullmatch(value.strip()):
        return int(value.strip())
    shown = repr(value)[:40]
    raise RewindOutOfReach(f"--to-step must be a step number (0, 1, 2 ...), got {shown}")


async def plan_rewind(store: OperatorStore, job_id: str, to_step: object) -> RewindPlan:
    """Read and check a rewind of ``job_id`` to after step ``to_step``; nothing is written.

    Raises:
        JobNotFound: no such job.
        RewindOutOfReach: the step is not a number, or the kept history does not hold it.
    """
    step = parse_step(to_step)
    job = await store.get_job(job_id)
    if job is None:
        raise JobNotFound(pruned_message(job_id, await store.pruned_job(job_id)))
    kept = [k for k in await store.kept_checkpoints(job_id) if crc32(k.data) == k.crc]
    reachable = tuple(sorted({k.step for k in kept}))
    # The oldest entry of the step is the checkpoint written when the step ended (a later one of the same
    # step is a park of the step after it).
    chosen = [k for k in kept if k.step == step]
    if not chosen:
        raise RewindOutOfReach(_out_of_reach(job_id, step, reachable))
    source = chosen[-1]
    try:
        data, length = _rewound_checkpoint(job_id, source)
    except CheckpointCorrupt as exc:  # bytes whose CRC matches but that are no checkpoint: written by hand
        raise RewindOutOfReach(f"cannot rewind job {job_id} to step {step}: {exc}") from None
    target = RewindTarget(
        to_step=step,
        attempt=job.attempt,
        source_checkpoint_id=source.checkpoint_id,
        checkpoint_id=f"rewind-{step:06d}-{uuid.uuid4().hex[:8]}",
        data=data,
        crc=crc32(data),
        length=length,
    )
    effects = recorded_effects(await store.step_records(job_id), step)
    return RewindPlan(job, target, reachable, effects)


async def rewind_job(
    store: OperatorStore,
    plan: RewindPlan,
    *,
    actor: str,
    reason: str = "",
    force: bool = False,
    as_job_id: str | None = None,
) -> JobRecord:
    """Rewind the planned job in place (PENDING, next attempt), or fork it into ``as_job_id``.

    Raises:
        ConfigError: a bad actor, reason or new job id.
        JobNotFound: the job is gone.
        JobStateConflict: the row changed since the plan, a live worker holds it (without ``force``), or
            ``as_job_id`` exists.
    """
    try:
        who = check_actor(actor)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    # Kept in the row and journaled by the next attempt: a secret-shaped word in it is masked first.
    why = Redactor().redact(check_reason(reason)) if reason else ""
    if as_job_id is not None and not isinstance(as_job_id, str):
        raise ConfigError(f"the new job id must be text, got {type(as_job_id).__name__}")
    new_id = validate_job_id(as_job_id) if as_job_id is not None else None
    if new_id == plan.job.id:
        raise ConfigError(f"--as must name a new job, not {new_id} itself")
    return await store.rewind(plan.job.id, plan.target, actor=who, reason=why, force=force, new_id=new_id)


def recorded_effects(records: list[StepRecord], step: int) -> tuple[RecordedEffect, ...]:
    """The side-effecting calls the store recorded after ``step``, in the order they were written."""
    found: dict[str, RecordedEffect] = {}
    for record in sorted(records, key=lambda r: r.order):
        if record.step <= step:
            continue
        event = _event(record.data)
        kind = event.get("type")
        invocation = event.get("invocation_id")
        if kind not in ("TOOL_STARTED", "TOOL_COMPLETED") or not isinstance(invocation, str):
            continue
        if kind == "TOOL_STARTED":
            if event.get("side_effects") is False:
                continue
            at = event.get("carried_ts", event.get("ts"))
            when = float(at) if isinstance(at, int | float) and not isinstance(at, bool) else None
            tool = event.get("tool")
            found.setdefault(
                invocation,
                RecordedEffect(record.step, tool if isinstance(tool, str) else "?", invocation, when, False),
            )
        elif invocation in found:
            previous = found[invocation]
            found[invocation] = RecordedEffect(
                previous.step, previous.tool, previous.invocation_id, previous.at, True
            )
    return tuple(found.values())


def _event(data: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _out_of_reach(job_id: str, step: int, reachable: tuple[int, ...]) -> str:
    if not reachable:
        return f"job {job_id} has no checkpoint to rewind to (it has not finished a step)"
    if reachable == tuple(range(reachable[0], reachable[-1] + 1)):
        steps = f"steps {reachable[0]} to {reachable[-1]}" if len(reachable) > 1 else f"step {reachable[0]}"
    else:
        steps = "steps " + ", ".join(str(s) for s in reachable)
    return (
        f"cannot rewind job {job_id} to step {step}: out of reach; its checkpoint history (the last "
        f"{HISTORY_KEEP} checkpoints) holds {steps}"
    )


def _rewound_checkpoint(job_id: str, source: KeptCheckpoint) -> tuple[bytes, int]:
    """The bytes to write (the document, resumable and approving nothing) and the conversation's length."""
    doc = CheckpointDoc.decode(source.data, job_id)
    if doc.phase in ("awaiting_approval", "waiting"):
        doc = doc.evolve(phase="running")
    doc = doc.evolve(approved=False)
    length = int(doc.conversation["length"]) if doc.conversation else 0
    return doc.encode(), length
