"""Reading YAML files into checked values, with errors that name the file and field.

A figure in a topology or workload file may be written plainly (``memory_gib: 16``) or
with its source (``memory_gib: {value: 16, source: "NVIDIA T4 datasheet"}``). Shipped
topologies always use the second form; a test checks it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from shardsim.simulator.errors import ConfigError


def load_yaml(path: Path) -> dict[str, Any]:
    """Load a YAML mapping; malformed files raise ConfigError naming the file and line."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read file: {exc.strerror}", where=str(path)) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise ConfigError(f"malformed YAML{line}: {problem}", where=str(path)) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("expected a YAML mapping at the top level", where=str(path))
    return data


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

    def raw(self, key: str) -> Any:
        value = self.data.get(key)
        if isinstance(value, dict) and "value" in value:
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
        """A number > minimum (strict) or >= minimum; missing → default or error."""
        value = self.raw(key)
        if value is None:
            if default is not None or not required:
                return default
            raise ConfigError("missing; expected a number", where=self.where, field=self._name(key))
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"expected a number, got {value!r}", where=self.where, field=self._name(key))
        bad_low = value <= minimum if strict else value < minimum
        if bad_low:
            op = ">" if strict else ">="
            raise ConfigError(
                f"expected a number {op} {minimum:g}, got {value!r}", where=self.where, field=self._name(key)
            )
        if maximum is not None and value > maximum:
            raise ConfigError(
                f"expected a number <= {maximum:g}, got {value!r}", where=self.where, field=self._name(key)
            )
        return float(value)

    def integer(self, key: str, *, default: int | None = None, minimum: int = 1) -> int:
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
