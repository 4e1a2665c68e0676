"""Kubernetes manifests: derivations from the constants, validation against the official schemas, the CLI.

Schemas come from ``kubernetes-validate`` (offline, strict: unknown fields are errors). CronJob
``spec.timeZone`` is GA from Kubernetes 1.27, so every manifest is checked against 1.27 and the newest
bundled version (and a version in between).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate import utils as kv_utils

from agentlife._manifest import (
    job_manifest,
)

K8S_VERSIONS = ["1.27.0", "1.30.0", kv_utils.latest_version()]
IMAGE = "ghcr.io/acme/reviewer:1.4.2"
AGENT = "reviewer.agent:Reviewer"


def make_job(**overrides: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"name": "reviewer", "image": IMAGE, "agent_class": AGENT}
    kwargs.update(overrides)
    return job_manifest(**kwargs)


def pod(manifest: Mapping[str, Any]) -> dict[str, Any]:
    spec = manifest["spec"]["jobTemplate"]["spec"] if manifest["kind"] == "CronJob" else manifest["spec"]
    result: dict[str, Any] = spec["template"]["spec"]
    return result


def container(manifest: Mapping[str, Any]) -> dict[str, Any]:
    [only] = pod(manifest)["containers"]
    result: dict[str, Any] = only
    return result


def env_of(manifest: Mapping[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(manifest)["env"]}


# -- the command line ----------------------------------------------------------------------------------


def run_cli(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLIFE_")}
    return subprocess.run(
        [sys.executable, "-m", "agentlife", "manifest", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**base, **(env or {})},
    )


def test_cli_prints_the_job_the_function_builds() -> None:
    result = run_cli(
        "--image",
        IMAGE,
        "--agent",
        AGENT,
        "--name",
        "reviewer",
        "--namespace",
        "agents",
        "--env",
        "DEPLOYMENT_ENV=prod",
        "--secret",
        "reviewer-keys",
        "--cpu",
        "1",
        "--memory",
        "1Gi",
        "--pvc",
        "reviewer-data",
    )
    assert result.returncode == 0, result.stderr
    expected = make_job(
        namespace="agents",
        env={"DEPLOYMENT_ENV": "prod"},
        secrets=["reviewer-keys"],
        resources={"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1Gi"}},
        data_volume="reviewer-data",
    )
    assert yaml.safe_load(result.stdout) == expected


def test_cli_applies_the_shell_overrides_to_the_manifest() -> None:
    env = {"AGENTLIFE_DRAIN_STEP_DEADLINE_SECONDS": "100", "AGENTLIFE_DRAIN_TERMINATION_GRACE_SECONDS": "120"}
    result = run_cli("--image", IMAGE, "--agent", AGENT, "-o", "json", env=env)
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)
    assert job["metadata"]["name"] == "reviewer"  # from the class name
    assert pod(job)["terminationGracePeriodSeconds"] == 120
    assert env_of(job)["AGENTLIFE_DRAIN_STEP_DEADLINE_SECONDS"] == "100"


def test_cli_refuses_an_invariant_breaking_override_with_one_line() -> None:
    result = run_cli("--image", IMAGE, "--agent", AGENT, env={"AGENTLIFE_DRAIN_STEP_DEADLINE_SECONDS": "100"})
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert "termination_grace = 65 s" in result.stderr
    assert "Traceback" not in result.stderr
    via_flag = run_cli(
        "--image", IMAGE, "--agent", AGENT, "--env", "AGENTLIFE_DRAIN_CLEANUP_BUDGET_SECONDS=30"
    )
    assert via_flag.returncode == 2
    assert "cleanup_budget" in via_flag.stderr


def test_cli_prints_the_cronjob_with_the_phase_budget() -> None:
    result = run_cli(
        "--image",
        IMAGE,
        "--agent",
        AGENT,
        "--schedule",
        "0 9 * * 1-5",
        "--timezone",
        "Asia/Tokyo",
        "--init-p95",
        "95.4",
        "--exec-p95",
        "420",
        "--safety-buffer",
        "180",
        "--budget-usd",
        "2.5",
    )
    assert result.returncode == 0, result.stderr
    cron = yaml.safe_load(result.stdout)
    assert cron["spec"]["schedule"] == "0 9 * * 1-5"
    assert cron["spec"]["timeZone"] == "Asia/Tokyo"
    assert cron["spec"]["jobTemplate"]["spec"]["activeDeadlineSeconds"] == 720
    assert env_of(cron)["AGENTLIFE_BUDGET_MAX_COST_USD"] == "2.5"
    assert container(cron)["args"][-1] == "--create-job"  # each run is a new job row
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(cron, version, strict=True)


def test_cli_reads_the_p95s_from_session_journals(tmp_path: Path) -> None:
    # Two sessions in the journal format:
    # init = SESSION_STARTED -> EXECUTING, exec = EXECUTING -> SESSION_ENDED.
    for job_id, (start, executing, end) in {
        "a": (1000.0, 1095.4, 1515.4),
        "b": (2000.0, 2050.0, 2300.0),
    }.items():
        folder = tmp_path / "sessions" / job_id
        folder.mkdir(parents=True)
        events = [
            {"v": 1, "ts": start, "seq": 0, "type": "SESSION_STARTED"},
            {"v": 1, "ts": executing, "seq": 1, "type": "LIFECYCLE", "from": "READY", "to": "EXECUTING"},
            {"v": 1, "ts": end, "seq": 2, "type": "SESSION_ENDED", "exit_code": 0},
        ]
        (folder / "session_0001_1000000.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    result = run_cli(
        "--image",
        IMAGE,
        "--agent",
        AGENT,
        "--schedule",
        "0 9 * * *",
        "--from-journals",
        str(tmp_path),
        "-o",
        "json",
    )
    assert result.returncode == 0, result.stderr
    # p95 of (95.4, 50) = 95.4; of (420, 250) = 420; + 180 = 695.4 -> 720.
    assert json.loads(result.stdout)["spec"]["jobTemplate"]["spec"]["activeDeadlineSeconds"] == 720


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--schedule", "*/5 * * * *", "--init-p95", "10", "--exec-p95", "10"], "60 min"),
        (["--env", "ANTHROPIC_API_KEY=sk-ant-secret"], "--secret"),
    ],
)
def test_cli_refusals_are_one_line_and_exit_2(args: list[str], needle: str) -> None:
    result = run_cli("--image", IMAGE, "--agent", AGENT, *args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert needle in result.stderr
    assert "sk-ant-secret" not in result.stderr
    assert "Traceback" not in result.stderr
