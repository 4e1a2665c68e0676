"""``python -m agentlife worker MODULE:CLASS``: a warm process running the agent's jobs one after another."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import sys
from typing import Any

from agentlife._cli._run import validated_settings
from agentlife._config import validate_database_url
from agentlife._exceptions import ConfigError, SignalDuringImport, describe_error
from agentlife._exitcode import ExitCode
from agentlife._runtime._entry import load_agent_class
from agentlife.constants import MAX_ENV_SECONDS, Constants

#: How long a worker waits for a job before it exits 0 (``--idle-timeout``), seconds.
DEFAULT_IDLE_TIMEOUT = 1800.0
#: The most jobs one worker runs at once (``--concurrency``): past it one process is the wrong unit.
MAX_CONCURRENCY = 1024
#: The smallest ``--time-scale``: below it the drain and cleanup budgets round to nothing (a drain would
#: hard-exit at once).
MIN_TIME_SCALE = 0.001


def register(sub: Any) -> None:
    """Add ``worker`` to the subcommands."""
    worker = sub.add_parser(
        "worker",
        help="run the agent's jobs in this process, one or N at a time (a warm pool member)",
        description=(
            "Boot once, then claim the oldest runnable job of the agent (PENDING, or RETRYING past its "
            "not_before) and run it, again and again; --concurrency N runs up to N at once in one event "
            "loop. SIGTERM drains every running job and exits 143; the idle timeout and --max-jobs exit 0."
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
        "--concurrency",
        type=int,
        default=1,
        metavar="N",
        help=f"run up to N jobs at once in one event loop (default 1, at most {MAX_CONCURRENCY})",
    )
    worker.add_argument(
        "--agent-id", help="the agent whose jobs to take (default: AGENTLIFE_AGENT_ID, else the class's)"
    )
    worker.add_argument(
        "--database-url",
        metavar="URL",
        help="the job store (default: AGENTLIFE_DATABASE_URL, else the embedded SQLite file)",
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
    if not 1 <= args.concurrency <= MAX_CONCURRENCY:
        raise ConfigError(f"--concurrency must be between 1 and {MAX_CONCURRENCY}, got {args.concurrency}")
    constants = scaled_constants(Constants.from_env(os.environ), args.time_scale)
    early = args.early_signal
    try:
        budget = constants.drain.cleanup_budget_seconds
        with early.abandoning_imports(budget) if early is not None else contextlib.nullcontext():
            agent_cls = load_agent_class(args.target)
    except SignalDuringImport as exc:
        sys.stderr.write(f"agentlife: drained by {exc.name} while importing {args.target}\n")
        return ExitCode.DRAINED

    from agentlife._runtime._worker import ShellOptions, Worker, WorkerOptions

    agent_id = args.agent_id or os.environ.get("AGENTLIFE_AGENT_ID") or getattr(agent_cls, "agent_id", None)
    env = dict(os.environ)
    if agent_id:
        env["AGENTLIFE_AGENT_ID"] = agent_id
    if args.database_url:
        env["AGENTLIFE_DATABASE_URL"] = validate_database_url(args.database_url, "--database-url")
    validated_settings(env, job_id="worker", agent_id=agent_id or None)  # exit 2 on a bad variable
    try:
        agent_cls()  # one instance up front: a class that cannot be built is a usage error, not N crashes
    except Exception as exc:
        raise ConfigError(f"creating {agent_cls.__name__}() failed: {describe_error(exc)}") from None
    options = WorkerOptions(
        agent_id=agent_id or None,
        idle_timeout=args.idle_timeout,
        max_jobs=args.max_jobs,
        max_poll_interval=max(0.05, min(1.0, constants.probe.readiness_period_seconds / 5)),
        constants=constants,
        shell=ShellOptions(early_signal=early),
        concurrency=args.concurrency,
    )
    worker = Worker(agent_cls, env=env, options=options)
    code = anyio.run(worker.run)
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def scaled_constants(constants: Constants, factor: float) -> Constants:
    """``constants`` with every duration multiplied by ``--time-scale`` ``factor``, checked first.

    Raises:
        ConfigError: naming ``--time-scale``: not a finite number of at least `MIN_TIME_SCALE`, or one that
            stretches a duration past `MAX_ENV_SECONDS` (thread timers and sleeps overflow there).
    """
    if not (math.isfinite(factor) and factor >= MIN_TIME_SCALE):
        raise ConfigError(f"--time-scale must be a finite number >= {MIN_TIME_SCALE:g}, got {factor:g}")
    if factor == 1.0:
        return constants
    name, longest = _longest_duration(constants)
    if longest * factor > MAX_ENV_SECONDS:
        raise ConfigError(
            f"--time-scale {factor:g} makes {name} {longest * factor:g} s, past the longest duration "
            f"allowed ({MAX_ENV_SECONDS:g} s): use at most {MAX_ENV_SECONDS / longest:g}"
        )
    return constants.scaled(factor)


def _longest_duration(constants: Constants) -> tuple[str, float]:
    """The longest duration the constants hold (the one a time scale stretches furthest), with its name."""
    found = ("", 0.0)
    for group in dataclasses.fields(constants):
        value = getattr(constants, group.name)
        if not dataclasses.is_dataclass(value):
            continue
        for f in dataclasses.fields(value):
            if not f.metadata.get("seconds"):
                continue
            seconds = getattr(value, f.name)
            for item in seconds if isinstance(seconds, tuple) else (seconds,):
                if isinstance(item, (int, float)) and item > found[1]:
                    found = (f"{group.name}.{f.name}", float(item))
    return found
