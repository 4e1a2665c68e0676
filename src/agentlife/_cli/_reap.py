"""``python -m agentlife reap``: one pass of the zombie reaper, for a CronJob beside the agents.

RUNNING rows whose ``heartbeat_at`` is older than the threshold (default
``AGENTLIFE_HEARTBEAT_ZOMBIE_AFTER_SECONDS``, 300 s) become RETRYING with ``not_before`` from the crash
backoff schedule (their next claim is attempt + 1), or DEAD_LETTER / FAILED, each decision printed and
recorded in the row's crash history. Safe to run from several places at once: no row is acted on twice.
With a retention policy (``AGENTLIFE_RETAIN_*``) it then prunes the finished jobs past their period.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Any

from agentlife._cli._common import Parser
from agentlife._cli._job import open_store
from agentlife._config import data_dir_from_env
from agentlife._exceptions import ConfigError
from agentlife._runtime._retention import RetentionPass, apply_retention
from agentlife.constants import Constants
from agentlife.stores import ReapDecision

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add ``reap`` to the ``python -m agentlife`` parser."""
    parser: Parser = sub.add_parser(
        "reap",
        help="one pass of the zombie reaper over the job rows",
        description="Move RUNNING job rows whose heartbeat is older than the threshold to RETRYING "
        "(not_before from the crash backoff schedule, held longer while the agent's circuit breaker is "
        "open; the next claim is attempt + 1) or DEAD_LETTER, and print each decision. Exit 0 whether or "
        "not rows were reaped.",
    )
    parser.add_argument(
        "--threshold",
        type=float,
        metavar="S",
        help="heartbeat age in seconds (default: AGENTLIFE_HEARTBEAT_ZOMBIE_AFTER_SECONDS, 300)",
    )
    parser.add_argument("--database-url", help="default: AGENTLIFE_DATABASE_URL or the embedded SQLite file")
    parser.set_defaults(handler=_cmd_reap)


def _cmd_reap(args: argparse.Namespace) -> int:
    import anyio

    constants = Constants.from_env(os.environ)
    threshold = constants.heartbeat.zombie_after_seconds if args.threshold is None else args.threshold
    floor = 2 * constants.heartbeat.job_interval_seconds
    if not math.isfinite(threshold) or threshold < floor:
        # Below two heartbeat periods a live job whose one heartbeat came late would be reaped.
        raise ConfigError(
            f"--threshold {threshold:g} s must be >= 2 x the job heartbeat interval = {floor:g} s "
            "(AGENTLIFE_HEARTBEAT_JOB_INTERVAL_SECONDS)"
        )

    async def reap() -> tuple[list[ReapDecision], RetentionPass]:
        store = await open_store(args)
        try:
            decisions = await store.reap(threshold, constants=constants)
            # The periods (AGENTLIFE_RETAIN_*) if set; old tombstones and pruned jobs' journals always.
            kept = await apply_retention(store, constants.retention, data_dir_from_env(os.environ))
            return decisions, kept
        finally:
            await store.close()

    decisions, kept = anyio.run(reap)
    for d in decisions:
        when = ""
        if d.not_before is not None:
            when = " not before " + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(d.not_before))
        sys.stdout.write(
            f"{d.job_id} (agent {d.agent_id}): heartbeat stale for {d.heartbeat_age_seconds:.0f} s -> "
            f"{d.status}, next attempt {d.attempt}{when}: {d.reason}\n"
        )
    sys.stdout.write(
        f"reaped {len(decisions)} job{'s' if len(decisions) != 1 else ''} (threshold {threshold:g} s)\n"
    )
    if constants.retention.periods() or kept.tombstones or kept.journals:
        sys.stdout.write(
            f"retention: pruned {len(kept.pruned)} finished jobs, {kept.tombstones} old tombstones,"
            f" {kept.journals} journal directories\n"
        )
    return 0
