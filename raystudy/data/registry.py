"""The dataset registry: every source's ``DatasetInfo`` by name, the study's benchmarks, and the
lookups that give a dataset's entry (the registry's, or one for your own images) and its Source.

    raystudy data        # the registry and where each dataset's files are expected
"""

from __future__ import annotations

from pathlib import Path

from raystudy.data import sources, userdata
from raystudy.data.source import DatasetInfo, Pool, Source
from raystudy.errors import ConfigError


def collect() -> dict[str, DatasetInfo]:
    """Every source module's records by name, in the sources' order; a name two sources give is a
    mistake in them (ValueError)."""
    found: dict[str, DatasetInfo] = {}
    for module in sources.modules():
        for info in module.DATASETS:
            if info.name in found:
                raise ValueError(f"dataset {info.name!r} is registered twice (again in {module.__name__})")
            found[info.name] = info
    return found


def study_names(datasets: dict[str, DatasetInfo]) -> tuple[str, ...]:
    """The names of the study's benchmarks among ``datasets``, in the registry's order (the study's)."""
    return tuple(name for name, info in datasets.items() if info.study)


DATASETS: dict[str, DatasetInfo] = collect()
STUDY_DATASETS = study_names(DATASETS)  # the paper's 11


def check_dataset(name: str) -> DatasetInfo:
    """The registry entry of dataset ``name``, or ConfigError naming the valid ones."""
    if name not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; valid: {', '.join(DATASETS)}, or your own images with data=PATH")
    return DATASETS[name]


USER_CACHE_SIZE = 256  # your own images in the tensor cache: squares as the benchmarks' that are not CIFAR


def dataset_info(name: str, data: str = "") -> DatasetInfo:
    """The entry of ``name``: the registry's, or with ``data`` one for your own images there
    (its classes counted when it is scanned). Cheap: ``data`` is checked to exist, not listed."""
    if not data:
        return check_dataset(name)
    if name in DATASETS:
        raise ConfigError(f"dataset {name!r} names a registry dataset; give your own data (data={data}) another name")
    userdata.check_name(name)
    userdata.check_location(data)
    return DatasetInfo(name, 0, _user_load(data), f"your own images at {data}", cache_size=USER_CACHE_SIZE)


def _user_load(data: str):
    def load(root: Path, download: bool) -> Source:
        return user_source(data)[0]

    return load


def user_source(data: str, mode: str = "RGB") -> tuple[Source, userdata.Scan]:
    """Your own images at ``data`` as a Source (images in ``mode``) and the scan it came from: the
    splits given, or the fixed test split and the rest as the training pool."""
    s = userdata.scan(data)
    p = userdata.partition(s)

    def pool(part: userdata.Part | None) -> Pool | None:
        return None if part is None else Pool(userdata.Images(s, part, mode), part.labels)

    return Source(pool(p.pool), pool(p.test), pool(p.val)), s
