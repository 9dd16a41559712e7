"""Measure the plasticity of every component of every block of a ViT, with its theoretical bound.

    python -m raystudy probe                                  # the offline demo: vit_demo, digits_c
    python -m raystudy probe --mode in_situ --pairs 2048 --components MHA,FC1
    python -m raystudy probe --model vit_base --dataset cifar100 --pairs 12800 --batch-size 128 \\
        --device cuda --num-workers 8                         # the paper's measurement
    python -m raystudy probe --dataset mine --data ./photos   # y from your own images, checked first
    python -m raystudy probe --model gpt2 --dataset tokens_rule --tokens x.npy --target-tokens y.npy \\
        --mode shared                                         # GPT-2 on token ids you supply

x comes from the source (pretraining-like) dataset's test split (default: ``digits`` for the
demo, ``imagenet_val`` otherwise), y from the downstream dataset's test split; both go through
the model's eval transform. With ``--data PATH`` the downstream dataset is your own images there
(``--dataset`` names it), checked in full first and split as a finetuning run splits them. For GPT-2
x and y are token-id sequences: x from ``--tokens FILE`` (.npy or .pt, sequences x tokens; default:
uniform random tokens, ``tokens_random``), y from ``--target-tokens FILE`` or the dataset's test split.
Prints a table per mode and the model-level ranking, and writes the tidy table (CSV and Parquet)
and a figure (PNG and PDF) to --out.

Bad input (unknown mode, component, model or dataset, a count or seed outside its bound (see
--help), image sizes that differ, missing dataset files or weights) exits with status 2 and one
line naming the bad value and the valid choices, before any model is built.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from raystudy.commands import cli
from raystudy.errors import ConfigError
from raystudy.models.architectures import PROBE_COMPONENTS
from raystudy.models.components import PAIRINGS
from raystudy.train.config import NORMALIZATIONS

# From the torch-free registries, so that `--help` needs no torch.
COMPONENTS = ",".join(PROBE_COMPONENTS)


def save_figure(df, path_stem: str | Path) -> list[Path]:
    """The report's plasticity figure (per-layer curves with 95% bands) as PNG and PDF."""
    from analysis import figures
    from raystudy.measure import plasticity

    comps = [c for c in plasticity.PROBE_COMPONENTS if c in set(df["component"])]
    return figures.plasticity_layers(with_interval(df), comps, path_stem, modes=list(plasticity.MODES))


def with_interval(df):
    """``df`` with the 95% t interval of each mean (``analysis.stats.pooling.t_interval``, scipy's t
    quantile) after its n, unless it has one: the probe measures n, mean and std."""
    from analysis.stats import pooling
    from raystudy.measure import probe

    return df if all(c in df for c in probe.INTERVAL) else pooling.t_interval(df)


