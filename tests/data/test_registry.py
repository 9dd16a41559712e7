"""The dataset registry: gathered from the sources, the study's datasets, the recipe of a new one, the docs' table."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from raystudy.commands import data as data_command
from raystudy.data import registry, sources
from raystudy.data.registry import DATASETS, STUDY_DATASETS, check_dataset
from raystudy.data.splits import build_splits

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "dataset_table.py"
_spec = importlib.util.spec_from_file_location("dataset_table", SCRIPT)
dataset_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dataset_table)


def test_registry_has_the_studys_11_benchmarks_and_the_demo():
    assert len(STUDY_DATASETS) == 11
    assert set(STUDY_DATASETS) <= set(DATASETS)
    assert DATASETS["domainnet_sketch"].num_classes == 345
    assert DATASETS["pets"].num_classes == 37
    assert DATASETS["flowers102"].num_classes == 102
    assert {"digits", "digits_c", "digits_blur", "digits_rotate", "digits_occlude"} <= set(DATASETS)


def test_the_paper_space_runs_the_studys_datasets_in_its_order():
    # a dataset marked study=True joins the paper's protocol, which gives its steps and lr grid
    from raystudy.spaces import grids

    assert tuple(grids.load_grid("paper").datasets) == STUDY_DATASETS


def test_the_registry_holds_each_download_source():
    # torchvision downloads these (prefetch, download=true); the others are placed by hand
    fetched = {n for n, info in DATASETS.items() if info.download}
    assert fetched == {"cifar10", "cifar100", "flowers102", "pets"}
    assert all(DATASETS[n].download.startswith("https://") for n in fetched)


def test_data_cli_lists_the_registry(capsys):
    assert data_command.main([]) == 0
    out = capsys.readouterr().out
    assert "cifar10c_speckle_noise" in out and "zenodo" in out


# A source module as docs/development.md's recipe writes one: a loader returning a Source (torch
# imported when it runs) and its records in DATASETS.
TOY_SOURCE = """
import numpy as np

from raystudy.data.source import DatasetInfo, Pool, Source, TensorImages


def load(root, download):
    import torch

    x, y = torch.rand(50, 1, 16, 16), np.arange(50) % 5
    return Source(Pool(TensorImages(x[:40], y[:40]), y[:40]), Pool(TensorImages(x[40:], y[40:]), y[40:]))


DATASETS = (DatasetInfo("toy", 5, load, "generated in the test", image=False, study=True),)
"""


def collected_with(monkeypatch, folder, name: str, text: str) -> dict:
    """The registry as ``registry.collect`` gathers it with one more source module, ``name``
    holding ``text``, in the sources package (from ``folder``: the checkout is left alone)."""
    (folder / f"{name}.py").write_text(text)
    monkeypatch.setattr(sources, "__path__", [*sources.__path__, str(folder)])
    try:
        return registry.collect()
    finally:
        sys.modules.pop(f"{sources.__name__}.{name}", None)


def test_a_new_dataset_is_one_source_module(tmp_path, monkeypatch):
    # docs/development.md's recipe: one module in raystudy/data/sources/; the registry, the
    # study's list, the lookups, the splits and the docs' table take it from there
    found = collected_with(monkeypatch, tmp_path, "toy", TOY_SOURCE)
    assert list(found) == [*DATASETS, "toy"]  # after the ordered sources, the rest by name
    assert registry.study_names(found) == (*STUDY_DATASETS, "toy")
    monkeypatch.setattr(registry, "DATASETS", found)
    assert check_dataset("toy") is found["toy"]
    s = build_splits("toy", seed=0, img_size=16, mean=(0.5,), std=(0.5,), data_path="cache")
    assert (len(s.train) + len(s.val), len(s.test), s.num_classes) == (40, 10, 5)
    assert "\n| `toy` | 5 | yes | none: built in memory |" in dataset_table.table()


def test_a_dataset_two_sources_register_is_refused(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="'cifar10' is registered twice"):
        collected_with(monkeypatch, tmp_path, "again", TOY_SOURCE.replace('"toy"', '"cifar10"'))


def test_the_docs_dataset_table_is_the_registrys():
    page = dataset_table.PAGE.read_text()
    assert dataset_table.updated(page) == page, "docs/finetune.md disagrees with the registry: run " + (
        "python scripts/dataset_table.py"
    )


def test_importing_the_registry_loads_no_torch():
    # every CLI's config check reads the registry: its sources are records and loaders only
    code = "import sys; from raystudy.data import registry, splits; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
