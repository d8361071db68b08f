"""What the dataset code refuses: one error with what to do, shown by the operator as its ConfigError (exit 3)
and by the converter on a node as its error line (convert.py)."""

from __future__ import annotations

EXIT = 3  # the operator's exit status for it (errors.ExitCode.CONFIG)


class DatasetError(Exception):
    """A refusal of the input or the destination; `hint` says what to do next."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
