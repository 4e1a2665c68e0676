"""Validated recurring schedules: 5-field cron in an IANA time zone.

Kubernetes runs scheduled agents (a CronJob with ``spec.timeZone``); agentlife only checks, before a
schedule is handed over, what a schedule manager must: the cron syntax, the time zone, the minimum interval
between consecutive runs and the per-run budget under the system cap. Every refusal is a `ScheduleError`
whose one-line message names the limit and the offending value.

``croniter`` parses and evaluates the expression; a small lexical filter in front of it refuses what
croniter accepts but Kubernetes' parser (robfig/cron ``ParseStandard``) does not (``L``, ``#``, ``W``,
``H``, ``?``, macros, seconds or year fields, day-of-week 7, ranges that run backwards), so a schedule that
passes here is one the API server accepts.

Daylight saving time follows the Kubernetes CronJob controller, which evaluates the schedule with
robfig/cron in the zone: a local time that does not exist (clocks go forward) is skipped that day, and a
local time that exists twice (clocks go back) runs twice, once per occurrence. croniter's own time-zone
mode does something else (it fires at the end of the gap), so `Schedule.next_runs` evaluates the cron on
wall-clock time and maps each wall-clock time to its real instants itself.

croniter and zoneinfo are imported when a schedule is built, never at ``import agentlife``.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta, tzinfo
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from agentlife._exceptions import ScheduleError

if TYPE_CHECKING:
    pass

__all__ = [
    "DEFAULT_BUDGET_CAP_USD",
    "DEFAULT_MIN_INTERVAL_MINUTES",
    "Schedule",
    "check_budget",
]

#: The system cap on a scheduled run's cost, in USD.
DEFAULT_BUDGET_CAP_USD = 10.0
#: The default minimum interval between two consecutive runs, in minutes.
DEFAULT_MIN_INTERVAL_MINUTES = 60.0

# The largest change of UTC offset in the tz database (Pacific/Apia skipped a whole day in 2011; America/Sitka
# moved back almost a day in 1867). Wall-clock candidates are searched this far either side of an instant so
# that a repeated or skipped stretch of local time can never hide a run.
_MAX_OFFSET_JUMP = timedelta(hours=26)
_MINUTES_PER_DAY = 1440

_FIELD_NAMES = ("minute", "hour", "day-of-month", "month", "day-of-week")
_BOUNDS = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 6))
_MONTHS = {"jan": 1, "feb": 2, "mar": 3, "apr": 4, "may": 5, "jun": 6}
_MONTHS |= {"jul": 7, "aug": 8, "sep": 9, "oct": 10, "nov": 11, "dec": 12}
_DAYS = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}
_NAMES: tuple[dict[str, int] | None, ...] = (None, None, None, _MONTHS, _DAYS)
_ITEM = re.compile(r"^(?:\*|(?P<lo>[A-Za-z0-9]+)(?:-(?P<hi>[A-Za-z0-9]+))?)(?:/(?P<step>[0-9]+))?$")
# How far to look for the closest pair of matching days: day-of-week patterns repeat weekly; month-day
# patterns meet every month boundary within 2000-2001 (February with 29 and with 28 days); mixed patterns
# need the 28-year weekday/date cycle (1901-2099).
_WEEK_HORIZON = timedelta(days=14)
_MONTHS_HORIZON = timedelta(days=366 * 2)
_MIXED_HORIZON = timedelta(days=366 * 28)
_REFERENCE_DAY = datetime(2000, 1, 1)


def check_budget(budget_usd: float, cap_usd: float = DEFAULT_BUDGET_CAP_USD) -> float:
    """Return ``budget_usd`` if it is a usable per-run budget under ``cap_usd``.

    Raises:
        ScheduleError: the budget is not a number, not above zero, or above the cap.
    """
    _check_cap(cap_usd)
    if isinstance(budget_usd, bool) or not isinstance(budget_usd, (int, float)) or math.isnan(budget_usd):
        raise ScheduleError(f"per-run budget {budget_usd!r} USD is refused: it must be a number > 0")
    if budget_usd < 0:
        raise ScheduleError(f"per-run budget {budget_usd:g} USD is negative: it must be > 0 USD")
    if budget_usd == 0:
        raise ScheduleError(
            "per-run budget 0 USD is refused: it must be > 0 USD (no run could call the model)"
        )
    if budget_usd > cap_usd:
        raise ScheduleError(f"per-run budget {budget_usd:g} USD exceeds the system cap of {cap_usd:.2f} USD")
    return float(budget_usd)


def _check_cap(cap_usd: object) -> None:
    if isinstance(cap_usd, bool) or not isinstance(cap_usd, (int, float)) or not math.isfinite(cap_usd):
        raise ScheduleError(f"system budget cap {cap_usd!r} USD is refused: it must be a finite number > 0")
    if cap_usd <= 0:
        raise ScheduleError(f"system budget cap {cap_usd:g} USD is refused: it must be > 0")


@dataclass(frozen=True, slots=True)
class Schedule:
    """A recurring schedule, validated when it is built.

    Raises:
        ScheduleError: one line naming the limit and the offending value.

    Example:
        >>> s = Schedule("0 9 * * 1-5", "Asia/Tokyo")
        >>> s.min_gap()
        datetime.timedelta(days=1)
    """

    cron: str
    """Five fields, ``minute hour day-of-month month day-of-week``, normalised (names ``jan``-``dec`` and
    ``sun``-``sat`` allowed; day of week 0-6, 0 is Sunday)."""
    timezone: str
    """The IANA zone the cron fields are read in, such as ``"Asia/Tokyo"`` or ``"UTC"`` (the ``tzdata``
    package serves it where the system has no zone database)."""
    min_interval_minutes: float = DEFAULT_MIN_INTERVAL_MINUTES
    """The shortest gap allowed between two consecutive runs."""
    budget_usd: float | None = None
    """The per-run cost budget, passed to each run as ``AGENTLIFE_BUDGET_MAX_COST_USD``; None leaves the run's
    own default."""
    budget_cap_usd: float = DEFAULT_BUDGET_CAP_USD
    """The system cap ``budget_usd`` must stay under."""
    _zone: tzinfo = field(init=False, repr=False, compare=False)
    _gap: timedelta = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_zone", _load_zone(self.timezone))
        object.__setattr__(self, "cron", _check_cron(self.cron))
        if not isinstance(self.min_interval_minutes, (int, float)) or not self.min_interval_minutes > 0:
            raise ScheduleError(
                f"minimum interval {self.min_interval_minutes!r} min is refused: it must be > 0"
            )
        gap, where = _nominal_min_gap(self.cron)
        object.__setattr__(self, "_gap", gap)
        if gap < timedelta(minutes=self.min_interval_minutes):
            raise ScheduleError(
                f"cron {self.cron!r} runs {format_span(gap)} apart at its closest ({where}); the minimum "
                f"interval between runs is {self.min_interval_minutes:g} min"
            )
        _check_cap(self.budget_cap_usd)
        if self.budget_usd is not None:
            check_budget(self.budget_usd, self.budget_cap_usd)

    def min_gap(self) -> timedelta:
        """The shortest gap between two consecutive runs on the local wall clock.

        Every gap between the runs of one day counts, and so does the gap from the last run of a day to the
        first run of the next matching day, over the whole calendar (weekends, month ends, leap years) — not
        just the first two runs. On a day the clocks change, a gap that straddles the change is shorter or
        longer in real time by the shift (and a run in the repeated hour happens twice, one hour apart).
        """
        return self._gap

    def next_runs(self, n: int, after: datetime | None = None) -> list[datetime]:
        """The next ``n`` runs strictly after ``after`` (default: now), as aware datetimes in the zone.

        Runs are distinct instants in time order. A local time that the zone skips is not a run; a local time
        that occurs twice gives two runs (``fold=0`` then ``fold=1``), as Kubernetes does. Compare or
        subtract the results in UTC (``.astimezone(datetime.UTC)``): Python compares two datetimes that
        share a tzinfo by wall clock, ignoring ``fold``.

        Raises:
            ScheduleError: ``after`` is naive or ``n`` is negative.
        """
        if n < 0:
            raise ScheduleError(f"number of runs {n} is refused: it must be >= 0")
        start = self._start(after)
        found: list[datetime] = []
        if n == 0:
            return found
        bound: datetime | None = None
        for wall in self._walls_from(start):
            if bound is not None and wall > bound:
                break
            for instant in _instants(self._zone, wall):
                if instant > start:
                    bisect.insort(found, instant)
            if len(found) >= n:
                # Later wall-clock times can still map to earlier instants across a clock change.
                bound = _wall(found[n - 1], self._zone) + _MAX_OFFSET_JUMP
        return [instant.astimezone(self._zone) for instant in found[:n]]

    def skipped(self, after: datetime, until: datetime) -> list[datetime]:
        """Local wall-clock times between ``after`` and ``until`` that match but do not exist (DST gap).

        Kubernetes does not run them; they are returned naive (a wall-clock reading, not an instant).
        """
        start, end = self._start(after), self._start(until)
        last = _wall(end, self._zone)
        out = []
        for wall in self._walls_from(start):
            if wall > last:
                break
            if wall >= _wall(start, self._zone) and not _instants(self._zone, wall):
                out.append(wall)
        return out

    def is_repeated(self, run: datetime) -> bool:
        """Whether ``run``'s local time occurs twice that day (clocks go back), so it runs twice."""
        return len(_instants(self._zone, _wall(run, self._zone))) > 1

    def _start(self, after: datetime | None) -> datetime:
        if after is None:
            return datetime.now(UTC)
        if after.tzinfo is None or after.utcoffset() is None:
            raise ScheduleError(f"'after' {after.isoformat()} is naive: pass a timezone-aware datetime")
        return after.astimezone(UTC)

    def _walls_from(self, start: datetime) -> Iterator[datetime]:
        """Matching wall-clock times (naive), from well before ``start`` onwards."""
        from croniter import croniter

        cursor = croniter(self.cron, _wall(start, self._zone) - _MAX_OFFSET_JUMP)
        while True:
            yield cursor.get_next(datetime)


