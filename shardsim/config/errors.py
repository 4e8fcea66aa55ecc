"""A pydantic ValidationError of the configuration tree as one `ConfigError` line naming the field,
in the words the file reader uses (``expected an integer >= 1, got 0``)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from shardsim.core.errors import ConfigError
from shardsim.simulator.scale import beyond
from shardsim.simulator.strategies.kinds import STRATEGIES as KINDS

# the parts of an error's location that are not fields: the strategy (its fields are flat
# settings), the union's tag (the kind), a union member's type
_NOT_FIELDS = {"strategy", *KINDS, "str", "is-instance[Arch]", "function-after[...]", "int", "none"}


def field_path(loc: tuple[Any, ...]) -> str:
    """The field an error's location names, dotted: ``strategy.zero2d.degree`` is ``degree``
    (the strategy's fields are settings of their own name), ``strategy`` alone stays."""
    parts = [str(p) for p in loc if str(p) not in _NOT_FIELDS and not str(p).startswith(("function-", "is-instance"))]
    if not parts and loc and loc[0] == "strategy":
        return "strategy"
    return ".".join(parts)


def _words(err: dict[str, Any]) -> str:
    kind, value, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"expected an integer, got {value!r}"
    if kind == "greater_than_equal":
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
        return "unknown key"
    if kind == "missing":
        return "missing"
    if kind == "union_tag_invalid":
        return f"unknown strategy {ctx.get('tag')!r}; expected one of {', '.join(KINDS)}"
    if kind == "union_tag_not_found":
        return f"a strategy needs its kind, one of {', '.join(KINDS)}"
    if kind == "is_instance_of":
        return f"expected {ctx.get('class', 'another type')}, got {value!r}"
    return err["msg"]


def config_error(exc: ValidationError, where: str | None = None) -> ConfigError:
    """The first error of `exc` as one ConfigError line naming its field."""
    errors = exc.errors(include_url=False)
    # a union of types reports each member's failure: the one that names the value's own type says most
    first = errors[0]
    for err in errors:
        if err["type"] not in ("string_type", "is_instance_of", "none_required"):
            first = err
            break
    field = field_path(tuple(first["loc"]))
    if first["type"] == "union_tag_invalid":
        field = "strategy"
    return ConfigError(_words(first), where=where, field=field or None)
