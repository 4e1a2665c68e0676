"""The fleet-wide rate limits as configured: every bad value is one clear line at boot, none a default."""

from __future__ import annotations

import pytest

from agentlife import ConfigError
from agentlife._config import Settings
from agentlife._ratelimit import MAX_LIMIT, RateLimit, RateLimits, rate_limits_from_env

BASE = {"AGENTLIFE_JOB_ID": "j", "AGENTLIFE_AGENT_ID": "a"}


def test_no_limit_configured_is_no_limiter_at_all() -> None:
    assert rate_limits_from_env({}, "anthropic") is None
    assert Settings.from_env(BASE).rate_limits is None


def test_the_accounts_limits_and_a_models_own_are_read_from_the_environment() -> None:
    env = {
        **BASE,
        "AGENTLIFE_LLM_PROVIDER": "openai",
        "AGENTLIFE_RATE_LIMIT_RPM": "600",
        "AGENTLIFE_RATE_LIMIT_INPUT_TPM": "2e5",
        "AGENTLIFE_RATE_LIMIT_IN_FLIGHT": "40",
        "AGENTLIFE_RATE_LIMIT_MODELS": "gpt-4o rpm=50 output_tpm=8000; o3 in_flight=2;",
    }
    limits = Settings.from_env(env).rate_limits
    assert limits == RateLimits(
        RateLimit("openai", 600, 200_000, None, 40),
        {"gpt-4o": RateLimit("openai/gpt-4o", 50, None, 8000), "o3": RateLimit("openai/o3", in_flight=2)},
    )
    assert [b.key for b in limits.buckets("gpt-4o")] == ["openai", "openai/gpt-4o"]
    assert [b.key for b in limits.buckets("other")] == ["openai"]


def test_an_account_name_separates_fleets_that_use_different_keys() -> None:
    env = {"AGENTLIFE_RATE_LIMIT_RPM": "5", "AGENTLIFE_RATE_LIMIT_ACCOUNT": "team-b@anthropic"}
    limits = rate_limits_from_env(env, "anthropic")
    assert limits is not None and limits.account is not None and limits.account.key == "team-b@anthropic"


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"AGENTLIFE_RATE_LIMIT_RPM": "0"}, "must be from 1 to"),
        ({"AGENTLIFE_RATE_LIMIT_RPM": "-0"}, "must be from 1 to"),
        ({"AGENTLIFE_RATE_LIMIT_RPM": "-5"}, "must be from 1 to"),
        ({"AGENTLIFE_RATE_LIMIT_INPUT_TPM": "nan"}, "is not a whole number"),
        ({"AGENTLIFE_RATE_LIMIT_INPUT_TPM": "inf"}, "is not a whole number"),
        ({"AGENTLIFE_RATE_LIMIT_INPUT_TPM": "1e300"}, "must be from 1 to"),
        ({"AGENTLIFE_RATE_LIMIT_OUTPUT_TPM": str(2**63)}, "must be from 1 to"),
        ({"AGENTLIFE_RATE_LIMIT_OUTPUT_TPM": "9" * 5000}, "is not a whole number"),
        ({"AGENTLIFE_RATE_LIMIT_IN_FLIGHT": "2.5"}, "is not a whole number"),
        ({"AGENTLIFE_RATE_LIMIT_IN_FLIGHT": "ten"}, "is not a whole number"),
        ({"AGENTLIFE_RATE_LIMIT_IN_FLIGHT": "1\x00"}, "is not a whole number"),
        ({"AGENTLIFE_RATE_LIMIT_RPM": str(MAX_LIMIT + 1)}, "must be from 1 to"),
        ({"AGENTLIFE_RATE_LIMIT_MODELS": "gpt-4o"}, "has no limit"),
        ({"AGENTLIFE_RATE_LIMIT_MODELS": "gpt-4o rpm"}, "is not one of"),
        ({"AGENTLIFE_RATE_LIMIT_MODELS": "gpt-4o tpm=5"}, "is not one of"),
        ({"AGENTLIFE_RATE_LIMIT_MODELS": "gpt-4o rpm=0"}, "must be from 1 to"),
        ({"AGENTLIFE_RATE_LIMIT_MODELS": "a rpm=1; a rpm=2"}, "listed twice"),
        ({"AGENTLIFE_RATE_LIMIT_MODELS": "rpm=5"}, "is not a model name"),
        ({"AGENTLIFE_RATE_LIMIT_MODELS": "\u00e9 rpm=5"}, "is not a model name"),
        ({"AGENTLIFE_RATE_LIMIT_ACCOUNT": "a b", "AGENTLIFE_RATE_LIMIT_RPM": "1"}, "is not a name"),
        ({"AGENTLIFE_RATE_LIMIT_ACCOUNT": "x" * 101, "AGENTLIFE_RATE_LIMIT_RPM": "1"}, "is not a name"),
        ({"AGENTLIFE_RATE_LIMIT_RPM": "\u0665"}, "is not a whole number"),  # Arabic-Indic five
        # A repeated key in a model's entry: one would silently win.
        ({"AGENTLIFE_RATE_LIMIT_MODELS": "m rpm=5 rpm=6"}, "rpm is given twice for m"),
        ({"AGENTLIFE_RATE_LIMIT_MODELS": "m in_flight=1 rpm=5 in_flight=1"}, "in_flight is given twice"),
        # Blank: a Helm value rendered empty would turn the limit off for the fleet.
        ({"AGENTLIFE_RATE_LIMIT_RPM": ""}, "is set but blank"),
        ({"AGENTLIFE_RATE_LIMIT_INPUT_TPM": " "}, "is set but blank"),
        ({"AGENTLIFE_RATE_LIMIT_MODELS": "\t"}, "is set but blank"),
        ({"AGENTLIFE_RATE_LIMIT_ACCOUNT": "", "AGENTLIFE_RATE_LIMIT_RPM": "1"}, "is set but blank"),
        # A mistyped name would too, even with no other limit set.
        ({"AGENTLIFE_RATE_LIMIT_RMP": "600"}, "did you mean AGENTLIFE_RATE_LIMIT_RPM?"),
        ({"AGENTLIFE_RATE_LIMIT_TPM": "600"}, "is not a rate-limit variable"),
        (
            {"AGENTLIFE_RATE_LIMIT_INPUT_TPM": "5", "AGENTLIFE_RATE_LIMIT_Rpm": "1"},
            "AGENTLIFE_RATE_LIMIT_Rpm",
        ),
    ],
)
def test_a_bad_limit_is_one_clear_line_naming_the_variable(env: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({**BASE, **env})
    message = str(caught.value)
    assert needle in message and "\n" not in message and len(message) < 300
    assert any(name in message for name in env)


def test_every_variable_the_docs_name_is_known_and_none_other() -> None:
    """The boot's list of names is the docs' table: a name added to one and not the other is caught here."""
    import re
    from pathlib import Path

    page = (Path(__file__).parents[1] / "docs" / "rate-limits.md").read_text()
    named = set(re.findall(r"^\| `(AGENTLIFE_RATE_LIMIT_[A-Z_]+)` \|", page, re.MULTILINE))  # the table
    for name in named:  # each accepted alone, with a value of its kind
        rate_limits_from_env({name: "m rpm=1" if name.endswith("MODELS") else "1"}, "x")
    assert len(named) == 7, named
