"""The engine's records: `RunOptions`, what hydration found and how a job ended.

`Hydrated` and `Resume` carry what hydration found, `Outcome` how the lifecycle ended; no behaviour.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from agentlife._agent import Job
from agentlife._budget import Budget
from agentlife._checkpoint import CheckpointDoc
from agentlife._journal._conversation import ConversationLog
from agentlife._runtime._process import ShellOptions
from agentlife._state import State
from agentlife._step._approvals import Approvals
from agentlife.constants import Constants
from agentlife.stores import JobRecord, JobStatus

if TYPE_CHECKING:
    from agentlife._journal._recovery import ReplayMap
    from agentlife._memory import MemoryRecord


log = logging.getLogger("agentlife.runtime")
PHASE_NAMES = {
    State.BOOTING: "boot",
    State.HYDRATING: "hydration",
    State.READY: "the wait for the first step",
}
TERMINAL_STATUSES = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.DEAD_LETTER)
#: Statuses a claimed job is not run in: ended, or PAUSED by an operator (it runs after ``job resume``).
NOT_RUN_STATUSES = (*TERMINAL_STATUSES, JobStatus.PAUSED)
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How this process runs; the CLI and the test harness differ only here.

    Attributes:
        job_id: overrides ``AGENTLIFE_JOB_ID``.
        payload: the job payload for a job row this process creates.
        create_job: create a missing job row on PostgreSQL too (SQLite always creates it).
        constants: use these instead of reading them from the environment.
        shell: what the process takes on: logs, signals, hard exit, probes (`ShellOptions`).
        attempt: the attempt a worker claimed (overrides ``AGENTLIFE_ATTEMPT``); the environment's
            ``AGENTLIFE_PREVIOUS_EXIT_CODE`` is then the worker container's, not the job's, and is ignored.
        claimed: the row a worker's claim (``claim_next``) returned for ``attempt``: hydration takes it as
            this attempt's claim instead of reading and claiming the row again (five round trips). Every
            write after it is fenced by attempt and owner all the same.
    """

    job_id: str | None = None
    payload: Any = None
    create_job: bool = False
    constants: Constants | None = None
    shell: ShellOptions = field(default_factory=ShellOptions)
    attempt: int | None = None
    claimed: JobRecord | None = None


@dataclass(slots=True)
class Outcome:
    exit_code: int
    reason: str
    status: str | None = None


@dataclass(slots=True)
class Resume:
    doc: CheckpointDoc
    checkpoint_id: str | None
    replay: ReplayMap | None = None
    memories: list[MemoryRecord] = field(default_factory=list)
    conversation: ConversationLog = field(default_factory=ConversationLog)


@dataclass(frozen=True, slots=True)
class Hydrated:
    """What hydration found: the claimed job, its budget, its approval state and where to resume."""

    job: Job
    budget: Budget
    approvals: Approvals
    resume: Resume
