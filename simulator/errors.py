"""User-facing errors: one line that says what is wrong and where."""

from __future__ import annotations


class ConfigError(Exception):
    """Bad input from the user (a file, a flag, a preset name).

    The CLI prints ``str(err)`` as a single line and exits with status 2.
    """

    def __init__(self, message: str, *, where: str | None = None, field: str | None = None):
        self.where = where
        self.field = field
        self.message = message
        super().__init__(self._render())

    def _render(self) -> str:
        prefix = ""
        if self.where:
            prefix += f"{self.where}: "
        if self.field:
            prefix += f"field '{self.field}': "
        return prefix + self.message


class CorruptFile(ConfigError, ValueError):
    """A file shardsim wrote earlier that cannot be read back as what it should hold (truncated,
    edited, not text): named, with what is wrong. The CLI prints it as one line, exit status 2,
    as bad input; readers that take any unreadable file as a ValueError see one too."""
