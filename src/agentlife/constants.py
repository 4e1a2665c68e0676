"""Every timing and budget agentlife uses, in one frozen place.

The defaults come from the platform's lifecycle spikes. Each group is a frozen dataclass; `Constants` holds
them all. `Constants.from_env()` applies the ``AGENTLIFE_*`` overrides of the design (seconds as decimals) and
checks every invariant, so a configuration that would, say, let Kubernetes SIGKILL a pod in the middle of its
cleanup refuses to boot with a message naming both sides of the inequality.

Example:
    >>> from agentlife.constants import Constants
    >>> c = Constants()
    >>> c.drain.step_deadline_seconds
    45.0
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

from agentlife._exceptions import ConfigError, InvariantViolation

__all__ = [
    "DEFAULT_TOOL_TIMEOUTS",
    "MAX_OUTPUT_EVENTS_PER_JOB",
    "MAX_OUTPUT_NAME_CHARS",
    "MAX_OUTPUT_VALUE_BYTES",
    "OUTPUT_DELTA_BYTES_PER_SECOND",
    "OUTPUT_DELTA_FLUSH_SECONDS",
    "BudgetConstants",
    "CallConstants",
    "Constants",
    "DrainConstants",
    "HeartbeatConstants",
    "HydrationConstants",
    "ProbeConstants",
    "RetentionConstants",
    "RetryConstants",
]

#: Per-tool default timeouts in seconds; other tools get ``tool_default_timeout_seconds``.
DEFAULT_TOOL_TIMEOUTS: Mapping[str, float] = MappingProxyType(
    {
        "kubectl_apply": 30.0,
        "kubectl_get": 15.0,
        "file_read": 10.0,
        "file_write": 10.0,
        "browser_navigate": 120.0,
        "browser_screenshot": 30.0,
        "http_request": 120.0,
        "git_clone": 300.0,
        "git_push": 60.0,
    }
)


def _seconds(default: float | None, env: str | None = None) -> Any:
    """A duration field: scaled by `Constants.scaled`, overridable from ``env``."""
    return field(default=default, metadata={"env": env, "seconds": True})


def _number(default: float | int, env: str | None = None) -> Any:
    """A count or money field: never scaled."""
    return field(default=default, metadata={"env": env, "seconds": False})


@dataclass(frozen=True, slots=True)
class DrainConstants:
    """The SIGTERM budget: Kubernetes' grace period split into its phases."""

    pre_stop_seconds: float = _seconds(5.0, "AGENTLIFE_DRAIN_PRE_STOP_SECONDS")
    """The preStop hook's sleep, while endpoints stop routing to the pod
    (``AGENTLIFE_DRAIN_PRE_STOP_SECONDS``)."""
    termination_grace_seconds: float = _seconds(65.0, "AGENTLIFE_DRAIN_TERMINATION_GRACE_SECONDS")
    """Kubernetes' ``terminationGracePeriodSeconds``: SIGTERM to SIGKILL
    (``AGENTLIFE_DRAIN_TERMINATION_GRACE_SECONDS``)."""
    step_deadline_seconds: float = _seconds(45.0, "AGENTLIFE_DRAIN_STEP_DEADLINE_SECONDS")
    """How long the current step may go on after SIGTERM before it is cancelled
    (``AGENTLIFE_DRAIN_STEP_DEADLINE_SECONDS``)."""
    cleanup_budget_seconds: float = _seconds(10.0, "AGENTLIFE_DRAIN_CLEANUP_BUDGET_SECONDS")
    """The time for the final checkpoint, the journal and the job row after the step
    (``AGENTLIFE_DRAIN_CLEANUP_BUDGET_SECONDS``)."""
    sigkill_buffer_seconds: float = _seconds(5.0, "AGENTLIFE_DRAIN_SIGKILL_BUFFER_SECONDS")
    """The margin left before the kubelet's SIGKILL (``AGENTLIFE_DRAIN_SIGKILL_BUFFER_SECONDS``)."""


