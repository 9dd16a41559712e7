"""Fetch pretrained weights and datasets once, into the caches every trial reads, before any trial starts.

    python -m raystudy.prefetch --models vit_base,vit_huge --datasets study    # weights + the 11 benchmarks
    python -m raystudy.prefetch --models vit_huge --datasets cifar10,pets --data-root /shared/data
    python -m raystudy.prefetch --models vit_huge --datasets study --check    # report only, never download

Weights go to the Hugging Face cache timm reads ($HF_HUB_CACHE, or --hf-cache), datasets under
the data root ($RAYSTUDY_DATA, or --data-root): on a cluster, a folder the nodes share, or one
synced to every node (docs/cluster.md), so a thousand trials never hit the hub at once and
a trial never downloads. What is already cached is checked on disk only: with everything present
no network is used at all. Downloads happen only for what is missing, after a few-second check
that its host answers. CIFAR-10-C, DomainNet and ImageNet val cannot be downloaded automatically:
their files are checked and, when missing, the line says where to get them.

One line per item. Exit status 0 when everything is in place, 1 when something could not be
fetched (each named on its own line), 2 for bad input (an unknown model or dataset).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

from raystudy.data import userdata
from raystudy.errors import ConfigError

# Hosts torchvision downloads each dataset from (checked before a download, so offline fails fast).
HUB_HOST = "huggingface.co"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # timm's order


class Unfetchable(RuntimeError):
    """An item is not cached and cannot be fetched; the message names it and says why."""


def parse_models(value: str | None) -> list[str]:
    """The model names of a comma-separated ``--models`` value, each checked (ConfigError)."""
    from raystudy.models import registry

    names = [v.strip() for v in (value or "").split(",") if v.strip()]
    if value is not None and not names:
        raise ConfigError(f"--models: empty list {value!r}")
    for n in names:
        registry.check_model(n)
    return names


def parse_datasets(value: str | None) -> list[str]:
    """The dataset names of a comma-separated ``--datasets`` value (``study``: the 11 benchmarks),
    each checked, without repeats (ConfigError)."""
    from raystudy.data import datasets

    names = []
    for v in (value or "").split(","):
        v = v.strip()
        if v == "study":
            names += [d for d in datasets.STUDY_DATASETS if d not in names]
        elif v.startswith(userdata.HF_PREFIX):  # your own data on the Hugging Face hub
            userdata.check_location(v)
            if v not in names:
                names.append(v)
        elif v:
            datasets.check_dataset(v)
            if v not in names:
                names.append(v)
    if value is not None and not names:
        raise ConfigError(f"--datasets: empty list {value!r}")
    return names


# ---------------------------------------------------------------- weights


def fetch_weights(name: str, *, check_only: bool = False) -> str:
    """Make ``name``'s pretrained weights available offline; returns a one-line status."""
    from raystudy.models import registry
    from raystudy.train import pretrain

    full = registry.resolve_name(name)
    if registry.pretrain_recipe(full) is not None:  # pretrained here, on data that ships offline
        if check_only:
            state = "built" if registry.weights_file(full).is_file() else "built by prefetch"
            return (
                f"local   {name}: {state} from data that ships offline "
                f"({registry.weights_file(full)}); nothing to download"
            )
        return f"ready   {name}: {pretrain.ensure_weights(full, log=None)}"
    arch = registry.architecture(full)
    if arch.hubless_is_random_init and registry.hf_hub_id(full) is None:
        return f"local   {name}: random init (no pretrained weights exist for it); nothing to download"
    cached = registry.cached_weights(full)
    if cached is not None:
        return f"cached  {name} ({full}): {cached}"
    repo = registry.hf_hub_id(full)
    if not repo:
        raise Unfetchable(f"{name} ({full}): timm knows no Hugging Face repo for it; pass --weights FILE to the runs")
    if check_only:
        raise Unfetchable(f"{name} ({full}): not in the Hugging Face cache {registry.hub_cache_dir()}")
    if not registry.hub_reachable(HUB_HOST):
        raise Unfetchable(
            f"{name} ({full}): not in the Hugging Face cache {registry.hub_cache_dir()} "
            f"and {HUB_HOST} is unreachable; run this where there is network, then copy the cache"
        )
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    t0 = time.time()
    for fname in WEIGHT_FILES:
        try:
            for extra in arch.hub_extra_files:  # e.g. the config transformers' from_pretrained reads
                hf_hub_download(repo, extra)
            path = hf_hub_download(repo, fname)
            break
        except EntryNotFoundError:
            continue
        except Exception as e:  # noqa: BLE001 - any download failure is reported the same way
            raise Unfetchable(
                f"{name} ({full}): download from {repo} failed: {type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''}"
            ) from None
    else:
        raise Unfetchable(f"{name} ({full}): {repo} has none of {', '.join(WEIGHT_FILES)}")
    return f"fetched {name} ({full}): {path} ({time.time() - t0:.0f} s)"


# ---------------------------------------------------------------- datasets


