"""Kubernetes manifests: derivations from the constants, validation against the official schemas, the CLI.

Schemas come from ``kubernetes-validate`` (offline, strict: unknown fields are errors). CronJob
``spec.timeZone`` is GA from Kubernetes 1.27, so every manifest is checked against 1.27 and the newest
bundled version (and a version in between).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import kubernetes_validate
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes_validate import utils as kv_utils

from agentlife._cli._manifest import register as register_cli
from agentlife._exceptions import ConfigError, InvariantViolation, ScheduleError
from agentlife._manifest import (
    DEFAULT_COMMAND,
    constants_env,
    cronjob_manifest,
    job_manifest,
    render,
    to_yaml,
)
from agentlife._schedule import Schedule
from agentlife.constants import Constants
from agentlife.stores._policy import derive_total_timeout

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


# -- derivations from the constants --------------------------------------------------------------------


def test_default_job_derives_grace_prestop_and_probes_from_the_constants() -> None:
    job = make_job()
    c = container(job)
    assert job["apiVersion"] == "batch/v1"
    assert job["kind"] == "Job"
    assert job["spec"]["backoffLimit"] == 0
    assert pod(job)["restartPolicy"] == "Never"
    assert pod(job)["automountServiceAccountToken"] is False
    assert pod(job)["terminationGracePeriodSeconds"] == 65
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    assert c["startupProbe"] == {
        "httpGet": {"path": "/healthz", "port": "health"},
        "periodSeconds": 5,
        "timeoutSeconds": 5,
        "failureThreshold": 12,
    }
    assert c["livenessProbe"] == {
        "httpGet": {"path": "/healthz", "port": "health"},
        "periodSeconds": 10,
        "timeoutSeconds": 5,
        "failureThreshold": 3,
    }
    assert c["readinessProbe"] == {
        "httpGet": {"path": "/readyz", "port": "health"},
        "periodSeconds": 5,
        "timeoutSeconds": 3,
        "failureThreshold": 2,
    }
    assert c["ports"] == [{"name": "health", "containerPort": 8086, "protocol": "TCP"}]


def test_container_runs_the_agent_as_args_so_the_image_init_stays_pid_1() -> None:
    c = container(make_job(extra_args=("--create-job",)))
    assert "command" not in c
    assert c["args"] == [*DEFAULT_COMMAND, AGENT, "--create-job"]


def test_security_context_is_non_root_read_only_and_drops_everything() -> None:
    job = make_job()
    sc = container(job)["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["runAsNonRoot"] is True
    assert sc["runAsUser"] == 10001
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod(job)["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    mounts = {m["mountPath"]: m["name"] for m in container(job)["volumeMounts"]}
    assert mounts == {"/data": "data", "/tmp": "tmp"}
    volumes = {v["name"]: v for v in pod(job)["volumes"]}
    assert volumes["data"] == {"name": "data", "emptyDir": {}}
    assert "emptyDir" in volumes["tmp"]


def test_data_volume_can_be_a_claim() -> None:
    volumes = {v["name"]: v for v in pod(make_job(data_volume="reviewer-data"))["volumes"]}
    assert volumes["data"] == {"name": "data", "persistentVolumeClaim": {"claimName": "reviewer-data"}}


def test_runtime_environment_matches_the_pod_spec() -> None:
    env = env_of(make_job(health_port=9100, env={"DEPLOYMENT_ENV": "prod"}, secrets=["reviewer-keys"]))
    assert env["AGENTLIFE_DATA_DIR"] == "/data"
    assert env["AGENTLIFE_HEALTH_PORT"] == "9100"
    assert env["AGENTLIFE_JOB_ID"] == {"fieldRef": {"fieldPath": "metadata.labels['job-name']"}}
    assert env["DEPLOYMENT_ENV"] == "prod"
    # Default constants are the runtime's defaults too: nothing to pass.
    assert not [name for name in env if name.startswith("AGENTLIFE_DRAIN")]
    job = make_job(health_port=9100, secrets=["reviewer-keys"])
    assert container(job)["ports"][0]["containerPort"] == 9100
    assert container(job)["envFrom"] == [{"secretRef": {"name": "reviewer-keys"}}]


def test_overriding_drain_constants_changes_the_manifest_and_reaches_the_pod() -> None:
    constants = Constants.from_env(
        {
            "AGENTLIFE_DRAIN_STEP_DEADLINE_SECONDS": "100",
            "AGENTLIFE_DRAIN_TERMINATION_GRACE_SECONDS": "120.5",
            "AGENTLIFE_DRAIN_PRE_STOP_SECONDS": "3",
        }
    )
    job = make_job(constants=constants)
    assert pod(job)["terminationGracePeriodSeconds"] == 121  # 120.5 rounded up: never shorter than the drain
    assert container(job)["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "3"]
    env = env_of(job)
    assert env["AGENTLIFE_DRAIN_STEP_DEADLINE_SECONDS"] == "100"
    assert env["AGENTLIFE_DRAIN_TERMINATION_GRACE_SECONDS"] == "120.5"
    assert env["AGENTLIFE_DRAIN_PRE_STOP_SECONDS"] == "3"
    # What the pod receives rebuilds exactly the constants the manifest came from.
    plain = {k: v for k, v in env.items() if isinstance(v, str)}
    assert Constants.from_env(plain) == constants


def test_probe_blocks_follow_the_probe_constants() -> None:
    slower = Constants().scaled(2.0)  # every duration doubled, the invariants still hold
    c = container(make_job(constants=slower))
    assert c["startupProbe"]["periodSeconds"] == 10
    assert c["livenessProbe"]["periodSeconds"] == 20
    assert c["livenessProbe"]["timeoutSeconds"] == 10
    assert c["readinessProbe"]["timeoutSeconds"] == 6
    assert pod(make_job(constants=slower))["terminationGracePeriodSeconds"] == 130
    tiny = container(make_job(constants=Constants().scaled(0.01)))
    assert tiny["livenessProbe"]["periodSeconds"] == 1  # Kubernetes' minimum, never 0


def test_no_pre_stop_hook_when_pre_stop_is_zero() -> None:
    constants = Constants.from_env({"AGENTLIFE_DRAIN_PRE_STOP_SECONDS": "0"})
    assert "lifecycle" not in container(make_job(constants=constants))


def test_invariant_breaking_override_refuses_to_build_constants() -> None:
    with pytest.raises(InvariantViolation) as info:
        Constants.from_env({"AGENTLIFE_DRAIN_STEP_DEADLINE_SECONDS": "100"})
    assert "termination_grace" in str(info.value)


def test_constants_env_lists_only_non_default_values() -> None:
    assert constants_env(Constants()) == {}
    env = constants_env(
        Constants.from_env({"AGENTLIFE_BUDGET_MAX_COST_USD": "2.5", "AGENTLIFE_RUN_MAX_SECONDS": "600"})
    )
    assert env == {"AGENTLIFE_BUDGET_MAX_COST_USD": "2.5", "AGENTLIFE_RUN_MAX_SECONDS": "600"}


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"name": "Reviewer"}, "Job name 'Reviewer'"),
        ({"name": "reviewer\n"}, "Job name 'reviewer\\n'"),
        ({"name": "r" * 64}, "at most 63"),
        ({"namespace": "team_a"}, "namespace 'team_a'"),
        ({"image": "has space"}, "image 'has space'"),
        ({"agent_class": "reviewer.agent.Reviewer"}, "MODULE:CLASS"),
        ({"env": {"ANTHROPIC_API_KEY": "sk-ant-abc"}}, "--secret"),
        ({"env": {"AGENTLIFE_CONTROL_PLANE_TOKEN": "t0ken"}}, "--secret"),
        ({"env": {"AGENTLIFE_DATABASE_URL": "postgresql://u:pw@db/agents"}}, "--secret"),
        ({"env": {"AGENTLIFE_DATA_DIR": "/elsewhere"}}, "AGENTLIFE_DATA_DIR"),
        ({"env": {"AGENTLIFE_HEALTH_HOST": "127.0.0.1"}}, "kubelet"),
        ({"env": {"AGENTLIFE_DRAIN_STEP_DEADLINE_SECONDS": "40"}}, "disagrees"),
        ({"env": {"BAD NAME": "x"}}, "env name"),
        ({"resources": {"requests": {"memory": "lots"}}}, "'lots'"),
        ({"data_volume": "Data_Claim"}, "PersistentVolumeClaim name"),
        ({"secrets": ["Keys"]}, "Secret name"),
        ({"health_port": 70000}, "70000"),
    ],
)
def test_job_refusals_are_one_line(overrides: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        make_job(**overrides)
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


# -- the CronJob ---------------------------------------------------------------------------------------


def test_cronjob_wraps_the_job_with_schedule_zone_deadline_and_budget() -> None:
    job = make_job(namespace="agents", extra_args=("--create-job",))
    deadline = derive_total_timeout(95.4, 420, 180)
    assert deadline == 720  # 695.4 s rounded up to the next minute
    schedule = Schedule("0 9 * * 1-5", "Asia/Tokyo", budget_usd=2.5)
    cron = cronjob_manifest(schedule, job, deadline)
    spec = cron["spec"]
    assert cron["kind"] == "CronJob"
    assert cron["metadata"]["name"] == "reviewer"
    assert cron["metadata"]["namespace"] == "agents"
    assert spec["schedule"] == "0 9 * * 1-5"
    assert spec["timeZone"] == "Asia/Tokyo"
    assert spec["concurrencyPolicy"] == "Forbid"
    assert spec["startingDeadlineSeconds"] == 300
    assert spec["successfulJobsHistoryLimit"] == 3
    assert spec["failedJobsHistoryLimit"] == 3
    template = spec["jobTemplate"]["spec"]
    assert template["activeDeadlineSeconds"] == 720
    assert template["backoffLimit"] == 0
    env = env_of(cron)
    assert env["AGENTLIFE_BUDGET_MAX_COST_USD"] == "2.5"
    assert env["AGENTLIFE_RUN_MAX_SECONDS"] == str(720 - 65)  # the run gives up before Kubernetes kills it
    # The Job itself is untouched, and its pod spec is the template's apart from the added env.
    assert "activeDeadlineSeconds" not in job["spec"]
    assert {k: v for k, v in pod(cron).items() if k != "containers"} == {
        k: v for k, v in pod(job).items() if k != "containers"
    }


def test_cronjob_keeps_a_run_max_the_pod_already_has_and_replaces_the_budget() -> None:
    constants = Constants.from_env({"AGENTLIFE_RUN_MAX_SECONDS": "300", "AGENTLIFE_BUDGET_MAX_COST_USD": "1"})
    job = make_job(constants=constants)
    cron = cronjob_manifest(Schedule("0 9 * * *", "UTC", budget_usd=4.0), job, 600)
    env = env_of(cron)
    assert env["AGENTLIFE_RUN_MAX_SECONDS"] == "300"
    assert env["AGENTLIFE_BUDGET_MAX_COST_USD"] == "4"
    assert [e["name"] for e in container(cron)["env"]].count("AGENTLIFE_BUDGET_MAX_COST_USD") == 1


def test_starting_deadline_shrinks_for_close_runs_and_refuses_too_short() -> None:
    close = Schedule("0,20,40 * * * *", "UTC", min_interval_minutes=20)
    assert cronjob_manifest(close, make_job(), 600)["spec"]["startingDeadlineSeconds"] == 300
    closer = Schedule("*/5 * * * *", "UTC", min_interval_minutes=5)
    assert cronjob_manifest(closer, make_job(), 600)["spec"]["startingDeadlineSeconds"] == 150
    with pytest.raises(ConfigError, match="startingDeadlineSeconds 5"):
        cronjob_manifest(close, make_job(), 600, starting_deadline_seconds=5)


@pytest.mark.parametrize(
    ("job", "deadline", "needle"),
    [
        ({"kind": "Pod", "metadata": {"name": "x"}}, 600, "kind 'Pod'"),
        (None, 0, "activeDeadlineSeconds 0"),
        (None, 600.5, "whole number"),
    ],
)
def test_cronjob_refusals(job: dict[str, Any] | None, deadline: Any, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        cronjob_manifest(Schedule("0 9 * * *", "UTC"), job or make_job(), deadline)


def test_cronjob_name_leaves_room_for_the_controller_suffix() -> None:
    with pytest.raises(ConfigError, match="at most 52"):
        cronjob_manifest(Schedule("0 9 * * *", "UTC"), make_job(name="a" * 53), 600)


# -- the official schemas ------------------------------------------------------------------------------


def job_variants() -> list[dict[str, Any]]:
    overridden = Constants.from_env(
        {"AGENTLIFE_DRAIN_STEP_DEADLINE_SECONDS": "100", "AGENTLIFE_DRAIN_TERMINATION_GRACE_SECONDS": "120.5"}
    )
    return [
        make_job(),
        make_job(namespace="agents", data_volume="reviewer-data", secrets=["keys", "db.creds"]),
        make_job(constants=overridden, env={"DEPLOYMENT_ENV": "prod", "AGENTLIFE_JOB_ID": "job-42"}),
        make_job(constants=Constants.from_env({"AGENTLIFE_DRAIN_PRE_STOP_SECONDS": "0"}), health_port=9100),
        make_job(resources={"requests": {"cpu": "2", "memory": "1.5Gi"}, "limits": {"memory": "1.5Gi"}}),
    ]


def cronjob_variants() -> list[dict[str, Any]]:
    schedules = [
        Schedule("0 9 * * 1-5", "Asia/Tokyo", budget_usd=2.5),
        Schedule("30 1 * * *", "Europe/London"),
        Schedule("0 9,18 * * *", "America/New_York", budget_usd=10.0),
    ]
    jobs = job_variants()
    return [cronjob_manifest(s, jobs[i % len(jobs)], 720) for i, s in enumerate(schedules)]


def test_bundled_schemas_cover_the_versions_we_check() -> None:
    versions = kv_utils.all_versions()
    assert "1.27.0" in versions
    assert kv_utils.latest_version() in versions


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_generated_manifest_passes_the_official_schema(version: str) -> None:
    for manifest in job_variants() + cronjob_variants():
        assert kubernetes_validate.validate(manifest, version, strict=True) == version.rsplit(".", 1)[0]
        # What kubectl reads is the rendered text, not the dict.
        assert kubernetes_validate.validate(yaml.safe_load(to_yaml(manifest)), version, strict=True)


@pytest.mark.parametrize(
    "break_it",
    [
        lambda m: pod(m).update(restartPolicyy="Never"),
        lambda m: container(m).update(args="python -m agentlife run"),
        lambda m: pod(m).update(terminationGracePeriodSeconds="65"),
    ],
)
def test_schema_validation_catches_a_broken_manifest(break_it: Any) -> None:
    manifest = make_job()
    break_it(manifest)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(manifest, K8S_VERSIONS[0], strict=True)


# -- YAML output ---------------------------------------------------------------------------------------


def test_yaml_and_json_render_the_same_document() -> None:
    for manifest in job_variants() + cronjob_variants():
        assert yaml.safe_load(render(manifest, "yaml")) == manifest
        assert json.loads(render(manifest, "json")) == manifest
    with pytest.raises(ConfigError, match="'toml'"):
        render(make_job(), "toml")


def test_yaml_quotes_what_a_yaml_1_1_reader_would_misread() -> None:
    text = to_yaml({"a": "yes", "b": "0 9 * * *", "c": "08", "d": "*", "e": "on", "f": "1e3", "g": "a: b"})
    assert yaml.safe_load(text) == {
        "a": "yes",
        "b": "0 9 * * *",
        "c": "08",
        "d": "*",
        "e": "on",
        "f": "1e3",
        "g": "a: b",
    }
    assert 'a: "yes"' in text
    assert to_yaml({"k\n": "v\n"}) == '"k\\n": "v\\n"\n'


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text(max_size=8), json_values, max_size=5))
def test_yaml_round_trips_any_json_document(document: dict[str, Any]) -> None:
    assert yaml.safe_load(to_yaml(document)) == document


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


def manifest_handler(argv: list[str]) -> Any:
    """The ``manifest`` command in-process, through the same `register_cli` the real CLI calls."""
    parser = argparse.ArgumentParser()
    register_cli(parser.add_subparsers())
    args = parser.parse_args(["manifest", *argv])
    return lambda: args.handler(args)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--schedule", "*/5 * * * *", "--init-p95", "10", "--exec-p95", "10"], "60 min"),
        (
            ["--schedule", "0 9 * * *", "--timezone", "Mars/Olympus", "--init-p95", "1", "--exec-p95", "1"],
            "'Mars/Olympus'",
        ),
        (["--schedule", "0 9 * * *"], "--init-p95"),
        (
            ["--schedule", "0 9 * * *", "--init-p95", "1", "--exec-p95", "1", "--budget-usd", "12"],
            "system cap of 10.00 USD",
        ),
        (["--schedule", "0 9 * * *", "--init-p95", "-1", "--exec-p95", "1"], "--init-p95 -1"),
        (
            ["--schedule", "0 9 * * *", "--init-p95", "1", "--exec-p95", "1", "--from-journals", "x"],
            "not both",
        ),
        (["--schedule", "0 9 * * *", "--from-journals", "/nonexistent/agentlife"], "no session journals"),
        (["--timezone", "UTC"], "only apply with --schedule"),
        (["--suspend"], "--suspend only apply with --schedule"),
        (["--env", "NOVALUE"], "KEY=VALUE"),
        (["--budget-usd", "-3"], "--budget-usd -3"),
        (["--budget-usd", "2", "--env", "AGENTLIFE_BUDGET_MAX_COST_USD=3"], "once"),
    ],
)
def test_manifest_command_refusals(
    args: list[str], needle: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in [n for n in os.environ if n.startswith("AGENTLIFE_")]:
        monkeypatch.delenv(name)
    handler = manifest_handler(["--image", IMAGE, "--agent", AGENT, *args])
    with pytest.raises(ConfigError) as info:
        handler()
    assert needle in str(info.value)
    assert "\n" not in str(info.value)
    assert capsys.readouterr().out == ""


def test_manifest_command_warns_when_a_run_can_outlast_the_gap(capsys: pytest.CaptureFixture[str]) -> None:
    handler = manifest_handler(
        [
            "--image",
            IMAGE,
            "--agent",
            AGENT,
            "--schedule",
            "0 * * * *",
            "--init-p95",
            "60",
            "--exec-p95",
            "3600",
        ]
    )
    assert handler() == 0
    captured = capsys.readouterr()
    assert "activeDeadlineSeconds: 3840" in captured.out
    assert "warning" in captured.err
    assert "3840 s" in captured.err


def test_a_paused_schedule_renders_suspend_true_and_a_valid_cronjob(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = [
        "--image",
        IMAGE,
        "--agent",
        AGENT,
        "--schedule",
        "0 * * * *",
        "--init-p95",
        "6",
        "--exec-p95",
        "60",
    ]
    assert manifest_handler(args)() == 0
    assert yaml.safe_load(capsys.readouterr().out)["spec"]["suspend"] is False
    assert manifest_handler([*args, "--suspend"])() == 0
    paused = yaml.safe_load(capsys.readouterr().out)
    assert paused["spec"]["suspend"] is True
    kubernetes_validate.validate(paused, K8S_VERSIONS[-1], strict=True)


def test_schedule_errors_are_config_errors() -> None:
    assert issubclass(ScheduleError, ConfigError)


@pytest.mark.parametrize(
    "value",
    [
        "postgresql://agent:hun ter2@db/x",
        "postgresql://agent:it's\"q@db/x",
        "redis://:s p a c e@cache:6379/0",
    ],
)
def test_an_env_url_whose_password_holds_spaces_or_quotes_is_refused(value: str) -> None:
    with pytest.raises(ConfigError, match="--secret"):
        make_job(env={"DSN": value})


def test_an_env_url_without_a_password_is_kept() -> None:
    env = make_job(env={"HOOK": "https://hooks.example:443/x?notify=ops@example.com"})
    assert "https://hooks.example:443/x?notify=ops@example.com" in json.dumps(env)
