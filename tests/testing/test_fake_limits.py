"""The fake servers' enforced limits: the providers' 429 shapes and headers, and the flags that set them."""

from __future__ import annotations

import argparse

import httpx
import pytest

from agentlife import ConfigError
from agentlife.testing import FakeAnthropicServer, FakeOpenAIServer, ProviderLimits
from agentlife.testing._fake_cli import latency_from_args, limits_from_args, main

pytestmark = pytest.mark.anyio

BODY = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 5,
    "stream": True,
    "messages": [{"role": "user", "content": "hi"}],
}


async def test_anthropic_fake_answers_past_its_limit_as_the_api_does() -> None:
    async with (
        FakeAnthropicServer(default_turn="ok", limits=ProviderLimits(requests_per_minute=60)) as server,
        httpx.AsyncClient() as client,
    ):
        ok = await client.post(f"{server.base_url}/v1/messages", json=BODY)
        server.spend(requests=60)
        refused = await client.post(f"{server.base_url}/v1/messages", json=BODY)
    assert ok.status_code == 200 and ok.headers["anthropic-ratelimit-requests-limit"] == "60"
    assert int(ok.headers["anthropic-ratelimit-requests-remaining"]) == 59
    assert ok.headers["anthropic-ratelimit-requests-reset"].endswith("Z")
    assert refused.status_code == 429 and refused.json()["type"] == "error"
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert (
        refused.headers["retry-after"] == "1"
        and refused.headers["anthropic-ratelimit-requests-remaining"] == "0"
    )
    assert server.rate_limited == 1 and len(server.admitted) == 1


async def test_openai_fake_answers_past_its_limit_as_the_api_does() -> None:
    limits = ProviderLimits(requests_per_minute=60, input_tokens_per_minute=1000)
    async with FakeOpenAIServer(default_turn="ok", limits=limits) as server, httpx.AsyncClient() as client:
        ok = await client.post(f"{server.base_url}/chat/completions", json=BODY)
        server.spend(input_tokens=1000)
        refused = await client.post(f"{server.base_url}/chat/completions", json=BODY)
    assert ok.status_code == 200 and ok.headers["x-ratelimit-limit-tokens"] == "1000"
    assert ok.headers["x-ratelimit-remaining-requests"] == "59" and ok.headers["x-ratelimit-reset-requests"]
    error = refused.json()["error"]
    assert refused.status_code == 429 and error["code"] == "rate_limit_exceeded" and error["type"] == "tokens"
    assert "on tokens per min (TPM): Limit 1000" in error["message"]
    assert refused.headers["x-ratelimit-remaining-tokens"] == "0"


def args(**values: str | None) -> argparse.Namespace:
    return argparse.Namespace(**{"rpm": None, "input_tpm": None, "output_tpm": None, **values})


def test_limit_flags_become_provider_limits() -> None:
    assert limits_from_args(args()) is None
    assert limits_from_args(args(rpm="600", input_tpm="200000")) == ProviderLimits(600, 200_000)
    assert latency_from_args("0.02,0.2") == (0.02, 0.2) and latency_from_args("0.1") == (0.1, 0.1)


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "nan", "1e3", "99999999999", "", "x"])
def test_a_bad_limit_flag_is_one_line(value: str) -> None:
    with pytest.raises(ConfigError, match=r"--rpm .* must be a whole number from 1 to 10\*\*9"):
        limits_from_args(args(rpm=value))


@pytest.mark.parametrize("value", ["0.2,0.1", "-1,1", "nan,1", "1,inf", "a,b", "100,100"])
def test_a_bad_latency_is_one_line(value: str) -> None:
    with pytest.raises(ConfigError, match="--latency"):
        latency_from_args(value)


def test_the_command_line_refuses_a_bad_limit_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fake-anthropic", "--rpm", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --rpm") and err.count("\n") == 1