def _load_zone(name: object) -> tzinfo:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    if not isinstance(name, str) or not name.strip():
        raise ScheduleError(
            f"time zone {name!r} is refused: give an IANA name such as 'Europe/London' or 'UTC'"
        )
    if name.lower() == "local" or any(p in (".", "..") or p.startswith("-") for p in name.split("/")):
        raise ScheduleError(
            f"time zone {name!r} is refused: give an explicit IANA name such as 'Europe/London'"
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ScheduleError(
            f"time zone {name!r} is not an IANA time zone (e.g. 'Europe/London', 'Asia/Tokyo', 'UTC')"
        ) from None


def _check_cron(expression: object) -> str:
    if not isinstance(expression, str):
        raise ScheduleError(f"cron {expression!r} is refused: it must be a string of 5 fields")
    cron = " ".join(expression.split())
    if cron.startswith("@"):
        raise ScheduleError(
            f"cron {cron!r} is a macro: write its 5 fields instead (e.g. '0 0 * * *' for @daily)"
        )
    if re.match(r"(?i)(CRON_)?TZ=", cron):
        raise ScheduleError(f"cron {cron!r} carries a time zone: pass the zone separately (--timezone)")
    fields = cron.split(" ") if cron else []
    if len(fields) != 5:
        raise ScheduleError(
            f"cron {cron!r} has {len(fields)} fields; a schedule has exactly 5: minute hour day-of-month "
            "month day-of-week"
        )
    for index, text in enumerate(fields):
        for item in text.split(","):
            _check_item(cron, index, item)
    _evaluate(cron)
    return cron


def _check_item(cron: str, index: int, item: str) -> None:
    name, (low, high) = _FIELD_NAMES[index], _BOUNDS[index]
    match = _ITEM.fullmatch(item)
    if match is None:
        raise ScheduleError(
            f"cron {cron!r}: {name} item {item!r} is not supported by Kubernetes' cron parser; use numbers"
            f"{' or names' if _NAMES[index] else ''}, '*', ',', '-' and '/'"
        )
    values = [_value(cron, index, match.group(g)) for g in ("lo", "hi") if match.group(g) is not None]
    for value in values:
        if not low <= value <= high:
            hint = " (use 0 for Sunday)" if index == 4 and value == 7 else ""
            raise ScheduleError(f"cron {cron!r}: {name} {value} is out of range {low}-{high}{hint}")
    if len(values) == 2 and values[0] > values[1]:
        raise ScheduleError(
            f"cron {cron!r}: {name} range {item!r} runs backwards ({values[0]} > {values[1]}); "
            "Kubernetes refuses it, split it in two with ','"
        )
    if match.group("step") is not None and int(match.group("step")) < 1:
        raise ScheduleError(f"cron {cron!r}: {name} step {item!r} must be >= 1")


def _value(cron: str, index: int, token: str) -> int:
    if token.isdigit():
        return int(token)
    names = _NAMES[index]
    if names is not None and token.lower() in names:
        return names[token.lower()]
    raise ScheduleError(
        f"cron {cron!r}: {_FIELD_NAMES[index]} value {token!r} is not a number or a known name"
    )


def _evaluate(cron: str) -> None:
    """Let croniter parse the expression and find a first run; refuse what never fires."""
    from croniter import CroniterBadDateError, CroniterError, croniter

    try:
        croniter(cron, _REFERENCE_DAY).get_next(datetime)
    except CroniterBadDateError:
        raise ScheduleError(
            f"cron {cron!r} never fires: no date matches its day-of-month and month fields"
        ) from None
    except (CroniterError, ValueError, KeyError) as exc:
        message = " ".join(str(exc).split())
        raise ScheduleError(f"cron {cron!r} is not a valid schedule: {message}") from None


def _nominal_min_gap(cron: str) -> tuple[timedelta, str]:
    """The smallest wall-clock gap between consecutive runs, and where it happens (for the message).

    Every matching day has the same times of day, so the gaps inside a day come from the hour and minute
    fields, and the gap across midnight from the closest pair of consecutive matching days.
    """
    from croniter import croniter

    expanded = croniter(cron).expanded
    minutes = _full(expanded[0], 0, 59)
    hours = _full(expanded[1], 0, 23)
    times = sorted({h * 60 + m for h in hours for m in minutes})
    candidates = [(b - a, f"{_hhmm(a)} -> {_hhmm(b)}") for a, b in pairwise(times)]
    day_gap = _min_day_gap(cron)
    if day_gap is not None:
        across = day_gap * _MINUTES_PER_DAY - (times[-1] - times[0])
        candidates.append((across, f"{_hhmm(times[-1])} -> {_hhmm(times[0])} {day_gap} day(s) later"))
    if not candidates:  # one run in the whole horizon: at least that long between runs
        return _MIXED_HORIZON, "once in the horizon"
    minutes_apart, where = min(candidates)
    return timedelta(minutes=minutes_apart), where


def _full(values: list[Any], low: int, high: int) -> list[int]:
    return list(range(low, high + 1)) if values == ["*"] else [int(v) for v in values]


def _min_day_gap(cron: str) -> int | None:
    """The fewest days between two consecutive matching days, over the period the day fields repeat in."""
    from croniter import croniter

    _, _, dom, month, dow = cron.split(" ")
    if dom == "*" and month == "*":
        horizon = _WEEK_HORIZON
    elif dow == "*":
        horizon = _MONTHS_HORIZON
    else:
        horizon = _MIXED_HORIZON
    days = croniter(f"0 0 {dom} {month} {dow}", _REFERENCE_DAY - timedelta(minutes=1))
    end = _REFERENCE_DAY + horizon
    previous: date | None = None
    best: int | None = None
    while True:
        day = days.get_next(datetime)
        if day > end:
            if best is not None or end >= _REFERENCE_DAY + _MIXED_HORIZON:
                return best
            end = _REFERENCE_DAY + _MIXED_HORIZON  # fewer than two matches so far (29 February): look further
        if previous is not None:
            gap = (day.date() - previous).days
            best = gap if best is None else min(best, gap)
            if best == 1:
                return best
        previous = day.date()


def _instants(zone: tzinfo, wall: datetime) -> list[datetime]:
    """The UTC instants whose local time in ``zone`` reads ``wall``: none in a gap, two in a fold."""
    out: list[datetime] = []
    for fold in (0, 1):
        instant = wall.replace(tzinfo=zone, fold=fold).astimezone(UTC)
        if _wall(instant, zone) == wall and instant not in out:
            out.append(instant)
    out.sort()
    return out


def _wall(instant: datetime, zone: tzinfo) -> datetime:
    return instant.astimezone(zone).replace(tzinfo=None, fold=0)


def _hhmm(minute_of_day: int) -> str:
    return f"{minute_of_day // 60:02d}:{minute_of_day % 60:02d}"


def format_span(gap: timedelta) -> str:
    minutes = gap.total_seconds() / 60
    if minutes < 120:
        return f"{minutes:g} min"
    if minutes < 2 * _MINUTES_PER_DAY:
        return f"{minutes / 60:g} h"
    return f"{minutes / _MINUTES_PER_DAY:g} days"
