"""``python -m agentlife budget``: a job's total timeout from its phase p95s."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from agentlife._exceptions import ConfigError
from agentlife.stores._policy import DEFAULT_SAFETY_BUFFER_SECONDS, derive_total_timeout, p95, phase_durations


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``budget`` to the ``python -m agentlife`` subcommands (its handler is ``args.handler(args)``)."""
    parser = subparsers.add_parser(
        "budget",
        help="derive a job's total timeout from its phase p95s",
        description=(
            "Total timeout = init p95 + exec p95 + safety buffer, rounded up to the granularity. Give the "
            "p95s directly, or --from-journals DATA_DIR to measure them from the session journals there."
        ),
    )
    parser.add_argument("--init-p95", metavar="SECONDS", help="p95 of spawn to first step")
    parser.add_argument("--exec-p95", metavar="SECONDS", help="p95 of first step to session end")
    parser.add_argument("--from-journals", metavar="DATA_DIR", help="read the p95s from DATA_DIR/sessions")
    parser.add_argument(
        "--safety-buffer",
        metavar="SECONDS",
        help=(
            "added on top (required with the p95s; "
            f"default {DEFAULT_SAFETY_BUFFER_SECONDS:g} with --from-journals)"
        ),
    )
    parser.add_argument(
        "--granularity", metavar="SECONDS", default="60", help="round up to a multiple of this"
    )
    parser.set_defaults(handler=_budget_command)


def _budget_command(args: argparse.Namespace) -> int:
    granularity = _whole_seconds("--granularity", args.granularity)
    if args.from_journals is not None:
        if args.init_p95 is not None or args.exec_p95 is not None:
            raise ConfigError("use either --init-p95/--exec-p95 or --from-journals, not both")
        phases, files = phase_durations(Path(args.from_journals))
        init_p95, exec_p95 = p95([p[0] for p in phases]), p95([p[1] for p in phases])
        buffer = (
            DEFAULT_SAFETY_BUFFER_SECONDS
            if args.safety_buffer is None
            else _seconds("--safety-buffer", args.safety_buffer)
        )
        print(f"{len(phases)} of {files} session journals under {args.from_journals} reached execution")
    else:
        if args.init_p95 is None or args.exec_p95 is None or args.safety_buffer is None:
            raise ConfigError(
                "budget needs --init-p95, --exec-p95 and --safety-buffer (or --from-journals DATA_DIR)"
            )
        init_p95 = _seconds("--init-p95", args.init_p95)
        exec_p95 = _seconds("--exec-p95", args.exec_p95)
        buffer = _seconds("--safety-buffer", args.safety_buffer)
    total = derive_total_timeout(init_p95, exec_p95, buffer, granularity)
    print(
        f"init p95 + exec p95 + safety buffer = {_num(init_p95)} + {_num(exec_p95)} + {_num(buffer)}"
        f" = {_num(init_p95 + exec_p95 + buffer)} s"
    )
    print(f"rounded up to a multiple of {granularity} s: {total} s")
    return 0


def _seconds(flag: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{flag} must be a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{flag} must be a finite number of seconds >= 0, got {text!r}")
    return value


def _whole_seconds(flag: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{flag} must be a whole number of seconds >= 1, got {text!r}") from None
    if value < 1:
        raise ConfigError(f"{flag} must be a whole number of seconds >= 1, got {text!r}")
    return value


def _num(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".")
