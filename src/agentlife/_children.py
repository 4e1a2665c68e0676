"""Process groups this process started that must not outlive it, for the hard exit.

The runtime normally stops what it started (an MCP stdio server is stopped by the SDK: stdin closed, then
SIGTERM and SIGKILL to its process group). The SDK signals the group only when the server outlives the
end of its input, so what a server that exits promptly leaves in its group would live on: `end_group`
kills that as soon as the server is gone. A hard exit (``os._exit`` when code that ignores cancellation
overruns the drain budget) skips all of that, so `kill_groups` SIGKILLs every registered group first.
Cheap to import: the command line loads it before the agent's module, with the early signal handler.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

__all__ = ["end_group", "forget_group", "kill_groups", "register_group"]

_GROUPS: set[int] = set()
_LOCK = threading.Lock()


def register_group(group: int) -> None:
    """Kill process group ``group`` (the pid of its leader, a child of this process) on a hard exit."""
    with _LOCK:
        _GROUPS.add(group)


def forget_group(group: int) -> None:
    """``group`` was stopped the ordinary way."""
    with _LOCK:
        _GROUPS.discard(group)


def end_group(group: int) -> None:
    """The leader of ``group`` has exited: SIGKILL whatever is left in its group and forget it; never raises.

    Only a registered group, once: a second call does nothing.

    Called at once when the leader is seen gone. While any process of the group lives, the kernel gives
    no new process the group's id, so the signal reaches only what the leader left behind; an empty group
    answers ``ESRCH``. (A new group with that id would need the pid to be freed and handed out again after
    the kernel cycled through every other pid, in the moment between the leader's end and this call.)
    """
    with _LOCK:
        if group not in _GROUPS:  # ended already (or never registered): its id may not be ours any more
            return
        _GROUPS.discard(group)
    with contextlib.suppress(OSError):
        os.killpg(group, signal.SIGKILL)


def kill_groups() -> None:
    """SIGKILL every registered group; from any thread, never raises.

    A group is killed only while its leader is still this process's child leading its own group: once
    the leader is reaped, its pid (the group's id) may belong to an unrelated process.
    """
    with _LOCK:
        groups = list(_GROUPS)
    for group in groups:
        if _our_child(group):
            with contextlib.suppress(OSError):
                os.killpg(group, signal.SIGKILL)


def _our_child(pid: int) -> bool:
    """Whether ``pid`` is a child of this process that leads its own process group (Linux ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            stat = f.read()
    except OSError:
        return False
    # "pid (command) state ppid pgrp ...": the command may hold spaces and parentheses.
    fields = stat[stat.rfind(")") + 2 :].split()
    return len(fields) > 2 and fields[1] == str(os.getpid()) and fields[2] == str(pid)
