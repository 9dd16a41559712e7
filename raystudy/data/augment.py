"""The paper's transforms as batched tensor operations, for images held as uint8 tensors.

torchvision transforms one PIL image at a time: RandomResizedCrop(size) + RandomHorizontalFlip()
for training, Resize(size) + CenterCrop(size) for evaluation. Here a whole batch is
transformed at once on the device that holds it. The crop boxes are drawn by torchvision's rule,
vectorised: all 10 attempts at once, the first that fits wins, else the centre-crop fallback.
Crop, resize, flip and normalisation then become one affine resample (``affine_grid`` and a
bilinear ``grid_sample``) to the output size.

Boxes are (top, left, height, width) in pixels of the *original* image. A cache that squashed
every image to a fixed S×S square still crops exactly the region torchvision would crop, at the
cache's resolution: the resample works in coordinates normalised to the whole image.

Differences from torchvision, by design: the output is not rounded to uint8 in between, and the
resample does not antialias (PIL does when it shrinks). Caches are sized so that the resample
shrinks by at most ~1.15× (256 → 224); tests/data/test_augment.py states the tolerances.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

SCALE = (0.08, 1.0)  # torchvision RandomResizedCrop defaults
RATIO = (3.0 / 4.0, 4.0 / 3.0)
ATTEMPTS = 10
FLIP_P = 0.5


def random_resized_crop_boxes(
    sizes: torch.Tensor,
    generator: torch.Generator | None = None,
    scale: Sequence[float] = SCALE,
    ratio: Sequence[float] = RATIO,
    attempts: int = ATTEMPTS,
) -> torch.Tensor:
    """RandomResizedCrop boxes for images of ``sizes`` (B, 2: height, width); (B, 4) float64.

    torchvision's ``RandomResizedCrop.get_params`` per image: up to ``attempts`` draws of an
    area fraction in ``scale`` and a log-uniform aspect ratio in ``ratio``, side lengths rounded
    to whole pixels; the first draw that fits gets a uniform integer offset; if none fits, the
    largest centred crop whose ratio is clamped into ``ratio``. Same distribution, different
    random stream (all attempts are drawn whether needed or not).
    """
    dev = sizes.device
    hw = sizes.to(torch.float64)
    H, W = hw[:, :1], hw[:, 1:]  # (B, 1)
    u = torch.rand((len(sizes), attempts, 4), generator=generator, device=dev, dtype=torch.float64)
    target = H * W * (scale[0] + (scale[1] - scale[0]) * u[..., 0])
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = torch.exp(log_lo + (log_hi - log_lo) * u[..., 1])
    w = torch.round(torch.sqrt(target * aspect))  # round half to even, as Python
    h = torch.round(torch.sqrt(target / aspect))
    fits = (w > 0) & (w <= W) & (h > 0) & (h <= H)  # (B, attempts)
    first = fits.to(torch.uint8).argmax(1, keepdim=True)  # the first attempt that fits
    h, w = h.gather(1, first), w.gather(1, first)
    top = torch.floor(u[..., 2].gather(1, first) * (H - h + 1))  # randint(0, H - h + 1)
    left = torch.floor(u[..., 3].gather(1, first) * (W - w + 1))

    # No attempt fitted: the whole image, its ratio clamped into ``ratio``, centred.
    in_ratio = W / H
    fw = torch.where(in_ratio > ratio[1], torch.round(H * ratio[1]), W)
    fh = torch.where(in_ratio < ratio[0], torch.round(W / ratio[0]), H)
    ftop, fleft = torch.floor((H - fh) / 2), torch.floor((W - fw) / 2)
    found = fits.any(1, keepdim=True)
    box = torch.cat(
        [
            torch.where(found, top, ftop),
            torch.where(found, left, fleft),
            torch.where(found, h, fh),
            torch.where(found, w, fw),
        ],
        1,
    )
    return box


def center_crop_boxes(sizes: torch.Tensor, size: int) -> torch.Tensor:
    """Resize(size) + CenterCrop(size) as boxes in original pixels; (B, 4) float64.

    torchvision's geometry exactly: the shorter side becomes ``size``, the longer
    ``int(size * long / short)``, and the crop starts at ``round((new - size) / 2)``.
    """
    hw = sizes.to(torch.float64)
    H, W = hw[:, 0], hw[:, 1]
    short, long = torch.minimum(H, W), torch.maximum(H, W)
    new_long = torch.floor(size * long / short)
    new_h = torch.where(W <= H, new_long, torch.full_like(H, size))
    new_w = torch.where(W <= H, torch.full_like(W, size), new_long)
    top = torch.round((new_h - size) / 2) * H / new_h
    left = torch.round((new_w - size) / 2) * W / new_w
    return torch.stack([top, left, size * H / new_h, size * W / new_w], 1)


def resample(
    images: torch.Tensor,
    sizes: torch.Tensor,
    boxes: torch.Tensor,
    size: int,
    mean: Sequence[float],
    std: Sequence[float],
    flip: torch.Tensor | None = None,
    value_range: float = 255.0,
) -> torch.Tensor:
    """Crop ``boxes`` out of ``images``, resize to ``size``², flip where asked, normalise: one resample.

    ``images`` (B, C, S, S') hold the originals of ``sizes`` at any resolution (uint8 in
    [0, ``value_range``] or floats); the result is float32 (B, C, size, size), normalised as
    ``(x / value_range - mean) / std``. Bilinear, half-pixel centres, edges clamped.
    """
    hw = sizes.to(torch.float64)
    H, W = hw[:, 0], hw[:, 1]
    top, left, h, w = boxes.unbind(1)
    # Output pixel centre u in (-1, 1) maps to x = left + (u + 1) / 2 * w original pixels, i.e.
    # to 2x / W - 1 = u * w / W + (2 left + w) / W - 1 in grid_sample's normalised coordinates.
    sx, tx = w / W, (2 * left + w) / W - 1
    sy, ty = h / H, (2 * top + h) / H - 1
    if flip is not None:
        sx = torch.where(flip, -sx, sx)
    zero = torch.zeros_like(sx)
    theta = torch.stack([sx, zero, tx, zero, sy, ty], 1).view(-1, 2, 3).to(torch.float32)
    b, c = images.shape[:2]
    grid = F.affine_grid(theta, [b, c, size, size], align_corners=False)
    x = F.grid_sample(images.to(torch.float32), grid, mode="bilinear", padding_mode="border", align_corners=False)
    return normalise(x, mean, std, value_range)


def normalise(x: torch.Tensor, mean: Sequence[float], std: Sequence[float], value_range: float = 1.0) -> torch.Tensor:
    """``(x / value_range - mean) / std`` per channel, as one fused multiply-add."""
    shift, scale = _affine(tuple(mean), tuple(std), float(value_range), x.device)
    return torch.addcmul(shift, x.to(torch.float32), scale)


@functools.lru_cache(maxsize=64)
def _affine(mean: tuple, std: tuple, value_range: float, device: torch.device):
    # Made once per device and kept: a host-to-device copy per batch would wait for the GPU.
    m = torch.tensor(mean, dtype=torch.float64).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float64).view(1, -1, 1, 1)
    return (-m / s).float().to(device), (1.0 / (value_range * s)).float().to(device)


def train_batch(
    images: torch.Tensor,
    sizes: torch.Tensor,
    size: int,
    mean: Sequence[float],
    std: Sequence[float],
    generator: torch.Generator | None = None,
    value_range: float = 255.0,
) -> torch.Tensor:
    """RandomResizedCrop(size) + RandomHorizontalFlip() + Normalize, batched."""
    boxes = random_resized_crop_boxes(sizes, generator)
    flip = torch.rand(len(sizes), generator=generator, device=sizes.device) < FLIP_P
    return resample(images, sizes, boxes, size, mean, std, flip, value_range)


def eval_batch(
    images: torch.Tensor,
    sizes: torch.Tensor,
    size: int,
    mean: Sequence[float],
    std: Sequence[float],
    value_range: float = 255.0,
) -> torch.Tensor:
    """Resize(size) + CenterCrop(size) + Normalize, batched."""
    return resample(images, sizes, center_crop_boxes(sizes, size), size, mean, std, None, value_range)
