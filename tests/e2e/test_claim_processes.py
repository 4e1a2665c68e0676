"""Two real processes claiming one job with the same attempt: the second loses the claim."""

from __future__ import annotations

from pathlib import Path

from procs import agent_env, json_lines, run_cli, spawn, wait_for

# -- two live processes, one attempt ----------------------------------------------------------------------


def test_a_second_process_with_the_same_attempt_loses_the_claim(tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    env = agent_env(tmp_path / "data", TEST_MARKER_DIR=str(markers), TEST_TOOL_SECONDS="3")
    first = spawn("agents.hardening_agents:SlowEffectAgent", env, "--job-id", "twin")
    try:
        wait_for(markers / "slow", timeout=30)
        second = run_cli("run", "agents.hardening_agents:SlowEffectAgent", "--job-id", "twin", env=env)
        _, err = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert second.returncode == 1
    assert any("already claimed by a live process" in str(x.get("msg")) for x in json_lines(second.stdout))
    assert first.returncode == 0, err.decode()[-2000:]
    assert len((markers / "slow").read_text().splitlines()) == 1  # the effect ran once, not twice
    # The same attempt may claim again once the first process is gone (a local re-run).
    again = run_cli("run", "agents.hardening_agents:SlowEffectAgent", "--job-id", "twin", env=env)
    assert again.returncode == 0
