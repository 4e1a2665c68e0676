"""Kubernetes manifests derived from the constants: a batch/v1 Job, and a CronJob for scheduled runs.

``python -m agentlife manifest`` prints them. Everything timing-related comes from
`agentlife.constants.Constants` — the same values the runtime reads — so the pod spec and the process cannot
disagree: ``terminationGracePeriodSeconds`` is the drain's termination grace, the preStop hook sleeps the
drain's pre-stop time, the probe blocks are the probe constants, and every constant that differs from its
default travels to the container as its ``AGENTLIFE_*`` variable. A set of constants that breaks an
invariant raises `InvariantViolation` before any manifest exists.

The functions here are pure: they build plain dicts. `to_yaml` writes them as block YAML without PyYAML
(every string that could be read as anything else is double-quoted), `render` as YAML or JSON; ``kubectl
apply -f`` takes either.
"""

from __future__ import annotations

import copy
import json
import math
import re
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from agentlife._config import DEFAULT_HEALTH_PORT
from agentlife._exceptions import ConfigError
from agentlife.constants import Constants

if TYPE_CHECKING:
    from agentlife._schedule import Schedule

__all__ = [
    "DATA_MOUNT",
    "DEFAULT_COMMAND",
    "RUN_AS_USER",
    "constants_env",
    "cronjob_manifest",
    "job_manifest",
    "render",
    "to_yaml",
    "worker_manifest",
]

#: What the container runs, before the ``MODULE:CLASS`` argument. It goes to the container's ``args``, so the
#: image's ENTRYPOINT (an init such as tini, see examples/deploy/) stays PID 1.
DEFAULT_COMMAND: tuple[str, ...] = ("python", "-m", "agentlife", "run")
#: What a worker Deployment's container runs, before the ``MODULE:CLASS`` argument.
WORKER_COMMAND: tuple[str, ...] = ("python", "-m", "agentlife", "worker")
#: Where the data volume is mounted; ``AGENTLIFE_DATA_DIR`` points there.
DATA_MOUNT = "/data"
#: The non-root user and group the pod runs as (matches examples/deploy/Dockerfile).
RUN_AS_USER = 10001

