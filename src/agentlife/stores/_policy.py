"""Failure policy helpers: what to do after a crash, per-agent circuit breaking, phase budgets.

Everything here is pure (no I/O except `p95_from_journals` reading journals), so a control plane can call it
as readily as the next attempt of a job:

- `should_retry_after_crash` turns the job row's crash history (its ``error`` list) and budgets into a
  `RetryDecision`: retry after an escalating backoff, retry with a reduced footprint after an OOM kill,
  or stop.
- `CircuitBreaker` stops scheduling an agent that keeps failing, and tries it again after a cooldown.
- `derive_total_timeout` and `p95_from_journals` size a job's total timeout (``activeDeadlineSeconds``) from
  the measured phases; ``python -m agentlife budget`` prints the arithmetic.
"""

from __future__ import annotations

import enum
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from agentlife._budget import format_usd
from agentlife._exceptions import ConfigError
from agentlife.constants import BudgetConstants, Constants
from agentlife.stores._base import JobStatus

__all__ = [
    "DEFAULT_SAFETY_BUFFER_SECONDS",
    "OOM_EXIT_CODE",
    "SAME_ERROR_LIMIT",
    "CircuitBreaker",
    "CircuitState",
    "CrashRecord",
    "RetryDecision",
    "crash_backoff_schedule",
    "derive_total_timeout",
    "p95_from_journals",
    "should_retry_after_crash",
]

#: The exit code of a container killed by the kernel's OOM killer (or any SIGKILL): 128 + 9.
OOM_EXIT_CODE = 137
#: The same error class and message this many times in a row means retrying will not help.
SAME_ERROR_LIMIT = 3
#: Consecutive OOM kills that make an OOM persistent: the second one already ran with the reduced footprint.
PERSISTENT_OOM_LIMIT = 2
#: ``python -m agentlife budget --from-journals`` adds this when no ``--safety-buffer`` is given.
DEFAULT_SAFETY_BUFFER_SECONDS = 180.0
_MESSAGE_LIMIT = 2000


# -- crash records and the retry decision -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CrashRecord:
    """One entry of the job row's ``error`` list: why an attempt ended abnormally.

    Attributes:
        exit_code: the process's exit code (1 for a crash, 137 for an OOM kill), None when unknown.
        error_class: the exception's class name, or ``"OOMKilled"`` for exit 137.
        message: the exception's message, already redacted.
        at: unix time of the crash.
        attempt: the attempt that crashed.
        step: the step that was running, when known.
    """

    exit_code: int | None
    error_class: str
    message: str
    at: float
    attempt: int
    step: int | None = None

    @property
    def is_oom(self) -> bool:
        """Whether the attempt was OOM-killed (exit code 137)."""
        return self.exit_code == OOM_EXIT_CODE

    def to_dict(self) -> dict[str, Any]:
        """The JSON object stored in the job row's ``error`` list."""
        out: dict[str, Any] = {
            "exit_code": self.exit_code,
            "error_class": self.error_class,
            "message": self.message,
            "at": self.at,
            "attempt": self.attempt,
        }
        if self.step is not None:
            out["step"] = self.step
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CrashRecord:
        """Read one ``error`` list entry; missing fields (rows written by other tools) get neutral values."""
        exit_code = data.get("exit_code")
        step = data.get("step")
        return cls(
            exit_code=int(exit_code) if exit_code is not None else None,
            error_class=str(data.get("error_class", "")),
            message=str(data.get("message", "")),
            at=float(data.get("at", 0.0)),
            attempt=int(data.get("attempt", 0)),
            step=int(step) if step is not None else None,
        )

    @classmethod
    def from_exception(
        cls,
        exc: BaseException,
        *,
        attempt: int,
        exit_code: int | None = 1,
        step: int | None = None,
        redact: Callable[[str], str] | None = None,
        at: float | None = None,
    ) -> CrashRecord:
        """The record of a crash caused by ``exc``; pass ``redact`` (e.g. ``Redactor.redact``) for secrets."""
        message = " ".join(str(exc).split())
        if redact is not None:
            message = redact(message)
        return cls(
            exit_code=exit_code,
            error_class=type(exc).__name__,
            message=message[:_MESSAGE_LIMIT],
            at=time.time() if at is None else at,
            attempt=attempt,
            step=step,
        )

    @classmethod
    def from_exit_code(cls, exit_code: int, *, attempt: int, at: float | None = None) -> CrashRecord:
        """The record of an attempt known only by its exit code (e.g. ``AGENTLIFE_PREVIOUS_EXIT_CODE``)."""
        oom = exit_code == OOM_EXIT_CODE
        return cls(
            exit_code=exit_code,
            error_class="OOMKilled" if oom else "ProcessExit",
            message="killed by SIGKILL (OOM)" if oom else f"exited with code {exit_code}",
            at=time.time() if at is None else at,
            attempt=attempt,
        )


