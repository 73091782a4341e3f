"""The errors ctpore raises on purpose, for every layer (data, models, pipelines, app).

:class:`InputError` means "the user gave us something we cannot use": a file that cannot be read,
a shape that does not fit, an option out of range. The command line turns it into one line on
stderr and exit code 2. It subclasses :class:`ValueError`, so ``except ValueError`` still
catches it. :class:`NonFiniteError` means a NaN or Inf appeared inside a computation. Anything
else that escapes is an internal error (exit code 1). Messages name the file and say what to do.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["InputError", "NonFiniteError", "CtporeWarning"]


class InputError(ValueError):
    """Bad input or usage: a file that cannot be read, a shape that does not fit, ...

    Parameters
    ----------
    message : str
        What is wrong and, where it helps, what to do about it.
    path : str or Path, optional
        The file concerned; it is put in front of the message.
    """

    def __init__(self, message: str, path: str | Path | None = None):
        self.path = None if path is None else Path(path)
        self.message = message
        super().__init__(f"{self.path}: {message}" if self.path is not None else message)


class NonFiniteError(RuntimeError):
    """A NaN or Inf appeared inside a computation; the message names where."""


class CtporeWarning(UserWarning):
    """Something the user should know about a result that was still produced (the command prints
    it as one ``ctpore: warning:`` line): a scan without contrast, values clipped, unknown units."""
