"""The offline demo: scikit-learn's digits and their four shifts."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from raystudy.data.registry import check_dataset
from raystudy.data.sources.digits import DEMO_OCCLUDER, DEMO_SHIFTS, demo_digits, digits_arrays
from raystudy.data.splits import build_splits


def test_digits_are_scikit_learns_read_without_importing_it():

    from sklearn.datasets import load_digits

    images, target = digits_arrays()
    d = load_digits()
    assert np.array_equal(images, d.images) and np.array_equal(target, d.target) and target.dtype == np.int64
    code = (
        "import sys; from raystudy.data.sources.digits import demo_digits; demo_digits('blur'); "
        "print('sklearn' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_demo_shift_is_real_and_labels_unchanged():
    x, y = demo_digits()
    xc, yc = demo_digits("invert_noise")
    assert x.shape == (1797, 1, 16, 16) and np.array_equal(y, yc)
    assert 0 <= xc.min() and xc.max() <= 1
    # contrast inversion: mean brightness flips
    assert x.mean() < 0.4 and xc.mean() > 0.6
    assert torch.equal(xc, demo_digits("invert_noise")[0])  # fixed noise


@pytest.fixture(scope="module")
def clean_and_shifted():
    x, y = demo_digits()
    return x, y, {shift: demo_digits(shift) for shift, _ in DEMO_SHIFTS.values()}


@pytest.mark.parametrize("name", list(DEMO_SHIFTS))
def test_every_demo_shift_is_a_registered_fixed_dataset_of_the_same_digits(name, clean_and_shifted):
    x, y, shifted = clean_and_shifted
    shift = DEMO_SHIFTS[name][0]
    xs, ys = shifted[shift]
    assert check_dataset(name).num_classes == 10
    assert xs.shape == x.shape and xs.dtype == torch.float32 and np.array_equal(ys, y)
    assert 0 <= xs.min() and xs.max() <= 1
    assert torch.equal(xs, demo_digits(shift)[0])  # seeded: the same images every call
    assert (xs - x).abs().amax(dim=(1, 2, 3)).gt(0.05).float().mean() > 0.9  # nearly every image moved
    s = build_splits(name, seed=0, img_size=16, mean=(0.5,), std=(0.5,))
    assert (len(s.train), len(s.val), len(s.test)) == (1078, 360, 359)


def _edge_energy(x: torch.Tensor) -> torch.Tensor:
    """Per image, the sum of squared differences between neighbouring pixels: what a blur removes."""
    return x.diff(dim=-1).pow(2).sum(dim=(1, 2, 3)) + x.diff(dim=-2).pow(2).sum(dim=(1, 2, 3))


def test_blur_smooths_edges_and_keeps_the_ink(clean_and_shifted):
    x, _, shifted = clean_and_shifted
    xb = shifted["blur"][0]
    assert (_edge_energy(xb) < 0.5 * _edge_energy(x)).all()
    # a normalised kernel moves ink around; only what spills past the border is lost
    ink = xb.sum(dim=(1, 2, 3)) / x.sum(dim=(1, 2, 3))
    assert ink.min() > 0.7 and ink.max() <= 1.0 + 1e-5


def _orientation(x: torch.Tensor) -> torch.Tensor:
    """Angle (degrees, mod 180) of each image's principal axis, from its central second moments."""
    r, c = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    w = x[:, 0] / x[:, 0].sum(dim=(1, 2), keepdim=True)
    mr, mc = (w * r).sum(dim=(1, 2), keepdim=True), (w * c).sum(dim=(1, 2), keepdim=True)
    rr, cc, rc = (
        (w * (r - mr) ** 2).sum(dim=(1, 2)),
        (w * (c - mc) ** 2).sum(dim=(1, 2)),
        (w * (r - mr) * (c - mc)).sum(dim=(1, 2)),
    )
    return torch.rad2deg(0.5 * torch.atan2(2 * rc, cc - rr)) % 180


def test_rotation_turns_the_digits_by_30_to_60_degrees(clean_and_shifted):
    x, y, shifted = clean_and_shifted
    xr = shifted["rotate"][0]
    ones = torch.as_tensor(y == 1)  # ones are elongated: their principal axis is well defined
    turn = (_orientation(xr[ones]) - _orientation(x[ones])).abs() % 180
    turn = torch.minimum(turn, 180 - turn)
    assert 25 < turn.median() < 65 and (turn > 20).float().mean() > 0.8
    assert (_edge_energy(xr) > 0.7 * _edge_energy(x)).all()  # turned, not blurred


def test_occlusion_paints_one_bright_square_and_leaves_the_rest(clean_and_shifted):
    x, _, shifted = clean_and_shifted
    xo = shifted["occlude"][0]
    side = DEMO_OCCLUDER
    changed = xo != x
    assert (xo[changed] == 1.0).all()
    for img, ch in zip(xo[:200, 0], changed[:200, 0]):
        rows, cols = ch.any(dim=1).nonzero(), ch.any(dim=0).nonzero()
        assert rows.max() - rows.min() < side and cols.max() - cols.min() < side
        windows = img.unfold(0, side, 1).unfold(1, side, 1)
        assert (windows == 1.0).all(dim=-1).all(dim=-1).any()  # a whole square is bright
