"""The dataset sources, a module each (one dataset or one kind of source), each listing its
``DatasetInfo`` records in ``DATASETS``. A new module here joins the registry by being here.

Importing a source is cheap (records and loaders; torch and torchvision load when a loader runs).
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

# The registry's order (``raystudy data`` lists it, errors name the valid datasets in it): the
# study's benchmarks in the paper's order, then the rest. A module not named here follows these,
# in the order of its name.
ORDER = ("cifar", "cifar10c", "domainnet", "oxford", "imagenet", "digits", "tokens")


def modules() -> list[ModuleType]:
    """Every source module of this package: those in ``ORDER``, then any other by name."""
    found = sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
    names = [n for n in ORDER if n in found] + [n for n in found if n not in ORDER]
    return [importlib.import_module(f"{__name__}.{n}") for n in names]
