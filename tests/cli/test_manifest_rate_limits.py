"""``manifest`` carries the fleet's rate limits to the pod's env, and refuses a bad one as the pod would."""

from __future__ import annotations

import json

import pytest

from agentlife._cli import main

BASE = ["manifest", "--image", "x:1", "--agent", "m:C", "-o", "json"]


def container_env(out: str) -> dict[str, str]:
    container = json.loads(out)["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in container["env"]}


def test_the_shells_and_envs_rate_limits_reach_the_pod(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AGENTLIFE_RATE_LIMIT_RPM", "600")
    assert main([*BASE, "--env", "AGENTLIFE_RATE_LIMIT_INPUT_TPM=200000"]) == 0
    env = container_env(capsys.readouterr().out)
    assert env["AGENTLIFE_RATE_LIMIT_RPM"] == "600" and env["AGENTLIFE_RATE_LIMIT_INPUT_TPM"] == "200000"


def test_a_bad_rate_limit_is_refused_before_any_pod_boots(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("AGENTLIFE_RATE_LIMIT_RPM", raising=False)
    assert main([*BASE, "--env", "AGENTLIFE_RATE_LIMIT_IN_FLIGHT=0"]) == 2
    err = capsys.readouterr().err
    assert "AGENTLIFE_RATE_LIMIT_IN_FLIGHT='0' must be from 1 to" in err and err.count("\n") == 1
