"""Reading YAML and JSON files into checked values, with errors that name the file and field.

Every file the user passes is read through `load_yaml` or `load_json` (or `read_text`): at most
`FILE_BYTES` of it (more is refused before it is parsed), as UTF-8, its YAML with one loader
(`StrictLoader`) that refuses duplicate keys and nesting deeper than `MAX_DEPTH`, and its JSON
refusing duplicate keys too. A file of 0 bytes is refused, and so is a number that is not
finite (YAML's ``.nan`` and ``.inf``, JSON's ``NaN`` and ``Infinity``) wherever it is, read or not.

A figure in a topology or workload file may be written plainly (``memory_gib: 16``) or
with its source (``memory_gib: {value: 16, source: "NVIDIA T4 datasheet"}``). Shipped
topologies always use the second form; a test checks it. A mapping read with `Fields` names
the keys it may hold (`Fields.closed`): any other is refused, with the nearest known key.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from shardsim.core.errors import ConfigError

MiB = 1 << 20
FILE_BYTES = MiB  # configurations, topologies, models, matrices, calibration files, profiles
MAX_DEPTH = 64  # levels of nested mappings and lists; shipped files use fewer than 8
FIGURE_KEYS = ("value", "source")  # a figure written with its source


def _size(n: int) -> str:
    return f"{n / MiB:g} MiB" if n >= MiB else f"{n} bytes"


def read_text(path: Path, *, limit: int = FILE_BYTES) -> str:
    """The UTF-8 text of a file of at most `limit` bytes (at most limit + 1 bytes are read, so a
    device or a huge file is refused at once); ConfigError naming the file otherwise."""
    where = str(path)
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read file: {exc.strerror or exc}", where=where) from None
    if len(data) > limit:
        raise ConfigError(f"larger than {_size(limit)}, the most shardsim reads from such a file", where=where)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text at byte {exc.start}", where=where) from None


def _some_text(path: Path, limit: int) -> str:
    """`read_text`, refusing a file of 0 bytes (an unwritten file is not a configuration of defaults)."""
    text = read_text(path, limit=limit)
    if not text:
        raise ConfigError("empty file (0 bytes)", where=str(path))
    return text


class _Refused(yaml.MarkedYAMLError):
    """Valid YAML that shardsim does not read (a duplicate key, nesting too deep)."""


class StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses a key given twice in one mapping (YAML's last-wins would
    drop the first silently) and nesting deeper than `MAX_DEPTH` (the composer recurses), an
    alias's nesting counted where it is used, and an alias inside the value it names."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._height: dict[int, int] = {}  # id of a composed node → levels of nesting in it

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            line = self.peek_event().start_mark.line + 1
            if self._depth > MAX_DEPTH:
                raise _Refused(problem=f"nested deeper than {MAX_DEPTH} levels at line {line}")
            alias = self.check_event(yaml.AliasEvent)
            node = super().compose_node(parent, index)
            height = self._height.get(id(node))
            if height is None:
                if alias:  # the anchored value is still being composed: it would hold itself
                    raise _Refused(problem=f"an alias at line {line} refers to a value that holds it")
                children = node.value if isinstance(node, yaml.SequenceNode) else ()
                if isinstance(node, yaml.MappingNode):
                    children = [n for pair in node.value for n in pair]
                height = self._height[id(node)] = 1 + max((self._height[id(c)] for c in children), default=0)
            if self._depth - 1 + height > MAX_DEPTH:
                raise _Refused(problem=f"nested deeper than {MAX_DEPTH} levels at line {line}")
            return node
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *base` merges keys that the mapping's own may override
                key = self.construct_object(key_node, deep=False)
                try:
                    first = seen.setdefault(key, key_node.start_mark)
                except TypeError:
                    continue  # an unhashable key: the constructor refuses it itself
                if first is not key_node.start_mark:
                    line = key_node.start_mark.line + 1
                    raise _Refused(problem=f"duplicate key {key!r} at line {line} (first at line {first.line + 1})")
        return super().construct_mapping(node, deep=deep)


def _key_path(path: tuple[Any, ...]) -> str:
    """``a.b[2].c``: where a value sits in nested mappings and lists."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text


