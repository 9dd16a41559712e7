"""Test inputs built by more than one test file: class folders of generated images, a tiny ViT
and a disk filled to its last byte."""

import errno
import os
from pathlib import Path


def class_folders(
    root: Path,
    classes=("cat", "dog", "eel"),
    n: int = 8,
    size: int = 16,
    start: int = 0,
    spread: int = 60,
    step: int = 90,
) -> Path:
    """``n`` random ``size``x``size`` RGB PNGs per class under ``root/<class>/``, numbered from ``start``
    (also the seed); class ``c``'s pixels lie in [c * step, c * step + spread), so the classes differ
    in brightness. ``root``."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(start)
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(start, start + n):
            a = (rng.random((size, size, 3)) * spread + c * step).astype("uint8")
            Image.fromarray(a).save(root / name / f"{i}.png")
    return root


def tiny_vit(**kw):
    """A random-init timm ViT small enough for any test: 16x16 grey images, 2 blocks of width 32, 10 classes."""
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(
        img_size=16, patch_size=4, in_chans=1, embed_dim=32, depth=2, num_heads=2, num_classes=10, **kw
    )


def fill(disk: Path) -> None:
    """Take every free byte of ``disk``: a file written until the filesystem refuses."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        for size in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
    finally:
        os.close(fd)
