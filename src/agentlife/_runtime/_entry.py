"""Loading the agent class a process runs: ``MODULE:CLASS`` imported and checked before anything runs."""

from __future__ import annotations

import importlib
import inspect
import os
import signal
import sys
from typing import Any

from agentlife._agent import AgentProcess
from agentlife._exceptions import ConfigError, SignalDuringImport, describe_error

__all__ = ["check_agent_class", "load_agent_class"]


def load_agent_class(target: str) -> type:
    """Import ``MODULE:CLASS`` and check it is an `AgentProcess` subclass.

    Raises:
        ConfigError: with one line saying what is wrong with ``target``.
    """
    module_name, sep, class_name = target.partition(":")
    if not sep or not module_name or not class_name:
        raise ConfigError(f"{target!r} is not MODULE:CLASS (e.g. mypkg.agents:Reviewer)")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigError(f"cannot import module {module_name!r}: {exc}") from None
    except SystemExit as exc:  # sys.exit(0) at import must not look like a finished job
        raise ConfigError(f"importing module {module_name!r} called sys.exit({exc.code!r})") from None
    except SignalDuringImport:
        raise  # a drain signal: the caller ends the process for it
    except KeyboardInterrupt as exc:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            raise  # nothing took SIGINT over: this may be a real Ctrl-C
        # The CLI's handler turns a real SIGINT into SignalDuringImport: this one the module raised itself.
        raise ConfigError(f"importing module {module_name!r} failed: {describe_error(exc)}") from None
    except BaseException as exc:  # any other BaseException too: one line, never a traceback
        raise ConfigError(f"importing module {module_name!r} failed: {describe_error(exc)}") from None
    obj: Any = module
    for part in class_name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ConfigError(f"module {module_name!r} has no attribute {class_name!r}")
    if not isinstance(obj, type) or not issubclass(obj, AgentProcess):
        raise ConfigError(f"{target!r} is not an AgentProcess subclass")
    check_agent_class(obj)
    return obj


def check_agent_class(cls: type) -> None:
    """Refuse an agent class the runtime could only fail on later: ``step`` must be ``async def``."""
    step = getattr(cls, "step", None)
    if not inspect.iscoroutinefunction(step):
        raise ConfigError(f"{cls.__name__}.step must be 'async def step(self, ctx)', not a plain def")
