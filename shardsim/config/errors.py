"""A pydantic ValidationError of the configuration tree as one `ConfigError` line naming the field,
in the words the file reader uses (``expected an integer >= 1, got 0``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from shardsim.core.documents import error_words
from shardsim.core.errors import ConfigError
from shardsim.core.yamlio import unknown_key
from shardsim.specs.bounds import beyond
from shardsim.specs.strategies import STRATEGIES as KINDS


def field_path(loc: tuple[Any, ...]) -> str:
    """The field an error's location names, dotted; the strategy's union tag (its kind) left
    out, as its fields are settings of their own name (``degree``)."""
    return ".".join(str(p) for p in loc if str(p) not in KINDS)


def _words(err: dict[str, Any]) -> str:
    kind, value, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"expected an integer, got {value!r}"
    if kind == "greater_than_equal":
        if isinstance(ctx["ge"], float):  # a real-valued setting's bound
            return f"expected a number >= {ctx['ge']:g}, got {value!r}"
        return f"expected an integer >= {ctx['ge']}, got {value!r}"
    if kind == "less_than_equal":
        return beyond(value, ctx["le"]) if isinstance(value, int) else f"expected at most {ctx['le']}, got {value!r}"
    if kind == "literal_error":
        choices = ", ".join(str(c).strip("'") for c in str(ctx.get("expected", "")).replace(" or ", ", ").split(", "))
        return f"expected one of {choices}, got {value!r}"
    if kind == "string_type":
        return f"expected a string, got {value!r}"
    if kind == "bool_type":
        return f"expected true or false, got {value!r}"
    if kind == "extra_forbidden":
        return "unknown key"  # with the nearest known name: `config_error`
    if kind == "missing":
        return "missing"
    if kind == "union_tag_invalid":
        return f"unknown strategy {ctx.get('tag')!r}; expected one of {', '.join(KINDS)}"
    if kind == "union_tag_not_found":
        return f"a strategy needs its kind, one of {', '.join(KINDS)}"
    if kind == "is_instance_of":
        return f"expected {ctx.get('class', 'another type')}, got {value!r}"
    return error_words(err)  # as every other document's error is worded


def config_error(exc: ValidationError, where: str | None = None, known: Iterable[str] = ()) -> ConfigError:
    """The first error of `exc` as one ConfigError line naming its field; an unknown key with the
    nearest of `known` (the model's fields) as what was meant."""
    first = exc.errors(include_url=False)[0]
    field = field_path(tuple(first["loc"]))
    if first["type"] == "union_tag_invalid":
        field = "strategy"
    if first["type"] == "extra_forbidden" and known:
        return unknown_key(field, known, where=where, field=field)
    return ConfigError(_words(first), where=where, field=field or None)