@dataclass(frozen=True, slots=True)
class HeartbeatConstants:
    """SSE heartbeats to the control plane and the job row's ``heartbeat_at``."""

    sse_interval_seconds: float = _seconds(15.0, "AGENTLIFE_HEARTBEAT_SSE_INTERVAL_SECONDS")
    """Seconds between two SSE heartbeats to the control plane
    (``AGENTLIFE_HEARTBEAT_SSE_INTERVAL_SECONDS``)."""
    unhealthy_after_seconds: float = _seconds(45.0, "AGENTLIFE_HEARTBEAT_UNHEALTHY_AFTER_SECONDS")
    """Silence after which the control plane judges the agent unhealthy, 3 intervals
    (``AGENTLIFE_HEARTBEAT_UNHEALTHY_AFTER_SECONDS``)."""
    job_interval_seconds: float = _seconds(30.0, "AGENTLIFE_HEARTBEAT_JOB_INTERVAL_SECONDS")
    """Seconds between two writes of the job row's ``heartbeat_at``
    (``AGENTLIFE_HEARTBEAT_JOB_INTERVAL_SECONDS``)."""
    zombie_after_seconds: float = _seconds(300.0, "AGENTLIFE_HEARTBEAT_ZOMBIE_AFTER_SECONDS")
    """Age of ``heartbeat_at`` after which the reaper takes a RUNNING row back, at least 2 job intervals
    (``AGENTLIFE_HEARTBEAT_ZOMBIE_AFTER_SECONDS``)."""
    reconnect_initial_seconds: float = _seconds(1.0)
    """The first wait before reconnecting a broken SSE stream; doubled on each failure."""
    reconnect_max_seconds: float = _seconds(30.0)
    """The longest wait between two SSE reconnection attempts."""


@dataclass(frozen=True, slots=True)
class ProbeConstants:
    """Kubernetes probe blocks and the event-loop watchdog."""

    startup_period_seconds: float = _seconds(5.0)
    """The startup probe's ``periodSeconds``."""
    startup_failure_threshold: int = _number(12)
    """The startup probe's ``failureThreshold``: boot and hydration must answer within period x threshold."""
    liveness_period_seconds: float = _seconds(10.0)
    """The liveness probe's ``periodSeconds``."""
    liveness_failure_threshold: int = _number(3)
    """The liveness probe's ``failureThreshold``."""
    liveness_timeout_seconds: float = _seconds(5.0)
    """The liveness probe's ``timeoutSeconds``."""
    readiness_period_seconds: float = _seconds(5.0)
    """The readiness probe's ``periodSeconds`` (also how often a worker counts runnable jobs)."""
    readiness_failure_threshold: int = _number(2)
    """The readiness probe's ``failureThreshold``."""
    readiness_timeout_seconds: float = _seconds(3.0)
    """The readiness probe's ``timeoutSeconds``."""
    blocked_threshold_seconds: float = _seconds(5.0, "AGENTLIFE_PROBE_BLOCKED_THRESHOLD_SECONDS")
    """How long the event loop may go without running before ``/healthz`` answers 503
    (``AGENTLIFE_PROBE_BLOCKED_THRESHOLD_SECONDS``)."""
    lag_interval_seconds: float = _seconds(1.0, "AGENTLIFE_PROBE_LAG_INTERVAL_SECONDS")
    """How often the event-loop lag is sampled (``AGENTLIFE_PROBE_LAG_INTERVAL_SECONDS``)."""

    @property
    def startup_window_seconds(self) -> float:
        """How long Kubernetes waits for the first successful startup probe."""
        return self.startup_period_seconds * self.startup_failure_threshold

    @property
    def liveness_window_seconds(self) -> float:
        """How long a failing liveness probe takes to get the container restarted."""
        return self.liveness_period_seconds * self.liveness_failure_threshold


