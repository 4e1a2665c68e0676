"""``python -m agentlife``: run, check, manifest, budget, db init, journal show, schedule, demo.

Usage errors print one line on stderr and exit 2, never a traceback. Subcommands whose code is heavy
import it only when they run.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from agentlife._exceptions import AgentlifeError, ConfigError, SignalDuringImport, UnreplayableValue
from agentlife._replay import check_replayable

__all__ = ["exit_now", "main", "run_agent_main"]

EXIT_USAGE = 2
EXIT_DRAINED = 143


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors as one line and exit 2 (its default prints usage first)."""

    def error(self, message: str) -> Any:
        _say(f"agentlife: error: {message}")  # argparse quotes the offending argument: redact it
        raise SystemExit(EXIT_USAGE)


def _say(line: str) -> None:
    """Write one line on stderr with every secret of the environment masked.

    Errors raised before the lifecycle starts (an import that fails, an agent whose ``__init__`` raises)
    may quote a token from the environment; the runtime's log redactor does not exist yet.
    """
    from agentlife._redact import Redactor

    sys.stderr.write(Redactor.from_env(os.environ).redact(line) + "\n")


def _guarded(handler: Callable[[], int]) -> int:
    """Run a command, turning every error into one redacted line and its exit code."""
    try:
        return handler()
    except ConfigError as exc:
        _say(f"agentlife: error: {exc}")
        return EXIT_USAGE
    except AgentlifeError as exc:
        _say(f"agentlife: {type(exc).__name__}: {exc}")
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        # A bug, not bad input: still one line, since a traceback would print secrets unmasked.
        _say(f"agentlife: internal error: {type(exc).__name__}: {exc}")
        if (os.environ.get("AGENTLIFE_LOG_LEVEL") or "").upper() == "DEBUG":
            import traceback

            _say("".join(traceback.format_exception(exc)).rstrip())
        return 1


