"""Process configuration read from the environment."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from agentlife._exceptions import ConfigError
from agentlife._providers import DEFAULT_PROVIDER, PROVIDERS
from agentlife._ratelimit import RateLimits, rate_limits_from_env
from agentlife._redact import url_password
from agentlife._replay import MAX_DEPTH
from agentlife.constants import Constants

__all__ = [
    "DEFAULT_HEALTH_HOST",
    "DEFAULT_HEALTH_PORT",
    "JOB_ID_PATTERN",
    "LLM_PROVIDERS",
    "MAX_ATTEMPT",
    "MAX_PAYLOAD_DEPTH",
    "Settings",
    "data_dir_from_env",
    "llm_provider_from_env",
    "probe_address",
    "validate_agent_id",
    "validate_database_url",
    "validate_job_id",
    "validate_payload",
    "validate_url",
]

#: Where the probe server listens by default (``AGENTLIFE_HEALTH_HOST``, ``AGENTLIFE_HEALTH_PORT``).
DEFAULT_HEALTH_HOST = "0.0.0.0"
DEFAULT_HEALTH_PORT = 8086
JOB_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
#: The largest attempt number: PostgreSQL's ``integer`` column (the job row's ``attempt``) holds no more.
MAX_ATTEMPT = 2**31 - 1
#: How deeply a job payload may nest: as deeply as any value the journal records (`check_replayable`).
#: The journal, the checkpoint and the stores serialise with orjson, which refuses 255 levels; the margin
#: leaves room for the documents that carry the payload further down.
MAX_PAYLOAD_DEPTH = MAX_DEPTH
_SQLITE_NO_PATH = ("", "/")
#: The values of ``AGENTLIFE_LLM_PROVIDER``: which adapter the default ``make_llm()`` builds.
LLM_PROVIDERS = tuple(PROVIDERS)


def llm_provider_from_env(env: Mapping[str, str]) -> str:
    """``AGENTLIFE_LLM_PROVIDER`` (``anthropic`` by default, or ``openai``), lower-cased.

    Raises:
        ConfigError: any other value, naming the allowed ones.
    """
    raw = env.get("AGENTLIFE_LLM_PROVIDER") or ""
    provider = raw.strip().lower() or DEFAULT_PROVIDER
    if provider not in LLM_PROVIDERS:
        raise ConfigError(
            f"AGENTLIFE_LLM_PROVIDER={raw[:40]!r} is not a provider: use {' or '.join(LLM_PROVIDERS)}"
        )
    return provider


def validate_job_id(job_id: str) -> str:
    """Return ``job_id`` if it matches the allowed pattern, else raise `ConfigError`.

    The pattern keeps every path built from a job id inside the data directory: no separators, no NUL,
    no leading dot, at most 128 characters.
    """
    if not JOB_ID_PATTERN.fullmatch(job_id) or job_id in (".", ".."):
        shown = job_id if len(job_id) <= 40 else job_id[:40] + "..."
        raise ConfigError(
            f"job id {shown!r} is not allowed: it must match {JOB_ID_PATTERN.pattern} (no path separators)"
        )
    return job_id


def validate_agent_id(agent_id: str) -> str:
    """Return ``agent_id`` if it matches the job id pattern, else raise `ConfigError`.

    The rule every process applies at boot (`Settings`): a worker's agent id is checked by it, so a job row
    whose agent id breaks it could never be claimed. ``job create`` refuses such an id with this message.
    """
    if not agent_id or not JOB_ID_PATTERN.fullmatch(agent_id):
        shown = agent_id if len(agent_id) <= 40 else agent_id[:40] + "..."
        raise ConfigError(
            f"agent id {shown!r} is not allowed: it must match {JOB_ID_PATTERN.pattern} "
            "(no worker could take a job with it)"
        )
    return agent_id


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a process needs to know about where it runs, validated once at boot."""

    job_id: str
    agent_id: str
    attempt: int = 1
    data_dir: Path = Path(".agentlife")
    database_url: str | None = None
    qdrant_url: str | None = None
    control_plane_url: str | None = None
    control_plane_token: str | None = field(default=None, repr=False)
    health_host: str = DEFAULT_HEALTH_HOST
    health_port: int | None = DEFAULT_HEALTH_PORT
    previous_exit_code: int | None = None
    log_level: str = "INFO"
    pod_name: str = ""
    deployment_env: str = ""
    llm_provider: str = DEFAULT_PROVIDER
    constants: Constants = field(default_factory=Constants)
    rate_limits: RateLimits | None = None
    """The fleet-wide rate limits of model calls (``AGENTLIFE_RATE_LIMIT_*``); None: none configured."""

    def __post_init__(self) -> None:
        validate_job_id(self.job_id)
        if not self.agent_id or not JOB_ID_PATTERN.fullmatch(self.agent_id):
            raise ConfigError(
                f"agent id {self.agent_id!r} is not allowed: it must match {JOB_ID_PATTERN.pattern}"
            )
        if not 1 <= self.attempt <= MAX_ATTEMPT:
            raise ConfigError(f"AGENTLIFE_ATTEMPT={self.attempt} must be >= 1 and <= {MAX_ATTEMPT}")
        if self.database_url is not None:
            validate_database_url(self.database_url)
        if self.qdrant_url is not None:
            validate_url("AGENTLIFE_QDRANT_URL", self.qdrant_url, ("http", "https"))
        if self.control_plane_url is not None:
            validate_url("AGENTLIFE_CONTROL_PLANE_URL", self.control_plane_url, ("http", "https"))
        if self.llm_provider not in LLM_PROVIDERS:
            allowed = " or ".join(LLM_PROVIDERS)
            raise ConfigError(
                f"AGENTLIFE_LLM_PROVIDER={self.llm_provider!r} is not a provider: use {allowed}"
            )
        if self.log_level not in _LOG_LEVELS:
            raise ConfigError(
                f"AGENTLIFE_LOG_LEVEL={self.log_level!r} must be one of {', '.join(_LOG_LEVELS)}"
            )

    @property
    def resolved_database_url(self) -> str:
        """The store URL, defaulting to the embedded SQLite file under the data dir."""
        return self.database_url or f"sqlite:///{self.data_dir / 'agentlife.db'}"

    @property
    def session_dir(self) -> Path:
        """``{data_dir}/sessions/{job_id}``: where this job's journals live."""
        return self.data_dir / "sessions" / self.job_id

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        *,
        job_id: str | None = None,
        agent_id: str | None = None,
        constants: Constants | None = None,
    ) -> Settings:
        """Read the ``AGENTLIFE_*`` variables; explicit arguments win over the environment.

        Raises:
            ConfigError: with a one-line message naming the variable at fault.
        """
        env = os.environ if env is None else env
        job = job_id or job_id_from_env(env)
        if not job:
            raise ConfigError("no job id: set AGENTLIFE_JOB_ID or pass --job-id")
        agent = env.get("AGENTLIFE_AGENT_ID") or agent_id
        if not agent:
            raise ConfigError("no agent id: set AGENTLIFE_AGENT_ID or the agent class's agent_id")
        provider = llm_provider_from_env(env)
        return cls(
            job_id=job,
            agent_id=agent,
            attempt=_int(env, "AGENTLIFE_ATTEMPT", 1),  # type: ignore[arg-type]
            data_dir=Path(env.get("AGENTLIFE_DATA_DIR") or ".agentlife"),
            database_url=env.get("AGENTLIFE_DATABASE_URL") or None,
            qdrant_url=env.get("AGENTLIFE_QDRANT_URL") or None,
            control_plane_url=(env.get("AGENTLIFE_CONTROL_PLANE_URL") or "").rstrip("/") or None,
            control_plane_token=env.get("AGENTLIFE_CONTROL_PLANE_TOKEN") or None,
            health_host=env.get("AGENTLIFE_HEALTH_HOST") or DEFAULT_HEALTH_HOST,
            health_port=_port(env),
            previous_exit_code=_int(env, "AGENTLIFE_PREVIOUS_EXIT_CODE", None),
            log_level=(env.get("AGENTLIFE_LOG_LEVEL") or "INFO").upper(),
            pod_name=env.get("HOSTNAME") or socket.gethostname(),
            deployment_env=env.get("DEPLOYMENT_ENV", ""),
            llm_provider=provider,
            constants=constants if constants is not None else Constants.from_env(env),
            rate_limits=rate_limits_from_env(env, provider),
        )


