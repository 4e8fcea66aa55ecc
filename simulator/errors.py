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
