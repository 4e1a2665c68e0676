"""The fan-out example (examples/fanout_agent.py) run by three real workers, one of the parent agent and two
of the child agent, under seeded SIGKILLs, on SQLite and PostgreSQL, each worker process on a disk of its
own: the parent's sum is right, every child's effect happened exactly once, and every child was created
exactly once."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from procs import REPO, agent_env, cli_in_process

CHILDREN = 20
KILLS = int(os.environ.get("FANOUT_SIGKILLS", "4"))
SEED = int(os.environ.get("FANOUT_SEED", "7"))
#: Every duration x 0.02: job heartbeat 0.6 s, so a killed worker's jobs are reaped within about a second.
SCALE = "0.02"
SLOTS = (("fanout_agent:FanOut", ()), ("fanout_agent:Square", ("--concurrency", "4")))


def test_twenty_children_under_seeded_kills_sum_right_with_each_effect_and_child_once(
    tmp_path: Path, db_url: str
) -> None:
    # Each worker process on a disk of its own (a new pod), the effects in a file they share.
    data = tmp_path / "data"
    effects = tmp_path / "fanout-effects.log"
    env = agent_env(
        data,
        AGENTLIFE_DATABASE_URL=db_url,
        AGENTLIFE_HEALTH_PORT="off",
        FANOUT_EFFECTS=str(effects),
        PYTHONPATH=os.pathsep.join([str(REPO / "examples"), str(REPO / "src")]),
    )
    assert cli_in_process("db", "init", env=env).returncode == 0
    made = cli_in_process(
        "job", "create", "fanout", "--id", "fan", "--payload", f'{{"children": {CHILDREN}}}', env=env
    )
    assert made.returncode == 0, made.stderr
    rng = random.Random(SEED)
    targets = [SLOTS[0], SLOTS[1], SLOTS[1]]
    slots: list[subprocess.Popen[bytes] | None] = [None, None, None]
    logs = tmp_path / "logs"
    logs.mkdir()
    spawned, kills = 0, 0
    deadline = time.monotonic() + 90
    next_kill = time.monotonic() + rng.uniform(0.5, 1.5)
    try:
        while True:
            for i, (target, args) in enumerate(targets):
                if slots[i] is None or slots[i].poll() is not None:  # type: ignore[union-attr]
                    spawned += 1
                    with (logs / f"w{spawned:03d}.log").open("wb") as log:
                        slots[i] = subprocess.Popen(
                            [
                                sys.executable,
                                "-m",
                                "agentlife",
                                "worker",
                                target,
                                "--time-scale",
                                SCALE,
                                *args,
                            ],
                            env={**env, "AGENTLIFE_DATA_DIR": str(data / f"pod-{spawned:03d}")},
                            cwd=REPO,
                            stdout=log,
                            stderr=subprocess.STDOUT,
                        )
            if kills < KILLS and time.monotonic() >= next_kill:
                victim = slots[rng.randrange(3)]
                assert victim is not None
                victim.send_signal(signal.SIGKILL)
                kills += 1
                next_kill = time.monotonic() + rng.uniform(0.3, 1.2)
            shown = cli_in_process("job", "list", "--status", "COMPLETED", "--json", env=env)
            if kills >= KILLS and '"fan"' in shown.stdout:
                break
            assert time.monotonic() < deadline, "\n".join(p.read_text()[-2000:] for p in logs.glob("*.log"))
            time.sleep(0.2)
    finally:
        for proc in slots:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    shown = cli_in_process("job", "show", "fan", env=env)
    assert f'result      {{"sum": {sum(i * i for i in range(CHILDREN))}}}' in shown.stdout, shown.stdout
    lines = effects.read_text().splitlines()
    assert sorted(lines) == sorted(f"fan.0.{i}/0/0 {i}" for i in range(CHILDREN))  # each effect once
    listed = cli_in_process("job", "list", "--json", "--limit", "1000", env=env)
    ids = [line for line in listed.stdout.splitlines() if '"id"' in line or line.startswith("{")]
    assert listed.returncode == 0, listed.stderr
    for i in range(CHILDREN):
        assert listed.stdout.count(f'"fan.0.{i}"') == 1, ids  # each child created once
    assert listed.stdout.count('"fan.0.') == CHILDREN
