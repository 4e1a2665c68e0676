"""``python -m agentlife``: the command line, one module per subcommand.

Each module registers its parser with ``register(subparsers)``; `COMMANDS` maps each subcommand to its
module. Only the module of the command being run is imported (``run`` pays for no other command's
imports and parsers); ``--help``, ``--version`` and an unknown command load them all, so a module that
fails to import or register fails loudly there and in its own command instead of vanishing. Usage errors
print one line on stderr and exit 2, never a traceback; commands import their heavy parts only when they
run.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from collections.abc import Sequence
from types import ModuleType

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

__all__ = [
    "COMMANDS",
    "build_parser",
    "command_module",
    "exit_now",
    "load_agent_class",
    "main",
    "run_agent_main",
]

#: Every subcommand and the module under ``agentlife._cli`` that registers it, in ``--help`` order.
COMMANDS: dict[str, str] = {
    "run": "_run",
    "worker": "_worker",
    "check": "_check",
    "db": "_db",
    "job": "_job",
    "reap": "_reap",
    "demo": "_demo",
    "journal": "_journal",
    "budget": "_budget",
    "manifest": "_manifest",
    "schedule": "_schedule",
    "console": "_console",
}


def command_module(name: str) -> ModuleType:
    """The module that registers subcommand ``name``, imported now."""
    return importlib.import_module(f"{__name__}.{COMMANDS[name]}")


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command-line parser: for ``argv`` naming a command, with that command alone; else with all.

    The first argument is the command unless it is an option (``--help``, ``--version``), since the
    top-level parser takes no option with a value.
    """
    parser = Parser(
        prog="python -m agentlife", description="Lifecycle runtime for AI-agent jobs on Kubernetes."
    )
    parser.add_argument("--version", action="version", version=version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    first = argv[0] if argv else None
    for name in [first] if first in COMMANDS else COMMANDS:
        command_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m agentlife`` and the ``agentlife`` script."""
    early = install_early_signal()
    if argv is None:
        argv = sys.argv[1:]
    parser = build_parser(argv)
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