@dataclass(frozen=True, slots=True)
class CallConstants:
    """Timeouts of LLM, HTTP and tool calls."""

    llm_connect_timeout_seconds: float = _seconds(30.0, "AGENTLIFE_LLM_CONNECT_TIMEOUT_SECONDS")
    """From an LLM request to the first event of its stream (``AGENTLIFE_LLM_CONNECT_TIMEOUT_SECONDS``)."""
    llm_inter_chunk_timeout_seconds: float = _seconds(60.0, "AGENTLIFE_LLM_INTER_CHUNK_TIMEOUT_SECONDS")
    """The longest silence between two events of an LLM stream
    (``AGENTLIFE_LLM_INTER_CHUNK_TIMEOUT_SECONDS``)."""
    llm_total_timeout_seconds: float = _seconds(300.0, "AGENTLIFE_LLM_TOTAL_TIMEOUT_SECONDS")
    """The longest an LLM call may take in all (``AGENTLIFE_LLM_TOTAL_TIMEOUT_SECONDS``)."""
    http_connect_timeout_seconds: float = _seconds(30.0)
    """A connect timeout for the agent's own HTTP clients to share; agentlife itself does not read it."""
    http_response_timeout_seconds: float = _seconds(120.0)
    """A response timeout for the agent's own HTTP clients to share; agentlife itself does not read it."""
    tool_default_timeout_seconds: float = _seconds(60.0, "AGENTLIFE_TOOL_DEFAULT_TIMEOUT_SECONDS")
    """The timeout of a tool that sets none and is not in `DEFAULT_TOOL_TIMEOUTS`
    (``AGENTLIFE_TOOL_DEFAULT_TIMEOUT_SECONDS``)."""
    policy_timeout_seconds: float = _seconds(2.0)
    """How long one ``check_policy`` call of a restricted tool may take."""
    policy_retry_seconds: float = _seconds(5.0)
    """The wait before asking ``check_policy`` again after it failed or timed out."""
    rate_limit_store_down_seconds: float = _seconds(30.0, "AGENTLIFE_RATE_LIMIT_STORE_DOWN_SECONDS")
    """With rate limits configured and the store unreachable: how long a model call waits for it before
    going on without the fleet's limit (``AGENTLIFE_RATE_LIMIT_STORE_DOWN_SECONDS``)."""

    @property
    def rate_limit_slot_lease_seconds(self) -> float:
        """How long an in-flight slot outlives a killed process: longer than any model call may take."""
        return 1.1 * (self.llm_connect_timeout_seconds + self.llm_total_timeout_seconds)


@dataclass(frozen=True, slots=True)
class HydrationConstants:
    """Budgets of the three hydration steps and of store connection."""

    checkpoint_tries: int = _number(3)
    """How many times loading the checkpoint (and connecting to PostgreSQL) is tried before boot fails."""
    checkpoint_backoff_seconds: float = _seconds(2.0)
    """The wait between two of those tries."""
    buffer_scan_timeout_seconds: float = _seconds(5.0, "AGENTLIFE_HYDRATION_BUFFER_SCAN_TIMEOUT_SECONDS")
    """The budget of the journal scan that finds calls left pending by the last attempt
    (``AGENTLIFE_HYDRATION_BUFFER_SCAN_TIMEOUT_SECONDS``)."""
    memory_timeout_seconds: float = _seconds(10.0, "AGENTLIFE_HYDRATION_MEMORY_TIMEOUT_SECONDS")
    """The budget of the memory fetch; past it the job starts without memories
    (``AGENTLIFE_HYDRATION_MEMORY_TIMEOUT_SECONDS``)."""
    memory_top_k: int = _number(10)
    """How many memories hydration fetches."""
    store_connect_timeout_seconds: float = _seconds(10.0)
    """The timeout of one connection attempt to the store."""

    @property
    def worst_case_seconds(self) -> float:
        """Boot + hydration in the worst case: retries, scan, memory fetch and store connection."""
        return (
            self.checkpoint_tries * self.checkpoint_backoff_seconds
            + self.buffer_scan_timeout_seconds
            + self.memory_timeout_seconds
            + self.store_connect_timeout_seconds
        )


@dataclass(frozen=True, slots=True)
class RetryConstants:
    """Backoff schedules: transient errors, crash retries, delivery."""

    transient_initial_seconds: float = _seconds(1.0)
    """The first wait before retrying a transient error (429, 5xx, a dropped stream); doubled each time."""
    transient_max_seconds: float = _seconds(30.0)
    """The longest wait between two retries of a transient error."""
    crash_backoff_seconds: tuple[float, ...] = field(
        default=(5.0, 60.0, 300.0, 1800.0), metadata={"env": None, "seconds": True}
    )
    """The waits before the 1st, 2nd, ... retry after a crash; one crash more than it has steps is
    DEAD_LETTER."""
    delivery_attempts: int = _number(3)
    """How many times ``deliver`` is tried."""
    delivery_initial_seconds: float = _seconds(5.0)
    """The first wait between two delivery tries."""
    delivery_multiplier: float = _number(2.0)
    """What each wait between delivery tries is multiplied by."""