def fetch_hub_dataset(name: str, *, check_only: bool = False) -> str:
    """Make the hub dataset ``name`` (``hf:NAME``) available in its cache (``userdata.hub_cache``),
    as a trial reads it; returns a one-line status. ``check_only``: the cache alone, offline."""
    offline = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"} if check_only else {}
    saved = {k: os.environ.get(k) for k in offline}
    os.environ.update(offline)  # read by the datasets package as it is imported, in the scan
    try:
        s = userdata.scan(name)
    except userdata.DataError as e:
        raise Unfetchable(f"dataset {name!r}: {'not cached' if check_only else 'not fetched'} ({e})") from None
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    n, where = sum(len(v) for v in s.items.values()), userdata.hub_cache()
    return f"{'cached ' if check_only else 'fetched'} {name}: {n} images, {len(s.classes)} classes under {where}"


def fetch_dataset(name: str, root: Path, *, check_only: bool = False) -> str:
    """Make dataset ``name`` available under ``root`` (``hf:NAME``: in the hub cache); returns a one-line status."""
    from raystudy.data import datasets
    from raystudy.models import registry

    if name.startswith(userdata.HF_PREFIX):
        return fetch_hub_dataset(name, check_only=check_only)
    info = datasets.check_dataset(name)
    try:
        src = info.load(root, False)  # files on disk only: never the network
        return f"cached  {name}: {len(src.train_pool.labels) + len(src.test.labels)} images under {root}"
    except datasets.DatasetUnavailable as e:
        missing = str(e)
    if not info.download:  # CIFAR-10-C, DomainNet, ImageNet val: by hand
        raise Unfetchable(missing)
    if check_only:
        raise Unfetchable(f"dataset {name!r}: not under {root}")
    host = urlparse(info.download).hostname
    if not registry.hub_reachable(host):
        raise Unfetchable(
            f"dataset {name!r}: not under {root} and {host} is unreachable; run this where "
            "there is network, or place the files there"
        )
    t0 = time.time()
    try:
        src = info.load(root, True)
    except Exception as e:  # noqa: BLE001 - a failed download of any kind
        raise Unfetchable(
            f"dataset {name!r}: download into {root} failed: {type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}"
        ) from None
    return (
        f"fetched {name}: {len(src.train_pool.labels) + len(src.test.labels)} images under {root} "
        f"({time.time() - t0:.0f} s)"
    )


# ---------------------------------------------------------------- CLI


def prefetch(
    model_names: list[str], dataset_names: list[str], root: Path, *, check_only: bool = False, out=print
) -> list[str]:
    """Fetch every item, printing one line each; returns the items that could not be fetched."""
    failed = []
    jobs = [(m, lambda m=m: fetch_weights(m, check_only=check_only)) for m in model_names]
    jobs += [(d, lambda d=d: fetch_dataset(d, root, check_only=check_only)) for d in dataset_names]
    for item, job in jobs:
        try:
            out(job())
        except Unfetchable as e:
            out(f"missing {e}" if check_only else f"error: could not fetch {e}")
            failed.append(item)
    return failed


def build_parser() -> argparse.ArgumentParser:
    """The prefetch CLI's argument parser."""
    from raystudy import cli

    ap = cli.Parser("python -m raystudy.prefetch", __doc__)
    ap.add_argument(
        "--models",
        "--model",
        dest="models",
        help="comma-separated models (aliases vit_base, vit_large, "
        "vit_huge, any timm ViT name, vit_demo, gpt2 or gpt2_tiny)",
    )
    ap.add_argument(
        "--datasets",
        help="comma-separated datasets, 'study' for the 11 benchmarks, or hf:NAME for your own on the "
        'Hugging Face hub (pip install -e ".[hf]"; cached under <data root>/hf)',
    )
    ap.add_argument("--data-root", help="dataset folder (default: $RAYSTUDY_DATA or ~/.cache/raystudy/data)")
    ap.add_argument("--hf-cache", help="Hugging Face hub cache (default: $HF_HUB_CACHE, from $HF_HOME)")
    ap.add_argument("--check", action="store_true", help="only report what is missing; never download")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Fetch what the flags name; returns 0 (all in place), 1 (something missing) or 2 (bad input)."""
    from raystudy import cli

    args = build_parser().parse_args(argv)
    try:
        model_names = parse_models(args.models)
        dataset_names = parse_datasets(args.datasets)
        if not model_names and not dataset_names:
            raise ConfigError("nothing to fetch: pass --models and/or --datasets")
        cli.check_folder("--data-root", args.data_root)
        cli.check_folder("--hf-cache", args.hf_cache)
    except ConfigError as e:
        return cli.fail(e)
    if args.hf_cache:  # before anything reads it; huggingface_hub looks it up at each call
        os.environ["HF_HUB_CACHE"] = str(Path(args.hf_cache).resolve())
        import huggingface_hub.constants

        huggingface_hub.constants.HF_HUB_CACHE = os.environ["HF_HUB_CACHE"]
    from raystudy import paths

    root = Path(args.data_root).resolve() if args.data_root else paths.data_root()
    failed = prefetch(model_names, dataset_names, root, check_only=args.check)
    if failed:
        print(
            f"{len(failed)} of {len(model_names) + len(dataset_names)} not available: {', '.join(failed)}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
