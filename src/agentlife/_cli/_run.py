"""``python -m agentlife run MODULE:CLASS``: load the agent class, validate everything, run the lifecycle."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from agentlife._cli._common import (
    Parser,
    guarded,
    install_early_signal,
)
from agentlife._config import (
    JOB_ID_PATTERN,
    MAX_PAYLOAD_DEPTH,
    Settings,
    job_id_from_env,
    validate_database_url,
    validate_payload,
)
from agentlife._exceptions import ConfigError, SignalDuringImport, UnreplayableValue, describe_error
from agentlife._exitcode import ExitCode
from agentlife._replay import check_replayable
from agentlife._runtime._entry import check_agent_class, load_agent_class
from agentlife.constants import Constants


def register(sub: Any) -> None:
    """Add ``run`` to the subcommands."""
    run = sub.add_parser(
        "run",
        help="run an agent class as this process's job",
        description="Run MODULE:CLASS (an AgentProcess subclass) through its lifecycle.",
    )
    add_run_arguments(run)
    run.add_argument("target", metavar="MODULE:CLASS", help="e.g. mypkg.agents:Reviewer")
    run.set_defaults(handler=_cmd_run)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job-id", help="default: AGENTLIFE_JOB_ID")
    parser.add_argument("--payload", help="job payload as JSON, for a job row this process creates")
    parser.add_argument(
        "--create-job", action="store_true", help="create the job row if missing (always done on SQLite)"
    )
    parser.add_argument(
        "--database-url",
        metavar="URL",
        help="the job store (default: AGENTLIFE_DATABASE_URL, else the embedded SQLite file)",
    )


def _cmd_run(args: argparse.Namespace) -> int:

    job_id_given(args)
    # A bad constant is a usage error before anything runs, and it sets how long an import may take
    # to give way to a signal.
    budget = Constants.from_env(os.environ).drain.cleanup_budget_seconds
    early = args.early_signal
    try:
        with early.abandoning_imports(budget) if early is not None else contextlib.nullcontext():
            agent_cls = load_agent_class(args.target)
    except SignalDuringImport as exc:
        _exit_line(ExitCode.DRAINED, f"drained by {exc.name} while importing {args.target}; no job state yet")
        return ExitCode.DRAINED
    return _run_agent(agent_cls, args)


def job_id_given(args: argparse.Namespace) -> None:
    """A job id from ``--job-id`` or ``AGENTLIFE_JOB_ID``: without one, `run` is a usage error (exit 2)."""
    if not (args.job_id or job_id_from_env(os.environ)):
        raise ConfigError("no job id: pass --job-id ID or set AGENTLIFE_JOB_ID")


def _exit_line(code: int, reason: str) -> None:
    """The runtime's exit line, for an exit that comes before the runtime exists."""
    line = {
        "ts": time.time(),
        "level": "INFO",
        "logger": "agentlife.runtime",
        "msg": f"exit {code}: {reason}",
    }
    sys.stdout.write(orjson.dumps({**line, "exit_code": code, "reason": reason}).decode() + "\n")


def run_agent_main(agent_cls: type, argv: Sequence[str] | None = None) -> int:
    """``AgentProcess.main()``: the ``run`` command for a class already at hand."""
    early = install_early_signal()
    try:
        check_agent_class(agent_cls)
    except ConfigError as exc:
        sys.stderr.write(f"agentlife: error: {exc}\n")
        return ExitCode.USAGE
    parser = Parser(
        prog=Path(sys.argv[0]).name, description=f"Run {agent_cls.__name__} as this process's job."
    )
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    args.early_signal = early

    def run() -> int:
        job_id_given(args)
        return _run_agent(agent_cls, args)

    return guarded(run)


def _run_agent(agent_cls: type, args: argparse.Namespace) -> int:
    import anyio

    from agentlife._runtime._lifecycle import RunOptions, Runtime, ShellOptions

    payload = validate_payload(_parse_payload(args.payload))
    # Everything `check` checks, checked the same way before anything runs or is written: exit 2.
    job_id = args.job_id or job_id_from_env(os.environ)
    if job_id and not JOB_ID_PATTERN.fullmatch(job_id):
        job_id = "check"  # the runtime refuses it at BOOTING (exit 1) without touching a path
    env = dict(os.environ)
    if getattr(args, "database_url", None):
        env["AGENTLIFE_DATABASE_URL"] = validate_database_url(args.database_url, "--database-url")
    settings = validated_settings(env, job_id=job_id, agent_id=getattr(agent_cls, "agent_id", None) or None)
    try:
        agent = agent_cls()
    except Exception as exc:
        raise ConfigError(f"creating {agent_cls.__name__}() failed: {describe_error(exc)}") from None
    options = RunOptions(
        job_id=args.job_id,
        payload=payload,
        create_job=args.create_job,
        constants=settings.constants,
        shell=ShellOptions(early_signal=args.early_signal),
    )
    runtime = Runtime(agent, env=env, options=options)
    code = anyio.run(runtime.run)
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def _parse_payload(raw: str | None) -> Any:
    """Parse ``--payload`` exactly: orjson would turn an int beyond 64 bits into a rounded float."""
    if raw is None:
        return None
    import json  # only with --payload: not on the boot path of a plain run

    try:
        payload = json.loads(raw, parse_constant=_refuse_constant)
    except ValueError as exc:
        raise ConfigError(f"--payload is not valid JSON: {exc}") from None
    except RecursionError:
        raise ConfigError(f"--payload nests deeper than {MAX_PAYLOAD_DEPTH} levels") from None
    try:
        check_replayable(payload, "--payload")
    except UnreplayableValue as exc:
        raise ConfigError(str(exc)) from None
    return payload


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


# -- check, db init ------------------------------------------------------------------------------------


def validated_settings(
    env: Any, *, job_id: str | None = None, agent_id: str | None = None, placeholders: bool = False
) -> Any:
    """The one validation `check` and `run` share: constants, their invariants and the process settings.

    With ``placeholders`` (``check`` outside a pod) a missing job id or agent id is replaced by a stand-in,
    so every other variable is still checked.

    Raises:
        ConfigError: naming the variable at fault (`InvariantViolation` naming both sides).
    """
    constants = Constants.from_env(env)
    return Settings.from_env(
        env,
        job_id=job_id or env.get("AGENTLIFE_JOB_ID") or ("check" if placeholders else None),
        agent_id=agent_id or ("check" if placeholders else None),
        constants=constants,
    )
