"""What every subcommand shares: one-line errors, exit codes, signals, the exit itself."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from agentlife._config import debug_from_env
from agentlife._exceptions import AgentlifeError, ConfigError, describe_error, leaf_exceptions
from agentlife._exitcode import ExitCode
from agentlife._redact import Redactor
from agentlife._version import __version__


class Parser(argparse.ArgumentParser):
    """argparse that reports errors as one line and exit 2 (its default prints usage first)."""

    def error(self, message: str) -> Any:
        say(f"agentlife: error: {message}")  # argparse quotes the offending argument: redact it
        raise SystemExit(ExitCode.USAGE)


def say(line: str) -> None:
    """Write one line on stderr with every secret of the environment masked.

    Errors raised before the lifecycle starts (an import that fails, an agent whose ``__init__`` raises)
    may quote a token from the environment; the runtime's log redactor does not exist yet.
    """
    sys.stderr.write(Redactor.from_env(os.environ).redact(line) + "\n")


#: What a shell shows for a program ended by SIGPIPE (128 + 13): the status a closed pipe ends a tool with.
_SIGPIPE_EXIT = 141


def guarded(handler: Callable[[], int]) -> int:
    """Run a command, turning every error into one redacted line and its exit code.

    An exception group (a task group's failure that escaped) is reported by its leaves: a group of one
    leaf exactly as that leaf would be (a `ConfigError` inside is still exit 2), several on one line.
    """
    try:
        return handler()
    except BaseException as exc:
        return _report(_sole_leaf(exc))


def _report(exc: BaseException) -> int:
    if isinstance(exc, ConfigError):
        say(f"agentlife: error: {exc}")
        return ExitCode.USAGE
    if isinstance(exc, AgentlifeError):
        say(f"agentlife: {_one_line(exc)}")
        return ExitCode.CRASH
    if isinstance(exc, KeyboardInterrupt):
        return ExitCode.INTERRUPTED
    if isinstance(exc, BrokenPipeError):
        # The reader left (`job list --json | head`): nothing is wrong, and nothing more can be printed.
        # Python would report the pipe again when it flushes stdout at exit: point stdout at nothing.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return _SIGPIPE_EXIT
    if isinstance(exc, (SystemExit, GeneratorExit)):
        raise exc
    # A bug, not bad input (or an agent's own BaseException subclass): still one line, since a
    # traceback would print secrets unmasked.
    say(f"agentlife: internal error: {_one_line(exc)}")
    if debug_from_env(os.environ):
        import traceback

        say("".join(traceback.format_exception(exc)).rstrip())
    return ExitCode.CRASH


def _one_line(exc: BaseException) -> str:
    # Masked before its lines are joined: a secret of several lines (a PEM key) is known only whole.
    return describe_error(exc, redact=Redactor.from_env(os.environ).redact)


def _sole_leaf(exc: BaseException) -> BaseException:
    """The one exception a group (nested or not) holds; the group itself when it holds several."""
    leaves = leaf_exceptions(exc)
    return leaves[0] if len(leaves) == 1 else exc


#: Commands that run an agent's lifecycle: a signal drains them. Any other command ends at once.
DRAINING_COMMANDS = frozenset({"run", "worker", "demo"})


def end_on_signals() -> None:
    """SIGTERM (exit 143) and Ctrl-C (exit 130) end a command at once, whatever it waits for.

    ``db init`` against a server that never answers or ``journal show`` on a FIFO would otherwise wait
    for ever: the early handler only remembers a signal for the drain of ``run``.
    """

    def handler(signum: int, frame: object) -> None:
        # SystemExit lets the command close what it holds; but raised at an arbitrary bytecode it can
        # land inside the event loop's own bookkeeping (asyncpg's connect half set up), leaving a task
        # that never finishes and asyncio's shutdown waiting on it for ever. So the exit is also armed.
        _arm_exit(128 + signum, after=_EXIT_GRACE_SECONDS)
        raise SystemExit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        with contextlib.suppress(ValueError):  # not the main thread: the embedding program owns signals
            signal.signal(signum, handler)


#: How long a command ended by a signal may spend closing what it holds before it is made to leave.
_EXIT_GRACE_SECONDS = 2.0


def _arm_exit(code: int, *, after: float) -> None:
    import threading

    timer = threading.Timer(after, exit_now, args=(code,))
    timer.daemon = True
    timer.start()


def exit_now(code: int) -> None:
    """Flush stdio and leave at once with ``code``.

    Everything the process owns was closed explicitly during cleanup, so interpreter finalisation has
    nothing left to do but join threads: and a worker thread still running a sync tool that ignored
    cancellation must not be able to hold the pod past its drain budget. This also saves ~25 ms per exit.
    """
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def install_early_signal() -> Any:
    from agentlife._runtime._signals import EarlySignal

    try:
        return EarlySignal().install()
    except ValueError:  # not the main thread (embedded use): the caller owns signals
        return None


def version() -> str:
    """The installed agentlife version."""
    return __version__