DEFAULT_RESOURCES: Mapping[str, Mapping[str, str]] = {
    "requests": {"cpu": "500m", "memory": "512Mi"},
    "limits": {"memory": "512Mi"},
}
_TMP_SIZE_LIMIT = "256Mi"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_AGENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_SECRET_NAME = re.compile(r"(API_?KEY|_TOKEN$|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"://[^:/@\s]*:[^@\s/]+@")
# Set by the manifest itself: the data volume and the probe port must match what the pod spec declares.
_RESERVED_ENV = ("AGENTLIFE_DATA_DIR", "AGENTLIFE_HEALTH_PORT")
CRONJOB_NAME_MAX = 52  # the CronJob controller appends "-<minutes since epoch>" to make a Job name
_JOB_NAME_MAX = 63


# -- the Job -------------------------------------------------------------------------------------------


def job_manifest(
    *,
    name: str,
    image: str,
    agent_class: str,
    command: Sequence[str] = DEFAULT_COMMAND,
    extra_args: Sequence[str] = (),
    namespace: str | None = None,
    env: Mapping[str, str] | None = None,
    secrets: Sequence[str] = (),
    resources: Mapping[str, Mapping[str, str]] | None = None,
    data_volume: str | None = None,
    constants: Constants | None = None,
    health_port: int = DEFAULT_HEALTH_PORT,
) -> dict[str, Any]:
    """A batch/v1 Job that runs one attempt of one agent job.

    Args:
        name: the Job's name (a DNS label); the pod reads it as its ``AGENTLIFE_JOB_ID`` unless ``env``
            sets one.
        image: the container image.
        agent_class: ``MODULE:CLASS`` of the `AgentProcess` subclass.
        command: the program and its leading arguments; ``agent_class`` and ``extra_args`` follow.
        extra_args: further arguments of ``run`` (e.g. ``("--create-job",)``).
        namespace: the namespace, or ``None`` to leave it to ``kubectl``'s context.
        env: extra environment variables (plain values: put secrets in a Secret and name it in ``secrets``).
        secrets: names of Secrets whose keys become environment variables (``envFrom``).
        resources: the container's ``requests``/``limits``; default 500m CPU, 512Mi memory (limit 512Mi).
        data_volume: a PersistentVolumeClaim name for ``/data``; ``None`` gives an ``emptyDir``.
        constants: the timings to derive from (default: the design defaults).
        health_port: the probe server's port, also passed as ``AGENTLIFE_HEALTH_PORT``.

    Raises:
        ConfigError: an argument Kubernetes (or the runtime) would refuse, with one line saying which.
        InvariantViolation: ``constants`` break an invariant (raised when they are built).
    """
    constants = constants if constants is not None else Constants()
    constants.check()
    _check_name(name, _JOB_NAME_MAX, "Job name")
    if namespace is not None:
        _check_name(namespace, 63, "namespace")
    if not image or any(c.isspace() for c in image):
        raise ConfigError(f"image {image!r} is refused: give an image reference without spaces")
    if not _AGENT.fullmatch(agent_class):
        raise ConfigError(f"agent {agent_class!r} is not MODULE:CLASS (e.g. my_agent:MyAgent)")
    if not 1 <= health_port <= 65535:
        raise ConfigError(f"health port {health_port} is refused: it must be between 1 and 65535")
    labels = {
        "app.kubernetes.io/name": "agentlife",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": "agent",
    }
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    metadata["labels"] = dict(labels)
    metadata["annotations"] = {"agentlife/agent": agent_class}
    pod_spec = _pod_spec(
        image=image,
        args=[*command, agent_class, *extra_args],
        env=_container_env(constants, dict(env or {}), health_port),
        secrets=secrets,
        resources=_check_resources(resources if resources is not None else DEFAULT_RESOURCES),
        data_volume=data_volume,
        constants=constants,
        health_port=health_port,
    )
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            # One pod is one attempt: retries belong to the control plane, which knows the job row.
            "backoffLimit": 0,
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
        },
    }


