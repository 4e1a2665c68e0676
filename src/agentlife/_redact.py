"""Keeping secrets out of logs, journals, heartbeats, crash records and ``/status``.

Two nets: the exact values of secret-looking environment variables (API keys, tokens, passwords) are
replaced wherever they appear, and well-known secret shapes (bearer tokens, ``sk-ant-`` keys, passwords in
connection strings) are masked even when their value was never in the environment.

The first net knows a value in every spelling it is likely to be printed in: as it is, percent-encoded,
escaped by ``repr`` or by JSON, so an exception message that quotes a URL with ``!r`` hides it as well.
A URL's password is found by parsing the URL's userinfo (``scheme://user:password@host``), never by a
character class, so a password holding spaces, tabs, quotes or ``/#?@`` is known whole.

Cost: masking a text is linear in its length (times the number of known values). Every pattern here is
linear even under ``search``: none can backtrack over a run of its input, and none restarts a long scan
from every position. ``tests/test_regex_cost.py`` holds every pattern of the package to that, and
``benchmarks/bench_redact.py`` measures masking a megabyte of adversarial text.
"""

from __future__ import annotations

import dataclasses
import json
import re
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

__all__ = [
    "MASK",
    "MAX_DEPTH",
    "MAX_SHOWN_TEXT",
    "Redactor",
    "bound",
    "mask_secret_keys",
    "mask_secret_keys_in_text",
    "spellings",
    "url_password",
]

MASK = "***"
# TOKEN but not TOKENS: AGENTLIFE_BUDGET_MAX_INPUT_TOKENS is a budget, not a credential. Not PWD: that
# variable is the working directory.
# ``KEY`` but not the concurrency keys' own limits (AGENTLIFE_CONCURRENCY_KEY_LIMIT[S]): numbers, not secrets,
# that a boot error must be able to quote.
_SECRET_NAME = re.compile(
    r"(KEY(?!_LIMITS?$)|TOKEN(?!S)|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|AUTH|COOKIE)", re.IGNORECASE
)
# Each starts with a literal, and no two quantifiers can share a character they both accept, so a match
# attempt costs at most the run it masks: the whole text is scanned in linear time.
_PATTERNS = (
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{6,}"),
    re.compile(r"sk-ant-[A-Za-z0-9_-]{6,}"),
    re.compile(r"(?i)\b(sk|pk|rk)-[A-Za-z0-9_-]{16,}"),
    # ``key=value`` and ``"key": "value"`` (JSON, a dict's repr): the value quoted or up to a separator; an
    # authorization's scheme word (``Basic``) is kept and the credential after it masked.
    re.compile(
        r"(?i)((?:(?:password|passwd|passphrase|pwd|token|api[_-]?key|secret)[\"']?\s*[=:]\s*"
        r"|auth(?:orization)?[\"']?\s*[=:]\s*(?:(?:basic|bearer|digest|negotiate)\s+)?))"
        r"(?:\"[^\"\n]*\"?|'[^'\n]*'?|[^\s&;,'\"]+)"
    ),
    # A cookie header holds several ``name=value`` pairs: all of it, to the end of its line, is masked.
    re.compile(r"(?i)((?:set-)?cookie[\"']?\s*[=:]\s*)(?:\"[^\"\n]*\"?|'[^'\n]*'?|[^\n\r'\"]+)"),
    # Token shapes known by a case-sensitive prefix (`_shapes_in` looks for it). Each starts only where a
    # run of its characters starts (the lookbehind), so no run is scanned twice: a GitHub token, an AWS
    # access key id, a JSON Web Token (three base64url parts, the first two JSON objects: ``eyJ``).
    re.compile(r"(?<![A-Za-z0-9_])(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})"),
    re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])"),
    re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
)
# Case-insensitive scans cost ~40-80 ns a character in ``re``, so a pattern runs only when the text holds
# what it cannot match without (`_shapes_in`). Every text the first five of _PATTERNS match also matches this,
# under the same case folding: the check for non-ASCII text, where folding reaches beyond ASCII (the long s is
# an ``s``, the Kelvin sign a ``k``).
_MAYBE_SHAPE = re.compile(r"(?i)bearer|[spr]k-|passw|passphrase|pwd|token|api[_-]?key|secret|auth|cookie")
_KEYWORDS = ("passw", "passphrase", "pwd", "token", "key", "secret", "auth")
# Short texts (dict keys, model names, tool names) recur in every event: their masked form is remembered.
_CACHED_LEN = 64
_CACHE_SIZE = 4096
# In free text a URL ends at whitespace or a quote (``repr`` and JSON put quotes around it).
_WORD_END = re.compile(r"[\s'\"]")
# The user of ``scheme://user:password@`` ends at the first of these, which must be the ":": it holds no
# ":", so it stops before the next "://".
_USER_END = re.compile(r"[:/@\s'\"]")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
# A password holding spaces ends the URL's word early: its "@" is looked for a little further, on the same
# line, past no "/" or quote (which "host:8080/path ... me@x" has, so a port is never taken for one).
_SPACED_PASSWORD = re.compile(r"[^/\r\n'\"<>@]{1,128}@")
# Values this short are too likely to occur by chance ("1", "true"); the patterns still catch their shapes.
_MIN_SECRET_LEN = 6
#: How deep `Redactor.redact_obj` walks. orjson (journal, stores) refuses 255 levels, so every value the
#: journal can hold is redacted exactly; anything deeper could not be written anyway.
MAX_DEPTH = 254


