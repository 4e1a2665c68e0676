"""``python -m agentlife manifest``: the Kubernetes Job or CronJob derived from the constants."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentlife._cli._run import _parse_payload
from agentlife._config import DEFAULT_HEALTH_PORT, llm_provider_from_env, validate_payload
from agentlife._exceptions import ConfigError
from agentlife._manifest import (
    CRONJOB_NAME_MAX,
    DEFAULT_RESOURCES,
    WORKER_COMMAND,
    cronjob_manifest,
    env_number,
    job_manifest,
    render,
    worker_manifest,
)
from agentlife._ratelimit import rate_limits_from_env
from agentlife.constants import Constants


def register(subparsers: Any) -> None:
    """Add ``manifest`` to the ``python -m agentlife`` parser."""
    parser = subparsers.add_parser(
        "manifest",
        help="print the Kubernetes Job (or, with --schedule, CronJob) for an agent",
        description="Print a batch/v1 Job whose grace period, preStop sleep and probes are derived from the "
        "constants (AGENTLIFE_* overrides from the environment and --env apply). With --schedule, print a "
        "batch/v1 CronJob running that Job on a cron schedule in a time zone.",
    )
    parser.add_argument("--image", required=True, help="container image, e.g. ghcr.io/acme/reviewer:1.4.2")
    parser.add_argument("--agent", required=True, metavar="MODULE:CLASS", help="the AgentProcess subclass")
    parser.add_argument("--name", help="Job/CronJob name (default: derived from the class name)")
    parser.add_argument("--namespace", help="namespace (default: none, kubectl's current namespace)")
    parser.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="extra env (repeatable)"
    )
    parser.add_argument(
        "--secret",
        action="append",
        default=[],
        metavar="NAME",
        help="a Secret whose keys become env, e.g. the API key (repeatable)",
    )
    parser.add_argument("--cpu", help="CPU request, e.g. 500m (default: 500m)")
    parser.add_argument("--memory", help="memory request and limit, e.g. 1Gi (default: 512Mi)")
    parser.add_argument("--pvc", metavar="CLAIM", help="PersistentVolumeClaim for /data (default: emptyDir)")
    parser.add_argument(
        "--health-port",
        type=int,
        default=DEFAULT_HEALTH_PORT,
        help=f"probe port (default: {DEFAULT_HEALTH_PORT})",
    )
    parser.add_argument(
        "--payload",
        metavar="JSON",
        help="the job payload, passed to run --payload: with --schedule, every run's row carries it",
    )
    parser.add_argument(
        "--output", "-o", choices=("yaml", "json"), default="yaml", help="format (default: yaml)"
    )
    scheduled = parser.add_argument_group("scheduled runs (CronJob)")
    scheduled.add_argument("--schedule", metavar="CRON", help="5-field cron, e.g. '0 9 * * 1-5'")
    scheduled.add_argument("--timezone", metavar="ZONE", help="IANA zone for --schedule (default: UTC)")
    scheduled.add_argument("--init-p95", type=float, metavar="S", help="p95 of boot + hydration, seconds")
    scheduled.add_argument("--exec-p95", type=float, metavar="S", help="p95 of execution, seconds")
    scheduled.add_argument(
        "--safety-buffer",
        type=float,
        metavar="S",
        help="added to the p95s (default: 180, as for 'budget')",
    )
    scheduled.add_argument(
        "--from-journals", metavar="DIR", help="read both p95s from the session journals in DIR"
    )
    scheduled.add_argument(
        "--budget-usd",
        type=float,
        metavar="USD",
        help="per-run cost budget (default: AGENTLIFE_BUDGET_MAX_COST_USD, 5.00)",
    )
    scheduled.add_argument(
        "--starting-deadline",
        type=int,
        metavar="S",
        help="startingDeadlineSeconds (default: 300, or half the closest gap if shorter)",
    )
    scheduled.add_argument(
        "--suspend",
        action="store_true",
        help="render the schedule paused (suspend: true): no run starts until it is set to false",
    )
    pool = parser.add_argument_group("warm workers (Deployment)")
    pool.add_argument(
        "--worker",
        action="store_true",
        help="print an apps/v1 Deployment of 'python -m agentlife worker' pods instead of a Job",
    )
    pool.add_argument("--replicas", type=int, metavar="N", help="workers (default: 2)")
    pool.add_argument("--idle-timeout", type=float, metavar="S", help="the workers' --idle-timeout")
    pool.add_argument("--max-jobs", type=int, metavar="N", help="the workers' --max-jobs")
    parser.set_defaults(handler=_cmd_manifest)


def _rate_limit_env(env: dict[str, str]) -> dict[str, str]:
    """The fleet's rate limits (``AGENTLIFE_RATE_LIMIT_*`` of the shell or ``--env``) for the pod, checked.

    Raises:
        ConfigError: a bad limit, named as the pod would name it at boot.
    """
    limits = {k: v for k, v in env.items() if k.startswith("AGENTLIFE_RATE_LIMIT_")}
    rate_limits_from_env(limits, llm_provider_from_env(env))
    return limits


def _cmd_manifest(args: argparse.Namespace) -> int:
    extra_env = _parse_env_flags(args.env)
    if args.budget_usd is not None:
        if "AGENTLIFE_BUDGET_MAX_COST_USD" in extra_env:
            raise ConfigError(
                "give the per-run budget once: --budget-usd or --env AGENTLIFE_BUDGET_MAX_COST_USD"
            )
        if not math.isfinite(args.budget_usd) or args.budget_usd <= 0:
            raise ConfigError(f"--budget-usd {args.budget_usd:g} is refused: it must be a finite number > 0")
        extra_env["AGENTLIFE_BUDGET_MAX_COST_USD"] = env_number(args.budget_usd)
    extra_env.update(_rate_limit_env({**os.environ, **extra_env}))
    if args.worker:
        return _worker_deployment(args, extra_env)
    _refuse_worker_options(args)
    # The constants the pod will run with: the shell's AGENTLIFE_* overrides, then --env on top. Those that
    # differ from the defaults reach the pod through `constants_env`.
    constants = Constants.from_env({**os.environ, **extra_env})
    scheduled = args.schedule is not None
    run_args: tuple[str, ...] = ("--create-job",) if scheduled else ()
    if args.payload is not None:
        run_args += ("--payload", _payload_arg(args.payload))
    job = job_manifest(
        name=args.name or _default_name(args.agent),
        image=args.image,
        agent_class=args.agent,
        extra_args=run_args,
        namespace=args.namespace,
        env=extra_env,
        secrets=args.secret,
        resources=_resources(args.cpu, args.memory),
        data_volume=args.pvc,
        constants=constants,
        health_port=args.health_port,
    )
    if not scheduled:
        _refuse_schedule_options(args)
        sys.stdout.write(render(job, args.output))
        return 0
    from agentlife._schedule import Schedule

    schedule = Schedule(args.schedule, args.timezone or "UTC", budget_usd=constants.budget.max_cost_usd)
    deadline = _active_deadline(args)
    cronjob = cronjob_manifest(
        schedule, job, deadline, starting_deadline_seconds=args.starting_deadline, suspend=args.suspend
    )
    if deadline > schedule.min_gap().total_seconds():
        sys.stderr.write(
            f"agentlife: warning: a run may take {deadline} s, longer than the closest gap between runs "
            f"({int(schedule.min_gap().total_seconds())} s); with concurrencyPolicy Forbid the next run "
            "is skipped\n"
        )
    sys.stdout.write(render(cronjob, args.output))
    return 0


def _payload_arg(raw: str) -> str:
    """``--payload`` checked as ``run`` will check it, and written compactly for the container's args."""
    payload = validate_payload(_parse_payload(raw))
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _parse_env_flags(pairs: Sequence[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--env {pair!r} is not KEY=VALUE")
        env[key] = value
    return env


def _resources(cpu: str | None, memory: str | None) -> dict[str, dict[str, str]]:
    requests = dict(DEFAULT_RESOURCES["requests"])
    limits = dict(DEFAULT_RESOURCES["limits"])
    if cpu is not None:
        requests["cpu"] = cpu
    if memory is not None:
        # Memory request = limit: the pod is never OOM-killed for using what it was promised.
        requests["memory"] = limits["memory"] = memory
    return {"requests": requests, "limits": limits}


def _default_name(agent: str) -> str:
    class_name = agent.rpartition(":")[2].rpartition(".")[2]
    words = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", class_name).lower()
    name = re.sub(r"[^a-z0-9-]+", "-", words).strip("-")[:CRONJOB_NAME_MAX].strip("-")
    return name or "agent"


def _refuse_schedule_options(args: argparse.Namespace) -> None:
    given = [
        flag
        for flag, value in (
            ("--timezone", args.timezone),
            ("--init-p95", args.init_p95),
            ("--exec-p95", args.exec_p95),
            ("--safety-buffer", args.safety_buffer),
            ("--from-journals", args.from_journals),
            ("--starting-deadline", args.starting_deadline),
            ("--suspend", args.suspend or None),
        )
        if value is not None
    ]
    if given:
        raise ConfigError(f"{', '.join(given)} only apply with --schedule")


def _active_deadline(args: argparse.Namespace) -> int:
    """``activeDeadlineSeconds`` from the phase budget: p95s (given or from journals) plus the buffer."""
    from agentlife.stores._policy import (
        DEFAULT_SAFETY_BUFFER_SECONDS,
        derive_total_timeout,
        p95_from_journals,
    )

    buffer = args.safety_buffer if args.safety_buffer is not None else DEFAULT_SAFETY_BUFFER_SECONDS
    if args.from_journals is not None:
        if args.init_p95 is not None or args.exec_p95 is not None:
            raise ConfigError("give the p95s either as --init-p95/--exec-p95 or --from-journals, not both")
        init_p95, exec_p95 = p95_from_journals(Path(args.from_journals))
    elif args.init_p95 is not None and args.exec_p95 is not None:
        init_p95, exec_p95 = args.init_p95, args.exec_p95
    else:
        raise ConfigError(
            "--schedule needs the phase budget for activeDeadlineSeconds: --init-p95 S and --exec-p95 S, "
            "or --from-journals DIR"
        )
    for flag, value in (("--init-p95", init_p95), ("--exec-p95", exec_p95), ("--safety-buffer", buffer)):
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"{flag} {value:g} is refused: it must be a finite number of seconds >= 0")
    return int(derive_total_timeout(init_p95, exec_p95, buffer))


def _worker_deployment(args: argparse.Namespace, extra_env: dict[str, str]) -> int:
    """``--worker``: the Deployment of warm workers, its pod derived from the constants like the Job's."""
    if args.schedule is not None:
        raise ConfigError("--worker and --schedule exclude each other: a worker takes jobs from the store")
    _refuse_schedule_options(args)
    job = job_manifest(
        name=args.name or _default_name(args.agent),
        image=args.image,
        agent_class=args.agent,
        command=WORKER_COMMAND,
        namespace=args.namespace,
        env=extra_env,
        secrets=args.secret,
        resources=_resources(args.cpu, args.memory),
        data_volume=args.pvc,
        constants=Constants.from_env({**os.environ, **extra_env}),
        health_port=args.health_port,
    )
    deployment = worker_manifest(
        job,
        replicas=2 if args.replicas is None else args.replicas,
        idle_timeout=args.idle_timeout,
        max_jobs=args.max_jobs,
    )
    sys.stdout.write(render(deployment, args.output))
    return 0


def _refuse_worker_options(args: argparse.Namespace) -> None:
    given = [
        flag
        for flag, value in (
            ("--replicas", args.replicas),
            ("--idle-timeout", args.idle_timeout),
            ("--max-jobs", args.max_jobs),
        )
        if value is not None
    ]
    if given:
        raise ConfigError(f"{', '.join(given)} only apply with --worker")
