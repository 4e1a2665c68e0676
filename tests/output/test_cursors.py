"""Cursors: bound to their job and place, and anything else refused in one line, never an internal error."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentlife import ConfigError
from agentlife._output._events import JobEvent, cursor_for, parse_cursor

job_ids = st.text(min_size=1, max_size=128)
seqs = st.integers(min_value=0, max_value=10**18 - 1)


@given(job_ids, seqs)
def test_a_cursor_names_its_place_in_its_job(job_id: str, seq: int) -> None:
    assert parse_cursor(job_id, cursor_for(job_id, seq)) == seq


@given(job_ids, job_ids, seqs)
def test_a_cursor_of_another_job_is_refused(job_id: str, other: str, seq: int) -> None:
    if other != job_id:
        with pytest.raises(ConfigError, match="is not a cursor of job"):
            parse_cursor(job_id, cursor_for(other, seq))


@given(st.text(max_size=300))
def test_any_other_text_is_refused_in_one_short_line(text: str) -> None:
    message = ""
    try:
        parse_cursor("job-1", text)
    except ConfigError as exc:
        message = str(exc)
    if message:
        assert "\n" not in message and len(message) < 200
    else:
        assert text == cursor_for("job-1", int(text.split(".")[0]))


@pytest.mark.parametrize("value", [None, 3, 3.0, b"1.ab", ["1.ab"]])
def test_a_cursor_that_is_not_a_string_is_refused(value: object) -> None:
    with pytest.raises(ConfigError, match="a cursor is a string"):
        parse_cursor("job-1", value)


def test_an_event_is_frozen_and_its_json_holds_what_an_sse_stream_sends() -> None:
    event = JobEvent("job-1", cursor_for("job-1", 2), "published", "phase", {"n": 1}, 1.5)
    with pytest.raises(AttributeError):
        event.cursor = "x"  # type: ignore[misc]
    assert event.to_json() == {
        "job_id": "job-1",
        "cursor": event.cursor,
        "kind": "published",
        "name": "phase",
        "value": {"n": 1},
        "time": 1.5,
    }
