"""Journal benchmarks: recovery scan cost, buffered append throughput, write-ahead fsync overhead.

Run: ``python benchmarks/bench_journal.py``. Prints one JSON object per line:

- ``scan_ratio_1m_vs_1k``: scan time with 1 000 000 events before the last marker vs 1 000 before it, both
  with 100 after it (target <= 1.5x: the cost follows the events after the marker, not the file);
- ``scan_time_1m``: the absolute scan time of the big file (target <= 50 ms);
- ``buffered_events_per_s``: `Journal.append` with the periodic flush running, against a naive
  ``json.dumps`` + write + flush per event in the same run (target >= 2.5x), on a realistic step (six
  events: step and call markers, a ~2 KB LLM reply, a ~400 B tool result, a checkpoint marker);
  ``buffered_small_events_per_s`` is the same on small ~150 B events only (target >= 3.3x). Rates are
  events per CPU second of the process (user + sys, all threads), best of 8 interleaved rounds, so that
  other load on a shared machine does not decide the ratio; wall-clock rates go to stderr, and so does the
  step mix journaled through a `Redactor` as the runtime does (informational: no target).

  Why not 5x: per event, in CPU ns (CPython 3.11, orjson 3.x, ext4), the naive side costs ~5 300 (step
  mix, 524 B a line) and ~4 600 (small). The journal's append, timed in the same loop with the disk taken
  out (the buffer dropped at each flush), costs 1 250 and 1 100, and nothing in it is left to cut: the call
  with ``**fields`` (~320: the bench's caller builds the keyword dict), the record dict with ``time.time()``
  (~200), the one orjson call (~370 and ~285; two calls and a join, or a header formatted in Python, cost
  more, as a float's repr alone is ~400), the append to the bytearray (~90 and ~30) and ~100 of checks,
  ``seq`` and wake; dropping the checks measured no difference. The write of those bytes to the page cache
  adds ~210 and ~60 on a quiet machine, 200-1 000 when writeback is busy (the spread between runs). That
  puts the ceiling at 5 300 / 1 460 = 3.6x and 4 600 / 1 160 = 4.0x; the targets leave room for writeback;
- ``durable_fsyncs_per_tool_call``: fsyncs for a side-effecting call (TOOL_STARTED and TOOL_COMPLETED both
  durable) among buffered events (target <= 2.2);
- ``durable_tool_call_time``: the time of such a call against two bare write+fdatasync on the same disk,
  alternating call by call; the overhead is the median of the paired differences (call - bare pair), and the
  target is additive: the call costs at most the bare pair + 0.25 ms. A ratio target (1.5x until 0.3) said
  less the faster the disk: on a disk whose fdatasync takes 0.3 ms, 1.5x allowed 0.3 ms of overhead, on one
  of 5 ms it allowed 5 ms; what the journal adds (the record, the hand-over to its writer thread and back,
  ~0.1-0.2 ms on CPython 3.11) does not grow with the disk;
- ``group_commit_fsyncs_per_call``: 16 concurrent side-effecting calls (target <= 1.0, i.e. well below 2).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import orjson

from agentlife._journal._recovery import scan_for_resume
from agentlife._journal._writer import EventType, Journal, session_path
from agentlife._redact import Redactor

BENCH = "journal"
MARKER_ID = "ckpt-final"


def emit(metric: str, value: float, unit: str, target: str, ok: bool, baseline: float | None = None) -> None:
    ratio = value / baseline if baseline else None
    print(
        json.dumps(
            {
                "bench": BENCH,
                "metric": metric,
                "value": round(value, 6),
                "unit": unit,
                "baseline": None if baseline is None else round(baseline, 6),
                "ratio": None if ratio is None else round(ratio, 4),
                "target": target,
                "pass": bool(ok),
            }
        ),
        flush=True,
    )


def best_of(fn: Callable[[], Any], runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


# -- (a) recovery scan ---------------------------------------------------------------------------------------


def step_event(seq: int, *, markers: bool = True) -> bytes:
    step, call = divmod(seq, 100)
    if call == 0 and markers:
        fields: dict[str, Any] = {
            "type": "CHECKPOINT_WRITTEN",
            "step": step,
            "checkpoint_id": f"ckpt-{step}",
            "crc": seq,
        }
    elif call % 3 == 1:
        fields = {
            "type": "LLM_COMPLETED",
            "step": step,
            "call": call,
            "response": {"text": "ok, next I will read the deployment manifest", "stop_reason": "tool_use"},
            "usage": {"input_tokens": 1200, "output_tokens": 40},
        }
    else:
        fields = {
            "type": "TOOL_COMPLETED",
            "step": step,
            "call": call,
            "invocation_id": f"job/{step}/{call}",
            "result": "deployment.apps/api configured",
        }
    return orjson.dumps(
        {"v": 1, "ts": 1.7e9 + seq / 1000, "seq": seq, **fields}, option=orjson.OPT_APPEND_NEWLINE
    )


def write_session(session_dir: Path, before: int, after: int) -> Path:
    session_dir.mkdir(parents=True)
    path = session_path(session_dir, 1, 1)
    with open(path, "wb") as f:
        batch: list[bytes] = []
        for seq in range(before):
            batch.append(step_event(seq))
            if len(batch) == 20_000:
                f.write(b"".join(batch))
                batch.clear()
        marker = {
            "v": 1,
            "ts": 1.8e9,
            "seq": before,
            "type": "CHECKPOINT_WRITTEN",
            "step": 10**6,
            "checkpoint_id": MARKER_ID,
            "crc": 1,
        }
        batch.append(orjson.dumps(marker, option=orjson.OPT_APPEND_NEWLINE))
        batch.extend(step_event(before + 1 + i, markers=False) for i in range(after))
        f.write(b"".join(batch))
    return path


def bench_scan(root: Path) -> None:
    big_dir, small_dir = root / "big", root / "small"
    big = write_session(big_dir, 1_000_000, 100)
    write_session(small_dir, 1_000, 100)
    for d in (big_dir, small_dir):  # same answer from both, and warm the page cache's last pages
        result = scan_for_resume(d, MARKER_ID)
        assert result.found, result.reason
        assert len(result.events) == 100, len(result.events)
    big_t = small_t = float("inf")
    for _ in range(15):  # interleaved, so drift on a shared machine hits both alike
        big_t = min(big_t, best_of(lambda: scan_for_resume(big_dir, MARKER_ID), 3))
        small_t = min(small_t, best_of(lambda: scan_for_resume(small_dir, MARKER_ID), 3))
    size_mb = big.stat().st_size / 1e6
    print(f"# big session file: {size_mb:.0f} MB", file=sys.stderr)
    emit("scan_ratio_1m_vs_1k", big_t * 1000, "ms", "<= 1.5x", big_t / small_t <= 1.5, small_t * 1000)
    emit("scan_time_1m", big_t * 1000, "ms", "<= 50 ms", big_t * 1000 <= 50)
    shutil.rmtree(big_dir)
    shutil.rmtree(small_dir)


# -- (b) buffered throughput ---------------------------------------------------------------------------------

CHUNK = 25_000
ROUNDS_THROUGHPUT = 8


_TEXT = (
    "The deployment failed because the staging namespace has no image pull secret. I will apply the secret "
    "from the vault reference, then re-apply the deployment manifest and watch the rollout until all three "
    "replicas report ready. If the rollout stalls for more than two minutes I will roll back to revision 41. "
) * 2
_MANIFEST = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: api\n  namespace: staging\n" * 4
_KUBECTL = "deployment.apps/api configured\nservice/api unchanged\nsecret/pull-secret created\n" * 5


def step_mix(i: int) -> tuple[str, dict[str, Any]]:
    """A realistic step, six events: small ones, a full LLM reply (~2 KB), a tool result (~400 B)."""
    step, kind = divmod(i, 6)
    inv = f"job-42/{step}/1"
    if kind == 0:
        return "STEP_STARTED", {"step": step}
    if kind == 1:
        return "LLM_STARTED", {"step": step, "call": 0, "model": "claude-sonnet-4-5"}
    if kind == 2:
        content = [
            {"type": "text", "text": _TEXT},
            {
                "type": "tool_use",
                "id": f"toolu_{step:020d}",
                "name": "kubectl_apply",
                "input": {"manifest": _MANIFEST},
            },
        ]
        usage = {"input_tokens": 18_000 + step, "output_tokens": 420, "cache_read_input_tokens": 16_000}
        response = {
            "text": _TEXT,
            "content": content,
            "usage": usage,
            "stop_reason": "tool_use",
            "model": "claude-sonnet-4-5",
            "cost_usd": 0.0123,
        }
        return "LLM_COMPLETED", {"step": step, "call": 0, "response": response, "usage": usage}
    if kind == 3:
        return "TOOL_STARTED", {
            "step": step,
            "call": 1,
            "invocation_id": inv,
            "tool": "kubectl_apply",
            "args_digest": "9f2c1e" * 10 + "abcd",
        }
    if kind == 4:
        return "TOOL_COMPLETED", {"step": step, "call": 1, "invocation_id": inv, "result": _KUBECTL}
    return "CHECKPOINT_WRITTEN", {"step": step, "checkpoint_id": f"ckpt-{step}", "crc": 2_882_400_000 + step}


def small_event(i: int) -> tuple[str, dict[str, Any]]:
    """A small fixed event (~150 B): the worst case for the buffered journal's relative advantage."""
    if i % 2:
        return "LLM_COMPLETED", {
            "step": i // 50,
            "call": i % 50,
            "response": {"text": "reading the manifest", "stop_reason": "tool_use"},
            "usage": {"input_tokens": 1200, "output_tokens": 40},
        }
    return "TOOL_COMPLETED", {"step": i // 50, "call": i % 50, "invocation_id": f"j/{i}", "result": "ok"}


class Rates:
    """Best events/s seen, by process CPU time (user + sys, all threads) and by wall time."""

    def __init__(self) -> None:
        self.cpu = 0.0
        self.wall = 0.0

    def add(self, events: int, cpu: float, wall: float) -> None:
        self.cpu = max(self.cpu, events / cpu)
        self.wall = max(self.wall, events / wall)


async def journal_chunk(journal: Journal, events: list[tuple[str, dict[str, Any]]], rates: Rates) -> None:
    append = journal.append
    cpu, wall = time.process_time(), time.perf_counter()
    for i, (kind, fields) in enumerate(events):
        append(kind, **fields)
        if i % 1000 == 999:
            await anyio.sleep(0)  # a real agent awaits between events: the flusher gets to run
    await journal.flush(fsync=False)  # count the writing too
    rates.add(len(events), time.process_time() - cpu, time.perf_counter() - wall)


def naive_chunk(f: Any, events: list[tuple[str, dict[str, Any]]], rates: Rates) -> None:
    cpu, wall = time.process_time(), time.perf_counter()
    for i, (kind, fields) in enumerate(events):
        f.write(json.dumps({"v": 1, "ts": time.time(), "seq": i, "type": kind, **fields}) + "\n")
        f.flush()
    rates.add(len(events), time.process_time() - cpu, time.perf_counter() - wall)


async def throughput(
    root: Path, make: Callable[[int], tuple[str, dict[str, Any]]], redactor: Redactor | None = None
) -> tuple[Rates, Rates]:
    # The events are built beforehand so both sides time only serialising and writing.
    events = [make(i) for i in range(CHUNK)]
    buffered, naive = Rates(), Rates()
    journal = Journal.create(root / "journal", 1, redactor=redactor)
    with open(root / "naive.jsonl", "a", encoding="utf-8") as f:
        async with anyio.create_task_group() as tg:
            tg.start_soon(journal.run_periodic_flush, 1.0)
            for _ in range(ROUNDS_THROUGHPUT):  # interleaved, best of each: the machine is shared
                naive_chunk(f, events, naive)
                await journal_chunk(journal, events, buffered)
            tg.cancel_scope.cancel()
    await journal.aclose()
    assert journal.events_written == CHUNK * ROUNDS_THROUGHPUT
    return buffered, naive


def bench_throughput(root: Path) -> None:
    cases = (("buffered_events_per_s", step_mix, 2.5), ("buffered_small_events_per_s", small_event, 3.3))
    for metric, make, target in cases:
        root.mkdir()
        buffered, naive = anyio.run(throughput, root, make)
        print(
            f"# {metric} wall clock: journal {buffered.wall:,.0f}/s, naive {naive.wall:,.0f}/s",
            file=sys.stderr,
        )
        emit(metric, buffered.cpu, "ops/s", f">= {target:g}x", buffered.cpu / naive.cpu >= target, naive.cpu)
        shutil.rmtree(root)
    # What the runtime pays: its journal masks secrets in every string (a pod's environment holds an API key
    # and a database URL). Reported, not targeted: the walk over the fields costs more than the rest.
    env = {
        "ANTHROPIC_API_KEY": "sk-ant-api03-" + "x" * 40,
        "DATABASE_URL": "postgresql://app:s3cr3t-pa55@db/app",
    }
    root.mkdir()
    buffered, naive = anyio.run(throughput, root, step_mix, Redactor.from_env(env))
    print(
        f"# buffered_events_per_s with a Redactor, CPU: journal {buffered.cpu:,.0f}/s, "
        f"naive {naive.cpu:,.0f}/s"
        f" = {buffered.cpu / naive.cpu:.2f}x",
        file=sys.stderr,
    )
    shutil.rmtree(root)


# -- (c) write-ahead overhead --------------------------------------------------------------------------------

N_CALLS = 250
ROUNDS = 10
CONCURRENT = 16
#: What a durable tool call may add to its two bare write + fdatasync pairs, in ms.
DURABLE_EXTRA_MS = 0.25


def bare_durable_pair(fd: int, i: int) -> float:
    """Two bare one-line write + fdatasync: the floor of a call's two durable writes on this disk."""
    started = time.perf_counter()
    for kind in (b"TOOL_STARTED", b"TOOL_COMPLETED"):
        os.write(fd, b'{"v":1,"seq":%d,"type":"%s"}\n' % (i, kind))
        os.fdatasync(fd)
    return time.perf_counter() - started


async def side_effecting_call(journal: Journal, step: int, call: int) -> None:
    invocation_id = f"job/{step}/{call}"
    await journal.append_durable(
        EventType.TOOL_STARTED,
        step=step,
        call=call,
        invocation_id=invocation_id,
        tool="kubectl_apply",
        args_digest="d",
    )
    await anyio.sleep(0)  # the tool itself
    await journal.append_durable(
        EventType.TOOL_COMPLETED, step=step, call=call, invocation_id=invocation_id, result="ok"
    )


async def sequential_calls(root: Path) -> tuple[float, float, float]:
    """(fsyncs per call, median call time, median of call - bare pair); the two alternate call by call."""
    journal = Journal.create(root / "seq", 1)
    bare_fd = os.open(root / "bare.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    calls, bare = [], []
    try:
        for call in range(N_CALLS):
            # Alternate so that the other I/O on a shared machine weighs on both sides alike.
            bare.append(bare_durable_pair(bare_fd, call))
            journal.append(EventType.LLM_COMPLETED, step=0, call=2 * call, response={"text": "x"}, usage={})
            started = time.perf_counter()
            await side_effecting_call(journal, 0, 2 * call + 1)
            calls.append(time.perf_counter() - started)
    finally:
        os.close(bare_fd)
    fsyncs = journal.fsync_count / N_CALLS
    await journal.aclose()
    # Each call is compared with the bare pair measured next to it (fsync latency drifts with the other I/O
    # on the disk); the median of those differences is the overhead.
    extra = statistics.median(c - b for c, b in zip(calls, bare, strict=True))
    return fsyncs, statistics.median(calls), extra


async def concurrent_calls(session_dir: Path) -> float:
    journal = Journal.create(session_dir, 2)
    for round_ in range(ROUNDS):
        async with anyio.create_task_group() as tg:
            for call in range(CONCURRENT):
                tg.start_soon(side_effecting_call, journal, round_, call)
    fsyncs = journal.fsync_count / (ROUNDS * CONCURRENT)
    await journal.aclose()
    return fsyncs


def bench_durable(root: Path) -> None:
    root.mkdir()
    fsyncs, per_call, extra = anyio.run(sequential_calls, root)
    group = anyio.run(concurrent_calls, root / "group")
    emit("durable_fsyncs_per_tool_call", fsyncs, "x", "<= 2.2", fsyncs <= 2.2)
    # baseline: the call time less the median paired overhead, i.e. the comparable time of two bare fsyncs
    bare_ms = (per_call - extra) * 1000
    emit(
        "durable_tool_call_time",
        per_call * 1000,
        "ms",
        f"<= bare pair + {DURABLE_EXTRA_MS:g} ms",
        extra * 1000 <= DURABLE_EXTRA_MS,
        bare_ms,
    )
    emit("group_commit_fsyncs_per_call", group, "x", "<= 1.0", group <= 1.0)
    shutil.rmtree(root)


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="bench_journal_"))
    try:
        # fsync timings first: the scan benchmark leaves 180 MB of writeback that would slow the disk.
        bench_durable(root / "durable")
        bench_throughput(root / "throughput")
        bench_scan(root / "scan")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
