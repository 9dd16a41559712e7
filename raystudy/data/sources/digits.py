"""The offline demo: scikit-learn's handwritten digits and four shifts of them, built in memory."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from raystudy.data.source import DatasetInfo, DatasetUnavailable, Source, TensorImages, pool_test

if TYPE_CHECKING:
    import torch

# The demo: scikit-learn's 1,797 handwritten digits (8x8), upscaled to 16x16, and shifts of them in
# the spirit of CIFAR-10-C, one target dataset each, every corruption drawn once from a fixed seed.
DEMO_NOISE = 0.3
DEMO_BLUR_SIGMA = 2.0  # pixels of the 16x16 image; a lighter blur leaves the source model nearly as accurate
DEMO_ROTATION = (30.0, 60.0)  # degrees, either way
DEMO_OCCLUDER = 6  # side of the bright square, pixels
DEMO_SEED = 1234
DEMO_SHIFTS = {  # dataset -> (shift, what it does), as ``raystudy data`` lists them
    "digits_c": ("invert_noise", "contrast inversion + Gaussian noise"),
    "digits_blur": ("blur", "Gaussian blur"),
    "digits_rotate": ("rotate", "rotation by 30-60 degrees"),
    "digits_occlude": ("occlude", "a bright 6x6 square"),
}


def _invert_noise(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    import torch

    noise = torch.randn(x.shape, generator=g)
    return (1.0 - x + DEMO_NOISE * noise).clamp(0.0, 1.0)


def _blur(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    import torch

    r = int(3 * DEMO_BLUR_SIGMA)
    k = torch.exp(-0.5 * (torch.arange(-r, r + 1, dtype=torch.float32) / DEMO_BLUR_SIGMA) ** 2)
    k = k / k.sum()
    # separable: rows then columns; zero padding is the digits' own background
    x = torch.nn.functional.conv2d(x, k.view(1, 1, 1, -1), padding=(0, r))
    return torch.nn.functional.conv2d(x, k.view(1, 1, -1, 1), padding=(r, 0)).clamp(0.0, 1.0)


def _rotate(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    import torch

    lo, hi = DEMO_ROTATION
    deg = (lo + (hi - lo) * torch.rand(len(x), generator=g)) * torch.randint(0, 2, (len(x),), generator=g).mul(2).sub(1)
    a = torch.deg2rad(deg)
    theta = torch.stack(
        [
            torch.stack([a.cos(), -a.sin(), torch.zeros_like(a)], 1),
            torch.stack([a.sin(), a.cos(), torch.zeros_like(a)], 1),
        ],
        1,
    )
    grid = torch.nn.functional.affine_grid(theta, list(x.shape), align_corners=False)
    return torch.nn.functional.grid_sample(x, grid, align_corners=False).clamp(0.0, 1.0)


def _occlude(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    import torch

    s, side = DEMO_OCCLUDER, x.shape[-1]
    top, left = (torch.randint(0, side - s + 1, (len(x),), generator=g) for _ in range(2))
    rows, cols = torch.arange(side).view(1, -1, 1), torch.arange(side).view(1, 1, -1)
    inside = (
        (rows >= top.view(-1, 1, 1))
        & (rows < top.view(-1, 1, 1) + s)
        & (cols >= left.view(-1, 1, 1))
        & (cols < left.view(-1, 1, 1) + s)
    )
    return x.masked_fill(inside.unsqueeze(1), 1.0)


_SHIFT_FNS = {"invert_noise": _invert_noise, "blur": _blur, "rotate": _rotate, "occlude": _occlude}


def demo_digits(shift: str | None = None) -> tuple[torch.Tensor, np.ndarray]:
    """Digits as (N, 1, 16, 16) floats in [0, 1], clean or with ``shift`` (a ``DEMO_SHIFTS`` kind).

    Every shift draws from its own generator seeded with ``DEMO_SEED``: the same images each call.
    """
    import torch

    images, target = digits_arrays()
    x = torch.tensor(images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = torch.nn.functional.interpolate(x, size=(16, 16), mode="bilinear", align_corners=False)
    if shift is not None:
        x = _SHIFT_FNS[shift](x, torch.Generator().manual_seed(DEMO_SEED))
    return x, target


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits, (1797, 8, 8) images in 0..16 and their labels, as
    ``sklearn.datasets.load_digits`` gives them, read from the file scikit-learn ships: importing
    scikit-learn costs every trial process seconds of CPU, reading the file milliseconds."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise DatasetUnavailable(
            "the demo digits ship with scikit-learn, which is not installed: pip install scikit-learn"
        )
    data = np.loadtxt(Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz", delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(np.int64)


def demo(shift: str | None):
    """The loader of the clean digits (``shift`` None) or one shift of them, split 80/20 once."""

    def load(root: Path, download: bool) -> Source:
        x, y = demo_digits(shift)
        return pool_test(TensorImages(x, y), y)

    return load


# The demo splits 60/20/20: val is a quarter of the 80% pool.
DATASETS = (
    DatasetInfo("digits", 10, demo(None), "ships with scikit-learn", image=False, val_fraction=0.25),
    *(
        DatasetInfo(name, 10, demo(shift), f"ships with scikit-learn; {what}", image=False, val_fraction=0.25)
        for name, (shift, what) in DEMO_SHIFTS.items()
    ),
)
