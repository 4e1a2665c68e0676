"""The command table: every subcommand is registered from its own module, and none can silently vanish."""

from __future__ import annotations

import argparse

import pytest

from agentlife._cli import COMMANDS, build_parser, command_module
from agentlife._exceptions import ConfigError

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


def test_domain_modules_hold_no_command_line_code() -> None:
    import inspect

    from agentlife import _manifest, _schedule
    from agentlife._journal import _show as _journal_show
    from agentlife.stores import _policy

    for module in (_journal_show, _manifest, _policy, _schedule):
        source = inspect.getsource(module)
        assert "argparse" not in source and "register_cli" not in source, module.__name__
        assert "print(" not in source, module.__name__


def test_the_console_s_actor_header_is_a_header_name_from_the_flag_or_the_environment() -> None:
    from agentlife._cli._console import actor_header

    assert actor_header(None, {}) is None
    assert actor_header(None, {"AGENTLIFE_CONSOLE_ACTOR_HEADER": ""}) is None
    assert actor_header(None, {"AGENTLIFE_CONSOLE_ACTOR_HEADER": "X-Remote-User"}) == "X-Remote-User"
    assert (
        actor_header("X-Forwarded-User", {"AGENTLIFE_CONSOLE_ACTOR_HEADER": "X-Other"}) == "X-Forwarded-User"
    )
    for bad in ("X User", "X-User:", "X\nUser", "", "x" * 101, "Ünïcode"):
        with pytest.raises(ConfigError, match="--actor-header must be an HTTP header name"):
            actor_header(bad, {})
