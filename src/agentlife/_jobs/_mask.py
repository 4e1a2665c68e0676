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
from collections.abc import Mapping
from typing import Any

from agentlife._redact import MAX_SHOWN_TEXT, Redactor, bound, mask_secret_keys, mask_secret_keys_in_text
from agentlife.stores import JobRecord

__all__ = ["MAX_TEXT", "Masker", "bound", "masker_for"]

#: The most characters of one value (a message's text, a tool's input, a payload) a page shows.
MAX_TEXT = MAX_SHOWN_TEXT


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
        return mask_secret_keys(self._redactor.redact_obj(value))

    def text(self, value: Any, limit: int = MAX_TEXT) -> str:
        """``value`` as masked text (a non-string is shown as its ``repr``), at most ``limit`` characters."""
        text = value if isinstance(value, str) else repr(value)
        shown = self.value(text, limit)
        return shown if isinstance(shown, str) else str(shown)

    def broken_json(self, text: str, limit: int = MAX_TEXT) -> str:
        """Text that should have been JSON and is not, masked as `text` masks it and by its key names too.

        A torn line, or one nested deeper than the parser reads, cannot be masked key by key as `whole`
        masks a value: the value after each quoted key named like a credential is masked in the text
        (`mask_secret_keys_in_text`), then the text is masked as any other.
        """
        return self.text(mask_secret_keys_in_text(text), limit)

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
