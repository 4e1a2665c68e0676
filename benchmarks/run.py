"""Run the benchmark scripts, collect their results and write ``docs/performance.md``.

Usage::

    python benchmarks/run.py [--only NAME ...] [--timeout SECONDS] [--no-page]

Every ``benchmarks/bench_*.py`` that has a ``__main__`` block runs as a subprocess, one after the other (they
measure against baselines taken in the same run, so running them side by side would only add noise). A
script prints one JSON object per result line::

    {"bench": "startup", "metric": "...", "value": 23.1, "unit": "ms", "baseline": 21.0, "ratio": 1.1,
     "target": "<= 1.5x ...", "pass": true}

A script that sets ``ON_DEMAND = True`` (the fleet run: minutes of several processes) runs only when
``--only`` names it; its last results stay on the page like the others'.

Other lines (notes, progress, JSON without those keys) are passed through and otherwise ignored. The results
go to ``bench-results/latest.json`` (plus a dated copy) and to ``docs/performance.md``, with the machine they
ran on. ``--only startup`` runs ``bench_startup.py`` alone. Results of benchmarks not run this time are kept
from the previous ``latest.json``, each with its own date and machine.

Exit status: 0 when every script ran to completion, whether or not each target was met (a missed target is
a finding, reported on the page and in the summary); 1 when a script crashed, timed out or printed no
result; 2 for a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO / "benchmarks"
RESULT_KEYS = ("bench", "metric", "value")


def discover(directory: Path = BENCH_DIR) -> dict[str, Path]:
    """Benchmark scripts by short name (``bench_startup.py`` is ``startup``); helper modules are skipped."""
    scripts = {}
    for path in sorted(directory.glob("bench_*.py")):
        if '__name__ == "__main__"' not in path.read_text(encoding="utf-8"):
            continue  # a helper module (bench_agents.py holds the agents the others spawn)
        scripts[path.stem.removeprefix("bench_")] = path
    return scripts


def machine() -> dict[str, Any]:
    """What the figures depend on: CPU, cores, memory, Python, kernel, and the load when the run began."""
    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "kernel": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
    }
    if hasattr(os, "sched_getaffinity"):
        info["usable_cores"] = len(os.sched_getaffinity(0))
    if hasattr(os, "getloadavg"):
        info["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + (" (with local changes)" if dirty.stdout.strip() else "")


def parse_result(line: str) -> dict[str, Any] | None:
    """The result in ``line``, or None for any other line (text, or JSON that is not a result)."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not all(k in obj for k in RESULT_KEYS):
        return None
    return obj


