"""DomainNet clipart and sketch: class folders unpacked by hand, split 80/20 as the paper's code."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from raystudy import paths
from raystudy.data import userdata
from raystudy.data.source import RGB, DatasetInfo, Source, pool_test, reference_split, require
from raystudy.errors import ConfigError

DOMAINNET_DOMAINS = ("clipart", "sketch")
# Images in DomainNet clipart's cleaned release (groundtruth/clipart.zip), the one the paper's code
# downloads: the reference's src/vitef/data/images/domainnet.py:98-100.
DOMAINNET_CLEANED_CLIPART = 48_129
_CLIPART_URL = "http://csr.bu.edu/ftp/visda/2019/multi-source/groundtruth/clipart.zip"  # the cleaned release
DN_CLIPART = f"the paper's is the cleaned release, {_CLIPART_URL}"
WHERE = (
    "download DomainNet from https://ai.bu.edu/M3SDA/ (clipart: the cleaned release, "
    f"{_CLIPART_URL}, as the paper; sketch: "
    "http://csr.bu.edu/ftp/visda/2019/multi-source/sketch.zip) and unpack each domain so that "
    "<data_root>/domainnet/<domain>/<class>/*.jpg exist"
)


def check_image_count(name: str, root: str | Path | None, expected: int) -> None:
    """Refuse, in one line, a class-folder dataset ``name`` under ``root`` whose image count is
    not ``expected`` (0: any). A folder not there is left to the trial's own message."""
    if not expected or not name.startswith("domainnet_"):
        return
    folder = Path(root or paths.data_root()) / "domainnet" / name.removeprefix("domainnet_")
    if not folder.is_dir():
        return
    found = sum(1 for p in folder.rglob("*") if p.suffix.lower() in userdata.IMAGE_EXTS)
    if found != expected:
        raise ConfigError(
            f"dataset {name!r}: {found:,} images under {folder}, expected {expected:,} (expect_images): "
            "another release gives another seeded split and test set; "
            + (DN_CLIPART if name == "domainnet_clipart" else "see the download note")
        )


def domainnet(domain: str, name: str, where: str):
    """The loader of one domain's class folders."""

    def load(root: Path, download: bool) -> Source:
        from torchvision.datasets import ImageFolder

        d = require(root / "domainnet" / domain, name, where)
        ds = ImageFolder(str(d))
        return pool_test(RGB(ds), np.asarray(ds.targets), reference_split)

    return load


DATASETS = tuple(
    DatasetInfo(f"domainnet_{d}", 345, domainnet(d, f"domainnet_{d}", WHERE), WHERE, study=True)
    for d in DOMAINNET_DOMAINS
)