@dataclass(frozen=True, slots=True)
class RetryDecision:
    """What to do with a job after a crash."""

    retry: bool
    """Whether to run another attempt."""
    delay_seconds: float
    """How long to wait before it (0 when not retrying)."""
    reason: str
    """One line for people and logs."""
    footprint_reduced: bool = False
    """Run the next attempt with the reduced footprint (after an OOM kill)."""
    status: str = JobStatus.RETRYING
    """The job status to record: RETRYING, FAILED or DEAD_LETTER."""


def crash_backoff_schedule(constants: Constants | None = None) -> tuple[float, ...]:
    """Delays before the 1st, 2nd, ... retry after a crash (5, 60, 300, 1800 s); past its end: DEAD_LETTER."""
    return (constants or Constants()).retry.crash_backoff_seconds


def should_retry_after_crash(
    history: Sequence[CrashRecord | Mapping[str, Any]],
    budget: Mapping[str, Any] | None = None,
    consumed: Mapping[str, Any] | None = None,
    *,
    constants: Constants | None = None,
) -> RetryDecision:
    """Decide whether a crashed job runs again, when, and with which footprint.

    The rules, first match wins:

    1. token budget exhausted (``consumed`` input tokens or cost at or over ``budget``) → FAILED;
    2. persistent OOM: the last two attempts were both OOM-killed (137) → DEAD_LETTER, since the second
       already ran with the reduced footprint;
    3. the same error (class and message) on the last three attempts → DEAD_LETTER;
    4. more crashes than the backoff schedule has steps → DEAD_LETTER;
    5. otherwise retry after the schedule's delay for this crash (5 s, 60 s, 300 s, 1800 s), with the
       reduced footprint when the last attempt was OOM-killed.

    Args:
        history: the job row's ``error`` list, oldest first (`CrashRecord` or its dict form).
        budget: the row's ``token_budget`` (``max_input_tokens``, ``max_cost_usd``); missing limits default to
            the constants (``AGENTLIFE_BUDGET_*``).
        consumed: the row's ``tokens_consumed`` (``input``, ``output``, ``cost_usd``).
        constants: where the defaults come from; `Constants()` when omitted.
    """
    constants = constants or Constants()
    records = [r if isinstance(r, CrashRecord) else CrashRecord.from_dict(r) for r in history]
    exhausted = _budget_exhausted(constants.budget, budget or {}, consumed or {})
    if exhausted:
        return RetryDecision(False, 0.0, exhausted, status=JobStatus.FAILED)
    recent_ooms = _trailing(records, lambda r: r.is_oom)
    if recent_ooms >= PERSISTENT_OOM_LIMIT:
        return RetryDecision(
            False,
            0.0,
            f"persistent OOM: the last {recent_ooms} attempts were killed with exit code {OOM_EXIT_CODE}, "
            "the last one with the reduced footprint",
            status=JobStatus.DEAD_LETTER,
        )
    repeated = _repeated_error(records)
    if repeated:
        return RetryDecision(False, 0.0, repeated, status=JobStatus.DEAD_LETTER)
    schedule = crash_backoff_schedule(constants)
    crashes = max(len(records), 1)  # we are called after a crash, recorded or not
    if crashes > len(schedule):
        return RetryDecision(
            False,
            0.0,
            f"crash retries exhausted: {crashes} crashes, schedule {', '.join(f'{s:g} s' for s in schedule)}",
            status=JobStatus.DEAD_LETTER,
        )
    delay = schedule[crashes - 1]
    if records and records[-1].is_oom:
        return RetryDecision(
            True,
            delay,
            f"OOM kill (exit {OOM_EXIT_CODE}): retry {crashes} of {len(schedule)} in {delay:g} s "
            "with the reduced footprint",
            footprint_reduced=True,
        )
    last = f" after {_describe(records[-1])}" if records else ""
    return RetryDecision(True, delay, f"retry {crashes} of {len(schedule)} in {delay:g} s{last}")


def _budget_exhausted(
    defaults: BudgetConstants, budget: Mapping[str, Any], consumed: Mapping[str, Any]
) -> str:
    max_cost = float(budget.get("max_cost_usd", defaults.max_cost_usd))
    max_input = int(budget.get("max_input_tokens", defaults.max_input_tokens))
    cost = float(consumed.get("cost_usd", 0.0))
    used_input = int(consumed.get("input", 0))
    if cost >= max_cost:
        return f"token budget exhausted (${format_usd(cost)} / ${format_usd(max_cost)} max)"
    if used_input >= max_input:
        return f"token budget exhausted ({used_input} / {max_input} input tokens max)"
    return ""


