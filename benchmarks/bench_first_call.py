"""Spawn -> the first model request, for each provider's default client, against local fake servers.

A real ``python -m agentlife run`` of an agent whose first step makes one call through the default
``make_llm()``; the fake server (in this process, on its own thread) notes when the request arrives. Each
figure is the median of interleaved runs:

* spawn -> first request received, Anthropic (the default client: httpx) and OpenAI-compatible, each vs
  spawn -> exit of ``python -c "import asyncio"`` (target <= 3x);
* the Anthropic path vs the OpenAI-compatible path for the same agent: first-request latency and the
  child's peak RSS (``ru_maxrss`` from ``wait4``), target <= 1.2x each.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import anyio
from _common import child_env, compile_sources, emit, free_port, median

RUNS = 9
KEY = "sk-ant-bench-0123456789"


class Servers:
    """Both fake model servers on one thread with its own event loop; `arrivals` holds request times."""

    def __init__(self) -> None:
        self.arrivals: list[float] = []
        self.urls: dict[str, str] = {}
        self._ready = threading.Event()
        self._stop: Any = None
        self._thread = threading.Thread(target=anyio.run, args=(self._main,), daemon=True)

    def __enter__(self) -> Servers:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the fake servers did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    async def _main(self) -> None:
        from agentlife.testing import FakeAnthropicServer, FakeOpenAIServer

        def arrived(_: object) -> None:
            self.arrivals.append(time.perf_counter())

        self._stop = threading.Event()
        async with (
            FakeAnthropicServer(api_key=KEY, default_turn="ok", on_request=arrived) as anthropic,
            FakeOpenAIServer(default_turn="ok", on_request=arrived) as openai,
        ):
            self.urls = {"anthropic": anthropic.base_url, "openai": openai.base_url}
            self._ready.set()
            while not self._stop.is_set():
                await anyio.sleep(0.05)


def provider_env(servers: Servers, provider: str, data_dir: Path, job: str) -> dict[str, str]:
    extra = {
        "AGENTLIFE_DATA_DIR": str(data_dir),
        "AGENTLIFE_JOB_ID": job,
        "AGENTLIFE_HEALTH_HOST": "127.0.0.1",
        "AGENTLIFE_HEALTH_PORT": str(free_port()),
        "AGENTLIFE_LLM_PROVIDER": provider,
    }
    if provider == "anthropic":
        extra.update(ANTHROPIC_API_KEY=KEY, ANTHROPIC_BASE_URL=servers.urls["anthropic"])
    else:
        extra.update(OPENAI_BASE_URL=servers.urls["openai"])
    env = child_env(**extra)
    env.pop("OPENAI_API_KEY", None)
    return env


def first_request(servers: Servers, provider: str, data_dir: Path, job: str) -> tuple[float, int]:
    """Seconds from spawn to the request's arrival, and the child's peak RSS in KiB."""
    seen = len(servers.arrivals)
    env = provider_env(servers, provider, data_dir, job)
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentlife", "run", "bench_agents:FirstCallAgent"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0 or len(servers.arrivals) <= seen:
        raise RuntimeError(
            f"{provider}: the agent exited {proc.returncode} after {len(servers.arrivals) - seen} requests"
        )
    return servers.arrivals[seen] - started, int(usage.ru_maxrss)


def process_seconds(code: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=child_env())
    return time.perf_counter() - started


def main() -> None:
    compile_sources()
    base: list[float] = []
    latency: dict[str, list[float]] = {"anthropic": [], "openai": []}
    rss: dict[str, list[int]] = {"anthropic": [], "openai": []}
    with Servers() as servers, tempfile.TemporaryDirectory() as tmp:
        for i in range(RUNS):  # interleaved, so drift on a shared machine hits all three alike
            base.append(process_seconds("import asyncio"))
            for provider in ("anthropic", "openai"):
                seconds, peak = first_request(servers, provider, Path(tmp) / provider, f"{provider}-{i}")
                latency[provider].append(seconds)
                rss[provider].append(peak)
    b = median(base)
    names = {"anthropic": "Anthropic (default client)", "openai": "OpenAI-compatible"}
    for provider, label in names.items():
        value = median(latency[provider])
        emit(
            "first_call",
            f"spawn -> first model request, {label} (median)",
            value * 1000,
            "ms",
            baseline=b * 1000,
            target="<= 3x spawn of python -c 'import asyncio'",
            ok=value / b <= 3,
        )
    a, o = median(latency["anthropic"]), median(latency["openai"])
    emit(
        "first_call",
        "first-request latency, Anthropic vs OpenAI-compatible path (median)",
        a * 1000,
        "ms",
        baseline=o * 1000,
        target="<= 1.2x the OpenAI-compatible path",
        ok=a / o <= 1.2,
    )
    ra, ro = median([float(x) for x in rss["anthropic"]]), median([float(x) for x in rss["openai"]])
    emit(
        "first_call",
        "peak RSS of the process, Anthropic vs OpenAI-compatible path (median)",
        ra / 1024,
        "MiB",
        baseline=ro / 1024,
        target="<= 1.2x the OpenAI-compatible path",
        ok=ra / ro <= 1.2,
    )


if __name__ == "__main__":
    main()
