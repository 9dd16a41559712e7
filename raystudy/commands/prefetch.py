"""Fetch pretrained weights and datasets once, into the caches every trial reads, before any trial starts.

    python -m raystudy prefetch --models vit_base,vit_huge --datasets study    # weights + the 11 benchmarks
    python -m raystudy prefetch --models vit_huge --datasets cifar10,pets --data-root /shared/data
    python -m raystudy prefetch --models vit_huge --datasets study --check    # report only, never download

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
from pathlib import Path

from raystudy.data import userdata
from raystudy.errors import ConfigError
from raystudy.train.caches import prefetch


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
    from raystudy.data.registry import STUDY_DATASETS, check_dataset

    names = []
    for v in (value or "").split(","):
        v = v.strip()
        if v == "study":
            names += [d for d in STUDY_DATASETS if d not in names]
        elif v.startswith(userdata.HF_PREFIX):  # your own data on the Hugging Face hub
            userdata.check_location(v)
            if v not in names:
                names.append(v)
        elif v:
            check_dataset(v)
            if v not in names:
                names.append(v)
    if value is not None and not names:
        raise ConfigError(f"--datasets: empty list {value!r}")
    return names


def build_parser() -> argparse.ArgumentParser:
    """The prefetch CLI's argument parser."""
    from raystudy.commands import cli

    ap = cli.Parser("raystudy prefetch", __doc__)
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
    from raystudy.commands import cli

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