@dataclass(frozen=True, slots=True)
class BudgetConstants:
    """Per-job token, money and time budgets, approvals and the circuit breaker."""

    max_input_tokens: int = _number(500_000, "AGENTLIFE_BUDGET_MAX_INPUT_TOKENS")
    """Input tokens a job may spend over all its attempts, unless its row sets its own
    (``AGENTLIFE_BUDGET_MAX_INPUT_TOKENS``)."""
    max_cost_usd: float = _number(5.00, "AGENTLIFE_BUDGET_MAX_COST_USD")
    """US dollars a job may spend over all its attempts, unless its row sets its own
    (``AGENTLIFE_BUDGET_MAX_COST_USD``)."""
    run_max_seconds: float | None = _seconds(None, "AGENTLIFE_RUN_MAX_SECONDS")
    """How long one attempt may run; None (``none``, ``0`` or empty) for no limit
    (``AGENTLIFE_RUN_MAX_SECONDS``)."""
    idle_timeout_seconds: float = _seconds(1800.0, "AGENTLIFE_IDLE_TIMEOUT_SECONDS")
    """How long a job waits for an approval before it checkpoints and exits 0, parked in WAITING_FOR_APPROVAL
    (``AGENTLIFE_IDLE_TIMEOUT_SECONDS``)."""
    approval_poll_seconds: float = _seconds(5.0, "AGENTLIFE_APPROVAL_POLL_SECONDS")
    """How often a job waiting for approval reads its row (``AGENTLIFE_APPROVAL_POLL_SECONDS``)."""
    park_after_seconds: float = _seconds(30.0, "AGENTLIFE_PARK_AFTER_SECONDS")
    """A durable wait (``ctx.sleep``) shorter than this stays in the process; a longer one ends the step at
    the wait, parks the job in WAITING and frees the process or worker slot
    (``AGENTLIFE_PARK_AFTER_SECONDS``)."""
    circuit_failure_threshold: int = _number(3)
    """Crashes of one agent within ``circuit_window_seconds`` that open its circuit breaker."""
    circuit_window_seconds: float = _seconds(900.0)
    """The window in which the circuit breaker counts an agent's crashes."""
    circuit_cooldown_seconds: float = _seconds(1800.0)
    """How long an open circuit breaker holds the agent's retries."""


#: The shortest a retention period may be (days): shorter, a job's followers may still be reading it.
MIN_RETAIN_DAYS: float = 1.0
#: The longest a retention period may be (days): more is a typo.
MAX_RETAIN_DAYS: float = 36_500.0


@dataclass(frozen=True, slots=True)
class RetentionConstants:
    """How long finished jobs are kept before the reaper pass prunes them; None (unset): kept for ever.

    Off by default: an upgrade never starts deleting a team's history on its own. Each period is in days,
    from the job's last write (when it finished), at least `MIN_RETAIN_DAYS`.
    """

    completed_days: float | None = _number(None, "AGENTLIFE_RETAIN_COMPLETED_DAYS")  # type: ignore[arg-type]
    """COMPLETED jobs are pruned this many days after they finished (``AGENTLIFE_RETAIN_COMPLETED_DAYS``)."""
    failed_days: float | None = _number(None, "AGENTLIFE_RETAIN_FAILED_DAYS")  # type: ignore[arg-type]
    """FAILED jobs are pruned this many days after they finished (``AGENTLIFE_RETAIN_FAILED_DAYS``)."""
    dead_letter_days: float | None = _number(None, "AGENTLIFE_RETAIN_DEAD_LETTER_DAYS")  # type: ignore[arg-type]
    """DEAD_LETTER jobs are pruned this many days after they gave up
    (``AGENTLIFE_RETAIN_DEAD_LETTER_DAYS``)."""
    pruned_ids_days: float = _number(365.0, "AGENTLIFE_RETAIN_PRUNED_IDS_DAYS")
    """The tombstone of a pruned job (``job show`` says "pruned"; its id cannot be created again) is kept
    this many days after the prune (``AGENTLIFE_RETAIN_PRUNED_IDS_DAYS``)."""

    def periods(self) -> dict[str, float]:
        """The status -> days of each period set."""
        periods = {"COMPLETED": self.completed_days, "FAILED": self.failed_days}
        periods["DEAD_LETTER"] = self.dead_letter_days
        return {status: days for status, days in periods.items() if days is not None}


