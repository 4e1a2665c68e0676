"""The checks a durable wait and an event make of their input before anything is journaled or stored."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from agentlife import ConfigError
from agentlife._journal._recovery import build_replay
from agentlife._step._waits import sleep_seconds, until_time
from agentlife.stores._events import MAX_EVENT_PAYLOAD_BYTES, check_event


@pytest.mark.parametrize("seconds", [0, -0.0, 0.001, 30, 1e9])
def test_a_sleep_of_zero_to_about_31_years_is_accepted(seconds: float) -> None:
    assert sleep_seconds(seconds) == float(seconds) == abs(float(seconds))


@pytest.mark.parametrize(
    ("seconds", "needle"),
    [
        (-1, "got -1"),
        (float("nan"), "got nan"),
        (float("inf"), "got inf"),
        (-float("inf"), "got -inf"),
        (1e9 + 1, "got 1000000001.0"),
        (2**63, "got 9223372036854775808"),
        (True, "must be a number, got bool"),
        ("5", "must be a number, got str"),
        (None, "must be a number, got NoneType"),
    ],
)
def test_a_sleep_of_a_bad_duration_is_one_clear_error(seconds: object, needle: str) -> None:
    with pytest.raises(ConfigError, match=r"ctx\.sleep: seconds must be") as caught:
        sleep_seconds(seconds)
    assert needle in str(caught.value) and "\n" not in str(caught.value)


def test_sleep_until_needs_an_aware_datetime_within_31_years() -> None:
    when = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    assert until_time(when) == pytest.approx(time.time() + 3600, abs=5)
    with pytest.raises(ConfigError, match="must be timezone-aware, got naive"):
        until_time(dt.datetime(2030, 1, 1))
    with pytest.raises(ConfigError, match="must be a datetime, got float"):
        until_time(time.time())
    with pytest.raises(ConfigError, match="s away"):
        until_time(dt.datetime(9999, 1, 1, tzinfo=dt.UTC))


@pytest.mark.parametrize(
    ("name", "payload", "needle"),
    [
        ("", None, "non-empty string"),
        ("  ", None, "non-empty string"),
        ("x" * 201, None, "at most 200 characters"),
        ("a\nb", None, "control characters"),
        (5, None, "non-empty string"),
        ("ok", {1, 2}, "not JSON the journal can hold"),
        ("ok", float("nan"), "not JSON the journal can hold"),
        ("ok", "x" * MAX_EVENT_PAYLOAD_BYTES, "more than 262144"),
    ],
)
def test_an_event_that_is_almost_right_is_refused(name: object, payload: object, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        check_event(name, payload)


def test_an_event_name_with_unicode_and_a_deep_but_sane_payload_pass() -> None:
    assert check_event("réponse ✓", {"a": [1, {"b": None}]}) == b'{"a":[1,{"b":null}]}'


def test_the_replay_map_keeps_a_wait_completed_over_a_later_start_and_reads_a_bad_until_as_none() -> None:
    events = [
        {"type": "WAIT_STARTED", "step": 0, "call": 1, "kind": "sleep", "digest": "d", "until": 5.0},
        {"type": "WAIT_COMPLETED", "step": 0, "call": 1, "kind": "sleep", "digest": "d", "outcome": None},
        {"type": "WAIT_STARTED", "step": 0, "call": 1, "kind": "sleep", "digest": "d", "until": 9.0},
        {"type": "WAIT_STARTED", "step": 0, "call": 2, "kind": "event", "digest": "e", "until": "soon"},
        {"type": "WAIT_STARTED", "step": 1, "call": 3, "kind": "sleep", "digest": "f", "until": 1.0},
    ]
    replay = build_replay(events, 0)
    assert replay.waits[1].status == "completed" and replay.waits[1].until == 5.0
    assert replay.waits[2].status == "pending" and replay.waits[2].until is None
    assert 3 not in replay.waits and replay.max_call == 2 and not replay.empty
