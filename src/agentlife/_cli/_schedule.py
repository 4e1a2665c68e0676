"""``python -m agentlife schedule next``: the next runs of a cron schedule, in local time and UTC."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from agentlife._exceptions import ScheduleError
from agentlife._schedule import DEFAULT_MIN_INTERVAL_MINUTES, Schedule, format_span


def register(subparsers: Any) -> None:
    """Add ``schedule next CRON --timezone ZONE -n N`` to the ``python -m agentlife`` parser."""
    schedule = subparsers.add_parser(
        "schedule",
        help="check a cron schedule and show its next runs",
        description="Validate a 5-field cron schedule in an IANA time zone and show its next runs.",
    )
    schedule.set_defaults(handler=lambda _args: _usage(schedule))
    commands = schedule.add_subparsers(
        dest="schedule_command", metavar="COMMAND", parser_class=type(schedule)
    )
    nxt = commands.add_parser(
        "next",
        help="print the next runs in local time and UTC",
        description="Print the next runs of CRON in ZONE, local time and UTC, correct across DST changes "
        "(a local time that does not exist is skipped, one that occurs twice runs twice, as Kubernetes "
        "does).",
    )
    nxt.add_argument("cron", metavar="CRON", help="5 fields, quoted: e.g. '0 9 * * 1-5'")
    nxt.add_argument("--timezone", "--tz", default="UTC", metavar="ZONE", help="IANA zone (default: UTC)")
    nxt.add_argument("-n", type=int, default=5, metavar="N", help="how many runs (default: 5, at most 1000)")
    nxt.add_argument(
        "--after", metavar="ISO", help="start after this time (ISO 8601 with offset; default: now)"
    )
    nxt.add_argument(
        "--min-interval",
        type=float,
        default=DEFAULT_MIN_INTERVAL_MINUTES,
        metavar="MINUTES",
        help=f"minimum interval between runs (default: {DEFAULT_MIN_INTERVAL_MINUTES:g})",
    )
    nxt.set_defaults(handler=_cmd_next)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_usage(sys.stderr)
    return 2


def _cmd_next(args: argparse.Namespace) -> int:
    if not 1 <= args.n <= 1000:
        raise ScheduleError(f"-n {args.n} is refused: it must be between 1 and 1000")
    after = _parse_after(args.after)
    schedule = Schedule(args.cron, args.timezone, min_interval_minutes=args.min_interval)
    runs = schedule.next_runs(args.n, after)
    sys.stdout.write(render_runs(schedule, runs, after=after) + "\n")
    return 0


def _parse_after(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ScheduleError(f"--after {text!r} is not an ISO 8601 date-time") from None
    if value.tzinfo is None:
        raise ScheduleError(f"--after {text!r} has no UTC offset: add one (e.g. {text}+00:00 or {text}Z)")
    return value


def render_runs(schedule: Schedule, runs: list[datetime], *, after: datetime | None = None) -> str:
    """A table of ``runs``: local time, UTC, and a note on runs a clock change repeats or skips."""
    rows: list[tuple[datetime, str]] = []
    for number, run in enumerate(runs, 1):
        local = f"{run:%Y-%m-%d %a %H:%M} {run.tzname()} ({_offset(run)})"
        utc = f"{run.astimezone(UTC):%Y-%m-%d %a %H:%M}Z"
        note = ""
        if schedule.is_repeated(run):
            note = (
                "clocks go back: this time occurs twice" if run.fold == 0 else "second run: clocks went back"
            )
        rows.append((run.astimezone(UTC), f"{number:>3}  {local:<34}  {utc:<22}  {note}".rstrip()))
    if runs:
        start = after if after is not None else runs[0] - timedelta(seconds=1)
        for wall in schedule.skipped(start, runs[-1]):
            # Placed where the wall-clock time would have been, before the clocks jumped.
            where = wall.replace(tzinfo=runs[0].tzinfo).astimezone(UTC)
            local = f"{wall:%Y-%m-%d %a %H:%M} (skipped)"
            rows.append(
                (where, f"{'-':>3}  {local:<34}  {'-':<22}  this time does not exist: clocks go forward")
            )
    rows.sort(key=lambda row: row[0])
    header = [
        f"schedule {schedule.cron!r} in {schedule.timezone}; "
        f"closest runs {format_span(schedule.min_gap())} apart",
        f"{'#':>3}  {'local time':<34}  {'UTC':<22}  note".rstrip(),
    ]
    return "\n".join(header + [line for _, line in rows])


def _offset(run: datetime) -> str:
    offset = run.utcoffset() or timedelta(0)
    sign = "-" if offset < timedelta(0) else "+"
    minutes = abs(int(offset.total_seconds())) // 60
    return f"{sign}{minutes // 60:02d}:{minutes % 60:02d}"
