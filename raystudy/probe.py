"""Measure the plasticity of every component of every block of a ViT, with its theoretical bound.

    python -m raystudy.probe                                  # the offline demo: vit_demo, digits_c
    python -m raystudy.probe --mode in_situ --pairs 2048 --components MHA,FC1
    python -m raystudy.probe --model vit_base --dataset cifar100 --pairs 12800 --batch-size 128 \\
        --device cuda --num-workers 8                         # the paper's measurement

x comes from the source (pretraining-like) dataset's test split (default: ``digits`` for the
demo, ``imagenet_val`` otherwise), y from the downstream dataset's test split; both go through
the model's eval transform. Prints a table per mode and the model-level ranking, and writes the
tidy table (CSV and Parquet) and a figure (PNG and PDF) to --out.

Bad input (unknown mode, component, model or dataset, pairs < 1, image sizes that differ,
missing dataset files or weights) exits with status 2 and one line naming the bad value and the
valid choices, before any model is built.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import torch.nn as nn

from raystudy import plasticity
from raystudy.config import ConfigError

DEMO_NOTE = ("note: the paper's plasticity claim (MHA > FC1 ~ FC2 > LN2 > LN1) is about large "
             "pretrained ViTs; this tiny demo's ranking is expected to differ: its embedding tokens "
             "are small next to sqrt(d), so LayerNorm amplifies differences, and its linear weights "
             "stay near their small initialisation (STUDY.md). It is reported as measured.")


def probe_model(model: nn.Module, source_ds, target_ds, *, n_pairs: int, batch_size: int,
                modes: str | Sequence[str] = plasticity.MODES, seed: int = 0, model_name: str = "",
                dataset_name: str = "", components: str | Sequence[str] = plasticity.PROBE_COMPONENTS,
                num_workers: int = 0, tags: dict | None = None):
    """Probe an already built model (any device) on (x, y) pairs; returns the tidy DataFrame.

    x from ``source_ds`` (pretraining-like), y from ``target_ds`` (downstream test split), both
    datasets of image tensors at the model's input size. All modes share one pass over the pairs.
    ``tags`` adds constant columns (``{"stage": "after_finetune", "run_id": ...}``), for the
    engine's before/after-finetuning probes and the Ray workers.
    """
    pairs = plasticity.pairs_from_datasets(source_ds, target_ds, n_pairs, batch_size, seed,
                                           num_workers=num_workers)
    rows = plasticity.probe(model, pairs, mode=modes, components=components)
    return plasticity.to_frame(rows, model=model_name, dataset=dataset_name, **(tags or {}))


def format_tables(df) -> list[str]:
    """Lines of the per-layer tables (mean P, bound) and the ranking of each mode."""
    lines = []
    agg = plasticity.aggregate(df)
    comps = [c for c in plasticity.PROBE_COMPONENTS if c in set(df["component"])]
    for mode in [m for m in plasticity.MODES if m in set(df["mode"])]:
        sub = df[df["mode"] == mode]
        n = int(sub["n"].min())
        lines.append(f"\n{mode}: plasticity P per layer (mean over {n} pairs, [bound])")
        lines.append(f"{'layer':<7}" + "".join(f"{c:>9}{'[bound]':>11}" for c in comps))
        for layer, rows in sub.groupby("layer"):
            cells = rows.set_index("component")
            lines.append(f"{layer:<7}" + "".join(
                f"{cells.at[c, 'mean']:>9.4g} [{cells.at[c, 'bound']:>8.3g}]" for c in comps))
        a = agg[agg["mode"] == mode]
        lines.append(f"{'model':<7}" + "".join(
            f"{a.set_index('component').at[c, 'plasticity']:>9.4g}{'':11}" for c in comps))
        over = sub[(sub["mean"] > sub["bound"] * (1 + 1e-6))]
        if len(over):
            lines.append(f"warning: measured above the bound at {len(over)} (layer, component): "
                         + ", ".join(f"{r.layer}/{r.component}" for r in over.itertuples()))
        lines.append(f"ranking ({mode}): " + " > ".join(
            f"{r.component} {r.plasticity:.3g}" for r in a.itertuples()))
    return lines


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        # One line, like every other bad input (argparse would add a usage block).
        self.exit(2, f"error: {message} (see python -m raystudy.probe --help)\n")


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(prog="python -m raystudy.probe", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--model", default="vit_demo", help="vit_demo, vit_base/large/huge or any timm ViT")
    ap.add_argument("--dataset", default="digits_c", help="downstream dataset: y from its test split")
    ap.add_argument("--source", help="pretraining-like dataset for x (default: digits for vit_demo, "
                                     "imagenet_val otherwise)")
    ap.add_argument("--pairs", type=int, default=1024, help="number of (x, y) pairs (paper: 12800)")
    ap.add_argument("--batch-size", type=int, default=128, help="pairs per batch")
    ap.add_argument("--mode", default="both", help="shared, in_situ or both (default)")
    ap.add_argument("--components", default=",".join(plasticity.PROBE_COMPONENTS),
                    help="comma-separated subset of " + ",".join(plasticity.PROBE_COMPONENTS))
    ap.add_argument("--weights", help="local checkpoint file (default: hub cache; the demo's own)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the pair sampling")
    ap.add_argument("--out", help="output folder (default runs/probe/<model>_<dataset>)")
    ap.add_argument("--data-root", help="dataset root (default $RAYSTUDY_DATA)")
    ap.add_argument("--download", action="store_true", help="let torchvision download the dataset")
    ap.add_argument("--device", default="auto", help="auto, cpu or cuda")
    ap.add_argument("--num-workers", type=int, default=0, help="data loading processes")
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:  # argparse has printed its message; same status, no traceback
        return int(e.code or 0)

    from raystudy import data, engine, models

    # -- validate everything cheap before any data or weights are touched
    try:
        modes = plasticity.check_modes(args.mode)
        comps = plasticity.check_components(args.components)
        if args.pairs < 1:
            raise ConfigError(f"--pairs must be >= 1, got {args.pairs}")
        if args.batch_size < 1:
            raise ConfigError(f"--batch-size must be >= 1, got {args.batch_size}")
        if args.num_workers < 0:
            raise ConfigError(f"--num-workers must be >= 0, got {args.num_workers}")
        if args.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"unknown device {args.device!r}; valid: auto, cpu, cuda")
        full = models.check_model(args.model)
        source = args.source or data.source_dataset(full)
        data.check_dataset(args.dataset)
        data.check_dataset(source)
        if args.weights is not None and not Path(args.weights).is_file():
            raise ConfigError(f"weights file {args.weights!r} does not exist")
        ic = models.input_config(args.model)
    except (ConfigError, plasticity.ProbeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    # -- data: test splits at the model's input size; shapes checked against each other and the model
    try:
        split = dict(seed=args.seed, img_size=ic["img_size"], mean=ic["mean"], std=ic["std"],
                     root=args.data_root, download=args.download)
        src, tgt = data.build_splits(source, **split), data.build_splits(args.dataset, **split)
        want = (ic["in_chans"], ic["img_size"], ic["img_size"])
        for name, ds in ((source, src.test), (args.dataset, tgt.test)):
            try:
                shape = tuple(plasticity.image_of(ds, 0).shape) if len(ds) else None
            except RuntimeError as e:  # e.g. grey images normalised with an RGB model's mean
                raise plasticity.ProbeError(
                    f"dataset {name!r} does not fit model {args.model!r}, which expects images of "
                    f"shape {want}: {str(e).splitlines()[0]}") from None
            if shape != want:
                raise plasticity.ProbeError(
                    f"dataset {name!r} gives images of shape {shape}, model {args.model!r} expects "
                    f"{want}; pick a source and dataset at the model's input size")
    except (data.DatasetUnavailable, plasticity.ProbeError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    # -- model
    weights = args.weights
    if weights is None and full == "vit_demo":
        weights = engine.demo_weights()
    try:
        model = models.create_model(args.model, tgt.num_classes, weights=weights)
        device = engine.resolve_device(args.device)
        model.to(device)
        plasticity.unwrap_vit(model)
    except (models.WeightsUnavailable, plasticity.ProbeError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    print(f"raystudy probe: {args.model} on {args.dataset} (x: {source} test, y: {args.dataset} "
          f"test), {args.pairs} pairs in batches of {args.batch_size}, modes {', '.join(modes)}, "
          f"seed {args.seed}, {device}", flush=True)
    df = probe_model(model, src.test, tgt.test, n_pairs=args.pairs, batch_size=args.batch_size,
                     modes=modes, seed=args.seed, model_name=args.model, dataset_name=args.dataset,
                     components=comps, num_workers=args.num_workers)
    for line in format_tables(df):
        print(line)
    if full == "vit_demo":
        print(DEMO_NOTE)

    out = Path(args.out or Path("runs") / "probe" / f"{args.model}_{args.dataset}")
    stem = out / "plasticity"
    written = plasticity.save_table(df, stem) + plasticity.plot(df, stem)
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
