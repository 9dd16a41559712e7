"""The caches every trial reads, filled once before any trial starts: pretrained weights from
the hub, datasets from their download source, the weights raystudy builds itself."""

from __future__ import annotations

import os
import time
from pathlib import Path
from urllib.parse import urlparse

from raystudy.data import userdata

# Hosts torchvision downloads each dataset from (checked before a download, so offline fails fast).
HUB_HOST = "huggingface.co"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # timm's order


class Unfetchable(RuntimeError):
    """An item is not cached and cannot be fetched; the message names it and says why."""


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
    from raystudy.data.registry import check_dataset
    from raystudy.data.source import DatasetUnavailable
    from raystudy.models import registry

    if name.startswith(userdata.HF_PREFIX):
        return fetch_hub_dataset(name, check_only=check_only)
    info = check_dataset(name)
    try:
        src = info.load(root, False)  # files on disk only: never the network
        return f"cached  {name}: {len(src.train_pool.labels) + len(src.test.labels)} images under {root}"
    except DatasetUnavailable as e:
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
