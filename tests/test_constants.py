from __future__ import annotations

import dataclasses
import inspect

import pytest

from agentlife import ConfigError, InvariantViolation, StreamTimeouts
from agentlife._config import DEFAULT_HEALTH_HOST, DEFAULT_HEALTH_PORT, Settings, probe_address
from agentlife._journal._recovery import scan_for_resume
from agentlife._llm._guard import stream_timeouts_from_constants
from agentlife._manifest import job_manifest
from agentlife._memory import QdrantMemory
from agentlife._retry import full_jitter_backoff, retry_call
from agentlife.constants import DEFAULT_TOOL_TIMEOUTS, Constants, DrainConstants, HeartbeatConstants


def test_defaults_are_the_spike_values() -> None:
    c = Constants()
    assert (
        c.drain.pre_stop_seconds,
        c.drain.termination_grace_seconds,
        c.drain.step_deadline_seconds,
        c.drain.cleanup_budget_seconds,
        c.drain.sigkill_buffer_seconds,
    ) == (5, 65, 45, 10, 5)
    assert (c.heartbeat.sse_interval_seconds, c.heartbeat.unhealthy_after_seconds) == (15, 45)
    assert (c.heartbeat.job_interval_seconds, c.heartbeat.zombie_after_seconds) == (30, 300)
    assert (
        c.calls.llm_connect_timeout_seconds,
        c.calls.llm_inter_chunk_timeout_seconds,
        c.calls.llm_total_timeout_seconds,
    ) == (30, 60, 300)
    assert c.budget.max_input_tokens == 500_000 and c.budget.max_cost_usd == 5.0
    assert c.budget.run_max_seconds is None
    assert c.probe.startup_window_seconds == 60 and c.probe.liveness_window_seconds == 30
    assert c.retry.crash_backoff_seconds == (5, 60, 300, 1800)


def test_tool_timeout_table() -> None:
    c = Constants()
    assert c.tool_timeout("kubectl_get") == 15
    assert c.tool_timeout("git_clone") == 300
    assert c.tool_timeout("something_else") == 60
    assert set(DEFAULT_TOOL_TIMEOUTS) >= {"kubectl_apply", "file_read", "browser_navigate", "http_request"}


def test_constants_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Constants().drain.step_deadline_seconds = 1  # type: ignore[misc]


def test_env_overrides_apply() -> None:
    c = Constants.from_env(
        {
            "AGENTLIFE_DRAIN_STEP_DEADLINE_SECONDS": "30.5",
            "AGENTLIFE_BUDGET_MAX_INPUT_TOKENS": "1000",
            "AGENTLIFE_RUN_MAX_SECONDS": "120",
            "UNRELATED": "x",
        }
    )
    assert c.drain.step_deadline_seconds == 30.5
    assert c.budget.max_input_tokens == 1000
    assert c.budget.run_max_seconds == 120


@pytest.mark.parametrize("raw", ["abc", "", "1e", "nan", "inf", "-3"])
def test_unparsable_env_value_is_a_config_error_naming_the_variable(raw: str) -> None:
    with pytest.raises(ConfigError, match="AGENTLIFE_DRAIN_CLEANUP_BUDGET_SECONDS"):
        Constants.from_env({"AGENTLIFE_DRAIN_CLEANUP_BUDGET_SECONDS": raw})


def test_drain_invariant_names_both_sides() -> None:
    with pytest.raises(InvariantViolation) as info:
        Constants.from_env({"AGENTLIFE_DRAIN_STEP_DEADLINE_SECONDS": "50"})
    message = str(info.value)
    assert "= 70 s" in message and "termination_grace = 65 s" in message


def test_sigkill_buffer_must_be_positive() -> None:
    with pytest.raises(InvariantViolation, match="sigkill_buffer = 0 s must be > 0"):
        Constants(drain=DrainConstants(sigkill_buffer_seconds=0))


