"""Process groups this process started that must not outlive it, for the hard exit.

The runtime normally stops what it started (an MCP stdio server is stopped by the SDK: stdin closed, then
SIGTERM and SIGKILL to its process group). A hard exit (``os._exit`` when code that ignores cancellation
overruns the drain budget) skips all of that, so `kill_groups` SIGKILLs every registered group first.
Cheap to import: the command line loads it before the agent's module, with the early signal handler.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

__all__ = ["forget_group", "kill_groups", "register_group"]

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