def _pod_spec(
    *,
    image: str,
    args: list[str],
    env: list[dict[str, Any]],
    secrets: Sequence[str],
    resources: dict[str, dict[str, str]],
    data_volume: str | None,
    constants: Constants,
    health_port: int,
) -> dict[str, Any]:
    drain = constants.drain
    container: dict[str, Any] = {
        "name": "agent",
        "image": image,
        "args": args,
        "env": env,
    }
    if secrets:
        for secret in secrets:
            _check_name(secret, 253, "Secret name", subdomain=True)
        container["envFrom"] = [{"secretRef": {"name": secret}} for secret in secrets]
    container["ports"] = [{"name": "health", "containerPort": health_port, "protocol": "TCP"}]
    container["resources"] = resources
    container["securityContext"] = {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if drain.pre_stop_seconds > 0:
        # Endpoints and load balancers stop routing to the pod while it sleeps; SIGTERM comes after.
        container["lifecycle"] = {
            "preStop": {"exec": {"command": ["sleep", env_number(drain.pre_stop_seconds)]}}
        }
    container.update(_probes(constants))
    container["volumeMounts"] = [
        {"name": "data", "mountPath": DATA_MOUNT},
        {"name": "tmp", "mountPath": "/tmp"},  # the only writable path besides /data
    ]
    if data_volume is None:
        data: dict[str, Any] = {"name": "data", "emptyDir": {}}
    else:
        _check_name(data_volume, 253, "PersistentVolumeClaim name", subdomain=True)
        data = {"name": "data", "persistentVolumeClaim": {"claimName": data_volume}}
    return {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        # preStop + step deadline + cleanup + SIGKILL buffer fit in it: the drain invariant of the constants.
        "terminationGracePeriodSeconds": math.ceil(drain.termination_grace_seconds),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER,
            "fsGroup": RUN_AS_USER,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [data, {"name": "tmp", "emptyDir": {"sizeLimit": _TMP_SIZE_LIMIT}}],
    }


def _probes(constants: Constants) -> dict[str, Any]:
    p = constants.probe
    return {
        "startupProbe": _probe(
            "/healthz", p.startup_period_seconds, p.startup_failure_threshold, p.liveness_timeout_seconds
        ),
        "livenessProbe": _probe(
            "/healthz", p.liveness_period_seconds, p.liveness_failure_threshold, p.liveness_timeout_seconds
        ),
        "readinessProbe": _probe(
            "/readyz", p.readiness_period_seconds, p.readiness_failure_threshold, p.readiness_timeout_seconds
        ),
    }


def _probe(path: str, period: float, failures: int, timeout: float) -> dict[str, Any]:
    # Kubernetes takes whole seconds, at least 1; rounding up never shortens a window the runtime relies on.
    return {
        "httpGet": {"path": path, "port": "health"},
        "periodSeconds": max(1, math.ceil(period)),
        "timeoutSeconds": max(1, math.ceil(timeout)),
        "failureThreshold": max(1, int(failures)),
    }


def _container_env(constants: Constants, extra: dict[str, str], health_port: int) -> list[dict[str, Any]]:
    for key, value in extra.items():
        _check_env_entry(key, value)
    actual = _constant_values(constants)
    for key, value in extra.items():
        if key in actual and not _same_number(value, actual[key]):
            raise ConfigError(
                f"env {key}={value} disagrees with the constants the manifest was derived from "
                f"({actual[key]})"
            )
    derived = constants_env(constants)
    env: dict[str, dict[str, Any]] = {}
    if "AGENTLIFE_JOB_ID" not in extra:
        # The Job controller labels its pods with the Job's name; a CronJob's Jobs get one name per run.
        env["AGENTLIFE_JOB_ID"] = {
            "name": "AGENTLIFE_JOB_ID",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['job-name']"}},
        }
    env["AGENTLIFE_DATA_DIR"] = {"name": "AGENTLIFE_DATA_DIR", "value": DATA_MOUNT}
    env["AGENTLIFE_HEALTH_PORT"] = {"name": "AGENTLIFE_HEALTH_PORT", "value": str(health_port)}
    for key, value in {**derived, **extra}.items():
        env[key] = {"name": key, "value": value}
    return list(env.values())


def _check_env_entry(key: str, value: str) -> None:
    if not _ENV_NAME.fullmatch(key):
        raise ConfigError(f"env name {key!r} is refused: use letters, digits, '_', '-' and '.'")
    if key in _RESERVED_ENV:
        raise ConfigError(f"env {key} is set by the manifest itself (the /data volume and the probe port)")
    if _SECRET_NAME.search(key) or _URL_PASSWORD.search(value) or _has_url_password(value):
        raise ConfigError(
            f"env {key} looks like a secret and would be written into the manifest in clear; "
            "store it in a Secret and pass --secret NAME instead"
        )
    if key == "AGENTLIFE_HEALTH_HOST" and value.strip() in ("127.0.0.1", "localhost", "::1"):
        raise ConfigError(f"env AGENTLIFE_HEALTH_HOST={value} would hide the probes from the kubelet")


def _has_url_password(value: str) -> bool:
    """Whether ``value`` is a URL with a password, even one holding spaces or quotes the pattern stops at."""
    try:
        return urllib.parse.urlsplit(value.strip()).password is not None
    except ValueError:  # an unclosed "[" of an IPv6 host
        return False


def constants_env(constants: Constants) -> dict[str, str]:
    """Every constant that differs from its default, as the ``AGENTLIFE_*`` variable the runtime reads."""
    defaults = _constant_values(Constants())
    return {name: value for name, value in _constant_values(constants).items() if defaults[name] != value}


def _constant_values(constants: Constants) -> dict[str, str]:
    """Every constant that has an ``AGENTLIFE_*`` variable, keyed by that variable, written as it would be."""
    out: dict[str, str] = {}
    for group_field in fields(constants):
        if group_field.name == "time_scale":
            continue
        group = getattr(constants, group_field.name)
        for f in fields(group):
            name = f.metadata.get("env")
            if name is not None:
                value = getattr(group, f.name)
                out[name] = "none" if value is None else env_number(value)
    return dict(sorted(out.items()))


def env_number(value: float) -> str:
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def _same_number(text: str, expected: str) -> bool:
    try:
        return math.isclose(float(text), float(expected))
    except ValueError:
        return text.strip().lower() == expected


def _check_resources(resources: Mapping[str, Mapping[str, str]]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for kind, amounts in resources.items():
        if kind not in ("requests", "limits"):
            raise ConfigError(f"resources key {kind!r} is refused: use 'requests' and 'limits'")
        for resource, quantity in amounts.items():
            if not _QUANTITY.fullmatch(str(quantity)):
                raise ConfigError(
                    f"{resource} quantity {quantity!r} is not a Kubernetes quantity (e.g. 500m, 1Gi)"
                )
        out[kind] = {k: str(v) for k, v in amounts.items()}
    return out


def _check_name(name: str, limit: int, what: str, *, subdomain: bool = False) -> None:
    parts = name.split(".") if subdomain else [name]
    if not name or len(name) > limit or not all(_DNS_LABEL.fullmatch(part) for part in parts):
        raise ConfigError(
            f"{what} {name!r} is refused: it must be at most {limit} lowercase letters, digits and '-'"
            f"{', dots between parts' if subdomain else ''}, starting and ending with a letter or digit"
        )


# -- the CronJob ---------------------------------------------------------------------------------------


def worker_manifest(
    job: Mapping[str, Any],
    *,
    replicas: int = 2,
    idle_timeout: float | None = None,
    max_jobs: int | None = None,
) -> dict[str, Any]:
    """An apps/v1 Deployment of warm workers (``python -m agentlife worker``) built from ``job``'s pod.

    The pod keeps what `job_manifest` derived from the constants (grace period, preStop, probes, security,
    volumes) with the worker command, ``restartPolicy: Always`` and no ``AGENTLIFE_JOB_ID``: each worker
    claims its jobs from the store. ``/readyz`` answers 200 only while a worker is idle, so a busy pod is
    unready, never restarted for it.

    Args:
        job: a `job_manifest` (built with ``command=WORKER_COMMAND``).
        replicas: the number of workers (an autoscaler may own it instead).
        idle_timeout: ``--idle-timeout`` of the workers; None keeps the worker's default. Under a Deployment
            a worker that exits is restarted, so leave it unset unless an autoscaler scales to zero.
        max_jobs: ``--max-jobs``: recycle each worker process after that many jobs.

    Raises:
        ConfigError: ``replicas`` < 0, ``idle_timeout`` <= 0 or ``max_jobs`` < 1.
    """
    if replicas < 0:
        raise ConfigError(f"replicas {replicas} is refused: it must be >= 0")
    extra: list[str] = []
    if idle_timeout is not None:
        if not idle_timeout > 0:
            raise ConfigError(f"idle timeout {idle_timeout:g} is refused: it must be > 0 seconds")
        extra += ["--idle-timeout", env_number(idle_timeout)]
    if max_jobs is not None:
        if max_jobs < 1:
            raise ConfigError(f"max jobs {max_jobs} is refused: it must be >= 1")
        extra += ["--max-jobs", str(max_jobs)]
    metadata = copy.deepcopy(dict(job["metadata"]))
    labels = {**metadata["labels"], "app.kubernetes.io/component": "worker"}
    metadata["labels"] = labels
    pod = copy.deepcopy(dict(job["spec"]["template"]["spec"]))
    pod["restartPolicy"] = "Always"
    [container] = pod["containers"]
    container["name"] = "worker"
    container["args"] = [*container["args"], *extra]
    container["env"] = [e for e in container["env"] if e["name"] != "AGENTLIFE_JOB_ID"]
    selector = {k: labels[k] for k in ("app.kubernetes.io/name", "app.kubernetes.io/instance")}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod},
        },
    }


