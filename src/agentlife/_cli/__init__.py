"""``python -m agentlife``: the command line, one module per subcommand.

Each module registers its parser with ``register(subparsers)``; the table below lists them, so a
subcommand that fails to import or register fails every invocation loudly instead of vanishing. Usage
errors print one line on stderr and exit 2, never a traceback; commands import their heavy parts only
when they run.
"""

from __future__ import annotations

import argparse
import signal
from collections.abc import Sequence

from agentlife._cli import (
    _budget,
    _check,
    _console,
    _db,
    _demo,
    _job,
    _journal,
    _manifest,
    _reap,
    _run,
    _schedule,
    _worker,
)
from agentlife._cli._common import (
    DRAINING_COMMANDS,
    Parser,
    end_on_signals,
    exit_now,
    guarded,
    install_early_signal,
    version,
)
from agentlife._cli._run import run_agent_main
from agentlife._runtime._entry import load_agent_class

__all__ = ["build_parser", "exit_now", "load_agent_class", "main", "run_agent_main"]

#: Every subcommand, in the order ``--help`` lists them.
COMMANDS = (
    _run,
    _worker,
    _check,
    _db,
    _job,
    _reap,
    _demo,
    _journal,
    _budget,
    _manifest,
    _schedule,
    _console,
)


def build_parser() -> argparse.ArgumentParser:
    """The full command-line parser."""
    parser = Parser(
        prog="python -m agentlife", description="Lifecycle runtime for AI-agent jobs on Kubernetes."
    )
    parser.add_argument("--version", action="version", version=version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m agentlife`` and the ``agentlife`` script."""
    early = install_early_signal()
    parser = build_parser()
    args = parser.parse_args(argv)
    args.early_signal = early
    if args.command not in DRAINING_COMMANDS:
        end_on_signals()
        if early is not None and early.is_set():
            return 128 + int(signal.Signals[early.name])
    try:
        return guarded(lambda: int(args.handler(args)))
    except SystemExit as exc:  # from _end_on_signals: leave through exit_now, at once
        return exc.code if isinstance(exc.code, int) else 1
