"""One way to say what an error was, on one line: `describe_error`, and the places that print it."""

from __future__ import annotations

import pytest

from agentlife._cli._common import guarded
from agentlife._exceptions import describe_error
from agentlife._mcp._client import server_error
from agentlife._redact import Redactor

#: A secret of several lines, as a PEM key held in a variable is.
PEM = "-----BEGIN KEY-----\nMIIBOgIBAAJBAKj34GkxFhD90vcNLYLInFEX\n-----END KEY-----"


def test_an_error_without_a_message_is_its_type_alone() -> None:
    assert describe_error(ValueError()) == "ValueError"
    assert describe_error(ValueError("")) == "ValueError"


def test_an_error_is_its_type_and_its_message_on_one_line() -> None:
    assert describe_error(KeyError("k")) == "KeyError: 'k'"
    assert describe_error(RuntimeError("one\ntwo\r\nthree")) == "RuntimeError: one two three"


def test_a_group_is_its_type_then_every_leaf_at_any_depth() -> None:
    group = ExceptionGroup("outer", [ValueError("a"), ExceptionGroup("inner", [OSError(), KeyError("k")])])
    assert describe_error(group) == "ExceptionGroup: ValueError: a; OSError; KeyError: 'k'"


def test_a_secret_of_several_lines_is_masked_before_the_lines_are_joined() -> None:
    redact = Redactor([PEM]).redact
    text = describe_error(RuntimeError(f"cannot load {PEM}"), redact=redact)
    assert "MIIB" not in text and text == "RuntimeError: cannot load ***"
    group = ExceptionGroup("tg", [RuntimeError(PEM)])
    assert "MIIB" not in describe_error(group, redact=redact)


def test_the_cut_comes_after_the_mask() -> None:
    secret = "s3cr3t-value-0123456789"
    text = describe_error(RuntimeError("x" * 10 + secret), redact=Redactor([secret]).redact, limit=16)
    assert text == "RuntimeError: xx"  # never a leading piece of the secret that no longer looks like one
    assert describe_error(RuntimeError("a" * 50), limit=20) == "RuntimeError: aaaaaa"


def test_the_command_line_masks_a_secret_of_several_lines_in_an_internal_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SIGNING_KEY", PEM)

    def fails() -> int:
        raise RuntimeError(f"bad key {PEM}")

    assert guarded(fails) == 1
    err = capsys.readouterr().err
    assert err == "agentlife: internal error: RuntimeError: bad key ***\n"


def test_an_mcp_server_error_reads_as_the_first_error_of_the_sdk_task_group() -> None:
    redact = Redactor(["tok-0123456789"]).redact
    missing = FileNotFoundError(2, "No such file", "/opt/server")
    assert (
        server_error(ExceptionGroup("tg", [missing, ValueError("x")]), redact)
        == "command not found: /opt/server"
    )
    assert server_error(ExceptionGroup("tg", [TimeoutError()]), redact) == "timed out"
    said = server_error(ExceptionGroup("tg", [ConnectionError("refused tok-0123456789\nretry")]), redact)
    assert said == "ConnectionError: refused *** retry"
    assert len(server_error(RuntimeError("y" * 5000), redact)) == 500