def run_script(name: str, path: Path, timeout: float) -> dict[str, Any]:
    """Run one script to completion (or its timeout) and return its entry for ``latest.json``."""
    started = time.monotonic()
    sys.stdout.write(f"== {name} ({_shown(path)})\n")
    sys.stdout.flush()
    proc = subprocess.Popen(
        [sys.executable, str(path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
        start_new_session=True,  # its own process group: a timeout stops the children it spawned too
    )
    assert proc.stdout is not None and proc.stderr is not None
    stderr_tail: deque[str] = deque(maxlen=30)
    timed_out = threading.Event()

    def pump_stderr() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            stderr_tail.append(line.rstrip("\n"))
            sys.stderr.write(f"   {line}")

    def kill() -> None:
        timed_out.set()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    pump = threading.Thread(target=pump_stderr, daemon=True)
    pump.start()
    timer = threading.Timer(timeout, kill)
    timer.start()
    results: list[dict[str, Any]] = []
    try:
        for line in proc.stdout:
            result = parse_result(line)
            if result is None:
                if line.strip():
                    sys.stdout.write(f"   {line}" if line.endswith("\n") else f"   {line}\n")
                continue
            results.append(result)
            sys.stdout.write(f"   {_describe(result)}\n")
            sys.stdout.flush()
        code = proc.wait()
    finally:
        timer.cancel()
    pump.join(5)
    error = None
    if timed_out.is_set():
        error = f"timed out after {timeout:g} s"
    elif code != 0:
        error = f"exited with {code}"
    elif not results:
        error = "printed no result"
    return {
        "script": _shown(path),
        "date": _now(),
        "exit_code": code,
        "seconds": round(time.monotonic() - started, 1),
        "error": error,
        "stderr_tail": list(stderr_tail) if error else [],
        "results": results,
    }


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _now() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()


def _describe(r: dict[str, Any]) -> str:
    baseline = f" vs {_num(r.get('baseline'))} {r.get('unit', '')}" if r.get("baseline") is not None else ""
    ratio = f" = {_num(r['ratio'])}x" if r.get("ratio") is not None else ""
    verdict = "pass" if r.get("pass") else "MISSED"
    target = f" (target {r['target']})" if r.get("target") else ""
    return f"{verdict:6} {r['metric']}: {_num(r['value'])} {r.get('unit', '')}{baseline}{ratio}{target}"


def _num(value: Any) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return str(value)
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


# -- the page ------------------------------------------------------------------------------------------------


def _machine_line(m: dict[str, Any]) -> str:
    cores = f"{m.get('cores')} cores" + (
        f" ({m['usable_cores']} usable)" if m.get("usable_cores") not in (None, m.get("cores")) else ""
    )
    memory = f"{m['memory_gib']} GiB RAM" if m.get("memory_gib") else "memory unknown"
    return f"{m.get('cpu')}, {cores}, {memory}, {m.get('python')}, {m.get('kernel')}"


def _same_machine(a: dict[str, Any] | None, b: dict[str, Any]) -> bool:
    keys = ("cpu", "cores", "memory_gib", "python", "kernel", "machine")
    return a is None or all(a.get(k) == b.get(k) for k in keys)


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_page(data: dict[str, Any], known: list[str]) -> str:
    """``docs/performance.md`` from ``latest.json``'s data; ``known`` lists every benchmark script."""
    m = data["machine"]
    lines = [
        "# Performance",
        "",
        "<!-- Generated by benchmarks/run.py (nox -s bench); edits are overwritten. -->",
        "",
        "Every figure is measured against a **baseline taken in the same run, on the same machine**: the",
        "naive design or the bare Python primitive that agentlife's code replaces or wraps. The ratio is",
        "value ÷ baseline. Absolute numbers move with the machine and its load, but ratios are much more",
        "stable. Each benchmark states its target. A **missed target is a finding, not a failure**: it is",
        "reported here and in the run's summary, and the run still succeeds. Only a benchmark script that",
        "crashes, times out or prints no result makes `python benchmarks/run.py` exit non-zero.",
        "",
        "Run them all with `nox -s bench` (or `python benchmarks/run.py`). `--only NAME` runs one script",
        "(`--only startup` runs `benchmarks/bench_startup.py`). Raw results: `bench-results/latest.json`.",
        "",
        "## Machine",
        "",
        "| | |",
        "|---|---|",
        f"| date of this run | {data['generated']} |",
        f"| CPU | {_cell(m.get('cpu'))} |",
        f"| cores | {m.get('cores')}"
        + (f" ({m['usable_cores']} usable by this process)" if m.get("usable_cores") else "")
        + " |",
        f"| memory | {m.get('memory_gib')} GiB |",
        f"| Python | {m.get('python')} |",
        f"| kernel | {_cell(m.get('kernel'))} ({m.get('machine')}) |",
        f"| load average at start | {', '.join(str(x) for x in m.get('load_average', [])) or 'unknown'} |",
        f"| commit | {data.get('commit') or 'unknown'} |",
        "",
        "The development machine is shared: other work runs on the same two cores, so tails (p99) are noisy.",
        "",
        "## Summary",
        "",
        "| benchmark | results | targets met | targets missed | script | measured |",
        "|---|---|---|---|---|---|",
    ]
    benches: dict[str, Any] = data["benches"]
    for name in known:
        entry = benches.get(name)
        if entry is None:
            lines.append(f"| {name} | — | — | — | not run yet (`--only {name}`) | — |")
            continue
        results = entry["results"]
        met = sum(1 for r in results if r.get("pass"))
        status = "ok" if not entry.get("error") else f"**{_cell(entry['error'])}**"
        lines.append(
            f"| [{name}](#{name}) | {len(results)} | {met} | {len(results) - met} | {status} "
            f"| {entry['date'][:10]} |"
        )
    for name in known:
        entry = benches.get(name)
        if entry is None:
            continue
        lines += ["", f"## {name}", ""]
        lines.append(
            f"`{entry['script']}`: {entry['seconds']} s, measured {entry['date']}"
            + (f" on {_machine_line(entry['machine'])}" if not _same_machine(entry.get("machine"), m) else "")
            + "."
        )
        if entry.get("error"):
            lines += ["", f"**The script {entry['error']}.** Its last lines on stderr:", "", "```"]
            lines += entry.get("stderr_tail") or ["(nothing)"]
            lines.append("```")
        if entry["results"]:
            lines += [
                "",
                "| metric | value | baseline | ratio | target | result |",
                "|---|---|---|---|---|---|",
            ]
            for r in entry["results"]:
                unit = r.get("unit", "")
                baseline = f"{_num(r['baseline'])} {unit}" if r.get("baseline") is not None else "—"
                ratio = f"{_num(r['ratio'])}x" if r.get("ratio") is not None else "—"
                verdict = "met" if r.get("pass") else "**missed**"
                value = f"{_num(r['value'])} {_cell(unit)}"
                target = _cell(r.get("target") or "—")
                lines.append(
                    f"| {_cell(r['metric'])} | {value} | {_cell(baseline)} | {ratio} | {target} | {verdict} |"
                )
    return "\n".join(lines) + "\n"


# -- main ----------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Command line; returns the exit status."""
    parser = argparse.ArgumentParser(description="Run benchmarks/bench_*.py and write docs/performance.md.")
    parser.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help="run only these, by short name: startup runs bench_startup.py (repeatable or comma-separated)",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per script (default 900)")
    parser.add_argument("--results", type=Path, default=REPO / "bench-results", help="results directory")
    parser.add_argument("--page", type=Path, default=REPO / "docs" / "performance.md", help="page to write")
    parser.add_argument("--no-page", action="store_true", help="do not write the page")
    parser.add_argument(
        "--bench-dir", type=Path, default=BENCH_DIR, help=argparse.SUPPRESS
    )  # tests of run.py
    args = parser.parse_args(argv)
    scripts = discover(args.bench_dir)

    selected = [name for name, path in scripts.items() if "\nON_DEMAND = True" not in path.read_text()]
    if args.only:
        selected = [
            n.strip().removeprefix("bench_").removesuffix(".py") for o in args.only for n in o.split(",")
        ]
        unknown = [n for n in selected if n not in scripts]
        if unknown:
            parser.error(f"unknown benchmark {', '.join(unknown)}; known: {', '.join(scripts)}")

    here = machine()
    latest = args.results / "latest.json"
    previous: dict[str, Any] = {}
    if latest.exists():
        try:
            old = json.loads(latest.read_text())
            previous = {k: v for k, v in old.get("benches", {}).items() if k in scripts}
        except (ValueError, AttributeError):
            sys.stderr.write(f"warning: {latest} is not readable; starting afresh\n")

    benches = dict(previous)
    for name in selected:
        entry = run_script(name, scripts[name], args.timeout)
        entry["machine"] = here
        benches[name] = entry

    generated = _now()
    data: dict[str, Any] = {
        "generated": generated,
        "machine": here,
        "commit": _git_commit(),
        "benches": benches,
    }
    args.results.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=2) + "\n"
    latest.write_text(text)
    stamp = generated.replace(":", "").replace("-", "").replace("+0000", "Z")
    (args.results / f"run-{stamp}.json").write_text(text)
    if not args.no_page:
        args.page.write_text(render_page(data, list(scripts)))

    ran = [benches[n] for n in selected]
    results = [r for e in ran for r in e["results"]]
    missed = [r for r in results if not r.get("pass")]
    failed = [e for e in ran if e.get("error")]
    sys.stdout.write(
        f"\n{len(ran)} benchmark script(s), {len(results)} results: "
        f"{len(results) - len(missed)} targets met, {len(missed)} missed; {len(failed)} script(s) failed\n"
    )
    for r in missed:
        sys.stdout.write(f"  missed  {r['bench']}: {_describe(r)}\n")
    for e in failed:
        sys.stdout.write(f"  FAILED  {e['script']}: {e['error']}\n")
    sys.stdout.write(f"results: {latest}" + ("" if args.no_page else f"; page: {args.page}") + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
