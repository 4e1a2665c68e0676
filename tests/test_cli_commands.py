"""The command table: every subcommand is registered from its own module, and none can silently vanish."""

from __future__ import annotations

import argparse

from agentlife._cli import COMMANDS, build_parser

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
    seen: set[str] = set()
    for module in COMMANDS:
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        module.register(sub)
        mine = set(sub.choices)
        assert len(mine) == 1, (module.__name__, mine)
        assert not mine & seen, f"{module.__name__} registers {mine & seen} again"
        seen |= mine
    assert seen == EXPECTED


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