def build_parser() -> cli.Parser:
    """The command line's flags: model, datasets, pairs, modes, components, outputs."""
    ap = cli.Parser("raystudy probe", __doc__)
    ap.add_argument("--model", default="vit_demo", help="vit_demo, vit_base/large/huge or any timm ViT")
    ap.add_argument(
        "--dataset", help="downstream dataset: y from its test split (default: digits_c; tokens_rule for GPT-2)"
    )
    ap.add_argument(
        "--source",
        help="pretraining-like dataset for x (default: the model's pretraining data: digits for vit_demo, "
        "imagenet_val otherwise)",
    )
    ap.add_argument(
        "--pairs", type=int, default=1024, help=f"number of (x, y) pairs (paper: 12800; {cli.bound('--pairs')})"
    )
    ap.add_argument("--batch-size", type=int, default=128, help=f"pairs per batch ({cli.bound('--batch-size')})")
    ap.add_argument("--mode", default="both", help="shared, in_situ or both (default)")
    ap.add_argument("--components", default=COMPONENTS, help="comma-separated subset of " + COMPONENTS)
    ap.add_argument("--weights", help="local checkpoint file (default: hub cache; the demo's own)")
    ap.add_argument(
        "--seed",
        type=int,
        help="seed of the random pairing (default 0; 0 <= seed < 2**32; "
        "refused with --pairing sequential, which draws nothing)",
    )
    ap.add_argument(
        "--pairing",
        default="random",
        choices=PAIRINGS,
        help="random (seeded draws, default) or sequential (each split in loader order, whole "
        "batches, started again when it runs out: the paper's measurement)",
    )
    ap.add_argument(
        "--normalization",
        default="checkpoint",
        choices=NORMALIZATIONS,
        help="input normalisation, as the grid's config key: the checkpoint's own mean/std (default) "
        "or ImageNet's (the paper's)",
    )
    ap.add_argument(
        "--tokens",
        help="GPT-2: token ids for x, a .npy or .pt file (sequences, tokens) "
        "of pretraining-like text (default: random tokens)",
    )
    ap.add_argument("--target-tokens", help="GPT-2: token ids for y (default: the dataset's test split)")
    ap.add_argument("--out", help="output folder (default runs/probe/<model>_<dataset>)")
    ap.add_argument(
        "--data",
        help="your own images for y (a folder of class folders, a CSV or Parquet, a save_to_disk "
        "folder or hf:NAME), named by --dataset; checked in full before the model is built",
    )
    ap.add_argument("--data-root", help="dataset root (default $RAYSTUDY_DATA)")
    ap.add_argument("--download", action="store_true", help="let torchvision download the dataset")
    ap.add_argument("--device", default="auto", help="auto, cpu or cuda")
    ap.add_argument(
        "--num-workers", type=int, default=0, help=f"data loading processes (default 0; {cli.bound('--num-workers')})"
    )
    return ap


def check_args(args: argparse.Namespace) -> dict[str, Any]:
    """Every cheap check of the command line, before any data or weights are touched: the plan
    (modes, components, full model name, source dataset, whether the model reads tokens, the
    token files given, the model's input config). Raises ConfigError or ProbeError (one line)."""
    from raystudy.data.registry import DATASETS, check_dataset
    from raystudy.measure import plasticity
    from raystudy.models import gpt2, preflight, registry

    modes = plasticity.check_modes(args.mode)
    comps = plasticity.check_components(args.components)
    for flag, value in (
        ("--pairs", args.pairs),
        ("--batch-size", args.batch_size),
        ("--num-workers", args.num_workers),
    ):
        cli.check_count(flag, value)
    if args.device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"unknown device {args.device!r}; valid: auto, cpu, cuda")
    cli.check_device("--device", args.device)
    cli.check_seed("--seed", args.seed)
    cli.check_unused("--pairing sequential", args.pairing == "sequential", {"--seed": args.seed})
    full = registry.check_model(args.model)
    source = args.source or registry.source_dataset(full)
    arch = registry.architecture(full)
    tokens = arch.tokens
    own = check_own_data(args, tokens)
    args.dataset = args.dataset or ("tokens_rule" if tokens else "digits_c")
    for name in (source,) if own else (args.dataset, source):
        if check_dataset(name).tokens != tokens:
            fits = [n for n, i in DATASETS.items() if i.tokens == tokens]
            raise ConfigError(
                f"dataset {name!r} does not fit model {args.model!r}, which reads "
                f"{arch.inputs}; valid: {', '.join(fits)}"
            )
    if args.weights is not None:
        registry.check_weights_file(args.weights)
    preflight.check(args.model, args.weights)
    cli.check_folder("--out", args.out)
    notes = cli.check_data([args.data or ""])  # the full scan of your own images, after the quick checks
    ic = {**registry.input_config(args.model)}
    if not tokens:  # the images are normalised as a finetuning run with the same key sees them
        ic["mean"], ic["std"] = registry.normalization(args.model, args.normalization)
    supplied = {}  # flag -> token ids of a file the user gave
    for flag, path in (("--tokens", args.tokens), ("--target-tokens", args.target_tokens)):
        if path is not None and not tokens:
            raise ConfigError(f"{flag} is for GPT-2 models; {args.model!r} reads images")
        if path is not None:
            supplied[flag] = gpt2.load_tokens(path, ic["vocab_size"], ic["max_len"])
    return dict(
        modes=modes, comps=comps, full=full, source=source, tokens=tokens, supplied=supplied, ic=ic, notes=notes
    )


