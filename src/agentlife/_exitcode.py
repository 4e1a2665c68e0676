"""The exit codes of ``python -m agentlife``: the process describes itself, the job row describes the job.

One enumeration, so a code is written once: the lifecycle's outcome, the hard exit's settled code, the
worker's, the command line's and the job commands' all name these members. `ExitCode` is an `int`: it
goes to ``sys.exit`` and ``os._exit`` as it is, and formats as its number in logs and messages.
"""

from __future__ import annotations

import enum

__all__ = ["ExitCode"]


class ExitCode(enum.IntEnum):
    """What a process of agentlife exits with."""

    DONE = 0
    """The job reached a status the agent recorded (COMPLETED, FAILED, parked); a worker ran out of work or
    of ``--max-jobs``; a command did what it was asked."""
    CRASH = 1
    """A fatal error or a crash (its context recorded on the job row where possible); a store error."""
    USAGE = 2
    """A usage or configuration error, reported on one line before the lifecycle starts."""
    NOT_FOUND = 3
    """A ``job`` command named a job the store does not hold."""
    CONFLICT = 4
    """A ``job`` command the job's status does not allow (another operator may have won a race)."""
    INTERRUPTED = 130
    """Ctrl-C ended a command that does not drain (128 + SIGINT)."""
    OOM_KILLED = 137
    """SIGKILL (128 + 9), the kernel's OOM killer's: never the process's own; the next attempt learns it from
    ``AGENTLIFE_PREVIOUS_EXIT_CODE``."""
    DRAINED = 143
    """Drained on SIGTERM, SIGINT or SIGHUP with the job still resumable: the next attempt resumes it."""
