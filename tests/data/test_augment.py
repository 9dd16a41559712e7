"""The batched, device-side transforms keep the definition of the paper's torchvision transforms."""

import numpy as np
import pytest
import torch
from scipy.stats import ks_2samp
from torchvision.transforms import RandomResizedCrop
from torchvision.transforms import functional as TF

from raystudy.data import augment
from raystudy.data.transforms import transforms

N = 4000


def boxes(H, W, n=N, seed=0):
    g = torch.Generator().manual_seed(seed)
    return augment.random_resized_crop_boxes(torch.tensor([[H, W]]).expand(n, 2), g).numpy()


def torchvision_boxes(H, W, n=N, seed=1):
    torch.manual_seed(seed)
    img = torch.zeros(1, H, W)
    return np.array([RandomResizedCrop.get_params(img, [0.08, 1.0], [3 / 4, 4 / 3]) for _ in range(n)], dtype=float)


def fallback_box(H, W):
    """torchvision's box when no attempt fits: the whole image, ratio clamped, centred."""
    r = W / H
    w, h = (W, round(W / (3 / 4))) if r < 3 / 4 else (round(H * 4 / 3), H) if r > 4 / 3 else (W, H)
    return ((H - h) // 2, (W - w) // 2, h, w)


@pytest.mark.parametrize("H,W", [(32, 32), (375, 500), (500, 333), (20, 300), (8, 8)])
def test_crop_boxes_are_whole_pixels_inside_the_image_within_scale_and_ratio(H, W):
    b = boxes(H, W)
    top, left, h, w = b.T
    assert np.array_equal(b, np.round(b))
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= H).all() and (left + w <= W).all()
    assert (h >= 1).all() and (w >= 1).all()
    drawn = ~np.all(b == fallback_box(H, W), axis=1)
    h, w = h[drawn], w[drawn]
    # Sides are rounded to whole pixels, so scale and ratio hold up to half a pixel per side.
    assert ((h + 0.5) * (w + 0.5) >= 0.08 * H * W).all() and ((h - 0.5) * (w - 0.5) <= H * W).all()
    assert ((w + 0.5) / (h - 0.5) >= 3 / 4).all() and ((w - 0.5) / (h + 0.5) <= 4 / 3).all()


@pytest.mark.parametrize("H,W", [(32, 32), (375, 500), (20, 300), (8, 8)])
def test_crop_box_distribution_matches_torchvision(H, W):
    ours, ref = boxes(H, W), torchvision_boxes(H, W)

    def features(b):
        top, left, h, w = b.T
        return {"area": h * w / (H * W), "log_ratio": np.log(w / h), "top": top / H, "left": left / W}

    fo, fr = features(ours), features(ref)
    for k in fo:  # two-sample Kolmogorov-Smirnov, fixed seeds: deterministic
        assert ks_2samp(fo[k], fr[k]).pvalue > 1e-3, k
    # the fallback (no attempt fits: frequent for a 20x300 strip) is as frequent as in torchvision
    fb = fallback_box(H, W)
    rate = lambda b: np.all(b == fb, axis=1).mean()  # noqa: E731
    assert rate(ours) == pytest.approx(rate(ref), abs=0.03)
    if (H, W) == (20, 300):
        assert rate(ref) > 0.3


def test_flip_rate_is_one_half_and_flip_mirrors_the_crop():
    g = torch.Generator().manual_seed(0)
    sizes = torch.tensor([[32, 32]]).expand(20_000, 2)
    x = torch.full((20_000, 1, 1, 2), 0, dtype=torch.uint8)
    x[..., 1] = 255  # left pixel black, right white: a flipped output has its bright side left
    out = augment.train_batch(x, sizes, 4, (0.0,), (1.0,), g, 255.0)
    flipped = (out[:, 0, 0, 0] > out[:, 0, 0, -1]).float().mean().item()
    assert flipped == pytest.approx(0.5, abs=0.015)

    img = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (1, 3, 40, 30), dtype=np.uint8))
    box = torch.tensor([[3.0, 5.0, 20.0, 17.0]], dtype=torch.float64)
    sz = torch.tensor([[40, 30]])
    plain = augment.resample(img, sz, box, 64, (0,) * 3, (1,) * 3)
    mirrored = augment.resample(img, sz, box, 64, (0,) * 3, (1,) * 3, flip=torch.tensor([True]))
    assert torch.allclose(mirrored, plain.flip(-1), atol=1e-5)


