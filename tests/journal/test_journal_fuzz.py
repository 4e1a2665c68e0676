"""Property tests: no damage to a session file makes the recovery scan or ``journal show`` raise.

Properties checked, for a valid session file ``F`` whose newest marker is ``M`` followed by events ``E``:

1. Any bytes appended to, inserted into or overwritten in ``F``, or any truncation of it: neither
   `scan_for_resume` nor `format_timeline` raises, and the scan's counters are consistent.
2. Bytes appended after ``F`` (which ends with a newline): the scan still finds ``M`` and ``E`` is a prefix
   of the events it returns, unless a garbage line happens to parse as a checkpoint marker.
3. Bytes inserted anywhere before the line of ``M``: the scan result is exactly the same as for ``F``
   (the scan never looks at those bytes).
4. ``F`` truncated anywhere after ``M``'s JSON (its newline may be cut): the scan finds ``M`` and returns a
   prefix of ``E``, with at least every complete line; truncated inside ``M``, the scan degrades.
5. `iter_lines_reverse` equals a forward split of the file, for any content and block size.
6. `format_timeline` renders any sequence of JSON objects, whatever the types of their fields.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentlife._journal._recovery import ScanResult, iter_lines_reverse, scan_for_resume
from agentlife._journal._show import format_timeline
from agentlife._journal._writer import EventType, session_path

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _line(seq: int, type_: str, **fields: Any) -> bytes:
    return orjson.dumps({"v": 1, "ts": 100.0 + seq, "seq": seq, "type": type_, **fields}) + b"\n"


BEFORE = [
    _line(0, "SESSION_STARTED", job_id="j", agent_id="a", attempt=1, pid=1),
    _line(1, "CHECKPOINT_WRITTEN", step=0, checkpoint_id="c0", crc=1),
    _line(2, "STEP_STARTED", step=1),
    _line(3, "LLM_COMPLETED", step=1, call=0, response={"text": "x"}, usage={}),
]
MARKER = _line(4, "CHECKPOINT_WRITTEN", step=1, checkpoint_id="c1", crc=2)
AFTER = [
    _line(5, "STEP_STARTED", step=2),
    _line(6, "LLM_COMPLETED", step=2, call=0, response={"text": "y\nz"}, usage={"input_tokens": 1}),
    _line(7, "TOOL_STARTED", step=2, call=1, invocation_id="j/2/1", tool="t", args_digest="d"),
    _line(8, "TOOL_COMPLETED", step=2, call=1, invocation_id="j/2/1", result={"ok": True}),
    _line(9, "TOOL_STARTED", step=2, call=2, invocation_id="j/2/2", tool="t", args_digest="e"),
]
VALID = b"".join([*BEFORE, MARKER, *AFTER])
MARKER_START = len(b"".join(BEFORE))
MARKER_END = MARKER_START + len(MARKER)
EXPECTED = [orjson.loads(raw) for raw in AFTER]

garbage = st.binary(min_size=1, max_size=300) | st.text(min_size=1, max_size=200).map(str.encode)
with_newlines = st.lists(
    garbage | st.just(b"\n") | st.just(b"{") | st.just(b"}\n"), min_size=1, max_size=8
).map(b"".join)


@contextmanager
def session_file(content: bytes) -> Iterator[tuple[Path, Path]]:
    with tempfile.TemporaryDirectory() as tmp:
        session_dir = Path(tmp)
        path = session_path(session_dir, 1, 1)
        path.write_bytes(content)
        yield session_dir, path


def scan(content: bytes) -> tuple[ScanResult, str]:
    with session_file(content) as (session_dir, path):
        return scan_for_resume(session_dir, "c1"), format_timeline(path)


def is_marker_line(raw: bytes) -> bool:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    return isinstance(value, dict) and value.get("type") == EventType.CHECKPOINT_WRITTEN


def check_consistent(result: ScanResult) -> None:
    assert isinstance(result.reason, str)
    assert result.reason
    assert 0 <= result.skipped_lines <= result.scanned_lines
    if not result.found:
        assert result.events == []


@FUZZ
@given(
    junk=with_newlines,
    where=st.integers(min_value=0, max_value=len(VALID)),
    mode=st.sampled_from(["ins", "ovr"]),
)
def test_any_damage_never_raises(junk: bytes, where: int, mode: str) -> None:
    if mode == "ins":
        content = VALID[:where] + junk + VALID[where:]
    else:
        content = VALID[:where] + junk + VALID[where + len(junk) :]
    result, text = scan(content)
    check_consistent(result)
    assert text.startswith("session_0001_1.jsonl")


@FUZZ
@given(junk=with_newlines)
def test_garbage_appended_after_the_events_keeps_them(junk: bytes) -> None:
    result, text = scan(VALID + junk)
    check_consistent(result)
    if any(is_marker_line(raw) for raw in junk.split(b"\n")):
        return  # garbage that is itself a valid marker legitimately changes the answer
    assert result.found, result.reason
    assert result.events[: len(EXPECTED)] == EXPECTED
    assert "step 2 started" in text


@FUZZ
@given(junk=with_newlines, where=st.integers(min_value=0, max_value=MARKER_START - 1))
def test_damage_before_the_marker_changes_nothing(junk: bytes, where: int) -> None:
    baseline, _ = scan(VALID)
    result, _ = scan(VALID[:where] + junk + VALID[where:])
    assert result.found
    assert result.events == baseline.events == EXPECTED
    assert (result.scanned_lines, result.skipped_lines) == (baseline.scanned_lines, baseline.skipped_lines)


@FUZZ
@given(cut=st.integers(min_value=MARKER_END - 1, max_value=len(VALID)))
def test_a_torn_tail_after_the_marker_gives_a_prefix_of_the_events(cut: int) -> None:
    result, _text = scan(VALID[:cut])
    assert result.found, result.reason
    assert result.events == EXPECTED[: len(result.events)]
    complete_lines = VALID[MARKER_END:cut].count(b"\n") if cut > MARKER_END else 0
    assert len(result.events) >= complete_lines
    assert result.skipped_lines <= 1


@FUZZ
@given(cut=st.integers(min_value=0, max_value=MARKER_END - 2))
def test_a_file_torn_before_the_end_of_the_marker_degrades(cut: int) -> None:
    result, _ = scan(VALID[:cut])
    check_consistent(result)
    assert not result.found


@FUZZ
@given(
    content=st.lists(st.binary(max_size=20) | st.just(b""), max_size=12),
    chunk=st.integers(1, 40),
    trailing=st.booleans(),
)
def test_iter_lines_reverse_equals_a_forward_split(content: list[bytes], chunk: int, trailing: bool) -> None:
    body = b"\n".join(c.replace(b"\n", b"") for c in content)
    data = body + (b"\n" if trailing and body else b"")
    with session_file(data) as (_, path):
        got = list(iter_lines_reverse(path, chunk))
    expected = data.split(b"\n") if data else []
    if data.endswith(b"\n"):
        expected.pop()
    assert got == expected[::-1]


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
field_names = st.sampled_from(
    [
        "ts",
        "step",
        "call",
        "from",
        "to",
        "response",
        "usage",
        "result",
        "tool",
        "invocation_id",
        "checkpoint_id",
        "crc",
        "reason",
        "exit_code",
        "error",
        "error_class",
        "delay",
        "carried",
        "model",
        "duration_ms",
        "kind",
    ]
)
events = st.builds(
    lambda type_, fields: {"type": type_, **fields},
    st.sampled_from([*EventType, "SOMETHING_ELSE"]).map(str),
    st.dictionaries(field_names, json_values, max_size=6),
)


@settings(FUZZ, max_examples=60)
@given(items=st.lists(events, max_size=15))
def test_format_timeline_renders_any_event_objects(items: list[dict[str, Any]]) -> None:
    with session_file(b"".join(orjson.dumps(e) + b"\n" for e in items)) as (session_dir, path):
        text = format_timeline(path)
        check_consistent(scan_for_resume(session_dir, None))
    assert f"{len(items)} event{'s' if len(items) != 1 else ''}" in text