def job_id_from_env(env: Mapping[str, str]) -> str | None:
    """``AGENTLIFE_JOB_ID``, or None when unset or empty."""
    return env.get("AGENTLIFE_JOB_ID") or None


def data_dir_from_env(env: Mapping[str, str]) -> Path:
    """``AGENTLIFE_DATA_DIR``, or ``.agentlife``: where journals (``sessions/``) and the SQLite file live."""
    return Path(env.get("AGENTLIFE_DATA_DIR") or ".agentlife")


def database_url_from_env(env: Mapping[str, str]) -> str:
    """``AGENTLIFE_DATABASE_URL``, or the embedded SQLite file under ``AGENTLIFE_DATA_DIR``."""
    data_dir = Path(env.get("AGENTLIFE_DATA_DIR") or ".agentlife")
    return env.get("AGENTLIFE_DATABASE_URL") or f"sqlite:///{data_dir / 'agentlife.db'}"


def debug_from_env(env: Mapping[str, str]) -> bool:
    """Whether ``AGENTLIFE_LOG_LEVEL`` asks for DEBUG (the CLI then prints tracebacks of internal errors)."""
    return (env.get("AGENTLIFE_LOG_LEVEL") or "").upper() == "DEBUG"


def validate_database_url(url: str, name: str = "AGENTLIFE_DATABASE_URL") -> str:
    """Return ``url`` if it names a usable store, else raise `ConfigError` naming the variable.

    ``sqlite:``, ``sqlite://``, ``sqlite:///`` and ``sqlite:///:memory:`` are refused: the first three
    have no file path (they used to become a file in the current directory, outside the data dir) and an
    in-memory database loses every checkpoint with the process. Leave the variable unset for the embedded
    default, ``{AGENTLIFE_DATA_DIR}/agentlife.db``. ``name`` is what the error names (a flag, say).
    """
    lowered = url[:14].lower()
    if not url.startswith(("sqlite:", "postgresql:", "postgres:")) and lowered.startswith(
        ("sqlite:", "postgresql:", "postgres:")
    ):
        raise ConfigError(f"{name}: write the URL's scheme in lower case (sqlite:/// or postgresql://)")
    if url.startswith("sqlite:"):
        path = url.removeprefix("sqlite:").removeprefix("//")
        if "@" in path.partition("/")[0]:
            # sqlite://user:password@host/db: a server URL written for SQLite; its "path" would be quoted.
            raise ConfigError(f"{name}: a sqlite URL names a file and has no user, password or host")
        memory = path.lstrip("/").startswith(":memory:") or "mode=memory" in path
        if path in _SQLITE_NO_PATH or memory or not url.startswith("sqlite://"):
            raise ConfigError(
                f"{name}={url!r} names no database file: use sqlite:///relative/path or "
                "sqlite:////absolute/path, or leave it unset for {AGENTLIFE_DATA_DIR}/agentlife.db"
            )
        return url
    if url.startswith(("postgresql://", "postgres://")):
        password = url_password(url)
        if password is not None and any(c in password for c in "/#?@"):
            # The driver would cut the URL inside the password and quote the pieces in its errors.
            raise ConfigError(
                f"{name}: the password holds an unencoded '/', '#', '?' or '@': percent-encode it "
                "(%2F, %23, %3F, %40)"
            )
        return validate_url(name, url, ("postgresql", "postgres"))
    if url.startswith(("postgresql:", "postgres:")):
        raise ConfigError(f"{name}: a PostgreSQL URL starts with postgresql:// (user@host:port/database)")
    raise ConfigError(f"{name} {_scheme_shown(url)} (use sqlite:/// or postgresql://)")


