"""`Setting`: what the command line and the sweep need of a configuration setting beside its type
(help text, flag, sweep list), carried in its annotation; `bounded`: an integer setting's bound."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field

from shardsim.specs.bounds import SETTING_BOUNDS


@dataclass(frozen=True)
class Setting:
    """What the command line and the sweep need of a setting, beside its type: its help text,
    whether it has a flag (False: a file key only), the default as --help says it (None: the
    value), the sweep's list flag (``degrees``) with its help where a sweep spans it, and for a
    choice that was a switch the values of the flag alone and of its ``--no-`` form."""

    help: str
    flag: bool = True
    default_text: str | None = None
    axis: str | None = None
    axis_help: str | None = None
    alone: str | None = None  # the value of the flag given alone (``--checkpointing``)
    negated: str | None = None  # the value of its ``--no-`` flag


def bounded(name: str) -> Any:
    """The constraint of an integer setting: its bound in `specs.bounds.SETTING_BOUNDS`."""
    b = SETTING_BOUNDS[name]
    return Field(ge=b.minimum, le=b.maximum)
