"""JSON that a rank, a program or a node wrote - a run's files, what a node sends back - read as data
that may be damaged or forged: parsed with its nesting bounded, then checked against a small
declarative schema before anything reads it, so that what is wrong is one line naming the field.

A schema is a tuple of types (``(int,)``, ``NUMBER``), or an ``Obj``, ``ListOf``, ``MapOf``,
``Matches`` or ``Maybe`` of schemas. The checker recurses into the schema, never deeper into the
data than the schema goes, and the data itself nests at most ``MAX_DEPTH`` deep."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Of objects and lists within each other: edgetrain's own files nest 4 deep, a script's metrics 1.
MAX_DEPTH = 32

NUMBER = (int, float)


@dataclass(frozen=True)
class Obj:
    """An object with these fields; fields it does not name travel along unread."""

    required: Mapping[str, Schema] = field(default_factory=dict)
    optional: Mapping[str, Schema] = field(default_factory=dict)


@dataclass(frozen=True)
class ListOf:
    """A list whose every item fits ``item``; of exactly ``length`` items where it is given."""

    item: Schema
    length: int | None = None


@dataclass(frozen=True)
class MapOf:
    """An object whose every value fits ``value``, and every key ``key`` where it is given."""

    value: Schema
    key: Matches | None = None


@dataclass(frozen=True)
class Matches:
    """A string the whole of which matches ``pattern``; ``what`` says what it is in a message."""

    pattern: re.Pattern[str]
    what: str


@dataclass(frozen=True)
class Maybe:
    """``null``, or what ``schema`` says."""

    schema: Schema


Schema = tuple[Any, ...] | Obj | ListOf | MapOf | Matches | Maybe

SHA256 = Matches(re.compile(r"[0-9a-f]{64}"), "a sha256 (64 lowercase hex characters)")


def loads(text: str | bytes) -> Any:
    """The value ``text`` holds; ValueError where it is not JSON or nests deeper than MAX_DEPTH."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"it nests deeper than {MAX_DEPTH} levels") from None
    if _deeper_than(value, MAX_DEPTH):
        raise ValueError(f"it nests deeper than {MAX_DEPTH} levels")
    return value


def load(path: Path) -> Any:
    """``loads`` of a file: OSError where it cannot be read, ValueError where it is not what it should be."""
    return loads(path.read_bytes())


def _deeper_than(value: Any, limit: int) -> bool:
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            pending += [(child, depth + 1) for child in (item.values() if isinstance(item, dict) else item)]
    return False


def fits(value: Any, types: tuple[Any, ...]) -> bool:
    # JSON's true is no count: a bool passes only where the schema names bool.
    return isinstance(value, types) and (not isinstance(value, bool) or bool in types)


def problem(value: Any, schema: Schema, name: str = "") -> str | None:
    """What keeps ``value`` from fitting ``schema``, in a phrase naming the field; None where it fits."""
    said = name or "it"
    if isinstance(schema, Maybe):
        return None if value is None else problem(value, schema.schema, name)
    if isinstance(schema, tuple):
        return None if fits(value, schema) else f"{said} is {_kind(value)}, not {_expected(schema)}"
    if isinstance(schema, Matches):
        ok = isinstance(value, str) and schema.pattern.fullmatch(value) is not None
        return None if ok else f"{said} is not {schema.what}"
    if isinstance(schema, ListOf):
        if not isinstance(value, list):
            return f"{said} is {_kind(value)}, not a list"
        if schema.length is not None and len(value) != schema.length:
            return f"{said} holds {len(value)} items, not {schema.length}"
        return next(filter(None, (problem(v, schema.item, f"{name}[{i}]") for i, v in enumerate(value))), None)
    if not isinstance(value, dict):
        return f"{said} is {_kind(value)}, not an object"
    if isinstance(schema, MapOf):
        if schema.key is not None:
            wrong = next((k for k in value if schema.key.pattern.fullmatch(k) is None), None)
            if wrong is not None:
                return f"{name or 'a'} key {wrong!r} is not {schema.key.what}"
        return next(filter(None, (problem(v, schema.value, f"{name}[{k!r}]") for k, v in value.items())), None)
    for key in schema.required:
        if key not in value:
            return f"{_field(name, key)} is missing"
    fields = {**schema.required, **schema.optional}
    return next(filter(None, (problem(value[k], s, _field(name, k)) for k, s in fields.items() if k in value)), None)


def check(value: Any, schema: Schema) -> Any:
    """``value``, where it fits ``schema``; else ValueError saying what does not."""
    wrong = problem(value, schema)
    if wrong is not None:
        raise ValueError(wrong)
    return value


def _field(name: str, key: str) -> str:
    return f"{name}.{key}" if name else key


KINDS = ((bool, "true or false"), (int, "a whole number"), (float, "a number"), (str, "a string"),
         (list, "a list"), (dict, "an object"), (type(None), "null"))


def _kind(value: Any) -> str:
    return next((said for t, said in KINDS if isinstance(value, t)), type(value).__name__)


def _expected(types: tuple[Any, ...]) -> str:
    # A float is named for a number, whole or not.
    named = [said for t, said in KINDS if t in types and not (t is int and float in types)]
    return " or ".join(named)
