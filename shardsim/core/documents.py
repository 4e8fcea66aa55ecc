"""Checking a file the user passes (a profile, a calibration, a validation matrix) against its
schema, a pydantic model: the first thing wrong becomes one ConfigError naming the file and
the field, in the words the rest of shardsim uses ("expected a number > 0, got 'x'").

Schemas derive from `Document`: strict types (no string read as a number, no true read as 1),
finite numbers (NaN and infinity are refused), keys a schema does not name kept or refused as the
schema says.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from shardsim.core.errors import ConfigError

D = TypeVar("D", bound=BaseModel)


class Document(BaseModel):
    """A schema of (part of) a file: strict types, finite numbers; keys it does not name are ignored."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True, allow_inf_nan=False)


class ClosedDocument(Document):
    """A schema that refuses keys it does not name (a misspelt key is an error, not a default)."""

    model_config = ConfigDict(extra="forbid")


def field_name(loc: tuple[int | str, ...]) -> str:
    """A pydantic location as a dotted field: ('links', 'emu-2x2', 'nic_Bps') → links.emu-2x2.nic_Bps;
    list positions as [i]; a mapping's key (followed by pydantic's '[key]') as the key itself."""
    out = ""
    for i, part in enumerate(loc):
        if part == "[key]":
            continue
        is_key = i + 1 < len(loc) and loc[i + 1] == "[key]"
        if isinstance(part, int) and not is_key:
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


_WORDS = {
    "model_type": "expected a mapping",
    "model_attributes_type": "expected a mapping",
    "dict_type": "expected a mapping",
    "list_type": "expected a list",
    "tuple_type": "expected a list",
    "float_type": "expected a number",
    "int_type": "expected a whole number",
    "int_from_float": "expected a whole number",
    "string_type": "expected a string",
    "bool_type": "expected true or false",
    "finite_number": "expected a finite number",
    "missing": "missing",
    "extra_forbidden": "unknown key",
}


def error_words(err: dict[str, Any]) -> str:
    """What is wrong, as shardsim words it (pydantic's own message where no wording is set)."""
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind in _WORDS:
        return _WORDS[kind]
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        op = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}[kind]
        bound = next(iter(ctx.values()))
        return f"expected a number {op} {bound:g}"
    if kind == "too_short":
        return f"expected at least {ctx.get('min_length')} item(s)"
    if kind == "too_long":
        return f"expected at most {ctx.get('max_length')} item(s)"
    if kind == "literal_error":
        return f"expected {ctx.get('expected')}"
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    msg = str(err["msg"])
    return msg[:1].lower() + msg[1:]


def _shown(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(exc: ValidationError) -> tuple[str, str]:
    """(the field, what is wrong with it) of the first error of a pydantic validation."""
    err = exc.errors(include_url=False)[0]
    words = error_words(err)
    if err["type"] not in ("missing", "extra_forbidden"):
        words += f", got {_shown(err['input'])}"
    return field_name(tuple(err["loc"])), words


def checked(schema: type[D], data: Any, where: str, *, prefix: str = "") -> D:
    """`data` (a file's parsed content) as `schema`, or ConfigError naming the file `where` and
    the first field that is wrong (`prefix` before it: where `data` sits in the file)."""
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        name, words = describe(exc)
        full = ".".join(p for p in (prefix, name) if p) or None
        raise ConfigError(words, where=where, field=full) from None
