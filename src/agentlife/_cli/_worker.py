"""``python -m agentlife worker MODULE:CLASS``: a warm process running the agent's jobs one after another."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any

from agentlife._cli._common import EXIT_DRAINED
from agentlife._cli._run import validated_settings
from agentlife._exceptions import ConfigError, SignalDuringImport
from agentlife._runtime._entry import load_agent_class
from agentlife.constants import Constants

#: How long a worker waits for a job before it exits 0 (``--idle-timeout``), seconds.
DEFAULT_IDLE_TIMEOUT = 1800.0


def register(sub: Any) -> None:
    """Add ``worker`` to the subcommands."""
    worker = sub.add_parser(
        "worker",
        help="run the agent's jobs one after another in this process (a warm pool member)",
        description=(
            "Boot once, then claim the oldest runnable job of the agent (PENDING, or RETRYING past its "
            "not_before) and run it, again and again. SIGTERM drains the current job and exits 143; "
            "the idle timeout and --max-jobs exit 0."
        ),
    )
    worker.add_argument("target", metavar="MODULE:CLASS", help="e.g. mypkg.agents:Reviewer")
    worker.add_argument(
        "--idle-timeout",
        type=float,
        default=DEFAULT_IDLE_TIMEOUT,
        metavar="S",
        help=f"exit 0 after S seconds without a job (default {DEFAULT_IDLE_TIMEOUT:g})",
    )
    worker.add_argument("--max-jobs", type=int, metavar="N", help="exit 0 after N jobs (default: no limit)")
    worker.add_argument(
        "--agent-id", help="the agent whose jobs to take (default: AGENTLIFE_AGENT_ID, else the class's)"
    )
    worker.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        metavar="F",
        help="multiply every duration of the constants by F (rehearsals and tests; default 1)",
    )
    worker.set_defaults(handler=_cmd_worker)


def _cmd_worker(args: argparse.Namespace) -> int:
    import anyio

    if not args.idle_timeout > 0:
        raise ConfigError(f"--idle-timeout must be > 0 seconds, got {args.idle_timeout:g}")
    if args.max_jobs is not None and args.max_jobs < 1:
        raise ConfigError(f"--max-jobs must be >= 1, got {args.max_jobs}")
    if not args.time_scale > 0:
        raise ConfigError(f"--time-scale must be > 0, got {args.time_scale:g}")
    constants = Constants.from_env(os.environ)
    if args.time_scale != 1.0:
        constants = constants.scaled(args.time_scale)
    early = args.early_signal
    try:
        budget = constants.drain.cleanup_budget_seconds
        with early.abandoning_imports(budget) if early is not None else contextlib.nullcontext():
            agent_cls = load_agent_class(args.target)
    except SignalDuringImport as exc:
        sys.stderr.write(f"agentlife: drained by {exc.name} while importing {args.target}\n")
        return EXIT_DRAINED

    from agentlife._runtime._worker import Worker, WorkerOptions

    agent_id = args.agent_id or os.environ.get("AGENTLIFE_AGENT_ID") or getattr(agent_cls, "agent_id", None)
    env = dict(os.environ)
    if agent_id:
        env["AGENTLIFE_AGENT_ID"] = agent_id
    validated_settings(env, job_id="worker", agent_id=agent_id or None)  # exit 2 on a bad variable
    try:
        agent_cls()  # one instance up front: a class that cannot be built is a usage error, not N crashes
    except Exception as exc:
        raise ConfigError(f"creating {agent_cls.__name__}() failed: {type(exc).__name__}: {exc}") from None
    options = WorkerOptions(
        agent_id=agent_id or None,
        idle_timeout=args.idle_timeout,
        max_jobs=args.max_jobs,
        poll_interval=0.05,
        max_poll_interval=max(0.05, min(1.0, constants.probe.readiness_period_seconds / 5)),
        constants=constants,
        early_signal=early,
    )
    worker = Worker(agent_cls, env=env, options=options)
    code = anyio.run(worker.run)
    sys.stdout.flush()
    sys.stderr.flush()
    return code