# -- a running job's output (``ctx.publish``, followers, live model text) ---------------------------------

#: The most events a job's output keeps, its status changes included: ``ctx.publish`` refuses the next one.
MAX_OUTPUT_EVENTS_PER_JOB: int = 10_000
#: The longest name of a published event, in characters.
MAX_OUTPUT_NAME_CHARS: int = 200
#: The largest value of a published event, in bytes of its JSON.
MAX_OUTPUT_VALUE_BYTES: int = 64 * 1024
#: The model text a job hands its followers per second, at most; text past it is dropped and counted.
OUTPUT_DELTA_BYTES_PER_SECOND: int = 32 * 1024
#: How often a streaming job hands its buffered model text on (seconds): one store write per batch.
OUTPUT_DELTA_FLUSH_SECONDS: float = 0.075

_Group = TypeVar("_Group")

#: The largest whole number an override may hold: exact in every JSON reader and in the stores' columns.
MAX_ENV_INTEGER: int = 2**53
#: The longest duration an override may hold (about 31 years): past it, thread timers and sleeps overflow.
MAX_ENV_SECONDS: float = 1e9
# Periods of loops and timeouts of calls: at 0 a loop would spin and every call would time out at once.
_POSITIVE = (
    ("heartbeat", "sse_interval_seconds", "AGENTLIFE_HEARTBEAT_SSE_INTERVAL_SECONDS"),
    ("heartbeat", "job_interval_seconds", "AGENTLIFE_HEARTBEAT_JOB_INTERVAL_SECONDS"),
    ("probe", "lag_interval_seconds", "AGENTLIFE_PROBE_LAG_INTERVAL_SECONDS"),
    ("budget", "approval_poll_seconds", "AGENTLIFE_APPROVAL_POLL_SECONDS"),
    ("calls", "llm_connect_timeout_seconds", "AGENTLIFE_LLM_CONNECT_TIMEOUT_SECONDS"),
    ("calls", "llm_inter_chunk_timeout_seconds", "AGENTLIFE_LLM_INTER_CHUNK_TIMEOUT_SECONDS"),
    ("calls", "llm_total_timeout_seconds", "AGENTLIFE_LLM_TOTAL_TIMEOUT_SECONDS"),
    ("calls", "tool_default_timeout_seconds", "AGENTLIFE_TOOL_DEFAULT_TIMEOUT_SECONDS"),
)


