"""The error every layer may raise for bad user input and how a command says it (``fail``), the
argument parser every CLI uses to report its own errors the same way, the check every reader of
an input file makes first, and what a full disk says; a leaf module that imports nothing of raystudy."""

import argparse
import errno
import os
import sys
from pathlib import Path


class ConfigError(ValueError):
    """Bad user input: the message is one line naming the value and the valid choices.

    Every CLI turns it into ``error: <message>`` and exit status 2, before heavy work starts.
    """


def fail(e: Exception) -> int:
    """Print a user error as one line; the exit status for bad input."""
    print(f"error: {e}", file=sys.stderr)
    return 2


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line (``error: ...``, exit 2), not a usage block."""

    def error(self, message: str):
        """Exit with status 2 after one line: ``error: <message> (see <prog> --help)``."""
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


# What a full disk says: the OS (ENOSPC, also inside a trial's traceback) and SQLite.
FULL_DISK = ("No space left on device", "database or disk is full")


def disk_full(error) -> bool:
    """Whether ``error`` (an exception, with what caused it, or an error's text) says a disk is full."""
    while isinstance(error, BaseException):
        if (isinstance(error, OSError) and error.errno == errno.ENOSPC) or any(m in str(error) for m in FULL_DISK):
            return True
        error = error.__cause__ or error.__context__
    return error is not None and any(m in str(error) for m in FULL_DISK)


class Preempted(RuntimeError):
    """The node got notice (SIGTERM): the trial checkpointed its last step and stops, to be retried."""


def check_input_file(what: str, path: str | os.PathLike, error: type[Exception] = ConfigError) -> Path:
    """``path`` as a file to read, else ``error`` in one line: it does not exist, or it is a folder."""
    p = Path(path)
    if p.is_dir():
        raise error(f"{what} {str(path)!r} is a folder, not a file")
    if not p.is_file():
        raise error(f"{what} {str(path)!r} does not exist")
    return p