def _scheme_shown(url: str) -> str:
    """What an error says of ``url``'s scheme: quoted only when it looks like one (never a secret)."""
    scheme, colon, _ = url.partition(":")
    if colon and re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]{0,19}", scheme):
        return f"scheme {scheme!r} is not supported"
    return "is not a URL"


def validate_url(name: str, url: str, schemes: tuple[str, ...]) -> str:
    """Check the scheme and every port of ``url``; raise `ConfigError` naming ``name`` otherwise.

    The password is never quoted in the error, and a password holding unencoded ``/``, ``#``, ``?`` or
    ``@`` does not confuse the parse: the host part starts after the last ``@`` of the URL's first word.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in schemes:
        shown = _scheme_shown(url) if sep else "is not a URL"
        raise ConfigError(f"{name} {shown} (use {' or '.join(schemes)})")
    hosts = rest[rest.rfind("@") + 1 :]
    import urllib.parse  # only where a server URL is checked: not on the SQLite start-up path

    try:  # what the drivers parse, without the userinfo (its password is never in the message)
        urllib.parse.urlsplit(f"{scheme}://{hosts}")
    except ValueError as exc:
        raise ConfigError(f"{name}: not a URL a driver can read ({exc})") from None
    hosts = re.split(r"[/?#]", hosts, maxsplit=1)[0]
    for host in hosts.split(","):  # libpq accepts host1:5432,host2:5433
        port = host.rpartition("]")[2] if host.startswith("[") else host
        if ":" not in port:
            continue
        port = port.rpartition(":")[2]
        if port == "":
            continue
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ConfigError(f"{name}: port {port[:20]!r} is not a port number (1-65535)")
    return url


def validate_payload(payload: object, what: str = "--payload") -> object:
    """Return ``payload`` if both stores keep it as given, else raise `ConfigError`.

    It nests at most `MAX_PAYLOAD_DEPTH` levels, and no string or key holds U+0000, which PostgreSQL's
    JSON cannot store (SQLite would, so the two stores would differ).
    """
    stack: list[tuple[object, int]] = [(payload, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str) and "\x00" in value:
            raise ConfigError(f"{what} holds U+0000 in a string (PostgreSQL's JSON cannot store it)")
        if isinstance(value, (dict, list)):
            if depth + 1 > MAX_PAYLOAD_DEPTH:
                raise ConfigError(f"{what} nests deeper than {MAX_PAYLOAD_DEPTH} levels")
            items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
            stack.extend((item, depth + 1) for item in items)
    return payload


def _int(env: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    text = raw.strip()
    # int() of a huge string costs quadratic time (and Python refuses past 4300 digits): no store holds it.
    if len(text.lstrip("+-")) > 18 and text.lstrip("+-").isdigit():
        raise ConfigError(f"{name}={raw[:24]!r}... is out of range")
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{name}={raw[:40]!r} is not a whole number") from None


def probe_address(env: Mapping[str, str]) -> tuple[str, int] | None:
    """Where the probe server listens, read before the settings are.

    None when it is ``off`` or the port is not one: the settings report a bad value as a configuration
    error right after.
    """
    try:
        port = _port(env)
    except ConfigError:
        return None
    return None if port is None else (env.get("AGENTLIFE_HEALTH_HOST") or DEFAULT_HEALTH_HOST, port)


def _port(env: Mapping[str, str]) -> int | None:
    """The probe port; ``off`` disables the probe server (in-process tests run several agents at once)."""
    raw = env.get("AGENTLIFE_HEALTH_PORT")
    if raw is not None and raw.strip().lower() == "off":
        return None
    port = _int(env, "AGENTLIFE_HEALTH_PORT", DEFAULT_HEALTH_PORT)
    if port is None or not 0 <= port <= 65535:
        raise ConfigError(f"AGENTLIFE_HEALTH_PORT={raw!r} must be a port number 0-65535 (0 = any free port)")
    return port
