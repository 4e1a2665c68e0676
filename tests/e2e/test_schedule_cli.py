"""agentlife.Schedule: cron + IANA zone validation, next runs across DST, the CLI ``schedule next``.

Expected runs are written out by hand from the calendar (2027-01-01 is a Friday; Tokyo is UTC+9 all year;
New York is UTC-5 in winter; Europe/London moves to BST on 2027-03-28 and back on 2027-10-31, both at
01:00 UTC), never computed by the code under test.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

# -- import cost and the command line ------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentlife", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_import_agentlife_does_not_import_croniter() -> None:
    code = (
        "import sys, agentlife, agentlife._schedule, agentlife._manifest;"
        "print(sorted(m for m in ('croniter', 'zoneinfo', 'dateutil') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_cli_schedule_next_prints_local_and_utc() -> None:
    result = run_cli(
        "schedule",
        "next",
        "0 9 * * 1-5",
        "--timezone",
        "Asia/Tokyo",
        "-n",
        "3",
        "--after",
        "2027-01-01T00:00:00Z",
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "'0 9 * * 1-5' in Asia/Tokyo" in lines[0]
    rows = [line.split() for line in lines[2:]]
    assert [row[1:4] for row in rows] == [
        ["2027-01-04", "Mon", "09:00"],
        ["2027-01-05", "Tue", "09:00"],
        ["2027-01-06", "Wed", "09:00"],
    ]
    assert [row[6:9] for row in rows] == [
        ["2027-01-04", "Mon", "00:00Z"],
        ["2027-01-05", "Tue", "00:00Z"],
        ["2027-01-06", "Wed", "00:00Z"],
    ]


def test_cli_schedule_next_shows_dst_skips_and_repeats() -> None:
    spring = run_cli(
        "schedule", "next", "30 1 * * *", "--tz", "Europe/London", "-n", "2", "--after", "2027-03-27T12:00Z"
    )
    assert spring.returncode == 0, spring.stderr
    assert "2027-03-28 Sun 01:30 (skipped)" in spring.stdout
    assert "does not exist" in spring.stdout
    autumn = run_cli(
        "schedule", "next", "30 1 * * *", "--tz", "Europe/London", "-n", "2", "--after", "2027-10-30T12:00Z"
    )
    assert autumn.returncode == 0, autumn.stderr
    assert "2027-10-31 Sun 01:30 BST (+01:00)   2027-10-31 Sun 00:30Z" in autumn.stdout
    assert "2027-10-31 Sun 01:30 GMT (+00:00)   2027-10-31 Sun 01:30Z" in autumn.stdout
    assert "second run: clocks went back" in autumn.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["*/5 * * * *"], "60 min"),
        (["0 9 * * *", "--timezone", "Nowhere/City"], "'Nowhere/City'"),
        (["0 9 * *"], "4 fields"),
        (["0 9 * * *", "--after", "2027-01-01T00:00"], "no UTC offset"),
    ],
)
def test_cli_schedule_next_refuses_with_one_line(args: list[str], needle: str) -> None:
    result = run_cli("schedule", "next", *args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert needle in result.stderr
    assert "Traceback" not in result.stderr
