"""``python -m agentlife demo``: the example agent end to end on the embedded defaults."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    """Add ``demo`` to the subcommands."""
    demo = sub.add_parser(
        "demo",
        help="run the example agent end to end on the embedded defaults",
        description="Run the example agent twice (SQLite, local Qdrant, scripted LLM) and "
        "print each session's timeline.",
    )
    demo.add_argument("--data-dir", default=None, help="default: ./.agentlife-demo")
    demo.set_defaults(handler=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    from agentlife._cli._demo_run import run_demo

    return run_demo(Path(args.data_dir) if args.data_dir else Path(".agentlife-demo"))