class Redactor:
    """Replaces known secret values and secret-shaped substrings with ``***``.

    Args:
        secrets: values masked wherever they appear (in every spelling of `spellings`), when at least six
            characters long: a shorter value is too likely to occur by chance.
        url_passwords: passwords of connection URLs: masked between ``:`` and ``@`` whatever their length,
            and wherever they appear when at least six characters long.
    """

    def __init__(self, secrets: Iterable[str] = (), *, url_passwords: Iterable[str] = ()) -> None:
        needles: dict[str, str] = {}
        for secret in secrets:
            if len(secret) >= _MIN_SECRET_LEN:
                needles.update((s, MASK) for s in spellings(secret) if len(s) >= _MIN_SECRET_LEN)
        for password in url_passwords:
            for spelled in spellings(password):
                needles[f":{spelled}@"] = f":{MASK}@"
                if len(password) >= _MIN_SECRET_LEN and len(spelled) >= _MIN_SECRET_LEN:
                    needles[spelled] = MASK
        # Longest first, so a secret that contains another is replaced whole.
        self._needles = sorted(needles.items(), key=lambda item: len(item[0]), reverse=True)
        self._short: dict[str, str] = {}

    def split_point(self, text: str) -> int:
        """Where text handed on in pieces (a model's reply to a job's followers) may be cut now.

        The part before the index may be masked and sent alone; the rest waits for more text. Nothing known
        crosses the cut or starts before it and runs to the end (it may go on in text not yet seen): no
        secret, no URL password, no secret-shaped run, no word (a token whose end has not come yet matches
        no shape yet, and the word before it, a keyword like ``Bearer`` or ``password:`` whose value is being
        written), and what follows it is not the start of a known secret. In the common case it holds back
        the word being written and the one before it.
        """
        cut = _word_start(text, len(text) - self._secret_prefix_at_end(text))
        cut = len(text[:cut].rstrip())  # one word more: a keyword's value may follow it
        while cut > 0 and not text[cut - 1].isspace():
            cut -= 1
        spans = [span for span in self._spans(text) if span[0] < cut]
        moved = True
        while moved:
            moved = False
            for start, end in spans:
                if start < cut and (end > cut or end >= len(text)):
                    cut, moved = start, True
            word = _word_start(text, cut)
            if word < cut:
                cut, moved = word, True
            spans = [span for span in spans if span[0] < cut]
        return cut

    def _secret_prefix_at_end(self, text: str) -> int:
        """The length of the longest end of ``text`` that begins a known secret (0: none)."""
        if not text:
            return 0
        longest, last = 0, text[-1]
        for needle, _ in self._needles:
            pos = needle.find(last, longest)  # needle[:pos + 1] ends as text does: a candidate
            while 0 <= pos < len(needle) - 1 and pos < len(text):
                if text.endswith(needle[: pos + 1]):
                    longest = pos + 1
                pos = needle.find(last, pos + 1)
        return longest

    def _spans(self, text: str) -> Iterator[tuple[int, int]]:
        for needle, _ in self._needles:
            pos = text.find(needle)
            while pos >= 0:
                yield pos, pos + len(needle)
                pos = text.find(needle, pos + 1)
        yield from _url_password_spans(text)
        for pattern in _shapes_in(text):
            for match in pattern.finditer(text):
                yield match.start(), match.end()

    @classmethod
    def from_env(cls, env: Mapping[str, str], extra: Iterable[str] = ()) -> Redactor:
        """Collect the values of secret-looking variables and the passwords inside URLs in ``env``."""
        secrets = [value for name, value in env.items() if _SECRET_NAME.search(name)]
        passwords = [password for value in env.values() for password in _passwords_in(value)]
        return cls([*secrets, *extra], url_passwords=passwords)

    def redact(self, text: str) -> str:
        """``text`` with every secret masked."""
        if len(text) > _CACHED_LEN:
            return self._mask(text)
        short = self._short
        masked = short.get(text)
        if masked is None:
            masked = self._mask(text)
            if len(short) >= _CACHE_SIZE:  # bounded: tool results can bring any number of distinct keys
                short.clear()
            short[text] = masked
        return masked

    def _mask(self, text: str) -> str:
        text = self._mask_needles_and_urls(text)
        for pattern in _shapes_in(text):
            text = pattern.sub(_mask_match, text)
        return text

    def _mask_needles_and_urls(self, text: str) -> str:
        for needle, replacement in self._needles:
            if needle in text:
                text = text.replace(needle, replacement)
        return _mask_url_passwords(text)

    def redact_obj(self, value: Any) -> Any:
        """A copy of a JSON-like value with every string redacted (keys included); never raises.

        A container met again inside itself becomes ``"<cycle: list>"`` and one nested deeper than
        `MAX_DEPTH` becomes ``"<nested too deep: dict>"``: the walk is bounded, so masking the result of a
        tool that already did its side effect cannot crash the step (and make a retry repeat the effect).
        Other values are returned as they are.
        """
        return self._walk(value, 0, set())

    def _walk(self, value: Any, depth: int, open_ids: set[int]) -> Any:
        cls = type(value)
        if cls is str:
            return self.redact(value)
        if cls is int or cls is float or cls is bool or value is None:  # before the slower ABC check
            return value
        if isinstance(value, str):
            return self.redact(value)
        if not isinstance(value, (Mapping, list, tuple)):
            if not hasattr(cls, "__dataclass_fields__") or isinstance(value, type):
                return value
            # orjson writes a dataclass as the object of its fields: walk them as that object.
            value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        if id(value) in open_ids:
            return f"<cycle: {type(value).__name__}>"
        if depth >= MAX_DEPTH:
            return f"<nested too deep: {type(value).__name__}>"
        open_ids.add(id(value))
        try:
            if isinstance(value, Mapping):
                return self._walk_mapping(value, depth + 1, open_ids)
            return [self._walk_item(v, depth + 1, open_ids) for v in value]
        finally:
            open_ids.discard(id(value))

    def _walk_mapping(self, value: Mapping[Any, Any], depth: int, open_ids: set[int]) -> dict[str, Any]:
        # Keys are short and recur in every event: their cached masked form is looked up here, without a
        # call to `redact` (a journaled event is mostly keys, small numbers and short strings).
        short = self._short
        out: dict[str, Any] = {}
        for k, v in value.items():
            key = short.get(k) if type(k) is str else None
            if key is None:
                key = self.redact(k if isinstance(k, str) else str(k))
            out[key] = self._walk_item(v, depth, open_ids)
        return out

    def _walk_item(self, value: Any, depth: int, open_ids: set[int]) -> Any:
        """`_walk` for a container's item: a short string or a plain scalar costs no further call."""
        cls = type(value)
        if cls is str:
            if len(value) <= _CACHED_LEN:
                masked = self._short.get(value)
                if masked is not None:
                    return masked
            return self.redact(value)
        if cls is int or cls is float or cls is bool or value is None:
            return value
        return self._walk(value, depth, open_ids)