@dataclass(frozen=True, slots=True)
class Constants:
    """All groups together; build with `from_env` to apply overrides and check invariants."""

    drain: DrainConstants = field(default_factory=DrainConstants)
    """The SIGTERM budget (`DrainConstants`)."""
    heartbeat: HeartbeatConstants = field(default_factory=HeartbeatConstants)
    """SSE heartbeats, the job heartbeat and the zombie threshold (`HeartbeatConstants`)."""
    probe: ProbeConstants = field(default_factory=ProbeConstants)
    """Kubernetes probe blocks and the event-loop watchdog (`ProbeConstants`)."""
    calls: CallConstants = field(default_factory=CallConstants)
    """Timeouts of LLM, HTTP, tool and policy calls (`CallConstants`)."""
    hydration: HydrationConstants = field(default_factory=HydrationConstants)
    """Budgets of hydration and of the store connection (`HydrationConstants`)."""
    retry: RetryConstants = field(default_factory=RetryConstants)
    """Backoff schedules (`RetryConstants`)."""
    budget: BudgetConstants = field(default_factory=BudgetConstants)
    """Per-job budgets, approvals and the circuit breaker (`BudgetConstants`)."""
    retention: RetentionConstants = field(default_factory=RetentionConstants)
    """How long finished jobs are kept (`RetentionConstants`)."""
    time_scale: float = 1.0
    """1.0 in production; `scaled` records its factor so per-tool table timeouts scale too."""

    def __post_init__(self) -> None:
        self.check()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Constants:
        """Defaults overridden by the ``AGENTLIFE_*`` variables present in ``env``.

        Raises:
            ConfigError: a value does not parse as a number.
            InvariantViolation: the result breaks one of the invariants.
        """
        groups = {f.name: _group_from_env(_default_group(f), env) for f in _group_fields()}
        return cls(**groups)

    def scaled(self, factor: float) -> Constants:
        """A copy with every duration multiplied by ``factor`` (tests run a 45 s deadline in 0.45 s)."""
        if not factor > 0:
            raise ConfigError(f"time scale must be > 0, got {factor}")
        groups = {f.name: _scale_group(getattr(self, f.name), factor) for f in _group_fields()}
        return Constants(**groups, time_scale=self.time_scale * factor)

    def tool_timeout(self, name: str) -> float:
        """The default timeout of tool ``name``, scaled like the rest."""
        if name in DEFAULT_TOOL_TIMEOUTS:
            return DEFAULT_TOOL_TIMEOUTS[name] * self.time_scale
        return self.calls.tool_default_timeout_seconds

    def check(self) -> None:
        """Raise `InvariantViolation` naming both sides of the first broken invariant."""
        for message in self.violations():
            raise InvariantViolation(message)

    def violations(self) -> list[str]:
        """Every broken invariant, each as a sentence naming both sides."""
        d, h, p, hy = self.drain, self.heartbeat, self.probe, self.hydration
        out: list[str] = []
        drain_total = d.pre_stop_seconds + d.step_deadline_seconds + d.cleanup_budget_seconds
        drain_total += d.sigkill_buffer_seconds
        if drain_total > d.termination_grace_seconds + 1e-9:
            out.append(
                "pre_stop + step_deadline + cleanup_budget + sigkill_buffer = "
                f"{d.pre_stop_seconds:g} + {d.step_deadline_seconds:g} + {d.cleanup_budget_seconds:g} + "
                f"{d.sigkill_buffer_seconds:g} = {drain_total:g} s must be <= termination_grace = "
                f"{d.termination_grace_seconds:g} s"
            )
        if not d.sigkill_buffer_seconds > 0:
            out.append(f"sigkill_buffer = {d.sigkill_buffer_seconds:g} s must be > 0 s")
        if not math.isclose(h.unhealthy_after_seconds, 3 * h.sse_interval_seconds, rel_tol=1e-9):
            out.append(
                f"heartbeat unhealthy_after = {h.unhealthy_after_seconds:g} s must equal "
                f"3 x sse_interval = {3 * h.sse_interval_seconds:g} s"
            )
        if h.zombie_after_seconds < 2 * h.job_interval_seconds - 1e-9:
            out.append(
                f"heartbeat zombie_after = {h.zombie_after_seconds:g} s must be >= "
                f"2 x job_interval = {2 * h.job_interval_seconds:g} s"
            )
        if hy.worst_case_seconds > p.startup_window_seconds + 1e-9:
            out.append(
                f"worst-case boot + hydration = {hy.worst_case_seconds:g} s must fit in the startup probe "
                f"window = {p.startup_period_seconds:g} s x {p.startup_failure_threshold} = "
                f"{p.startup_window_seconds:g} s"
            )
        if not p.blocked_threshold_seconds < p.liveness_window_seconds:
            out.append(
                f"probe blocked_threshold = {p.blocked_threshold_seconds:g} s must be < liveness window = "
                f"{p.liveness_period_seconds:g} s x {p.liveness_failure_threshold} = "
                f"{p.liveness_window_seconds:g} s"
            )
        if not p.lag_interval_seconds * 2 <= p.blocked_threshold_seconds:
            out.append(
                f"probe lag_interval x 2 = {2 * p.lag_interval_seconds:g} s must be <= blocked_threshold = "
                f"{p.blocked_threshold_seconds:g} s (a normal gap between samples must not look like a block)"
            )
        for group_name, field_name, env in _POSITIVE:
            value = getattr(getattr(self, group_name), field_name)
            if not value > 0:
                out.append(f"{env} = {value:g} s must be > 0 s")
        for group in (d, h, p, self.calls, hy, self.retry, self.budget):
            out.extend(_negative_fields(group))
        out.extend(_retention_violations(self.retention))
        return out

    def as_dict(self) -> dict[str, dict[str, Any]]:
        """A JSON-friendly view, used by ``python -m agentlife check``."""
        return {f.name: dataclasses.asdict(getattr(self, f.name)) for f in _group_fields()}