def build_parser() -> argparse.ArgumentParser:
    """The full command-line parser."""
    parser = _Parser(
        prog="python -m agentlife", description="Lifecycle runtime for AI-agent jobs on Kubernetes."
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    run = sub.add_parser(
        "run",
        help="run an agent class as this process's job",
        description="Run MODULE:CLASS (an AgentProcess subclass) through its lifecycle.",
    )
    _add_run_arguments(run)
    run.add_argument("target", metavar="MODULE:CLASS", help="e.g. mypkg.agents:Reviewer")
    run.set_defaults(handler=_cmd_run)

    check = sub.add_parser(
        "check",
        help="validate the constants and environment, print the derived values",
        description="Check every invariant of the constants (after AGENTLIFE_* overrides).",
    )
    check.add_argument("--json", action="store_true", help="print the constants as JSON")
    check.set_defaults(handler=_cmd_check)

    db = sub.add_parser("db", help="database commands", description="Database commands.")
    db_sub = db.add_subparsers(dest="db_command", metavar="COMMAND", parser_class=_Parser)
    db_sub.required = True
    init = db_sub.add_parser(
        "init",
        help="create the tables (idempotent)",
        description="Create the job, checkpoint_history and delivery tables if missing.",
    )
    init.add_argument("--database-url", help="default: AGENTLIFE_DATABASE_URL or the embedded SQLite file")
    init.set_defaults(handler=_cmd_db_init)

    demo = sub.add_parser(
        "demo",
        help="run the example agent end to end on the embedded defaults",
        description="Run the example agent twice (SQLite, local Qdrant, scripted LLM) and "
        "print each session's timeline.",
    )
    demo.add_argument("--data-dir", default=None, help="default: ./.agentlife-demo")
    demo.set_defaults(handler=_cmd_demo)

    for module in (
        "agentlife._journal_show",
        "agentlife._policy",
        "agentlife._manifest",
        "agentlife._schedule",
    ):
        _register(module, sub)
    return parser


def _register(module: str, sub: Any) -> None:
    try:
        register: Callable[[Any], None] = importlib.import_module(module).register_cli
    except (
        ImportError,
        AttributeError,
    ):  # pragma: no cover - a command module missing from a partial install
        return
    register(sub)


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job-id", help="default: AGENTLIFE_JOB_ID")
    parser.add_argument("--payload", help="job payload as JSON, for a job row this process creates")
    parser.add_argument(
        "--create-job", action="store_true", help="create the job row if missing (always done on SQLite)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m agentlife`` and the ``agentlife`` script."""
    early = _install_early_signal()
    parser = build_parser()
    args = parser.parse_args(argv)
    args.early_signal = early
    if args.command not in _DRAINING_COMMANDS:
        _end_on_signals()
        if early is not None and early.is_set():
            return 128 + int(signal.Signals[early.name])
    try:
        return _guarded(lambda: int(args.handler(args)))
    except SystemExit as exc:  # from _end_on_signals: leave through exit_now, at once
        return exc.code if isinstance(exc.code, int) else 1


#: Commands that run an agent's lifecycle: a signal drains them. Any other command ends at once.
_DRAINING_COMMANDS = frozenset({"run", "demo"})


def _end_on_signals() -> None:
    """SIGTERM (exit 143) and Ctrl-C (exit 130) end a command at once, whatever it waits for.

    ``db init`` against a server that never answers or ``journal show`` on a FIFO would otherwise wait
    for ever: the early handler only remembers a signal for the drain of ``run``.
    """

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        with contextlib.suppress(ValueError):  # not the main thread: the embedding program owns signals
            signal.signal(signum, handler)


def exit_now(code: int) -> None:
    """Flush stdio and leave at once with ``code``.

    Everything the process owns was closed explicitly during cleanup, so interpreter finalisation has
    nothing left to do but join threads: and a worker thread still running a sync tool that ignored
    cancellation must not be able to hold the pod past its drain budget. This also saves ~25 ms per exit.
    """
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def _install_early_signal() -> Any:
    from agentlife._runtime import EarlySignal

    try:
        return EarlySignal().install()
    except ValueError:  # not the main thread (embedded use): the caller owns signals
        return None


# -- run ------------------------------------------------------------------------------------------------


def _cmd_run(args: argparse.Namespace) -> int:
    from agentlife.constants import Constants

    job_id_given(args)
    # A bad constant is a usage error before anything runs, and it sets how long an import may take
    # to give way to a signal.
    budget = Constants.from_env(os.environ).drain.cleanup_budget_seconds
    early = args.early_signal
    try:
        with early.abandoning_imports(budget) if early is not None else contextlib.nullcontext():
            agent_cls = load_agent_class(args.target)
    except SignalDuringImport as exc:
        _exit_line(EXIT_DRAINED, f"drained by {exc.name} while importing {args.target}; no job state yet")
        return EXIT_DRAINED
    return _run_agent(agent_cls, args)


def job_id_given(args: argparse.Namespace) -> None:
    """A job id from ``--job-id`` or ``AGENTLIFE_JOB_ID``: without one, `run` is a usage error (exit 2)."""
    if not (args.job_id or os.environ.get("AGENTLIFE_JOB_ID")):
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
    early = _install_early_signal()
    try:
        check_agent_class(agent_cls)
    except ConfigError as exc:
        sys.stderr.write(f"agentlife: error: {exc}\n")
        return EXIT_USAGE
    parser = _Parser(
        prog=Path(sys.argv[0]).name, description=f"Run {agent_cls.__name__} as this process's job."
    )
    _add_run_arguments(parser)
    args = parser.parse_args(argv)
    args.early_signal = early

    def run() -> int:
        job_id_given(args)
        return _run_agent(agent_cls, args)

    return _guarded(run)


def _run_agent(agent_cls: type, args: argparse.Namespace) -> int:
    import anyio

    from agentlife._config import JOB_ID_PATTERN, validate_payload
    from agentlife._runtime import RunOptions, Runtime

    payload = validate_payload(_parse_payload(args.payload))
    # Everything `check` checks, checked the same way before anything runs or is written: exit 2.
    job_id = args.job_id or os.environ.get("AGENTLIFE_JOB_ID")
    if job_id and not JOB_ID_PATTERN.fullmatch(job_id):
        job_id = "check"  # the runtime refuses it at BOOTING (exit 1) without touching a path
    settings = validated_settings(
        os.environ, job_id=job_id, agent_id=getattr(agent_cls, "agent_id", None) or None
    )
    try:
        agent = agent_cls()
    except Exception as exc:
        raise ConfigError(f"creating {agent_cls.__name__}() failed: {type(exc).__name__}: {exc}") from None
    options = RunOptions(
        job_id=args.job_id,
        payload=payload,
        create_job=args.create_job,
        constants=settings.constants,
        early_signal=args.early_signal,
    )
    runtime = Runtime(agent, options=options)
    code = anyio.run(runtime.run)
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def _parse_payload(raw: str | None) -> Any:
    """Parse ``--payload`` exactly: orjson would turn an int beyond 64 bits into a rounded float."""
    from agentlife._config import MAX_PAYLOAD_DEPTH

    if raw is None:
        return None
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


def load_agent_class(target: str) -> type:
    """Import ``MODULE:CLASS`` and check it is an `AgentProcess` subclass.

    Raises:
        ConfigError: with one line saying what is wrong with ``target``.
    """
    from agentlife._agent import AgentProcess

    module_name, sep, class_name = target.partition(":")
    if not sep or not module_name or not class_name:
        raise ConfigError(f"{target!r} is not MODULE:CLASS (e.g. mypkg.agents:Reviewer)")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigError(f"cannot import module {module_name!r}: {exc}") from None
    except SystemExit as exc:  # sys.exit(0) at import must not look like a finished job
        raise ConfigError(f"importing module {module_name!r} called sys.exit({exc.code!r})") from None
    except Exception as exc:
        raise ConfigError(f"importing module {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    obj: Any = module
    for part in class_name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ConfigError(f"module {module_name!r} has no attribute {class_name!r}")
    if not isinstance(obj, type) or not issubclass(obj, AgentProcess):
        raise ConfigError(f"{target!r} is not an AgentProcess subclass")
    check_agent_class(obj)
    return obj


def check_agent_class(cls: type) -> None:
    """Refuse an agent class the runtime could only fail on later: ``step`` must be ``async def``."""
    step = getattr(cls, "step", None)
    if not inspect.iscoroutinefunction(step):
        raise ConfigError(f"{cls.__name__}.step must be 'async def step(self, ctx)', not a plain def")


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
    from agentlife._config import Settings
    from agentlife.constants import Constants

    constants = Constants.from_env(env)
    return Settings.from_env(
        env,
        job_id=job_id or env.get("AGENTLIFE_JOB_ID") or ("check" if placeholders else None),
        agent_id=agent_id or ("check" if placeholders else None),
        constants=constants,
    )


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


def _cmd_db_init(args: argparse.Namespace) -> int:
    import anyio

    from agentlife._redact import Redactor
    from agentlife.stores import store_from_url

    data_dir = Path(os.environ.get("AGENTLIFE_DATA_DIR") or ".agentlife")
    url = (
        args.database_url
        or os.environ.get("AGENTLIFE_DATABASE_URL")
        or f"sqlite:///{data_dir / 'agentlife.db'}"
    )
    store = store_from_url(url)

    async def init() -> None:
        await store.open()
        try:
            await store.init_schema()
        finally:
            await store.close()

    anyio.run(init)
    sys.stdout.write(f"schema ready at {Redactor.from_env(os.environ).redact(url)}\n")
    return 0


# -- demo ----------------------------------------------------------------------------------------------


def _cmd_demo(args: argparse.Namespace) -> int:
    from agentlife._demo import run_demo

    return run_demo(Path(args.data_dir) if args.data_dir else Path(".agentlife-demo"))


def _version() -> str:
    from agentlife import __version__

    return __version__
