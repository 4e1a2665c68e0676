r"""An MCP tool's JSON Schema: the validator of the model's arguments, with ``pattern`` in linear time.

`validator_for` builds a tool's validator once, when its server lists it; `checker` wraps it into the
function that checks each call's arguments (a JSON copy, then the schema), with one line per problem.

A tool's input schema comes from its server, and its ``pattern`` regular expressions run on the model's
arguments inside the agent's event loop. Python's ``re`` backtracks: ``(a+)+$`` on thirty characters, or
``\d*\d*x`` on a few thousand, would hold the loop (the probes, the drain) for minutes, and nothing can
interrupt a match. `compile_pattern` turns a pattern into a Thompson automaton (from ``re``'s own parser,
so the syntax and meaning are those of ``re.search``); `Pattern.search` runs every way of matching in step,
reading each character once: at most (text length) x (automaton size) steps, whatever the pattern.

What cannot be matched that way is refused with `PatternRefused` (the tool is then left out): back
references, look-arounds, atomic groups and possessive repeats, flags, and patterns whose automaton would
exceed `MAX_STATES` (a ``{1000}`` repeat of a long group). A search that would take more than `MAX_STEPS`
steps stops with `PatternRefused` too, which the caller reports as an argument it could not check.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

# re's parser: the same syntax, groups and character classes as `re.search`, which jsonschema uses.
from re import _constants as c  # type: ignore[attr-defined]
from re import _parser  # type: ignore[attr-defined]
from typing import Any

import orjson

from agentlife._exceptions import ToolArgumentsInvalid
from agentlife._schema import RUNTIME_PARAMETERS

__all__ = [
    "MAX_STATES",
    "MAX_STEPS",
    "Pattern",
    "PatternRefused",
    "checker",
    "compile_pattern",
    "json_key",
    "short",
    "validator_for",
]

#: The largest automaton a pattern may compile to.
MAX_STATES = 5_000
#: The most steps (automaton states visited) one search may take: well under a second of Python.
MAX_STEPS = 1_000_000

_MAX_PATTERN = 10_000
_DFA_STATES = 4096
_MAX_PROBLEMS = 10
_MAX_PROBLEM_TEXT = 300
_UNICODE = re.UNICODE.value


class PatternRefused(ValueError):
    """The pattern (or this text) cannot be matched in bounded time; the message says why."""


# Instructions: ("char", test) consumes one character that passes ``test``; ("split", a, b) and
# ("jump", a) branch without consuming; ("at", code) is a zero-width assertion; ("match",) accepts.
_Instr = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Pattern:
    """A compiled pattern: `search` says whether it matches anywhere in a text."""

    source: str
    program: tuple[_Instr, ...]

    def search(self, text: str) -> bool:
        """``re.search(self.source, text) is not None``, in at most ``len(text)`` x states steps.

        The set of live states after each character is remembered (a lazy DFA), keyed by the set before,
        the character and what the assertions can see there, so a long run of similar text costs one
        lookup a character.

        Raises:
            PatternRefused: the search would take more than `MAX_STEPS` steps.
        """
        program, n = self.program, len(text)
        accept = len(program) - 1
        # "^..." or "\A...": threads start at position 0 only, so once none is left the answer is no.
        anchored = program[0][0] == "at" and program[0][1] in (c.AT_BEGINNING, c.AT_BEGINNING_STRING)
        boundaries = any(i[0] == "at" and i[1] in (c.AT_BOUNDARY, c.AT_NON_BOUNDARY) for i in program)
        found: list[int] = []
        seen: set[int] = set()
        budget = MAX_STEPS - self._closure(0, 0, text, found, seen)
        current = frozenset(found)
        steps: dict[tuple[frozenset[int], str, tuple[bool, ...]], frozenset[int]] = {}
        for pos in range(n + 1):
            if accept in current:
                return True
            if pos == n or (anchored and not current):
                return False
            char, after = text[pos], pos + 1
            # All the assertions at `after` can depend on (see _ASSERTIONS).
            seen_there = (
                after == n,
                after == n - 1 and text[after] == "\n",
                boundaries and _word(char),
                boundaries and after < n and _word(text[after]),
            )
            key = (current, char, seen_there)
            following = steps.get(key)
            budget -= 1
            if following is None:
                found, seen = [], set()
                budget -= self._closure(0, after, text, found, seen)  # re.search: a thread starts anywhere
                for pc in current:
                    instr = program[pc]
                    if instr[0] == "char" and _passes(instr[1], char):
                        budget -= self._closure(pc + 1, after, text, found, seen)
                following = frozenset(found)
                if len(steps) >= _DFA_STATES:
                    steps.clear()
                steps[key] = following
            if budget < 0:
                raise PatternRefused(f"checking {n} characters against it would take too long")
            current = following
        return False

    def _closure(self, start: int, pos: int, text: str, out: list[int], seen: set[int]) -> int:
        """Add the states reachable from ``start`` without reading (at ``pos``) to ``out``; steps taken."""
        program = self.program
        stack, steps = [start], 0
        while stack:
            pc = stack.pop()
            if pc in seen:
                continue
            seen.add(pc)
            steps += 1
            instr = program[pc]
            kind = instr[0]
            if kind == "jump":
                stack.append(instr[1])
            elif kind == "split":
                stack.append(instr[2])
                stack.append(instr[1])
            elif kind == "at":
                if _holds(instr[1], text, pos):
                    stack.append(pc + 1)
            else:
                out.append(pc)
        return steps


@functools.lru_cache(maxsize=256)
def compile_pattern(source: str) -> Pattern:
    """The automaton of ``source`` (cached).

    Raises:
        PatternRefused: not a valid regular expression, or one that cannot be matched in linear time.
    """
    if not isinstance(source, str) or len(source) > _MAX_PATTERN:
        raise PatternRefused("a pattern must be a string of at most 10000 characters")
    try:
        parsed = _parser.parse(source, 0)
    except (re.error, RecursionError, OverflowError) as exc:
        raise PatternRefused(f"not a valid regular expression: {exc}") from None
    if parsed.state.flags & ~_UNICODE:
        raise PatternRefused("inline flags such as (?i) are not supported")
    builder = _Builder()
    builder.emit(list(parsed))
    builder.add(("match",))
    return Pattern(source, tuple(builder.program))


class _Builder:
    def __init__(self) -> None:
        self.program: list[_Instr] = []

    def add(self, instr: _Instr) -> int:
        if len(self.program) >= MAX_STATES:
            raise PatternRefused(f"it compiles to more than {MAX_STATES} states")
        self.program.append(instr)
        return len(self.program) - 1

    def patch(self, at: int, instr: _Instr) -> None:
        self.program[at] = instr

    def emit(self, items: list[tuple[Any, Any]]) -> None:
        for op, av in items:
            self.emit_one(op, av)

    def emit_one(self, op: Any, av: Any) -> None:
        if op is c.LITERAL:
            self.add(("char", ("lit", chr(av))))
        elif op is c.NOT_LITERAL:
            self.add(("char", ("notlit", chr(av))))
        elif op is c.ANY:
            self.add(("char", ("notlit", "\n")))
        elif op is c.IN:
            self.add(("char", _char_set(av)))
        elif op is c.AT:
            if av not in _ASSERTIONS:
                raise PatternRefused(f"the assertion {av} is not supported")
            self.add(("at", av))
        elif op is c.SUBPATTERN:
            _group, add_flags, del_flags, body = av
            if add_flags or del_flags:
                raise PatternRefused("flags inside a group are not supported")
            self.emit(list(body))
        elif op is c.BRANCH:
            self.branch([list(alt) for alt in av[1]])
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT):  # greedy or lazy: the same yes or no
            low, high, body = av
            self.repeat(low, high, list(body))
        else:
            names = {
                c.GROUPREF: "back references",
                c.GROUPREF_EXISTS: "conditional groups",
                c.ASSERT: "look-arounds",
                c.ASSERT_NOT: "look-arounds",
                c.ATOMIC_GROUP: "atomic groups",
                c.POSSESSIVE_REPEAT: "possessive repeats",
            }
            raise PatternRefused(f"{names.get(op, str(op).lower())} are not supported")

    def branch(self, alternatives: list[list[tuple[Any, Any]]]) -> None:
        jumps = []
        for alt in alternatives[:-1]:
            split = self.add(("split", 0, 0))
            self.emit(alt)
            jumps.append(self.add(("jump", 0)))
            self.patch(split, ("split", split + 1, len(self.program)))
        self.emit(alternatives[-1])
        for jump in jumps:
            self.patch(jump, ("jump", len(self.program)))

    def repeat(self, low: int, high: int, body: list[tuple[Any, Any]]) -> None:
        if low > MAX_STATES or (high != c.MAXREPEAT and high > MAX_STATES):
            raise PatternRefused(f"a repeat of more than {MAX_STATES} is not supported")
        for _ in range(low):
            self.emit(body)
        if high == c.MAXREPEAT:
            split = self.add(("split", 0, 0))
            self.emit(body)
            self.add(("jump", split))
            self.patch(split, ("split", split + 1, len(self.program)))
            return
        splits = []
        for _ in range(high - low):
            splits.append(self.add(("split", 0, 0)))
            self.emit(body)
        for split in splits:
            self.patch(split, ("split", split + 1, len(self.program)))


def _char_set(items: list[tuple[Any, Any]]) -> tuple[Any, ...]:
    """A character class: ("set", negated, literals, ranges, categories)."""
    negated, literals, ranges, categories = False, set(), [], []
    for op, av in items:
        if op is c.NEGATE:
            negated = True
        elif op is c.LITERAL:
            literals.add(chr(av))
        elif op is c.RANGE:
            ranges.append((chr(av[0]), chr(av[1])))
        elif op is c.CATEGORY and av in _CATEGORIES:
            categories.append(av)
        else:
            raise PatternRefused(f"{op} in a character class is not supported")
    return ("set", negated, frozenset(literals), tuple(ranges), tuple(categories))


def _passes(test: tuple[Any, ...], char: str) -> bool:
    kind = test[0]
    if kind == "lit":
        return char == test[1]  # type: ignore[no-any-return]
    if kind == "notlit":
        return char != test[1]  # type: ignore[no-any-return]
    _, negated, literals, ranges, categories = test
    inside = (
        char in literals
        or any(low <= char <= high for low, high in ranges)
        or any(_CATEGORIES[category](char) for category in categories)
    )
    return inside != negated  # type: ignore[no-any-return]


def _word(char: str) -> bool:
    # re's Unicode word character: alphanumeric (str.isalnum, as re's own test) or the underscore.
    return char.isalnum() or char == "_"


_CATEGORIES: dict[Any, Callable[[str], bool]] = {
    c.CATEGORY_DIGIT: str.isdecimal,
    c.CATEGORY_NOT_DIGIT: lambda ch: not ch.isdecimal(),
    c.CATEGORY_SPACE: str.isspace,
    c.CATEGORY_NOT_SPACE: lambda ch: not ch.isspace(),
    c.CATEGORY_WORD: _word,
    c.CATEGORY_NOT_WORD: lambda ch: not _word(ch),
}


def _boundary(text: str, pos: int) -> bool:
    before = pos > 0 and _word(text[pos - 1])
    after = pos < len(text) and _word(text[pos])
    return before != after


_ASSERTIONS: dict[Any, Callable[[str, int], bool]] = {
    c.AT_BEGINNING: lambda text, pos: pos == 0,
    c.AT_BEGINNING_STRING: lambda text, pos: pos == 0,
    # "$" without MULTILINE: the end, or just before a newline that ends the text.
    c.AT_END: lambda text, pos: pos == len(text) or (pos == len(text) - 1 and text[pos] == "\n"),
    c.AT_END_STRING: lambda text, pos: pos == len(text),
    c.AT_BOUNDARY: _boundary,
    c.AT_NON_BOUNDARY: lambda text, pos: not _boundary(text, pos),
}


def _holds(code: Any, text: str, pos: int) -> bool:
    return _ASSERTIONS[code](text, pos)


# -- the validator -------------------------------------------------------------------------------------


def validator_for(schema: Any) -> Any:
    """A validator for the schema, built once per tool (draft 2020-12 unless it names its own).

    Its ``pattern`` keyword runs agentlife's linear-time matcher instead of ``re``, and it resolves no
    ``$ref`` outside the schema: jsonschema would otherwise fetch a remote one over HTTP, synchronously,
    from the event loop, wherever the server's schema points.

    Raises:
        ValueError: what is wrong, to follow "its input schema ".
    """
    import jsonschema
    import jsonschema.exceptions
    import jsonschema.validators
    import referencing

    if not isinstance(schema, dict):
        raise ValueError(f"is not valid JSON Schema: it is a {type(schema).__name__}, not an object")  # noqa: TRY004
    if schema.get("type", "object") != "object":
        raise ValueError(
            f"is not valid JSON Schema for arguments: they are an object, the schema says type "
            f"{schema.get('type')!r}"
        )
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
        _check_patterns(schema)
    except jsonschema.exceptions.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "(root)"
        raise ValueError(f"is not valid JSON Schema: {where}: {short(exc.message)}") from None
    except RecursionError:
        raise ValueError("is not valid JSON Schema: nested too deeply") from None
    return _bounded(cls)(schema, registry=referencing.Registry())


@functools.cache
def _bounded(cls: Any) -> Any:
    """``cls`` with ``pattern`` and ``uniqueItems`` checked in linear time (one class per draft).

    jsonschema compares the items of an array of objects two by two: 3000 objects from the model take
    seconds of the event loop, 10 000 a minute.
    """
    import jsonschema.validators

    return jsonschema.validators.extend(
        cls, validators={"pattern": _pattern_keyword, "uniqueItems": _unique_items_keyword}
    )


def _pattern_keyword(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "string"):
        return
    try:
        found = compile_pattern(pattern).search(instance)
    except PatternRefused as exc:
        yield ValidationError(f"{_shown(instance)} could not be checked against {pattern!r}: {exc}")
        return
    if not found:
        yield ValidationError(f"{_shown(instance)} does not match {pattern!r}")


def _unique_items_keyword(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if not unique or not validator.is_type(instance, "array"):
        return
    seen: set[Any] = set()
    for item in instance:
        key = json_key(item)
        if key in seen:
            yield ValidationError(f"{_shown(repr(instance))} has non-unique elements")
            return
        seen.add(key)


def json_key(value: Any) -> Any:
    """A hashable key, equal for values JSON Schema calls equal: 1 and 1.0 (but not 1 and true)."""
    if value is True or value is False or value is None:
        return ("literal", value)
    if isinstance(value, (int, float)):
        return ("number", value)  # 1 == 1.0, with equal hashes
    if isinstance(value, str):
        return ("string", value)
    if isinstance(value, list):
        return ("array", tuple(json_key(v) for v in value))
    if isinstance(value, dict):
        return ("object", frozenset((k, json_key(v)) for k, v in value.items()))
    return ("other", repr(value))


def _shown(text: str) -> str:
    """The value in a problem line: its start, where it is long (the line is for the model, and short)."""
    return repr(text) if len(text) <= 40 else f"{text[:40]!r}... ({len(text)} characters)"


# Keywords whose value maps names to schemas (the names are not keywords), and keywords holding data.
_SCHEMA_MAPS = frozenset({"properties", "$defs", "definitions", "dependentSchemas", "patternProperties"})
_DATA = frozenset({"enum", "const", "default", "examples"})


def _check_patterns(schema: dict[str, Any]) -> None:
    """Every ``pattern`` must compile for the linear-time matcher; ``patternProperties`` are refused.

    Raises:
        ValueError: the first that does not, to follow "its input schema ".
    """
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        if isinstance(node.get("patternProperties"), dict) and node["patternProperties"]:
            raise ValueError(
                "uses patternProperties, which agentlife does not check: their regular expressions would "
                "run on the model's arguments without a bound"
            )
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            try:
                compile_pattern(pattern)
            except PatternRefused as exc:
                raise ValueError(
                    f"holds a pattern agentlife cannot check in bounded time ({short(repr(pattern))}: {exc})"
                ) from None
        for key, value in node.items():
            if key in _SCHEMA_MAPS and isinstance(value, dict):
                stack.extend(value.values())
            elif key not in _DATA and key != "pattern":
                stack.append(value)


def checker(name: str, validator: Any) -> Callable[[Any], dict[str, Any]]:
    def check(arguments: Any) -> dict[str, Any]:
        data = {} if arguments is None else arguments
        if not isinstance(data, dict):
            raise ToolArgumentsInvalid(name, [f"(arguments): must be an object, got {type(data).__name__}"])
        if RUNTIME_PARAMETERS & data.keys():
            raise ToolArgumentsInvalid(name, ["invocation_id: filled in by the runtime, not a parameter"])
        try:
            # A copy of plain JSON values: the tool gets what the journal digested, whatever the caller holds.
            data = orjson.loads(orjson.dumps(data))
        except (TypeError, orjson.JSONEncodeError) as exc:
            raise ToolArgumentsInvalid(name, [f"the arguments are not JSON: {exc}"]) from None
        try:
            errors = list(validator.iter_errors(data))  # one pass: valid arguments (the common case) end here
            if not errors:
                return data  # type: ignore[no-any-return]
            errors.sort(key=lambda e: [str(p) for p in e.absolute_path])
        except RecursionError:
            raise ToolArgumentsInvalid(name, ["(arguments): nested too deeply"]) from None
        except Exception as exc:  # the server's schema, not the arguments: an unresolvable $ref ...
            problem = f"(arguments): the tool's schema could not be applied: {type(exc).__name__}: {exc}"
            raise ToolArgumentsInvalid(name, [short(problem)]) from None
        raise ToolArgumentsInvalid(name, [_problem(e) for e in errors[:_MAX_PROBLEMS]])

    return check


def _problem(error: Any) -> str:
    where = ".".join(str(p) for p in error.absolute_path) or "(arguments)"
    return f"{where}: {short(error.message)}"


def short(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= _MAX_PROBLEM_TEXT else text[: _MAX_PROBLEM_TEXT - 1] + "…"