def _group_fields() -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(Constants) if f.name != "time_scale"]


def _default_group(f: dataclasses.Field[Any]) -> Any:
    factory: Any = f.default_factory
    return factory()


def _group_from_env(group: _Group, env: Mapping[str, str]) -> _Group:
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(group):  # type: ignore[arg-type]
        name = f.metadata.get("env")
        if name is None or name not in env:
            continue
        changes[f.name] = _parse_env_number(name, env[name], integer=isinstance(f.default, int))
    return dataclasses.replace(group, **changes)  # type: ignore[type-var]


def _parse_env_number(name: str, raw: str, *, integer: bool) -> float | int | None:
    text = raw.strip()
    if name == "AGENTLIFE_RUN_MAX_SECONDS" and text.lower() in ("", "none"):
        return None
    kind = "a whole number" if integer else "a number of seconds"
    days = name.startswith("AGENTLIFE_RETAIN_")
    if days:
        kind = "a number of days"
    try:
        # ASCII digits only: Python's int() and float() also take "1_0" and fullwidth digits, which no
        # one means as a number in a manifest.
        if not text.isascii() or "_" in text:
            raise ValueError(text)
        value = int(text) if integer else float(text)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not {kind}") from None
    if days and not (math.isfinite(value) and MIN_RETAIN_DAYS <= value <= MAX_RETAIN_DAYS):
        raise ConfigError(f"{name}={raw[:40]!r} must be {_retain_range(name)}")
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name}={raw!r} must be a finite number >= 0")
    limit = MAX_ENV_INTEGER if integer else MAX_ENV_SECONDS
    if value > limit:
        shown = f"{limit:d}" if integer else f"{limit:g} s"
        raise ConfigError(f"{name}={raw[:40]!r} must be at most {shown}")
    if value == 0:
        # "0", "0.0" and "-0" are one value: for the run budget it means unlimited, never "already out of
        # time"; elsewhere it drops the sign of a negative zero.
        return None if name == "AGENTLIFE_RUN_MAX_SECONDS" else type(value)(0)
    return value


def _scale_group(group: _Group, factor: float) -> _Group:
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(group):  # type: ignore[arg-type]
        if not f.metadata.get("seconds"):
            continue
        value = getattr(group, f.name)
        if value is None:
            continue
        changes[f.name] = tuple(v * factor for v in value) if isinstance(value, tuple) else value * factor
    return dataclasses.replace(group, **changes)  # type: ignore[type-var]


def _retention_violations(r: RetentionConstants) -> list[str]:
    out = []
    for f in dataclasses.fields(r):
        value = getattr(r, f.name)
        if value is None:
            continue
        if not (isinstance(value, int | float) and MIN_RETAIN_DAYS <= value <= MAX_RETAIN_DAYS):
            out.append(f"{f.metadata['env']} = {value!r} must be {_retain_range(f.metadata['env'])}")
    return out


def _retain_range(name: str) -> str:
    """What an ``AGENTLIFE_RETAIN_*`` value may be, and what leaving it unset means."""
    unset = (
        "unset: 365 days"
        if name == "AGENTLIFE_RETAIN_PRUNED_IDS_DAYS"
        else "leave it unset to keep these jobs for ever"
    )
    return f"a number of days from {MIN_RETAIN_DAYS:g} to {MAX_RETAIN_DAYS:g} ({unset})"


def _negative_fields(group: object) -> list[str]:
    out = []
    for f in dataclasses.fields(group):  # type: ignore[arg-type]
        value = getattr(group, f.name)
        if isinstance(value, (int, float)) and value < 0:
            out.append(f"{type(group).__name__}.{f.name} = {value:g} must be >= 0")
    return out
