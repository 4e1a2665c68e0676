"""The one way a value from the store or a journal reaches an operator: secrets masked, size bounded.

Every text the console renders or ``job show`` prints that the tool did not write itself (a row's ids,
status, payload, result, crash history and unreadable-column notes, an approval's request, a wait, a
conversation message, a journal event, an error's message) passes through `Masker` before any page, SVG,
JSON answer or line is built from it: the `Redactor` used for logs and journals (secret values in every
spelling, URL passwords, key shapes, ``pwd=``), then every value under a key named like a credential
(``password``, ``pwd``, ``passphrase``, ``auth``, ``cookie``, ``token`` ...) whatever it looks like, then
the size bounds. Masking comes before cutting, so a cut can never leave half a secret the redactor no
longer recognises.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from agentlife._redact import MASK, Redactor
from agentlife.stores import JobRecord

__all__ = ["MAX_TEXT", "Masker", "bound", "masker_for"]

#: The most characters of one value (a message's text, a tool's input, a payload) a page shows.
MAX_TEXT = 20_000
# A value under a key named like a credential is masked whole on a page, whatever it looks like: the
# redactor knows secret values and shapes, not a password typed into a payload by a user. Matched on the
# key's letters and digits, lower-cased: "API-Key", "api_key" and "apiKey" are one key. ``auth`` but not
# ``author``/``authority`` or ``authenticated``; ``token`` but not ``tokens`` (a count).
_SECRET_KEY = re.compile(
    r"password|passwd|passphrase|pwd|secret|apikey|accesskey|privatekey|authorization|auth(?!or|ent)"
    r"|credential|cookie|token(?!s)"
)


class Masker:
    """Masks and bounds what a page shows; built once per console from its `Redactor`."""

    def __init__(self, redactor: Redactor) -> None:
        self._redactor = redactor

    def value(self, value: Any, limit: int = MAX_TEXT) -> Any:
        """A JSON-like value with every string redacted, credential keys masked, and everything bounded."""
        return bound(self._redactor.redact_obj(value), limit)

    def whole(self, value: Any) -> Any:
        """A JSON-like value masked as `value` masks it, but never cut: what an API returns.

        The store bounds what it holds (payloads, results, published values), so an API can give it back
        as it is; only a page needs `bound`'s cuts.
        """
        return _mask_secret_keys(self._redactor.redact_obj(value))

    def text(self, value: Any, limit: int = MAX_TEXT) -> str:
        """``value`` as masked text (a non-string is shown as its ``repr``), at most ``limit`` characters."""
        text = value if isinstance(value, str) else repr(value)
        shown = self.value(text, limit)
        return shown if isinstance(shown, str) else str(shown)

    def row(self, row: JobRecord) -> JobRecord:
        """A copy of ``row`` holding only what a page may show: every field masked (the id too)."""
        return dataclasses.replace(
            row,
            id=self.text(row.id),
            agent_id=self.text(row.agent_id),
            status=self.text(row.status),
            payload=self.value(row.payload),
            checkpoint_id=None if row.checkpoint_id is None else self.text(row.checkpoint_id),
            concurrency_key=None if row.concurrency_key is None else self.text(row.concurrency_key),
            tokens_consumed=_mapping(self.value(row.tokens_consumed)),
            token_budget=None if row.token_budget is None else _mapping(self.value(row.token_budget)),
            error=[self.value(entry) for entry in row.error[-200:]],
            result=self.value(row.result),
            unreadable={self.text(k, 200): self.text(v, 500) for k, v in row.unreadable.items()},
        )


def masker_for(env: Mapping[str, str], database_url: str) -> Masker:
    """The masker of a tool reading ``database_url``: the environment's secrets and the URL's password."""
    # The URL (from a flag, not only the environment) joins the values searched for URL passwords.
    return Masker(Redactor.from_env({**env, "AGENTLIFE_OPERATOR_DATABASE_URL": database_url}))


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search("".join(c for c in key.lower()[:200] if c.isalnum())))


def _mask_secret_keys(value: Any) -> Any:
    """``value`` with the value of every key named like a credential (not None or empty) as ``***``."""
    if isinstance(value, dict):
        return {
            k: MASK if _secret_key(str(k)) and v not in (None, "") else _mask_secret_keys(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_mask_secret_keys(v) for v in value]
    return value


def bound(value: Any, limit: int = MAX_TEXT) -> Any:
    """``value`` with every string cut to ``limit`` characters and at most ``limit`` items per container.

    The value of a key named like a credential (``password``, ``api_key``, ``token`` ...) becomes ``***``.

    A page shows what a value holds, not all of it: a 10 MB result would otherwise be a 10 MB page.
    """
    budget = [limit * 4]

    def walk(item: Any, depth: int) -> Any:
        if budget[0] <= 0:
            return "…"
        if isinstance(item, str):
            budget[0] -= min(len(item), limit)
            return item if len(item) <= limit else item[:limit] + f"… ({len(item) - limit} more characters)"
        if depth > 40 and isinstance(item, (dict, list)):
            return f"<nested deeper than 40 levels: {type(item).__name__}>"
        if isinstance(item, dict):
            budget[0] -= len(item)
            return {
                str(k)[:200]: MASK if _secret_key(str(k)) and v not in (None, "") else walk(v, depth + 1)
                for k, v in list(item.items())[:limit]
            }
        if isinstance(item, list):
            budget[0] -= len(item)
            return [walk(v, depth + 1) for v in item[:limit]]
        return item

    return walk(value, 0)
