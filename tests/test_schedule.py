"""agentlife.Schedule: cron + IANA zone validation, next runs across DST, the CLI ``schedule next``.

Expected runs are written out by hand from the calendar (2027-01-01 is a Friday; Tokyo is UTC+9 all year;
New York is UTC-5 in winter; Europe/London moves to BST on 2027-03-28 and back on 2027-10-31, both at
01:00 UTC), never computed by the code under test.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentlife._exceptions import ConfigError, ScheduleError
from agentlife._schedule import Schedule, check_budget

AFTER = datetime(2027, 1, 1, tzinfo=UTC)  # Friday; 09:00 in Tokyo, 19:00 on Thursday in New York

# cron -> zone -> the next three runs after AFTER (ISO 8601, local time with its offset).
TABLE: dict[str, dict[str, list[str]]] = {
    "0 9 * * *": {
        # 09:00 JST is AFTER itself: runs are strictly after it.
        "Asia/Tokyo": ["2027-01-02T09:00:00+09:00", "2027-01-03T09:00:00+09:00", "2027-01-04T09:00:00+09:00"],
        "America/New_York": [
            "2027-01-01T09:00:00-05:00",
            "2027-01-02T09:00:00-05:00",
            "2027-01-03T09:00:00-05:00",
        ],
        "UTC": ["2027-01-01T09:00:00+00:00", "2027-01-02T09:00:00+00:00", "2027-01-03T09:00:00+00:00"],
    },
    "0 9 * * 1-5": {
        # Friday 09:00 JST is AFTER; the weekend is skipped: Monday 4th, Tuesday 5th, Wednesday 6th.
        "Asia/Tokyo": ["2027-01-04T09:00:00+09:00", "2027-01-05T09:00:00+09:00", "2027-01-06T09:00:00+09:00"],
        "America/New_York": [
            "2027-01-01T09:00:00-05:00",
            "2027-01-04T09:00:00-05:00",
            "2027-01-05T09:00:00-05:00",
        ],
        "UTC": ["2027-01-01T09:00:00+00:00", "2027-01-04T09:00:00+00:00", "2027-01-05T09:00:00+00:00"],
    },
    "0 */4 * * *": {
        "Asia/Tokyo": ["2027-01-01T12:00:00+09:00", "2027-01-01T16:00:00+09:00", "2027-01-01T20:00:00+09:00"],
        "America/New_York": [
            "2026-12-31T20:00:00-05:00",
            "2027-01-01T00:00:00-05:00",
            "2027-01-01T04:00:00-05:00",
        ],
        "UTC": ["2027-01-01T04:00:00+00:00", "2027-01-01T08:00:00+00:00", "2027-01-01T12:00:00+00:00"],
    },
    "0 0 1 * *": {
        "Asia/Tokyo": ["2027-02-01T00:00:00+09:00", "2027-03-01T00:00:00+09:00", "2027-04-01T00:00:00+09:00"],
        # US DST starts 2027-03-14, so 1 March is still EST.
        "America/New_York": [
            "2027-01-01T00:00:00-05:00",
            "2027-02-01T00:00:00-05:00",
            "2027-03-01T00:00:00-05:00",
        ],
        "UTC": ["2027-02-01T00:00:00+00:00", "2027-03-01T00:00:00+00:00", "2027-04-01T00:00:00+00:00"],
    },
    "30 8 * * 1": {
        "Asia/Tokyo": ["2027-01-04T08:30:00+09:00", "2027-01-11T08:30:00+09:00", "2027-01-18T08:30:00+09:00"],
        "America/New_York": [
            "2027-01-04T08:30:00-05:00",
            "2027-01-11T08:30:00-05:00",
            "2027-01-18T08:30:00-05:00",
        ],
        "UTC": ["2027-01-04T08:30:00+00:00", "2027-01-11T08:30:00+00:00", "2027-01-18T08:30:00+00:00"],
    },
    "0 9,18 * * *": {
        "Asia/Tokyo": ["2027-01-01T18:00:00+09:00", "2027-01-02T09:00:00+09:00", "2027-01-02T18:00:00+09:00"],
        "America/New_York": [
            "2027-01-01T09:00:00-05:00",
            "2027-01-01T18:00:00-05:00",
            "2027-01-02T09:00:00-05:00",
        ],
        "UTC": ["2027-01-01T09:00:00+00:00", "2027-01-01T18:00:00+00:00", "2027-01-02T09:00:00+00:00"],
    },
}
CASES = [(cron, zone, runs) for cron, zones in TABLE.items() for zone, runs in zones.items()]


def iso(runs: list[datetime]) -> list[str]:
    return [run.isoformat() for run in runs]


def utc(runs: list[datetime]) -> list[datetime]:
    return [run.astimezone(UTC) for run in runs]


# -- the cron / time-zone table ------------------------------------------------------------------------


@pytest.mark.parametrize(("cron", "zone", "expected"), CASES, ids=[f"{c}|{z}" for c, z, _ in CASES])
def test_next_runs_table(cron: str, zone: str, expected: list[str]) -> None:
    runs = Schedule(cron, zone).next_runs(3, after=AFTER)
    assert iso(runs) == expected
    assert all(run.tzinfo == ZoneInfo(zone) for run in runs)


@pytest.mark.parametrize(
    ("cron", "gap"),
    [
        ("0 9 * * *", timedelta(days=1)),
        ("0 9 * * 1-5", timedelta(days=1)),
        ("0 */4 * * *", timedelta(hours=4)),
        ("0 0 1 * *", timedelta(days=28)),  # 1 February -> 1 March in a common year
        ("30 8 * * 1", timedelta(days=7)),
        ("0 9,18 * * *", timedelta(hours=9)),  # 09:00 -> 18:00 (18:00 -> 09:00 is 15 h)
        ("0 0,23 * * *", timedelta(hours=1)),  # 23:00 -> 00:00 the next day
        ("0 9 31 * *", timedelta(days=31)),  # 31 July -> 31 August
        ("0 9 29 2 *", timedelta(days=4 * 365 + 1)),
    ],
)
def test_min_gap_covers_every_consecutive_pair(cron: str, gap: timedelta) -> None:
    assert Schedule(cron, "UTC", min_interval_minutes=1).min_gap() == gap


def test_duplicate_field_values_give_one_run() -> None:
    doubled, single = Schedule("0 9,9 * * *", "Asia/Tokyo"), Schedule("0 9 * * *", "Asia/Tokyo")
    runs = doubled.next_runs(4, after=AFTER)
    assert iso(runs) == iso(single.next_runs(4, after=AFTER))
    assert len(set(utc(runs))) == 4
    assert doubled.min_gap() == timedelta(days=1)


# -- daylight saving time (Kubernetes semantics: skip what does not exist, run twice what repeats) ------


def test_spring_forward_skips_the_missing_time() -> None:
    schedule = Schedule("30 1 * * *", "Europe/London")
    after = datetime(2027, 3, 26, 12, tzinfo=UTC)
    runs = schedule.next_runs(3, after=after)
    # 2027-03-28: clocks jump 01:00 GMT -> 02:00 BST, so 01:30 does not exist that day.
    assert iso(runs) == [
        "2027-03-27T01:30:00+00:00",
        "2027-03-29T01:30:00+01:00",
        "2027-03-30T01:30:00+01:00",
    ]
    assert schedule.skipped(after, runs[-1]) == [datetime(2027, 3, 28, 1, 30)]


def test_fall_back_runs_the_repeated_time_twice() -> None:
    schedule = Schedule("30 1 * * *", "Europe/London")
    runs = schedule.next_runs(4, after=datetime(2027, 10, 29, 12, tzinfo=UTC))
    # 2027-10-31: clocks go back 02:00 BST -> 01:00 GMT, so 01:30 happens at 00:30Z and again at 01:30Z.
    assert iso(runs) == [
        "2027-10-30T01:30:00+01:00",
        "2027-10-31T01:30:00+01:00",
        "2027-10-31T01:30:00+00:00",
        "2027-11-01T01:30:00+00:00",
    ]
    assert [run.fold for run in runs] == [0, 0, 1, 0]
    assert utc(runs)[2] - utc(runs)[1] == timedelta(hours=1)
    assert [schedule.is_repeated(run) for run in runs] == [False, True, True, False]


def test_start_inside_the_repeated_hour_still_sees_its_second_occurrence() -> None:
    schedule = Schedule("0,30 * * * *", "Europe/London", min_interval_minutes=30)
    after = datetime(2027, 10, 31, 0, 45, tzinfo=UTC)  # 01:45 BST, first pass through the hour
    runs = schedule.next_runs(3, after=after)
    # The wall clock goes back to 01:00: 01:00 and 01:30 GMT are still ahead, though "earlier" on the clock.
    assert utc(runs) == [datetime(2027, 10, 31, h, m, tzinfo=UTC) for h, m in ((1, 0), (1, 30), (2, 0))]
    assert iso(runs)[0] == "2027-10-31T01:00:00+00:00"


# The vectors of robfig/cron's spec_test.go (the parser behind Kubernetes' CronJob controller), in
# America/New_York, whose DST began 2012-03-11 02:00 EST and ended 2012-11-04 02:00 EDT.
ROBFIG = [
    ("0 * * * *", "2012-03-11T01:00:00-05:00", "2012-03-11T03:00:00-04:00"),  # hourly across the gap
    ("0 1 * * *", "2012-03-11T01:00:00-05:00", "2012-03-12T01:00:00-04:00"),
    ("0 2 * * *", "2012-03-11T00:00:00-05:00", "2012-03-12T02:00:00-04:00"),  # 2am nightly job (skipped)
    ("0 * * * *", "2012-11-04T01:00:00-04:00", "2012-11-04T01:00:00-05:00"),  # hourly through the fold
    ("0 1 * * *", "2012-11-04T00:00:00-04:00", "2012-11-04T01:00:00-04:00"),  # 1am nightly job (runs twice)
    ("0 1 * * *", "2012-11-04T01:00:00-04:00", "2012-11-04T01:00:00-05:00"),
    ("0 1 * * *", "2012-11-04T01:00:00-05:00", "2012-11-05T01:00:00-05:00"),
    ("0 2 * * *", "2012-11-04T00:00:00-04:00", "2012-11-04T02:00:00-05:00"),
]


@pytest.mark.parametrize(("cron", "after", "expected"), ROBFIG)
def test_matches_robfig_cron_next(cron: str, after: str, expected: str) -> None:
    [run] = Schedule(cron, "America/New_York").next_runs(1, after=datetime.fromisoformat(after))
    assert run.astimezone(UTC) == datetime.fromisoformat(expected).astimezone(UTC)


DST_ZONES = ["Europe/London", "America/New_York", "Australia/Lord_Howe", "America/Sao_Paulo", "Asia/Tokyo"]
DST_STARTS = [
    datetime(2027, 3, 27, 20, tzinfo=UTC),
    datetime(2027, 10, 30, 20, tzinfo=UTC),
    datetime(2027, 3, 13, 20, tzinfo=UTC),
    datetime(2027, 11, 6, 20, tzinfo=UTC),
    datetime(2027, 4, 3, 0, tzinfo=UTC),  # Lord Howe ends its half-hour DST
    datetime(2018, 11, 3, 12, tzinfo=UTC),  # Sao Paulo's DST started at midnight
]


@settings(max_examples=25, deadline=None)
@given(
    zone=st.sampled_from(DST_ZONES),
    start=st.sampled_from(DST_STARTS),
    shift_minutes=st.integers(0, 24 * 60),
    hours=st.sets(st.integers(0, 23), min_size=1, max_size=4),
    minute=st.integers(0, 59),
)
def test_next_runs_equal_every_instant_whose_wall_clock_matches(
    zone: str, start: datetime, shift_minutes: int, hours: set[int], minute: int
) -> None:
    """Oracle: scan every UTC minute and keep those whose local time reads a matching hour and minute."""
    cron = f"{minute} {','.join(map(str, sorted(hours)))} * * *"
    after = start + timedelta(minutes=shift_minutes)
    runs = Schedule(cron, zone, min_interval_minutes=1).next_runs(len(hours) * 2, after=after)
    tz = ZoneInfo(zone)
    expected: list[datetime] = []
    cursor = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
    while len(expected) < len(runs):
        local = cursor.astimezone(tz)
        if local.hour in hours and local.minute == minute:
            expected.append(cursor)
        cursor += timedelta(minutes=1)
    assert utc(runs) == expected


# -- refusals ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cron", "zone", "kwargs", "needles"),
    [
        ("*/5 * * * *", "UTC", {}, ["'*/5 * * * *'", "5 min", "60 min"]),
        ("0,30 9 1 * *", "UTC", {}, ["30 min", "09:00 -> 09:30", "60 min"]),  # only on the 1st: still seen
        ("0 0,23 * * 0,1", "UTC", {"min_interval_minutes": 120}, ["60 min", "23:00 -> 00:00", "120 min"]),
        ("0 0,23 1,2 * *", "UTC", {"min_interval_minutes": 120}, ["60 min", "120 min"]),
        ("0 9 * *", "UTC", {}, ["4 fields", "exactly 5"]),
        ("0 0 9 * * *", "UTC", {}, ["6 fields", "exactly 5"]),
        ("@daily", "UTC", {}, ["macro", "5 fields"]),
        ("TZ=Asia/Tokyo 0 9 * * *", "UTC", {}, ["time zone", "--timezone"]),
        ("0 24 * * *", "UTC", {}, ["hour 24", "0-23"]),
        ("61 9 * * *", "UTC", {}, ["minute 61", "0-59"]),
        ("0 9 * * 7", "UTC", {}, ["day-of-week 7", "0-6", "0 for Sunday"]),
        ("0 9 * * 5-1", "UTC", {}, ["'5-1'", "backwards"]),
        ("0 9 L * *", "UTC", {}, ["'L'"]),
        ("0 9 * * 1#2", "UTC", {}, ["'1#2'", "Kubernetes"]),
        ("0 9 ? * *", "UTC", {}, ["'?'"]),
        ("*/0 9 * * *", "UTC", {}, ["step", ">= 1"]),
        ("0 9 * * xyz", "UTC", {}, ["'xyz'"]),
        ("0 0 30 2 *", "UTC", {}, ["never fires"]),
        ("0 9 * * *", "Mars/Olympus", {}, ["'Mars/Olympus'", "IANA"]),
        ("0 9 * * *", "America", {}, ["'America'", "IANA"]),
        ("0 9 * * *", "Local", {}, ["'Local'"]),
        ("0 9 * * *", "", {}, ["time zone ''"]),
        ("0 9 * * *", "../../etc/passwd", {}, ["'../../etc/passwd'"]),
        ("0 9 * * *", "UTC", {"budget_usd": -1.0}, ["-1 USD", "negative"]),
        ("0 9 * * *", "UTC", {"budget_usd": 0.0}, ["0 USD", "> 0"]),
        ("0 9 * * *", "UTC", {"budget_usd": 10.01}, ["10.01 USD", "system cap of 10.00 USD"]),
        ("0 9 * * *", "UTC", {"budget_usd": 3.0, "budget_cap_usd": 2.0}, ["3 USD", "cap of 2.00 USD"]),
        ("0 9 * * *", "UTC", {"budget_usd": float("nan")}, ["nan"]),
        ("0 9 * * *", "UTC", {"budget_cap_usd": 0.0}, ["cap 0 USD"]),
        ("0 9 * * *", "UTC", {"min_interval_minutes": 0}, ["minimum interval 0"]),
    ],
)
def test_refusals_are_one_line_naming_limit_and_value(
    cron: str, zone: str, kwargs: dict[str, float], needles: list[str]
) -> None:
    with pytest.raises(ScheduleError) as info:
        Schedule(cron, zone, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message
    assert isinstance(info.value, ConfigError)  # the CLI turns it into one line and exit 2


def test_gaps_only_far_apart_days_are_not_refused() -> None:
    # 23:00 on the 1st and 00:00 on the 15th are 13 days apart: the closest pair is 00:00 -> 23:00.
    assert Schedule("0 0,23 1,15 * *", "UTC", min_interval_minutes=120).min_gap() == timedelta(hours=23)


def test_budget_at_the_cap_is_accepted_and_kept() -> None:
    assert Schedule("0 9 * * *", "UTC", budget_usd=10.0).budget_usd == 10.0
    assert check_budget(2.5) == 2.5
    with pytest.raises(ScheduleError, match=r"exceeds the system cap of 10\.00 USD"):
        check_budget(10.5)


def test_naive_after_and_negative_count_are_refused() -> None:
    schedule = Schedule("0 9 * * *", "UTC")
    with pytest.raises(ScheduleError, match="naive"):
        schedule.next_runs(1, after=datetime(2027, 1, 1))
    with pytest.raises(ScheduleError, match="-1"):
        schedule.next_runs(-1, after=AFTER)
    assert schedule.next_runs(0, after=AFTER) == []


def test_schedule_is_frozen_and_normalised() -> None:
    schedule = Schedule("  0   9 * *  1-5 ", "Asia/Tokyo")
    assert schedule.cron == "0 9 * * 1-5"
    assert schedule == Schedule("0 9 * * 1-5", "Asia/Tokyo")
    with pytest.raises(dataclasses.FrozenInstanceError):
        schedule.cron = "* * * * *"  # type: ignore[misc]


def test_next_runs_default_to_now() -> None:
    before = datetime.now(UTC)
    [run] = Schedule("0 * * * *", "UTC").next_runs(1)
    assert before < run.astimezone(UTC) <= before + timedelta(hours=1)