def cronjob_manifest(
    schedule: Schedule,
    job: Mapping[str, Any],
    active_deadline_seconds: int,
    *,
    starting_deadline_seconds: int | None = None,
    successful_jobs_history_limit: int = 3,
    failed_jobs_history_limit: int = 3,
    suspend: bool = False,
) -> dict[str, Any]:
    """A batch/v1 CronJob that runs ``job`` (a `job_manifest`) on ``schedule``.

    Args:
        schedule: the validated schedule; its zone becomes ``spec.timeZone`` (Kubernetes >= 1.27) and its
            per-run budget, when set, the pod's ``AGENTLIFE_BUDGET_MAX_COST_USD``.
        job: the Job whose spec becomes the job template.
        active_deadline_seconds: the wall-clock limit of one run, from the phase budget
            (``derive_total_timeout``). When the pod does not set ``AGENTLIFE_RUN_MAX_SECONDS``, it gets
            this minus the termination grace, so the run fails itself (and records why) before Kubernetes
            kills it.
        starting_deadline_seconds: how late a run may still start (default: 300 s, or half the closest
            gap between runs if that is shorter); a run missed by more is skipped, not run late.
        successful_jobs_history_limit: finished Jobs (and their pods' logs) kept.
        failed_jobs_history_limit: failed Jobs kept.
        suspend: the schedule paused (``suspend: true``): the controller starts no run until it is false;
            then a run missed by less than ``starting_deadline_seconds`` starts, older ones never do.

    Raises:
        ConfigError: a value Kubernetes would refuse.
    """
    if job.get("kind") != "Job":
        raise ConfigError(f"the job template must be a Job manifest, got kind {job.get('kind')!r}")
    name = str(job["metadata"]["name"])
    _check_name(name, CRONJOB_NAME_MAX, "CronJob name")
    if isinstance(active_deadline_seconds, bool) or not isinstance(active_deadline_seconds, int):
        raise ConfigError(
            f"activeDeadlineSeconds {active_deadline_seconds!r} must be a whole number of seconds"
        )
    if active_deadline_seconds < 1:
        raise ConfigError(f"activeDeadlineSeconds {active_deadline_seconds} must be >= 1")
    gap_seconds = int(schedule.min_gap().total_seconds())
    if starting_deadline_seconds is None:
        starting_deadline_seconds = max(10, min(300, gap_seconds // 2))
    if starting_deadline_seconds < 10:
        raise ConfigError(
            f"startingDeadlineSeconds {starting_deadline_seconds} is refused: the CronJob controller "
            "checks every 10 s, so a deadline under 10 s can miss runs"
        )
    for label, limit in (
        ("successful", successful_jobs_history_limit),
        ("failed", failed_jobs_history_limit),
    ):
        if limit < 0:
            raise ConfigError(f"{label}JobsHistoryLimit {limit} must be >= 0")
    job_spec = copy.deepcopy(dict(job["spec"]))
    job_spec.pop("activeDeadlineSeconds", None)
    job_spec = {"activeDeadlineSeconds": active_deadline_seconds, **job_spec}
    pod = job_spec["template"]["spec"]
    run_max = active_deadline_seconds - int(pod.get("terminationGracePeriodSeconds", 0))
    for container in pod["containers"]:
        if schedule.budget_usd is not None:
            _set_env(container, "AGENTLIFE_BUDGET_MAX_COST_USD", env_number(schedule.budget_usd))
        if run_max > 0 and not _has_env(container, "AGENTLIFE_RUN_MAX_SECONDS"):
            _set_env(container, "AGENTLIFE_RUN_MAX_SECONDS", str(run_max))
    metadata = {
        k: copy.deepcopy(v) for k, v in job["metadata"].items() if k in ("name", "namespace", "labels")
    }
    metadata["annotations"] = {
        **dict(job["metadata"].get("annotations", {})),
        "agentlife/schedule": f"{schedule.cron} ({schedule.timezone})",
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": metadata,
        "spec": {
            "schedule": schedule.cron,
            "timeZone": schedule.timezone,
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": starting_deadline_seconds,
            "successfulJobsHistoryLimit": successful_jobs_history_limit,
            "failedJobsHistoryLimit": failed_jobs_history_limit,
            "suspend": bool(suspend),
            "jobTemplate": {
                "metadata": {"labels": copy.deepcopy(dict(job["metadata"].get("labels", {})))},
                "spec": job_spec,
            },
        },
    }


def _has_env(container: Mapping[str, Any], name: str) -> bool:
    return any(entry.get("name") == name for entry in container.get("env", []))


def _set_env(container: dict[str, Any], name: str, value: str) -> None:
    env = container.setdefault("env", [])
    for entry in env:
        if entry.get("name") == name:
            entry.clear()
            entry.update({"name": name, "value": value})
            return
    env.append({"name": name, "value": value})


# -- output --------------------------------------------------------------------------------------------

_PLAIN = re.compile(r"^[A-Za-z][A-Za-z0-9_./-]*$")
# Words YAML 1.1 readers (PyYAML, go-yaml v2 behind kubectl) take for booleans or null.
_RESERVED_WORDS = frozenset(["y", "n", "yes", "no", "on", "off", "true", "false", "null"])


def to_yaml(document: Mapping[str, Any]) -> str:
    """Block-style YAML for a JSON-like mapping, deterministic and readable by any YAML 1.1/1.2 parser.

    Strings are written plain only when they cannot be read as another type (letters, digits, ``_./-``,
    starting with a letter, not a YAML boolean word); everything else is double-quoted with JSON escapes,
    which YAML shares.
    """
    if not document:
        return "{}\n"
    lines: list[str] = []
    _emit_mapping(document, 0, lines)
    return "\n".join(lines) + "\n"


def render(document: Mapping[str, Any], output: str = "yaml") -> str:
    """``document`` as ``"yaml"`` (default) or ``"json"`` text, ending in a newline."""
    if output == "json":
        return json.dumps(document, indent=2) + "\n"
    if output == "yaml":
        return to_yaml(document)
    raise ConfigError(f"output {output!r} is refused: use 'yaml' or 'json'")


def _emit_mapping(mapping: Mapping[str, Any], indent: int, lines: list[str]) -> None:
    pad = " " * indent
    for key, value in mapping.items():
        head = f"{pad}{_scalar(str(key))}:"
        if isinstance(value, Mapping) and value:
            lines.append(head)
            _emit_mapping(value, indent + 2, lines)
        elif isinstance(value, (list, tuple)) and value:
            lines.append(head)
            _emit_sequence(value, indent, lines)
        else:
            lines.append(f"{head} {_scalar(value)}")


def _emit_sequence(items: Sequence[Any], indent: int, lines: list[str]) -> None:
    pad = " " * indent
    for item in items:
        if isinstance(item, (Mapping, list, tuple)) and item:
            first = len(lines)
            if isinstance(item, Mapping):
                _emit_mapping(item, indent + 2, lines)
            else:
                _emit_sequence(item, indent + 2, lines)
            lines[first] = f"{pad}- {lines[first][indent + 2 :]}"
        else:
            lines.append(f"{pad}- {_scalar(item)}")


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"{value!r} cannot be written to a manifest")
        return repr(value)
    if isinstance(value, Mapping):
        return "{}"
    if isinstance(value, (list, tuple)):
        return "[]"
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in _RESERVED_WORDS:
        return text
    return _double_quoted(text)


_NAMED_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _double_quoted(text: str) -> str:
    """A YAML double-quoted scalar; YAML's escapes, since JSON's surrogate pairs mean nothing to YAML."""
    out = ['"']
    for char in text:
        code = ord(char)
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif char in _NAMED_ESCAPES:
            out.append(_NAMED_ESCAPES[char])
        elif _printable(code):
            out.append(char)
        elif code <= 0xFF:
            out.append(f"\\x{code:02x}")
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def _printable(code: int) -> bool:
    # YAML's printable set, minus the characters a YAML 1.1 reader treats as line breaks or strips (BOM).
    if 0x20 <= code <= 0x7E:
        return True
    if code in (0x2028, 0x2029, 0xFEFF):
        return False
    return 0xA0 <= code <= 0xD7FF or 0xE000 <= code <= 0xFFFD or 0x10000 <= code <= 0x10FFFF