def _trailing(records: Sequence[CrashRecord], predicate: Callable[[CrashRecord], bool]) -> int:
    count = 0
    for record in reversed(records):
        if not predicate(record):
            break
        count += 1
    return count


def _repeated_error(records: Sequence[CrashRecord]) -> str:
    if len(records) < SAME_ERROR_LIMIT:
        return ""
    last = records[-SAME_ERROR_LIMIT:]
    keys = {(r.error_class, r.message) for r in last}
    if len(keys) != 1:
        return ""
    return f"same error {SAME_ERROR_LIMIT} times in a row: {_describe(last[-1])}"


def _describe(record: CrashRecord) -> str:
    text = f"{record.error_class}: {record.message}" if record.message else record.error_class
    text = text or f"exit code {record.exit_code}"
    return text if len(text) <= 200 else text[:197] + "..."


# -- circuit breaker -----------------------------------------------------------------------------------


class CircuitState(enum.StrEnum):
    """A `CircuitBreaker`'s state."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """Stops sending work to an agent that keeps failing; keep one per agent id.

    CLOSED: every call is allowed; ``failure_threshold`` failures within ``window`` seconds open it.
    OPEN: nothing is allowed until ``cooldown`` seconds have passed, then it is HALF_OPEN.
    HALF_OPEN: one trial call is allowed (another one only if the trial's outcome is not recorded within a
    further ``cooldown``); its success closes the breaker, its failure opens it again for a full cooldown.

    A success while CLOSED does not forgive earlier failures: the rule is "3 failures in 15 minutes", not
    "3 in a row". Outcomes recorded while OPEN (calls that started before it opened) change nothing.
    Thread-safe.

    Example:
        >>> breaker = CircuitBreaker(clock=lambda: 0.0)
        >>> for _ in range(3):
        ...     breaker.record_failure()
        >>> breaker.state, breaker.allow()
        (<CircuitState.OPEN: 'open'>, False)
    """

    def __init__(
        self,
        failure_threshold: int = 3,
        window: float = 900.0,
        cooldown: float = 1800.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failure_threshold < 1 or not window > 0 or not cooldown >= 0:
            raise ConfigError(
                f"circuit breaker needs failure_threshold >= 1, window > 0 and cooldown >= 0, got "
                f"{failure_threshold}, {window:g} s and {cooldown:g} s"
            )
        self.failure_threshold = failure_threshold
        self.window = window
        self.cooldown = cooldown
        self._clock = clock
        self._lock = threading.Lock()
        self._state = CircuitState.CLOSED
        self._failures: deque[float] = deque()
        self._opened_at = 0.0
        self._trial_at: float | None = None

    @classmethod
    def from_constants(
        cls, budget: BudgetConstants, clock: Callable[[], float] = time.monotonic
    ) -> CircuitBreaker:
        """A breaker with the thresholds of `BudgetConstants` (3 failures in 15 min, 30 min cooldown)."""
        return cls(
            budget.circuit_failure_threshold,
            budget.circuit_window_seconds,
            budget.circuit_cooldown_seconds,
            clock,
        )

    @property
    def state(self) -> CircuitState:
        """The current state (an OPEN breaker whose cooldown is over reads as HALF_OPEN)."""
        with self._lock:
            return self._current(self._clock())

    def allow(self) -> bool:
        """Whether a call may go ahead now; in HALF_OPEN this takes the single trial slot."""
        with self._lock:
            now = self._clock()
            state = self._current(now)
            if state is CircuitState.CLOSED:
                return True
            if state is CircuitState.OPEN:
                return False
            if self._trial_at is None or now - self._trial_at >= self.cooldown:
                self._trial_at = now
                return True
            return False

    def record_success(self) -> None:
        """A call succeeded: a HALF_OPEN breaker closes."""
        with self._lock:
            if self._current(self._clock()) is CircuitState.HALF_OPEN:
                self._state = CircuitState.CLOSED
                self._failures.clear()
                self._trial_at = None

    def record_failure(self) -> None:
        """A call failed: count it (CLOSED) or re-open (HALF_OPEN)."""
        with self._lock:
            now = self._clock()
            state = self._current(now)
            if state is CircuitState.HALF_OPEN:
                self._open(now)
            elif state is CircuitState.CLOSED:
                self._failures.append(now)
                self._forget_before(now - self.window)
                if len(self._failures) >= self.failure_threshold:
                    self._open(now)

    def seconds_until_retry(self) -> float:
        """How long an OPEN breaker stays shut (0 when calls or a trial are allowed)."""
        with self._lock:
            now = self._clock()
            if self._current(now) is not CircuitState.OPEN:
                return 0.0
            return max(0.0, self._opened_at + self.cooldown - now)

    def _current(self, now: float) -> CircuitState:
        if self._state is CircuitState.OPEN and now - self._opened_at >= self.cooldown:
            self._state = CircuitState.HALF_OPEN
            self._trial_at = None
        return self._state

    def _open(self, now: float) -> None:
        self._state = CircuitState.OPEN
        self._opened_at = now
        self._failures.clear()
        self._trial_at = None

    def _forget_before(self, horizon: float) -> None:
        while self._failures and self._failures[0] < horizon:
            self._failures.popleft()

    def __repr__(self) -> str:
        failures = f"{len(self._failures)}/{self.failure_threshold}"
        return f"CircuitBreaker(state={self.state.value}, failures={failures})"


# -- phase budget ---------------------------------------------------------------------------------------


def derive_total_timeout(
    init_p95: float, exec_p95: float, safety_buffer: float, granularity: int = 60
) -> int:
    """The job's total timeout: init p95 + exec p95 + safety buffer, rounded *up* to ``granularity`` seconds.

    Example:
        >>> derive_total_timeout(95.4, 420, 180)
        720

    Raises:
        ConfigError: a duration is negative or not finite, or the granularity is not a positive integer.
    """
    for name, value in (("init_p95", init_p95), ("exec_p95", exec_p95), ("safety_buffer", safety_buffer)):
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    if isinstance(granularity, bool) or not isinstance(granularity, int) or granularity < 1:
        raise ConfigError(f"granularity must be a whole number of seconds >= 1, got {granularity!r}")
    total = init_p95 + exec_p95 + safety_buffer
    # Float sums like 600.0000000001 must not round up a whole extra step.
    steps = math.ceil(round(total / granularity, 9))
    return max(steps, 1) * granularity


def p95_from_journals(data_dir: str | Path) -> tuple[float, float]:
    """The p95 of the init and exec phases over the session journals under ``data_dir``.

    Reads ``{data_dir}/sessions/*/session_*.jsonl``. Per session, *init* runs from ``SESSION_STARTED`` to the
    start of execution (the first ``STEP_STARTED`` or ``LIFECYCLE`` to ``EXECUTING``, whichever comes first),
    *exec* from there to ``SESSION_ENDED`` (or the last event of a session that crashed). Sessions that never
    reached execution are left out; torn or corrupt lines are skipped. The p95 is the nearest-rank one.

    Raises:
        ConfigError: no session journals, or none of them reached execution.
    """
    phases, _ = phase_durations(Path(data_dir))
    return p95([p[0] for p in phases]), p95([p[1] for p in phases])


def phase_durations(data_dir: Path) -> tuple[list[tuple[float, float]], int]:
    sessions = data_dir / "sessions"
    files = sorted(sessions.glob("*/session_*.jsonl")) if sessions.is_dir() else []
    if not files:
        raise ConfigError(f"no session journals under {sessions} (expected */session_*.jsonl files)")
    phases = [p for p in (_session_phases(f) for f in files) if p is not None]
    if not phases:
        raise ConfigError(f"none of the {len(files)} session journals under {sessions} reached execution")
    return phases, len(files)


def _session_phases(path: Path) -> tuple[float, float] | None:
    started = executing = ended = last = None
    try:
        with path.open("rb") as lines:
            for event in _events(lines):
                ts, kind = event["ts"], event["type"]
                last = ts
                if kind == "SESSION_STARTED" and started is None:
                    started = ts
                elif executing is None and (
                    kind == "STEP_STARTED" or (kind == "LIFECYCLE" and event.get("to") == "EXECUTING")
                ):
                    executing = ts
                elif kind == "SESSION_ENDED":
                    ended = ts
    except OSError:
        return None
    if started is None or executing is None:
        return None
    end = ended if ended is not None else last
    assert end is not None
    return max(0.0, executing - started), max(0.0, end - executing)


def _events(lines: Iterable[bytes]) -> Iterable[dict[str, Any]]:
    for line in lines:
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue  # a torn last line or a corrupt one: the journal format promises nothing more
        if (
            isinstance(event, dict)
            and isinstance(event.get("ts"), (int, float))
            and isinstance(event.get("type"), str)
        ):
            yield event


def p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


# -- CLI --------------------------------------------------------------------------------------------------
