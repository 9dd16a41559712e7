"""The analysis's command lines: ``raystudy report``, ``raystudy export`` and ``raystudy replay``.

Each parses and checks its flags and calls the analysis library (``analysis.reporting``,
``analysis.best_config``, ``analysis.replaying``). Importing the package does nothing.
"""
