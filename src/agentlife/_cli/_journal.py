"""``python -m agentlife journal show PATH``: a session file as a readable timeline."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from agentlife._journal._show import format_timeline


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``journal show PATH`` to the CLI's subparsers; the handler is ``args.handler(args) -> int``.

    Args:
        subparsers: what ``ArgumentParser.add_subparsers()`` returned.

    Returns:
        The ``journal`` parser, in case the CLI wants to add more sub-commands to it.
    """
    journal = subparsers.add_parser(
        "journal", help="inspect session journals", description="Inspect session journals."
    )
    commands = journal.add_subparsers(dest="journal_command", metavar="COMMAND", required=True)
    show = commands.add_parser(
        "show",
        help="print a session file as a readable timeline",
        description="Print a session file (session_NNNN_MS.jsonl) as a timeline with relative times and "
        "durations; torn or corrupt lines are reported and skipped.",
    )
    show.add_argument("path", metavar="PATH", type=Path, help="a session_*.jsonl file")
    show.set_defaults(handler=_show)
    return journal  # type: ignore[no-any-return]


def _show(args: argparse.Namespace) -> int:
    """Print the timeline; a missing or unreadable file raises `ConfigError` (the CLI prints it, exit 2)."""
    text = format_timeline(args.path)
    sys.stdout.write(text + "\n")
    return 0
