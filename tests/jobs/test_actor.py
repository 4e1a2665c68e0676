"""The actor of an operator action: what `check_actor` accepts, and `default_actor` in a bare container."""

from __future__ import annotations

import getpass
import socket

import pytest

from agentlife._jobs._actor import MAX_ACTOR, check_actor, default_actor


@pytest.mark.parametrize(
    "good", ["alice", "alice@example.com", "console@10.0.0.7", "Zoë Ölçer", "a" * MAX_ACTOR, "sre: bob"]
)
def test_an_actor_of_printable_text_is_kept_exactly(good: str) -> None:
    assert check_actor(good) == good


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("", "must be 1 to 200 characters, got 0"),
        ("   ", "must not be blank"),
        ("a" * (MAX_ACTOR + 1), "must be 1 to 200 characters, got 201"),
        ("alice\nFAILED by root", "printable"),
        ("alice\r", "printable"),
        ("al\x00ice", "printable"),
        ("al\x1b[31mice", "printable"),
        ("admin\u202ecilA", "printable"),  # a right-to-left override: another name on the page
        ("al\u200dice", "printable"),  # a zero-width joiner: looks like "alice"
        ("al\u2028ice", "printable"),  # a line separator
        ("x" * 10_240, "1 to 200 characters"),
    ],
)
def test_an_actor_that_is_not_one_line_of_printable_text_is_refused_in_one_line(bad: str, says: str) -> None:
    with pytest.raises(ValueError, match=says) as caught:
        check_actor(bad)
    message = str(caught.value)
    assert "\n" not in message
    assert not bad.strip() or bad not in message  # the value is not echoed


def test_an_actor_that_is_not_text_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="must be text, got int"):
        check_actor(7)  # type: ignore[arg-type]


def test_the_default_actor_is_user_at_host() -> None:
    assert default_actor() == f"{getpass.getuser()}@{socket.gethostname()}"


def test_the_default_actor_survives_a_process_without_user_or_host(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_user() -> str:
        raise KeyError("getpwuid(): uid not found: 1000620000")  # an OpenShift uid without a passwd entry

    monkeypatch.setattr(getpass, "getuser", no_user)
    monkeypatch.setattr(socket, "gethostname", lambda: "pod\x1b]evil")
    assert default_actor() == "unknown@unknown"
    monkeypatch.setattr(socket, "gethostname", lambda: "")
    assert default_actor() == "unknown@unknown"
    monkeypatch.setattr(getpass, "getuser", lambda: "a" * 500)
    monkeypatch.setattr(socket, "gethostname", lambda: "h" * 500)
    actor = default_actor()
    assert check_actor(actor) == actor and len(actor) <= MAX_ACTOR
