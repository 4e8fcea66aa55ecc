"""shardsim's version: the installed distribution's, read from its metadata."""

from __future__ import annotations

from functools import cache


@cache
def version() -> str:
    """The installed distribution's version ("0.0.0+unknown" for a checkout on sys.path, not
    installed); `importlib.metadata` is loaded on first use, as it is slow to import."""
    from importlib import metadata

    try:
        return metadata.version("shardsim")
    except metadata.PackageNotFoundError:
        return "0.0.0+unknown"