def non_finite(value: Any) -> tuple[str, float] | None:
    """The first number that is not finite in nested mappings and lists (its key path and
    value), or None; walked without recursion."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if isinstance(item, dict) and "value" in item and set(item) <= set(FIGURE_KEYS):
            item = item["value"]  # a figure with its source: named by its key, as `Fields.raw` reads it
        if isinstance(item, float) and not math.isfinite(item):
            return _key_path(path), item
        if isinstance(item, dict):
            stack.extend((v, (*path, k)) for k, v in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((v, (*path, i)) for i, v in reversed(list(enumerate(item))))
    return None


def check_finite(value: Any, where: str) -> Any:
    """`value`, once every number in it is finite; ConfigError naming the first other one's key."""
    found = non_finite(value)
    if found is not None:
        path, number = found
        raise ConfigError(f"expected a finite number, got {number!r}", where=where, field=path or None)
    return value


def parse_yaml(text: str, where: str) -> Any:
    """The value of a YAML text (`StrictLoader`), every number in it finite (`check_finite`);
    ConfigError naming `where` and the line otherwise."""
    try:
        return check_finite(yaml.load(text, Loader=StrictLoader), where)  # a SafeLoader: plain data only
    except _Refused as exc:
        raise ConfigError(str(exc.problem), where=where) from None
    except yaml.reader.ReaderError as exc:
        raise ConfigError(
            f"malformed YAML at character {exc.position}: {exc.reason} {exc.character!r}", where=where
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise ConfigError(f"malformed YAML{line}: {problem}", where=where) from None


def load_yaml(path: Path, *, limit: int = FILE_BYTES) -> dict[str, Any]:
    """Load a YAML mapping from a file of at most `limit` bytes (an empty document, comments
    alone, is an empty mapping; a file of 0 bytes is refused); a ``.json`` file is read as JSON
    (`load_json`: its ``NaN`` and ``Infinity`` are numbers, where YAML would read them as words).
    ConfigError naming the file otherwise."""
    if path.suffix.lower() == ".json":
        data = load_json(path, limit=limit)
        if not isinstance(data, dict):
            raise ConfigError("expected a JSON object at the top level", where=str(path))
        return data
    data = parse_yaml(_some_text(path, limit), str(path))
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("expected a YAML mapping at the top level", where=str(path))
    return data


def _too_deep(value: Any) -> bool:
    """Whether lists and mappings nest deeper than `MAX_DEPTH` in `value` (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, dict | list):
                if depth + 1 > MAX_DEPTH:
                    return True
                stack.append((child, depth + 1))
    return False


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's mapping, refusing a key given twice (JSON's last-wins would drop the first)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Refused(problem=f"duplicate key {key!r}")
        out[key] = value
    return out


def load_json(path: Path, *, limit: int = FILE_BYTES) -> Any:
    """The value of a JSON file of at most `limit` bytes; ConfigError naming the file otherwise."""
    where = str(path)
    text = _some_text(path, limit)
    too_deep = ConfigError(f"nested deeper than {MAX_DEPTH} levels", where=where)
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys)
    except _Refused as exc:
        raise ConfigError(str(exc.problem), where=where) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not valid JSON (line {exc.lineno}: {exc.msg})", where=where) from None
    except RecursionError:
        raise too_deep from None
    if _too_deep(data):
        raise too_deep
    return check_finite(data, where)


def suggest(name: str, known: Iterable[str]) -> str:
    """The name of `known` nearest to `name` as a question, then every known name."""
    names = list(known)
    near = difflib.get_close_matches(name, names, n=1)
    return (f"did you mean {near[0]!r}? " if near else "") + f"known: {', '.join(names)}"


def unknown_key(key: Any, known: Iterable[str], *, where: str | None, field: str, expected: str | None = None):
    """The error of a key that a mapping may not hold: the nearest known key as a suggestion, or
    what is expected (`expected`, else the known keys)."""
    names = [str(k) for k in known]
    near = difflib.get_close_matches(str(key), names, n=1)
    hint = f"did you mean {near[0]!r}?" if near else expected or f"expected one of {', '.join(names)}"
    return ConfigError(f"unknown key; {hint}", where=where, field=field)


def check_keys(
    data: dict[Any, Any], known: Iterable[str], *, where: str | None, prefix: str = "", expected: str | None = None
) -> None:
    """Refuse the first key of `data` (in the file's order) that is not one of `known`."""
    names = tuple(known)
    for key in data:
        if key not in names:
            raise unknown_key(key, names, where=where, field=f"{prefix}{key}", expected=expected)


@dataclass(frozen=True)
class Fields:
    """A mapping read from a file, with typed getters that raise precise ConfigErrors."""

    data: dict[str, Any]
    where: str
    prefix: str = ""

    def _name(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def closed(self, keys: Iterable[str], *, expected: str | None = None) -> Fields:
        """This mapping, once no key but `keys` is in it (ConfigError on the first other key,
        with the nearest of `keys`, or `expected`, as what was meant)."""
        check_keys(self.data, keys, where=self.where, prefix=self.prefix, expected=expected)
        return self

    def raw(self, key: str) -> Any:
        value = self.data.get(key)
        if isinstance(value, dict) and "value" in value:
            check_keys(value, FIGURE_KEYS, where=self.where, prefix=f"{self._name(key)}.")
            return value["value"]
        return value

    def source(self, key: str) -> str | None:
        value = self.data.get(key)
        if isinstance(value, dict) and "value" in value:
            src = value.get("source")
            return str(src) if src else None
        return None

    def sub(self, key: str, *, required: bool = True) -> Fields | None:
        value = self.data.get(key)
        if value is None:
            if required:
                raise ConfigError("missing; expected a mapping", where=self.where, field=self._name(key))
            return None
        if not isinstance(value, dict):
            raise ConfigError(f"expected a mapping, got {value!r}", where=self.where, field=self._name(key))
        return Fields(value, self.where, f"{self._name(key)}.")

    def number(
        self,
        key: str,
        *,
        default: float | None = None,
        required: bool = True,
        minimum: float = 0.0,
        strict: bool = True,
        maximum: float | None = None,
    ) -> float | None:
        """A finite number > minimum (strict) or >= minimum, <= maximum; missing → default or error."""
        value = self.raw(key)
        if value is None:
            if default is not None or not required:
                return default
            raise ConfigError("missing; expected a number", where=self.where, field=self._name(key))
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"expected a number, got {value!r}", where=self.where, field=self._name(key))
        op = ">" if strict else ">="
        within = value > minimum if strict else value >= minimum  # False for NaN, as every comparison
        if not within:
            raise ConfigError(
                f"expected a number {op} {minimum:g}, got {value!r}", where=self.where, field=self._name(key)
            )
        if maximum is not None and value > maximum:
            raise ConfigError(
                f"expected a number <= {maximum:g}, got {value!r}", where=self.where, field=self._name(key)
            )
        if not math.isfinite(value):
            raise ConfigError(
                f"expected a finite number {op} {minimum:g}, got {value!r}", where=self.where, field=self._name(key)
            )
        return float(value)

    def integer(self, key: str, *, default: int | None = None, minimum: int = 1, maximum: int | None = None) -> int:
        """An integer >= minimum (and <= maximum, the simulator's bound); missing → default or error."""
        value = self.raw(key)
        if value is None:
            if default is not None:
                return default
            raise ConfigError("missing; expected an integer", where=self.where, field=self._name(key))
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"expected an integer, got {value!r}", where=self.where, field=self._name(key))
        if value < minimum:
            raise ConfigError(
                f"expected an integer >= {minimum}, got {value!r}", where=self.where, field=self._name(key)
            )
        if maximum is not None and value > maximum:
            why = f"{value:,} is beyond the simulator's bound of {maximum:,}"
            raise ConfigError(why, where=self.where, field=self._name(key))
        return value

    def text(self, key: str, *, default: str | None = None, choices: tuple[str, ...] | None = None) -> str:
        value = self.raw(key)
        if value is None:
            if default is not None:
                return default
            raise ConfigError("missing; expected a string", where=self.where, field=self._name(key))
        if not isinstance(value, str):
            raise ConfigError(f"expected a string, got {value!r}", where=self.where, field=self._name(key))
        if choices is not None and value not in choices:
            raise ConfigError(
                f"expected one of {', '.join(choices)}, got {value!r}", where=self.where, field=self._name(key)
            )
        return value

    def boolean(self, key: str, *, default: bool) -> bool:
        value = self.raw(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ConfigError(f"expected true or false, got {value!r}", where=self.where, field=self._name(key))
        return value
