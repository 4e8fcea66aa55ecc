"""`Frozen`: the base of every node of the configuration tree (immutable, closed, strict; a bad
value is one `ConfigError` naming the field)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic import ValidationError as _ValidationError

from shardsim.config.errors import config_error


class Frozen(BaseModel):
    """A node of the configuration tree: immutable, closed to other keys, strict about types."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except _ValidationError as exc:
            where = data.get("source") if isinstance(data.get("source"), str) else None
            raise config_error(exc, where, known=(k for k in type(self).model_fields if k != "source")) from None
