from __future__ import annotations

from pathlib import Path

import pytest

from agentlife import ConfigError
from agentlife._config import Settings, validate_job_id

BAD_IDS = ["..", "../etc", "a/b", "a\x00b", "x" * 200, "", ".hidden", "-flag", "a b", "job\n"]


@pytest.mark.parametrize("job_id", BAD_IDS, ids=repr)
def test_job_ids_that_could_leave_the_data_dir_are_refused(job_id: str) -> None:
    with pytest.raises(ConfigError, match="is not allowed"):
        validate_job_id(job_id)


@pytest.mark.parametrize("job_id", ["job-1", "A", "a.b_c-d", "x" * 128])
def test_good_job_ids(job_id: str) -> None:
    assert validate_job_id(job_id) == job_id
    settings = Settings(job_id=job_id, agent_id="a", data_dir=Path("/data"))
    assert settings.session_dir == Path("/data/sessions") / job_id


def test_from_env_reads_everything() -> None:
    s = Settings.from_env(
        {
            "AGENTLIFE_JOB_ID": "j1",
            "AGENTLIFE_AGENT_ID": "agent",
            "AGENTLIFE_ATTEMPT": "3",
            "AGENTLIFE_DATA_DIR": "/tmp/d",
            "AGENTLIFE_HEALTH_PORT": "0",
            "AGENTLIFE_PREVIOUS_EXIT_CODE": "137",
            "AGENTLIFE_CONTROL_PLANE_URL": "http://cp/",
            "AGENTLIFE_CONTROL_PLANE_TOKEN": "cp-token-value",
            "HOSTNAME": "pod-1",
            "AGENTLIFE_LOG_LEVEL": "debug",
        }
    )
    assert (s.job_id, s.agent_id, s.attempt, s.health_port, s.previous_exit_code) == (
        "j1",
        "agent",
        3,
        0,
        137,
    )
    assert s.control_plane_url == "http://cp" and s.pod_name == "pod-1" and s.log_level == "DEBUG"
    assert s.resolved_database_url == "sqlite:////tmp/d/agentlife.db"  # absolute path: four slashes
    assert "cp-token-value" not in repr(s)


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({}, "no job id"),
        (
            {"AGENTLIFE_JOB_ID": "j", "AGENTLIFE_ATTEMPT": "two"},
            "AGENTLIFE_ATTEMPT='two' is not a whole number",
        ),
        ({"AGENTLIFE_JOB_ID": "j", "AGENTLIFE_ATTEMPT": "0"}, "must be >= 1"),
        ({"AGENTLIFE_JOB_ID": "j", "AGENTLIFE_HEALTH_PORT": "70000"}, "AGENTLIFE_HEALTH_PORT"),
        ({"AGENTLIFE_JOB_ID": "j", "AGENTLIFE_LOG_LEVEL": "LOUD"}, "AGENTLIFE_LOG_LEVEL"),
        ({"AGENTLIFE_JOB_ID": "../../x"}, "is not allowed"),
    ],
)
def test_bad_env_is_one_clear_error(env: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        Settings.from_env(env, agent_id="agent")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("postgresql://agent:hunter2SECRET@[::1:55437/agents", "not a URL a driver can read"),
        ("postgresql://agent:hunter2SECRET@[::1]:55437/agents", None),
        ("sqlite://agent:hunter2SECRET@x/db", "no user, password or host"),
        ("hunter2SECRET", "is not a URL"),
        ("hunter2SECRET:x", "is not supported"),  # looks like a scheme: quoted, and it is the scheme only
        ("postgresql:/agent:hunter2SECRET@h/db", "starts with postgresql://"),
        ("PostgreSQL://agent:hunter2SECRET@h/db", "lower case"),
        ("SQLITE:///x.db", "lower case"),
        ("mysql://agent:hunter2SECRET@h/db", "scheme 'mysql' is not supported"),
    ],
)
def test_a_database_url_almost_right_is_one_config_error_that_never_quotes_its_password(
    url: str, says: str | None
) -> None:
    from agentlife._config import validate_database_url

    if says is None:
        assert validate_database_url(url) == url
        return
    with pytest.raises(ConfigError) as caught:
        validate_database_url(url)
    message = str(caught.value)
    assert says in message and "\n" not in message
    assert "SECRET" not in message or url == "hunter2SECRET:x"  # a scheme-shaped word is quoted as one
