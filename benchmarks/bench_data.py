"""Images/s of the two data paths: the tensor cache + batched device-side augmentation against
torchvision's per-image DataLoader path, on the same (synthetic) images.

    python benchmarks/bench_data.py                   # on the CPU
    python benchmarks/bench_data.py --device cuda     # on a GPU: the target is 10x
    python benchmarks/bench_data.py --n-cifar 8192 --n-jpeg 4096 --batch 512 --reps 5

Two datasets stand in for the study's (real ones cannot be downloaded everywhere):
  cifar-like   uint8 32x32 arrays (CIFAR, CIFAR-10-C): PIL images from memory, cache at 32x32
  jpeg-like    JPEG files of 300-500 px per side in an ImageFolder (DomainNet, Flowers, Pets):
               decoded per image by the per-image path; decoded once into a 256x256 cache
Both train with RandomResizedCrop(224) + flip + normalise. The per-image path runs a DataLoader
with one worker per host core (pinned, copied to the device), started afresh for each window
(start-up not timed) so that it cannot prefetch while the other path is timed; the cache path
cuts batches from the memory-mapped cache on the device and augments them in one resample. The
cache's one-off decoding time is printed separately. Windows of both paths alternate; medians.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from raystudy.data import batches  # noqa: E402
from raystudy.data.source import RGB, ArrayImages, Pool  # noqa: E402
from raystudy.data.splits import Splits, View  # noqa: E402
from raystudy.data.transforms import transforms  # noqa: E402

MEAN = STD = (0.5, 0.5, 0.5)


def machine(device: torch.device) -> str:
    cores = len(os.sched_getaffinity(0))
    dev = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    load = "/".join(f"{v:.1f}" for v in os.getloadavg())
    return (
        f"machine: {platform.node()} | {cores} host cores | {platform.processor() or platform.machine()} | "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads) | device {device} ({dev}) | "
        f"load average {load} (other processes share the machine)"
    )


def cifar_like(n: int) -> Pool:
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, n)
    return Pool(ArrayImages(imgs, labels), labels)


def jpeg_like(n: int, root: Path) -> Pool:
    """JPEGs of 300-500 px per side with smooth content (realistic file sizes), two classes."""
    from PIL import Image
    from torchvision.datasets import ImageFolder

    rng = np.random.default_rng(0)
    for i in range(n):
        d = root / f"c{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        h, w = (int(v) for v in rng.integers(300, 501, 2))
        small = rng.integers(0, 256, (h // 16, w // 16, 3), dtype=np.uint8)
        Image.fromarray(small).resize((w, h), Image.BICUBIC).save(d / f"{i}.jpg", quality=90)
    ds = ImageFolder(str(root))
    return Pool(RGB(ds), np.asarray(ds.targets))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def per_image_window(pool: Pool, batch: int, workers: int, batches: int, device: torch.device) -> float:
    """Images/s of torchvision's per-image path: fresh DataLoader workers per window, so they
    neither run ahead nor steal cores while the other path is timed; start-up is not timed."""
    from torch.utils.data import DataLoader

    train_tf, _ = transforms(224, MEAN, STD)
    ds = View(pool.items, np.arange(len(pool.labels)), train_tf)
    pin = device.type == "cuda"
    loader = DataLoader(
        ds,
        batch_size=batch,
        shuffle=True,
        drop_last=True,
        num_workers=workers,
        pin_memory=pin,
        generator=torch.Generator().manual_seed(0),
    )
    it = iter(loader)
    next(it)  # workers started and busy

    def stream():
        while True:
            x, y = next(it)  # noqa: F821 (deleted below once the stream is done)
            yield x.to(device, non_blocking=pin), y.to(device, non_blocking=pin)

    speed = window(stream(), batches, device)
    del it
    return speed


def cache_stream(pool: Pool, size: int, batch: int, device: torch.device, cache: Path, name: str):
    t0 = time.perf_counter()
    tp = batches.tensor_cache(name, "train", pool, size, cache, cache=cache, log=None)
    build = time.perf_counter() - t0
    view = batches.CachedView(tp, np.arange(len(tp)), train=True, size=224, mean=MEAN, std=STD)
    placed = batches.place(Splits(view, view, view, 10), device).train
    return batches.train_stream(placed, batch, seed=0, device=device), build, tp.images.nbytes


def window(stream, batches: int, device: torch.device) -> float:
    """Images/s over ``batches`` batches (the device finishes its work before the clock stops)."""
    sync(device)
    t0 = time.perf_counter()
    n = 0
    for _ in range(batches):
        x, y = next(stream)
        n += len(y)
    sync(device)
    return n / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", help="auto, cpu or cuda")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--batches", type=int, default=8, help="batches per timed window")
    ap.add_argument("--reps", type=int, default=3, help="alternating windows per path")
    ap.add_argument("--n-cifar", type=int, default=4096)
    ap.add_argument("--n-jpeg", type=int, default=1024)
    ap.add_argument(
        "--workers",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="DataLoader workers of the per-image path (default: all host cores)",
    )
    args = ap.parse_args(argv)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    print(machine(device))
    print(
        f"batch {args.batch}, {args.batches} batches per window, {args.reps} windows per path, "
        f"per-image path: {args.workers} DataLoader workers\n"
    )
    tmp = Path(tempfile.mkdtemp(prefix="bench_data"))
    try:
        rows = []
        for name, make, size in (
            ("cifar-like 32px", lambda: cifar_like(args.n_cifar), 32),
            ("jpeg-like 300-500px", lambda: jpeg_like(args.n_jpeg, tmp / "jpeg"), 256),
        ):
            pool = make()
            cached, build, nbytes = cache_stream(pool, size, args.batch, device, tmp / "cache", name.split()[0])
            nb = min(args.batches, len(pool.labels) // args.batch - 1)  # warm batch + window: one epoch
            if nb < 1:
                sys.exit(f"{name}: a pool of {len(pool.labels)} images holds fewer than 2 batches")
            window(cached, 1, device)  # warm: first page faults, kernels
            speeds: dict[str, list[float]] = {"cache": [], "per-image": []}
            for r in range(args.reps):
                runs = [
                    ("cache", lambda: window(cached, nb, device)),  # noqa: F821 (deleted below once timed)
                    ("per-image", lambda: per_image_window(pool, args.batch, args.workers, nb, device)),
                ]
                for key, run in runs if r % 2 == 0 else runs[::-1]:
                    speeds[key].append(run())
            c, p = statistics.median(speeds["cache"]), statistics.median(speeds["per-image"])
            rows.append((name, c, p, build, len(pool.labels), nbytes))
            print(
                f"{name:<22} cache + device augmentation {c:>8,.0f} img/s | per-image torchvision "
                f"{p:>8,.0f} img/s | ratio {c / p:5.2f}x"
            )
            print(
                f"{'':<22} ({nb} batches per window; cache built once: {len(pool.labels)} images, "
                f"{nbytes / 2**20:.0f} MiB, "
                f"{build:.1f} s = {len(pool.labels) / build:,.0f} img/s of decoding)"
            )
            del cached
        if device.type == "cpu":
            print(
                "\nOn CPU both paths share the same few cores with the model; a batched resample is no "
                "faster than PIL per image there. The device path pays off on a GPU, where the host "
                "cores can no longer feed the per-image path fast enough."
            )
        else:
            worst = min(c / p for _, c, p, *_ in rows)
            print(
                f"\ntarget (GPU): data path >= 10x the per-image path with all host cores: "
                f"{'met' if worst >= 10 else 'NOT met'} (worst ratio {worst:.1f}x)"
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"load average at the end: {'/'.join(f'{v:.1f}' for v in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
