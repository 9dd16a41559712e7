"""The error every layer may raise for bad user input, and the argument parser every CLI uses to
report its own errors the same way; a leaf module that imports nothing of raystudy."""

import argparse


class ConfigError(ValueError):
    """Bad user input: the message is one line naming the value and the valid choices.

    Every CLI turns it into ``error: <message>`` and exit status 2, before heavy work starts.
    """


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line (``error: ...``, exit 2), not a usage block."""

    def error(self, message: str):
        """Exit with status 2 after one line: ``error: <message> (see <prog> --help)``."""
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


class Preempted(RuntimeError):
    """The node got notice (SIGTERM): the trial checkpointed its last step and stops, to be retried."""
