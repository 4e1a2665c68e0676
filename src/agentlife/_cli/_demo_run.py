"""``python -m agentlife demo``: the example agent end to end on the embedded defaults.

Two jobs run in this process on SQLite, local Qdrant and the scripted LLM: the first writes a memory
at the end, the second hydrates it. Each session's timeline is printed from its journal.
"""

from __future__ import annotations

import io
import os
import sys
import time
from pathlib import Path

import anyio

from agentlife._exceptions import ConfigError
from agentlife._journal._show import format_timeline
from agentlife._runtime._entry import load_agent_class
from agentlife._runtime._lifecycle import RunOptions, Runtime, ShellOptions

__all__ = ["run_demo"]


def _examples_dir() -> Path:
    """The example agent: the source checkout's examples/, or the copy the wheel ships."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "examples" / "release_notes_agent.py"
        if candidate.exists():
            return candidate.parent
    packaged = here.parents[1] / "_examples"  # agentlife/_examples, beside this module's agentlife/_cli
    if (packaged / "release_notes_agent.py").exists():
        return packaged
    raise ConfigError("the demo's example agent is missing from this installation")


def run_demo(data_dir: Path) -> int:
    """Run two example jobs on ``data_dir``; returns 0 when both completed."""
    examples = _examples_dir()
    sys.path.insert(0, str(examples))
    agent_cls = load_agent_class("release_notes_agent:ReleaseNotesAgent")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    env = {
        **os.environ,
        "AGENTLIFE_DATA_DIR": str(data_dir),
        "AGENTLIFE_HEALTH_HOST": "127.0.0.1",
        "AGENTLIFE_HEALTH_PORT": "0",
        "RELEASE_NOTES_OUTBOX": str(data_dir / "outbox"),
    }
    env.pop("AGENTLIFE_DATABASE_URL", None)
    # The example's tools read their outbox from the process environment (verify sees only an invocation id).
    os.environ["RELEASE_NOTES_OUTBOX"] = env["RELEASE_NOTES_OUTBOX"]
    sys.stdout.write(f"agentlife demo: data dir {data_dir} (SQLite, local Qdrant, scripted LLM)\n")
    for n in (1, 2):
        job_id = f"demo-{stamp}-{n}"
        logs = io.StringIO()
        runtime = Runtime(
            agent_cls(),
            env={**env, "AGENTLIFE_JOB_ID": job_id},
            options=RunOptions(
                payload={"changes": str(examples / "changes.txt"), "outbox": str(data_dir / "outbox")},
                shell=ShellOptions(hard_exit=False, log_stream=logs),
            ),
        )
        started = time.monotonic()
        code = anyio.run(runtime.run)
        elapsed = time.monotonic() - started
        sys.stdout.write(f"\n== job {job_id}: exit {code} in {elapsed:.2f}s ==\n")
        if runtime.journal is not None:
            sys.stdout.write(format_timeline(runtime.journal.path) + "\n")
        if code != 0:
            sys.stdout.write(logs.getvalue())
            return code
    sys.stdout.write(f"\ndeliveries: {data_dir / 'outbox' / 'deliveries.jsonl'}\n")
    return 0