def check_own_data(args: argparse.Namespace, tokens: bool) -> bool:
    """Whether y comes from your own images (``--data``); with them, ``--data`` made absolute and
    the name and location checked cheaply (``dataset_info``). Raises ConfigError."""
    from raystudy.data import userdata
    from raystudy.data.registry import dataset_info

    if args.data is None:
        return False
    if tokens:
        raise ConfigError(f"--data is your own images; model {args.model!r} reads token ids (give --target-tokens)")
    if args.dataset is None:
        raise ConfigError("--data needs --dataset NAME, the name your images go by in the tables (e.g. --dataset mine)")
    args.data = userdata.resolve(args.data)
    dataset_info(args.dataset, args.data)
    return True


def load_data(args: argparse.Namespace, plan: dict[str, Any]) -> dict[str, Any]:
    """x and y as the flags and the checked ``plan`` ask (``measure.probe.load_data``)."""
    from raystudy.measure import probe

    return probe.load_data(
        args.model,
        args.dataset,
        plan["source"],
        plan["ic"],
        tokens=plan["tokens"],
        x_tokens=plan["supplied"].get("--tokens"),
        y_tokens=plan["supplied"].get("--target-tokens"),
        x_file=args.tokens,
        y_file=args.target_tokens,
        seed=args.seed or 0,
        root=args.data_root,
        download=args.download,
        data=args.data or "",
    )


def build_model(args: argparse.Namespace, plan: dict[str, Any], num_classes: int):
    """The model with its weights, on its device, unwrapped for the probe: (model, device)."""
    from raystudy.measure import plasticity
    from raystudy.models import registry
    from raystudy.train import engine, pretrain

    if args.weights is None:
        pretrain.ensure_weights(plan["full"])
    model = registry.create_model(args.model, num_classes, weights=args.weights)
    device = engine.resolve_device(args.device)
    model.to(device)
    plasticity.unwrap_vit(model)
    return model, device


def main(argv: list[str] | None = None) -> int:
    """Probe a model's plasticity from the command line; the exit status (2: bad input)."""
    ap = build_parser()
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:  # argparse has printed its message; same status, no traceback
        return int(e.code or 0)

    from raystudy.data.source import DatasetUnavailable
    from raystudy.measure import plasticity, probe
    from raystudy.models import registry

    try:  # everything cheap first, then the data, then the model: each refuses in one line
        plan = check_args(args)
        data = load_data(args, plan)
        model, device = build_model(args, plan, data["num_classes"])
    except (ConfigError, plasticity.ProbeError, DatasetUnavailable, registry.WeightsUnavailable) as e:
        return cli.fail(e)

    for note in plan["notes"]:
        print(note, flush=True)
    seed = args.seed or 0
    print(
        f"raystudy probe: {args.model} on {args.dataset} (x: {data['x_name']}, y: {data['y_name']}), "
        f"{args.pairs} pairs in batches of {args.batch_size}, modes {', '.join(plan['modes'])}, "
        f"{args.pairing} pairs" + (f" (seed {seed})" if args.pairing == "random" else "") + f", {device}",
        flush=True,
    )
    df, lines = probe.run(
        model,
        data,
        model_name=args.model,
        dataset_name=args.dataset,
        n_pairs=args.pairs,
        batch_size=args.batch_size,
        modes=plan["modes"],
        components=plan["comps"],
        seed=seed,
        num_workers=args.num_workers,
        pairing=args.pairing,
    )
    for line in lines:
        print(line)

    out = Path(args.out or Path("runs") / "probe" / f"{args.model}_{args.dataset}")
    stem = out / "plasticity"
    df = with_interval(df)  # the table shows each mean's interval, as the report does
    written = probe.save_table(df, stem) + save_figure(df, stem)
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