def test_heartbeat_invariants() -> None:
    with pytest.raises(InvariantViolation, match="unhealthy_after = 40 s must equal 3 x sse_interval = 45 s"):
        Constants(heartbeat=HeartbeatConstants(unhealthy_after_seconds=40))
    with pytest.raises(InvariantViolation, match="zombie_after = 50 s must be >= 2 x job_interval = 60 s"):
        Constants(heartbeat=HeartbeatConstants(zombie_after_seconds=50))


def test_startup_window_invariant() -> None:
    with pytest.raises(InvariantViolation, match="must fit in the startup probe window"):
        Constants.from_env({"AGENTLIFE_HYDRATION_MEMORY_TIMEOUT_SECONDS": "60"})


def test_blocked_threshold_must_be_below_liveness_window() -> None:
    with pytest.raises(InvariantViolation, match="blocked_threshold = 30 s must be < liveness window"):
        Constants.from_env({"AGENTLIFE_PROBE_BLOCKED_THRESHOLD_SECONDS": "30"})


def test_scaled_multiplies_durations_only() -> None:
    c = Constants().scaled(0.01)
    assert c.drain.step_deadline_seconds == pytest.approx(0.45)
    assert c.retry.crash_backoff_seconds == pytest.approx((0.05, 0.6, 3.0, 18.0))
    assert c.budget.max_input_tokens == 500_000
    assert c.probe.startup_failure_threshold == 12
    assert c.tool_timeout("git_clone") == pytest.approx(3.0)
    assert c.violations() == []
    with pytest.raises(ConfigError):
        Constants().scaled(0)


def test_lag_interval_must_leave_room_below_the_blocked_threshold() -> None:
    with pytest.raises(InvariantViolation, match="lag_interval x 2 = 6 s must be <= blocked_threshold = 5 s"):
        Constants.from_env({"AGENTLIFE_PROBE_LAG_INTERVAL_SECONDS": "3"})


def test_park_after_is_30_s_overridable_and_scaled_like_every_duration() -> None:
    assert Constants().budget.park_after_seconds == 30
    c = Constants.from_env({"AGENTLIFE_PARK_AFTER_SECONDS": "0.5"})
    assert c.budget.park_after_seconds == 0.5
    assert Constants().scaled(0.01).budget.park_after_seconds == pytest.approx(0.3)
    with pytest.raises(ConfigError, match="AGENTLIFE_PARK_AFTER_SECONDS"):
        Constants.from_env({"AGENTLIFE_PARK_AFTER_SECONDS": "nan"})


def _default(fn: object, name: str) -> object:
    return inspect.signature(fn).parameters[name].default  # type: ignore[arg-type]


def test_the_defaults_of_calls_retries_and_scans_are_the_constants() -> None:
    # Read from the constants, not written again: a default changed there is changed everywhere.
    c = Constants()
    assert StreamTimeouts() == stream_timeouts_from_constants(c.calls)
    assert _default(full_jitter_backoff, "initial") == _default(retry_call, "initial")
    assert _default(retry_call, "initial") == c.retry.transient_initial_seconds
    assert (
        _default(full_jitter_backoff, "cap") == _default(retry_call, "cap") == c.retry.transient_max_seconds
    )
    assert _default(scan_for_resume, "budget_seconds") == c.hydration.buffer_scan_timeout_seconds
    assert _default(QdrantMemory.search, "top_k") == c.hydration.memory_top_k
    settings = {f.name: f.default for f in dataclasses.fields(Settings)}
    assert settings["health_port"] == DEFAULT_HEALTH_PORT == _default(job_manifest, "health_port")
    assert settings["health_host"] == DEFAULT_HEALTH_HOST
    assert probe_address({}) == (DEFAULT_HEALTH_HOST, DEFAULT_HEALTH_PORT)
    assert probe_address({"AGENTLIFE_HEALTH_PORT": "off"}) is None
    assert probe_address({"AGENTLIFE_HEALTH_PORT": "70000"}) is None  # the settings say why, at boot
