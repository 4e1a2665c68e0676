from __future__ import annotations

from agentlife._redact import MASK, Redactor


def test_env_secret_values_are_masked_everywhere() -> None:
    r = Redactor.from_env(
        {
            "ANTHROPIC_API_KEY": "sk-ant-api03-SECRETVALUE",
            "AGENTLIFE_CONTROL_PLANE_TOKEN": "tok123456",
            "AGENTLIFE_DATABASE_URL": "postgresql://u:hunter22@db:5432/x",
            "PATH": "/usr/bin",
        }
    )
    text = "key sk-ant-api03-SECRETVALUE and tok123456 and pw hunter22 in /usr/bin"
    out = r.redact(text)
    assert "SECRETVALUE" not in out and "tok123456" not in out and "hunter22" not in out
    assert "/usr/bin" in out


def test_secret_shapes_are_masked_without_env() -> None:
    r = Redactor()
    assert r.redact("Authorization: Bearer abcdef123456") == f"Authorization: Bearer {MASK}"
    assert r.redact("postgresql://user:pw12345@host/db") == f"postgresql://user:{MASK}@host/db"
    assert "sk-ant-" not in r.redact("x sk-ant-abcdefghijkl y")
    assert r.redact("password=letmein now") == f"password={MASK} now"


def test_redact_obj_walks_json() -> None:
    r = Redactor(["topsecret"])
    assert r.redact_obj({"a": ["x topsecret", {"topsecret": 1}], "n": 3}) == {
        "a": [f"x {MASK}", {MASK: 1}],
        "n": 3,
    }


def test_short_values_are_not_treated_as_secrets() -> None:
    r = Redactor.from_env({"SOME_TOKEN": "1"})
    assert r.redact("step 1 of 10") == "step 1 of 10"
