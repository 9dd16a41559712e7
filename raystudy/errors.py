"""The error every layer may raise for bad user input; a leaf module that imports nothing of raystudy."""


class ConfigError(ValueError):
    """Bad user input: the message is one line naming the value and the valid choices.

    Every CLI turns it into ``error: <message>`` and exit status 2, before heavy work starts.
    """


class Preempted(RuntimeError):
    """The node got notice (SIGTERM): the trial checkpointed its last step and stops, to be retried."""