def spellings(secret: str) -> set[str]:
    """``secret`` as it is and as it reads once percent-encoded, decoded, or escaped by ``repr`` or JSON."""
    import json  # only once there is a secret: a job without one does not load it at boot

    # surrogatepass: an environment value may hold lone surrogates (undecodable bytes); never raise on them.
    quoted = urllib.parse.quote(secret, safe="", errors="surrogatepass")
    # A secret mounted from a file usually ends with a newline the code that uses it strips.
    bare = secret.strip()
    out = {
        secret,
        bare,
        urllib.parse.unquote(secret),
        quoted,
        quoted.replace("%20", "+"),  # a query string's form encoding
        urllib.parse.quote(secret, safe="/", errors="surrogatepass"),
        repr(secret)[1:-1],
        ascii(secret)[1:-1],
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        repr(secret.encode("utf-8", "surrogatepass"))[2:-1],
    }
    # repr() of a longer string that holds both quote kinds escapes the single quote even where repr() of
    # the secret alone (double-quoted) leaves it bare.
    out |= {spelled.replace("'", "\\'") for spelled in out if "\\'" not in spelled}
    return {spelled for spelled in out if spelled}


def url_password(url: str) -> str | None:
    """The password of the URL ``url`` (``scheme://user:password@host…``), or None when it has none.

    The userinfo runs to the URL's last ``@``, so a password holding spaces, quotes or unencoded ``/#?@``
    is returned whole; ``url`` is one URL, not a text that contains one.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or _SCHEME.fullmatch(scheme) is None:
        return None
    user, colon, password = rest[: max(rest.rfind("@"), 0)].partition(":")
    if not colon or not password or "/" in user or "@" in user:
        return None
    return password


def _passwords_in(value: str) -> list[str]:
    """Every URL password an environment value may hold, read in each way a reader could read it."""
    found = [value[start:end] for start, end in _url_password_spans(value)]
    password = url_password(value)
    if password is not None:
        # With an "@" in the query as well, the password may end at the first "@" instead.
        found += [password, password.partition("@")[0]]
    return found


def _word_start(text: str, at: int) -> int:
    """The start of the word ``at`` is inside of or ends (``at`` itself when it starts one or ends none)."""
    if at < len(text) and text[at].isspace():
        return at
    while at > 0 and not text[at - 1].isspace():
        at -= 1
    return at


def _mask_url_passwords(text: str) -> str:
    pieces: list[str] = []
    done = 0
    for start, end in _url_password_spans(text):
        pieces += [text[done:start], MASK]
        done = end
    return "".join(pieces) + text[done:] if pieces else text


def _url_password_spans(text: str) -> Iterator[tuple[int, int]]:
    """The ``(start, end)`` of the password of each ``scheme://user:password@`` in ``text``.

    In free text the password runs to the last ``@`` of the URL's word (up to whitespace or a quote), so
    whatever ``/#?@`` it holds is masked whole. One pass: each "://" is found once, the user part stops
    before the next "://", and a word's end and last ``@`` are looked up once per word, so a megabyte of
    "://" or of letters costs a linear scan.
    """
    word_end = last_at = -1
    pos = 0
    while (found := text.find("://", pos)) >= 0:
        start = found + 3
        first_in_word = start > word_end
        if first_in_word:  # the first "://" of a new word
            end_match = _WORD_END.search(text, start)
            word_end = end_match.start() if end_match else len(text)
            last_at = text.rfind("@", start, word_end)
        user_end = _USER_END.search(text, start)
        if user_end is None or user_end.group() != ":":
            pos = start
            continue
        if last_at <= user_end.end():
            # Only for a URL that starts its word: masking it must not join the word to an "@" an earlier
            # "://" of the word would then mask from (masking twice would change the text again).
            spaced = _SPACED_PASSWORD.match(text, user_end.end()) if first_in_word else None
            if spaced is None or not any(c.isspace() for c in spaced.group()) or _is_port(spaced.group()):
                pos = start
                continue
            # Then on to the last "@" of the word that "@" is in, as a URL's own word does: else masking
            # again would take the "@"s left after the mask as the password's end and change the text.
            at = spaced.end() - 1
            after = _WORD_END.search(text, at)
            end = text.rfind("@", at, after.start() if after else len(text))
            yield user_end.end(), end
            pos = end + 1
            continue
        yield user_end.end(), last_at
        pos = last_at + 1


def _is_port(span: str) -> bool:
    """Whether ``span`` (a ":" to an "@" further on) starts with a port: ``host:8080 and me@x``."""
    return span.split(None, 1)[0].isdigit()


def _shapes_in(text: str) -> tuple[re.Pattern[str], ...]:
    """The patterns of `_PATTERNS` that could match ``text``: a superset of those that do, in order.

    For ASCII text, ``lower()`` folds case exactly as the patterns' ``(?i)`` does, so each needs a plain
    substring: ``bearer``, ``k-``, or a keyword together with a ``=`` or ``:``. Masking by one pattern only
    puts ``***`` where a run was, which creates none of these, so the set also holds for the patterns after
    it.
    """
    github, aws, jwt = _PATTERNS[5:]
    tokens: tuple[re.Pattern[str], ...] = ()
    if "_" in text and ("gh" in text or "github_pat_" in text):
        tokens += (github,)
    if "AKIA" in text or "ASIA" in text:
        tokens += (aws,)
    if "eyJ" in text:
        tokens += (jwt,)
    if not text.isascii():
        return (_PATTERNS[:5] if _MAYBE_SHAPE.search(text) else ()) + tokens
    lowered = text.lower()
    bearer, key, word, cookie = _PATTERNS[0], (_PATTERNS[1], _PATTERNS[2]), _PATTERNS[3], _PATTERNS[4]
    found: tuple[re.Pattern[str], ...] = (bearer,) if "bearer" in lowered else ()
    if "k-" in lowered:
        found += key
    if "=" in text or ":" in text:
        if any(keyword in lowered for keyword in _KEYWORDS):
            found += (word,)
        if "cookie" in lowered:
            found += (cookie,)
    return found + tokens


def _mask_match(match: re.Match[str]) -> str:
    # The one group of a pattern, when it has one, is the prefix to keep ("bearer ", "password=").
    prefix = match.group(1) if match.re.groups else ""
    value = match.group(0)[len(prefix) :]
    quote = value[:1]
    if quote not in ("'", '"'):
        return f"{prefix}{MASK}"
    # A quoted value keeps its quotes, so masking the text again finds the same value: ``"***"``.
    closed = quote if len(value) > 1 and value.endswith(quote) else ""
    return f"{prefix}{quote}{MASK}{closed}"


# -- what an operator is shown: credential keys masked whole, sizes bounded --------------------------------

#: The most characters of one value (a message's text, a tool's input, a payload) a page shows.
MAX_SHOWN_TEXT = 20_000
# A value under a key named like a credential is masked whole on a page, whatever it looks like: the
# redactor knows secret values and shapes, not a password typed into a payload by a user. Matched on the
# key's letters and digits, lower-cased: "API-Key", "api_key" and "apiKey" are one key. ``auth`` but not
# ``author``/``authority`` or ``authenticated``; ``token`` but not ``tokens`` (a count).
_SECRET_KEY = re.compile(
    r"password|passwd|passphrase|pwd|secret|apikey|accesskey|privatekey|authorization|auth(?!or|ent)"
    r"|credential|cookie|token(?!s)"
)


def _secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search("".join(c for c in key.lower()[:200] if c.isalnum())))


def mask_secret_keys(value: Any) -> Any:
    """``value`` with the value of every key named like a credential (not None or empty) as ``***``."""
    if isinstance(value, dict):
        return {
            k: MASK if _secret_key(str(k)) and v not in (None, "") else mask_secret_keys(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [mask_secret_keys(v) for v in value]
    return value


# A double-quoted key and its colon in text that should have been JSON: the key's escapes are skipped whole,
# so a quote inside it never ends it; a scan from a quote stops at the next quote, so the search is linear.
_QUOTED_KEY = re.compile(r'"((?:[^"\\\n]|\\.)*)"\s*:[ \t]*')
# A JSON string, from its opening quote to its closing one.
_JSON_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')
# A key's text whose every escape is one of JSON's (so reading it cannot fail).
_JSON_ESCAPES = re.compile(r'(?:[^"\\]|\\["\\/bfnrt]|\\u[0-9A-Fa-f]{4})*')


def mask_secret_keys_in_text(text: str) -> str:
    r"""``text`` with the value after every quoted key named like a credential masked, as `mask_secret_keys`.

    For text that should have been JSON and cannot be read as JSON (a torn line, a line nested deeper than
    the parser goes), so a value under ``"private_key"`` is masked however the text around it is broken: a
    string value up to its closing quote, any other value (an object, a list, a number, a string that never
    closes) to the end of its line, since where it ends cannot be told. A key's JSON escapes are read
    (``"private\u005fkey"`` is ``private_key``).
    """
    parts: list[str] = []
    secret: dict[str, bool] = {}  # a line's keys recur: each is judged once
    copied = at = 0  # text[:copied] is in parts; the search goes on from at
    while (found := _QUOTED_KEY.search(text, at)) is not None:
        at = found.end()
        raw = found.group(1)
        judged = secret.get(raw)
        if judged is None:
            judged = secret[raw] = _secret_key(_json_key(raw))
        if not judged or at >= len(text) or text[at] in "\r\n":
            continue
        parts.append(text[copied:at])
        rest = _JSON_STRING.match(text, at)
        if rest is not None:
            parts.append(f'"{MASK}"')
            at = rest.end()
        else:
            line_end = text.find("\n", at)
            at = len(text) if line_end < 0 else line_end
            parts.append(MASK)
        copied = at
    parts.append(text[copied:])
    return "".join(parts)


def _json_key(raw: str) -> str:
    """A JSON key's text with its escapes read; as written when they are not JSON's."""
    if "\\" not in raw or not _JSON_ESCAPES.fullmatch(raw):
        return raw
    return str(json.loads(f'"{raw}"', strict=False))


def bound(value: Any, limit: int = MAX_SHOWN_TEXT) -> Any:
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
