"""``manifest --worker``: the Deployment of warm workers, derived from the constants like the Job, validated
against the official Kubernetes schemas (kubernetes-validate, strict)."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml

from agentlife._exceptions import ConfigError
from agentlife._manifest import WORKER_COMMAND, job_manifest, to_yaml, worker_manifest
from agentlife.constants import Constants
from test_manifest import IMAGE, K8S_VERSIONS, run_cli

AGENT = "reviewer.agent:Reviewer"


def make_deployment(constants: Constants | None = None, **overrides: Any) -> dict[str, Any]:
    job = job_manifest(
        name="reviewer", image=IMAGE, agent_class=AGENT, command=WORKER_COMMAND, constants=constants
    )
    return worker_manifest(job, **overrides)


def worker_container(deployment: dict[str, Any]) -> dict[str, Any]:
    [only] = deployment["spec"]["template"]["spec"]["containers"]
    result: dict[str, Any] = only
    return result


def test_deployment_runs_workers_with_the_job_pods_derivations() -> None:
    deployment = make_deployment(replicas=4, max_jobs=50, idle_timeout=600)
    pod = deployment["spec"]["template"]["spec"]
    c = worker_container(deployment)
    assert (deployment["apiVersion"], deployment["kind"]) == ("apps/v1", "Deployment")
    assert deployment["spec"]["replicas"] == 4
    assert pod["restartPolicy"] == "Always"
    assert pod["terminationGracePeriodSeconds"] == 65
    assert c["args"] == [*WORKER_COMMAND, AGENT, "--idle-timeout", "600", "--max-jobs", "50"]
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert "AGENTLIFE_JOB_ID" not in {e["name"] for e in c["env"]}
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_drain_overrides_reach_the_grace_period() -> None:
    constants = Constants.from_env(
        {"AGENTLIFE_DRAIN_STEP_DEADLINE_SECONDS": "100", "AGENTLIFE_DRAIN_TERMINATION_GRACE_SECONDS": "120"}
    )
    pod = make_deployment(constants)["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 120


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_deployments_pass_the_official_schema(version: str) -> None:
    for deployment in (make_deployment(), make_deployment(replicas=0, max_jobs=1, idle_timeout=0.5)):
        assert kubernetes_validate.validate(deployment, version, strict=True)
        assert kubernetes_validate.validate(yaml.safe_load(to_yaml(deployment)), version, strict=True)


def test_schema_validation_catches_a_broken_deployment() -> None:
    deployment = make_deployment()
    deployment["spec"]["replicas"] = "2"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[0], strict=True)


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"replicas": -1}, "replicas -1"),
        ({"max_jobs": 0}, "max jobs 0"),
        ({"idle_timeout": 0}, "idle timeout"),
    ],
)
def test_refusals(overrides: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        make_deployment(**overrides)


def test_cli_prints_the_deployment_the_function_builds() -> None:
    result = run_cli(
        "--worker",
        "--image",
        IMAGE,
        "--agent",
        AGENT,
        "--name",
        "reviewer",
        "--replicas",
        "3",
        "--max-jobs",
        "9",
    )
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout) == make_deployment(replicas=3, max_jobs=9)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--replicas", "2"], "--replicas only apply with --worker"),
        (["--worker", "--schedule", "0 9 * * *"], "exclude each other"),
        (["--worker", "--replicas", "-2"], "replicas -2 is refused"),
    ],
)
def test_cli_refusals_are_one_line(args: list[str], needle: str) -> None:
    result = run_cli("--image", IMAGE, "--agent", AGENT, *args)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and needle in result.stderr
