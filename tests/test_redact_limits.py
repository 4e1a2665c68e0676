"""The redactor's limits: bounded on any object, never raises, masks URL passwords with reserved
characters whole.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentlife._redact import MASK, Redactor

TOKEN = "cp-token-5f2a9c7e"


# -- secret masking ------------------------------------------------------------------------------------


def test_redact_obj_is_bounded_and_never_raises() -> None:
    r = Redactor([TOKEN])
    deep: Any = TOKEN
    for _ in range(20_000):  # far past the interpreter's recursion limit
        deep = [deep]
    masked = r.redact_obj(deep)
    for _ in range(254):
        masked = masked[0]
    assert masked == "<nested too deep: list>"
    shared = [TOKEN]
    assert r.redact_obj({"a": shared, "b": shared}) == {"a": [MASK], "b": [MASK]}  # shared is no cycle


@pytest.mark.parametrize("password", ["pa/ss#w?rd", "p@ss/word", "pass?word", "hash#tag99"])
def test_url_passwords_with_reserved_characters_are_masked_whole(password: str) -> None:
    url = f"postgresql://agent:{password}@db.internal:5432/jobs"
    r = Redactor.from_env({"AGENTLIFE_DATABASE_URL": url})
    for text in (f"cannot connect to {url}: refused", f"password was {password}"):
        out = r.redact(text)
        assert password not in out and "ss/word" not in out and "word@" not in out, out
    assert Redactor().redact(f"dsn {url} x") == f"dsn postgresql://agent:{MASK}@db.internal:5432/jobs x"
