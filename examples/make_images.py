"""Write a small labelled image set to try ``raystudy init`` on, offline: scikit-learn's digits.

    python examples/make_images.py photos                  # photos/<class>/*.png, one folder per class
    python examples/make_images.py photos --format csv     # photos/images/*.png and photos/labels.csv
    python examples/make_images.py photos --format hf      # a Hugging Face dataset, save_to_disk (needs `datasets`)

Each class is a digit (``zero`` ... ``three`` by default), each image an 8x8 digit scaled up to
32x32 pixels, in colour. Like a real photo folder, a few files are not RGB: one greyscale PNG and
one CMYK JPEG (raystudy converts them and says so once). ``--broken`` adds a truncated JPEG, which
raystudy's check refuses by name before anything runs. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path

import numpy as np
from PIL import Image

NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def digit_images(classes: int, per_class: int, size: int = 32) -> list[tuple[Image.Image, str]]:
    """``per_class`` images of each of the first ``classes`` digits, as (RGB image, class name)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    out = []
    for c in range(classes):
        rows = np.flatnonzero(digits.target == c)[:per_class]
        for k, i in enumerate(rows):
            grey = (digits.images[i] * (255 / 16)).astype(np.uint8)
            tint = np.array([1.0, 0.6 + 0.4 * (k % 2), 0.6 + 0.4 * (c % 2)])  # colour, so channels differ
            rgb = (grey[..., None] * tint).astype(np.uint8)
            out.append((Image.fromarray(rgb, "RGB").resize((size, size), Image.NEAREST), NAMES[c]))
    return out


def _save(img: Image.Image, path: Path, k: int) -> Path:
    """Most images as RGB PNGs; the first of the set greyscale, the second a CMYK JPEG."""
    if k == 0:
        path = path.with_suffix(".png")
        img.convert("L").save(path)
    elif k == 1:
        path = path.with_suffix(".jpg")
        img.convert("CMYK").save(path, quality=95)
    else:
        path = path.with_suffix(".png")
        img.save(path)
    return path


def _broken(path: Path) -> Path:
    """A JPEG cut off half-way, as an interrupted copy leaves one."""
    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 10, 10)).save(buf, "JPEG")
    path.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    return path


def write(out: Path, fmt: str, classes: int, per_class: int, broken: bool) -> Path:
    """Write the set under ``out`` in ``fmt``; the path to give ``raystudy init --data``."""
    images = digit_images(classes, per_class)
    out.mkdir(parents=True, exist_ok=False)
    if fmt == "hf":
        import datasets as hf

        features = hf.Features({"image": hf.Image(), "label": hf.ClassLabel(names=list(NAMES[:classes]))})
        rows = {"image": [im for im, _ in images], "label": [NAMES.index(c) for _, c in images]}
        hf.Dataset.from_dict(rows, features=features).save_to_disk(str(out))
        return out
    folder = out / "images" if fmt == "csv" else out
    rows = []
    for k, (img, cls) in enumerate(images):
        where = folder if fmt == "csv" else folder / cls
        where.mkdir(parents=True, exist_ok=True)
        rows.append((_save(img, where / f"{cls}_{k:04d}", k), cls))
    if broken:
        rows.append((_broken((folder if fmt == "csv" else folder / images[0][1]) / "broken.jpg"), images[0][1]))
    if fmt == "folder":
        return out
    table = out / "labels.csv"
    with table.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "label"])
        w.writerows((p.relative_to(out).as_posix(), cls) for p, cls in rows)
    return table


def main(argv: list[str] | None = None) -> int:
    """Write the image set; print the ``--data`` path for ``raystudy init``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path, help="folder to create (must not exist)")
    p.add_argument("--format", choices=("folder", "csv", "hf"), default="folder", help="default: folder")
    p.add_argument("--classes", type=int, default=4, choices=range(2, 11), metavar="2..10", help="default: 4")
    p.add_argument("--per-class", type=int, default=40, help="images per class (default: 40; the digits have ~170)")
    p.add_argument("--broken", action="store_true", help="add a truncated JPEG, which the check refuses")
    a = p.parse_args(argv)
    if a.out.exists():
        print(f"error: {a.out} exists; give a new folder", file=sys.stderr)
        return 2
    if not 5 <= a.per_class <= 170:
        print(f"error: --per-class {a.per_class}: 5 to 170 (the splits need 5; the digits have ~170)", file=sys.stderr)
        return 2
    print(write(a.out, a.format, a.classes, a.per_class, a.broken))
    return 0


if __name__ == "__main__":
    sys.exit(main())
