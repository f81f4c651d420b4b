"""Errors meant for the user: printed without a traceback, exit code 2 (bad input) or 1 (failure)."""

from __future__ import annotations


class UserError(Exception):
    """Bad input that costs nothing: the message names what to fix."""

    exit_code = 2

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
