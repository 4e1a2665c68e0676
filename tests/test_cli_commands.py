"""The command table: every subcommand is registered from its own module, and none can silently vanish."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from agentlife._cli import COMMANDS, build_parser, command_module
from procs import REPO, agent_env

EXPECTED = {
    "run",
    "worker",
    "check",
    "db",
    "job",
    "reap",
    "demo",
    "journal",
    "budget",
    "manifest",
    "schedule",
    "console",
}


def _subcommands(parser: argparse.ArgumentParser) -> set[str]:
    (action,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(action.choices)


def test_every_subcommand_is_registered() -> None:
    assert _subcommands(build_parser()) == EXPECTED


def test_each_command_module_registers_exactly_its_own_subcommands() -> None:
    for name in COMMANDS:
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        command_module(name).register(sub)
        assert set(sub.choices) == {name}, (COMMANDS[name], set(sub.choices))
    assert set(COMMANDS) == EXPECTED


def test_a_named_command_builds_its_parser_alone_and_anything_else_builds_them_all() -> None:
    assert _subcommands(build_parser(["job", "list"])) == {"job"}
    assert _subcommands(build_parser(["--help"])) == EXPECTED
    assert _subcommands(build_parser(["nosuch"])) == EXPECTED
    assert _subcommands(build_parser([])) == EXPECTED


def test_running_one_command_imports_no_other_command_module(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from agentlife._cli import main\n"
        "main(['schedule', 'next', '*/5 * * * *', '--after', '2026-01-01T00:00:00Z'])\n"
        "print(sorted(m for m in sys.modules if m.startswith('agentlife._cli.')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=agent_env(tmp_path),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.splitlines()[-1]
    assert "agentlife._cli._schedule" in loaded
    for other in ("_job", "_worker", "_budget", "_manifest", "_journal", "_check", "_demo"):
        assert f"agentlife._cli.{other}'" not in loaded, loaded


def test_the_console_loads_its_web_stack_only_when_it_runs() -> None:
    import subprocess
    import sys

    code = (
        "import sys, agentlife._cli;"
        " sys.exit(('aiohttp' in sys.modules) + 2 * ('agentlife._console' in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_domain_modules_hold_no_command_line_code() -> None:
    import inspect

    from agentlife import _manifest, _schedule
    from agentlife._journal import _show as _journal_show
    from agentlife.stores import _policy

    for module in (_journal_show, _manifest, _policy, _schedule):
        source = inspect.getsource(module)
        assert "argparse" not in source and "register_cli" not in source, module.__name__
        assert "print(" not in source, module.__name__