@pytest.mark.parametrize("box", [(3, 5, 20, 17), (0, 0, 32, 32), (10, 2, 9, 30)])
def test_crop_resample_is_torchvisions_resized_crop(box):
    """For a given box: torchvision's resized_crop (bilinear, no antialias) inside the crop.

    At the crop's edge torchvision clamps to the crop while the resample reads the neighbouring
    pixels outside it: the two differ only within half a source pixel of the edge.
    """
    img = torch.from_numpy(np.random.default_rng(1).integers(0, 256, (1, 3, 32, 32), dtype=np.uint8))
    got = augment.resample(
        img, torch.tensor([[32, 32]]), torch.tensor([box], dtype=torch.float64), 224, (0,) * 3, (1,) * 3
    )[0]
    want = TF.resized_crop(img[0].float() / 255, *box, [224, 224], antialias=False)
    m = int(np.ceil(224 / (2 * min(box[2], box[3])))) + 1
    assert (got - want)[:, m:-m, m:-m].abs().max() < 1e-4


@pytest.mark.parametrize("H,W", [(32, 32), (32, 48), (48, 32), (240, 250), (300, 260), (375, 500), (501, 333)])
def test_eval_is_resize_then_center_crop(H, W):
    """Exactly torchvision's geometry (sizes, rounding, offsets): equal to its tensor
    Resize(224, antialias=False) + CenterCrop(224) within float error, upsampling or shrinking."""
    img = torch.from_numpy(np.random.default_rng(H * W).integers(0, 256, (1, 3, H, W), dtype=np.uint8))
    got = augment.eval_batch(img, torch.tensor([[H, W]]), 224, (0,) * 3, (1,) * 3)[0]
    want = TF.center_crop(TF.resize(img[0].float() / 255, 224, antialias=False), 224)
    assert (got - want).abs().max() < 1e-4


def smooth_image(H, W, seed=0):
    """A natural-ish picture: coarse random colours, bicubically enlarged."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (max(H // 8, 2), max(W // 8, 2), 3), dtype=np.uint8)
    return Image.fromarray(small).resize((W, H), Image.BICUBIC)


@pytest.mark.parametrize("H,W", [(32, 32), (32, 48), (200, 150)])
def test_eval_matches_the_paper_pil_transform_when_enlarging(H, W):
    """Against transforms' PIL Resize + CenterCrop (CIFAR's case, 32 -> 224): PIL rounds
    to uint8, so within 1/255 per pixel."""
    _, ev = transforms(224, (0.0,) * 3, (1.0,) * 3)
    img = smooth_image(H, W)
    x = torch.from_numpy(np.array(img)).permute(2, 0, 1)[None]
    got = augment.eval_batch(x, torch.tensor([[H, W]]), 224, (0,) * 3, (1,) * 3)[0]
    assert (got - ev(img)).abs().max() <= 1.0 / 255 + 1e-6


@pytest.mark.parametrize("H,W", [(300, 260), (375, 500), (500, 333)])
def test_cached_256_eval_matches_the_paper_pil_transform_within_tolerance(H, W):
    """From a 256x256 squashed cache to 224 (DomainNet, Flowers, Pets): PIL antialiases when it
    shrinks, the resample does not, and the cache holds 256 pixels per side. Tolerance on
    natural-ish images: mean |difference| < 2.5/255, max < 20/255."""
    from PIL import Image

    _, ev = transforms(224, (0.0,) * 3, (1.0,) * 3)
    img = smooth_image(H, W, seed=H)
    cached = torch.from_numpy(np.array(img.resize((256, 256), Image.BILINEAR))).permute(2, 0, 1)[None]
    got = augment.eval_batch(cached, torch.tensor([[H, W]]), 224, (0,) * 3, (1,) * 3)[0]
    d = (got - ev(img)).abs()
    assert d.mean() < 2.5 / 255 and d.max() < 20 / 255


def test_normalise_and_value_range():
    x = torch.full((2, 3, 4, 4), 255, dtype=torch.uint8)
    out = augment.eval_batch(x, torch.tensor([[4, 4], [4, 4]]), 4, (0.5, 0.5, 0.5), (0.25, 0.5, 1.0))
    assert torch.allclose(out[:, :, 1, 1], torch.tensor([2.0, 1.0, 0.5]).expand(2, 3))
    f = augment.normalise(torch.ones(1, 1, 2, 2), (0.5,), (0.5,))
    assert torch.equal(f, torch.ones(1, 1, 2, 2))


def test_same_generator_seed_same_batch():
    x = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (8, 3, 32, 32), dtype=np.uint8))
    sizes = torch.tensor([[32, 32]]).expand(8, 2)
    a = augment.train_batch(x, sizes, 224, (0.5,) * 3, (0.5,) * 3, torch.Generator().manual_seed(3))
    b = augment.train_batch(x, sizes, 224, (0.5,) * 3, (0.5,) * 3, torch.Generator().manual_seed(3))
    c = augment.train_batch(x, sizes, 224, (0.5,) * 3, (0.5,) * 3, torch.Generator().manual_seed(4))
    assert a.shape == (8, 3, 224, 224) and a.dtype == torch.float32
    assert torch.equal(a, b) and not torch.equal(a, c)
