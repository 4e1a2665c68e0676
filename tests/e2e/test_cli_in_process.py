"""`cli_in_process` answers as ``python -m agentlife`` does: the tests that use it may trust its codes.

One real process per command, each compared with the in-process run on the same store: the exit code of a
success, a usage error raised by argparse, one raised by a handler and a not-found, with their stdout and
stderr.
"""

from __future__ import annotations

from pathlib import Path

from procs import agent_env, cli_in_process, run_cli
from world import init_schema

COMMANDS = [
    ("job", "create", "demo", "--id", "job-1"),
    ("job", "list", "--limit", "0"),
    ("job", "show", "no-such-job"),
    ("job", "send", "job-1", "", "--payload", "{}"),
    ("job", "list", "--json"),
]


def test_each_command_gives_the_code_and_output_of_a_process(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    init_schema(url)
    env = agent_env(tmp_path / "data", AGENTLIFE_DATABASE_URL=url)
    codes = []
    for args in COMMANDS:
        ours = cli_in_process(*args, env=env)
        if args[1] == "create":  # the real one makes the same job again: another id, the same answer
            args = (*args[:-1], "job-2")
        real = run_cli(*args, env=env)
        assert (ours.returncode, ours.stderr) == (real.returncode, real.stderr), args
        assert ours.stdout.replace("job-1", "job-2") == real.stdout.replace("job-1", "job-2"), args
        codes.append(ours.returncode)
    assert codes == [0, 2, 3, 2, 0]  # every kind of exit the tests read
