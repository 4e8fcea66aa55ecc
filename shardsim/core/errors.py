"""User-facing errors: one line that says what is wrong and where (bad input, exit status 2; a
file that could not be written, exit status 1)."""

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


class WriteError(OSError):
    """A file could not be written (the disk full, a device that refuses it): what was at the
    path is as it was. `written` and `not_written` name the command's other files, for its
    one line: ``cannot write out/sweep.parquet: No space left on device; written: sweep.csv;
    not written: recommended.json``. The CLI prints it as one line, exit status 1: the path
    passed the checks made before the work, the write is what failed."""

    def __init__(self, errno: int | None, strerror: str, filename: str, written=(), not_written=()):
        super().__init__(errno, strerror, filename)
        self.written = tuple(written)
        self.not_written = tuple(not_written)

    def __str__(self) -> str:
        text = f"cannot write {self.filename}: {self.strerror}"
        if self.written or self.not_written:
            text += f"; written: {', '.join(self.written) or 'nothing'}"
        if self.not_written:
            text += f"; not written: {', '.join(self.not_written)}"
        return text

    def naming(self, written=(), not_written=()) -> WriteError:
        """This error, naming what else was written and what was not."""
        return WriteError(self.errno, self.strerror, self.filename, written, not_written)
