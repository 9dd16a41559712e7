"""raystudy: which components of a pretrained Vision Transformer to finetune, and why.

Packages, lowest layer first (a module imports only its own layer or lower ones): the leaves
errors, paths, bounds; models, data, measure, train (one trial), spaces (YAML spaces to trials),
tracking (the MLflow run record), driver (runs grids and searches on Ray and writes MLflow from
the driver); then commands, the command lines (cli, the flag toolkit they share), and __main__,
the ``raystudy`` command that runs them by name (``grid``: ``python -m raystudy.grid``).
Importing raystudy does nothing else: no Ray, no MLflow, no seeding.
"""

__version__ = "0.1.0"
