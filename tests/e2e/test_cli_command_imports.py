"""The command table: every subcommand is registered from its own module, and none can silently vanish."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from procs import REPO, agent_env


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
