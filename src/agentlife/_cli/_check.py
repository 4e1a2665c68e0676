"""``python -m agentlife check``: the constants and the environment, validated as ``run`` validates them."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import orjson

from agentlife._cli._run import validated_settings


def register(sub: Any) -> None:
    """Add ``check`` to the subcommands."""
    check = sub.add_parser(
        "check",
        help="validate the constants and environment, print the derived values",
        description="Check every invariant of the constants (after AGENTLIFE_* overrides).",
    )
    check.add_argument("--json", action="store_true", help="print the constants as JSON")
    check.set_defaults(handler=_cmd_check)


def _cmd_check(args: argparse.Namespace) -> int:
    constants = validated_settings(os.environ, placeholders=True).constants
    if args.json:
        sys.stdout.write(orjson.dumps(constants.as_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    d, p, hy = constants.drain, constants.probe, constants.hydration
    drain_sum = (
        d.pre_stop_seconds + d.step_deadline_seconds + d.cleanup_budget_seconds + d.sigkill_buffer_seconds
    )
    lines = [
        "constants: all invariants hold",
        f"  drain: pre_stop {d.pre_stop_seconds:g} + step_deadline {d.step_deadline_seconds:g} + cleanup "
        f"{d.cleanup_budget_seconds:g} + sigkill_buffer {d.sigkill_buffer_seconds:g} = {drain_sum:g} s "
        f"<= termination_grace {d.termination_grace_seconds:g} s",
        f"  heartbeat: unhealthy after {constants.heartbeat.unhealthy_after_seconds:g} s = 3 x "
        f"{constants.heartbeat.sse_interval_seconds:g} s; "
        f"zombie after {constants.heartbeat.zombie_after_seconds:g} s "
        f">= 2 x {constants.heartbeat.job_interval_seconds:g} s",
        f"  startup: worst-case boot + hydration {hy.worst_case_seconds:g} s <= startup window "
        f"{p.startup_window_seconds:g} s",
        f"  liveness: blocked threshold {p.blocked_threshold_seconds:g} s < liveness window "
        f"{p.liveness_window_seconds:g} s",
    ]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0
