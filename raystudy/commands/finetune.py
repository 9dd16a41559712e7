"""Run one finetuning of one study condition end to end.

    python -m raystudy finetune                                  # the offline demo (MHA)
    python -m raystudy finetune --condition FC1 --lr 0.3 --seed 42
    python -m raystudy finetune --config examples/run.yaml --set steps=500 --out runs/one
    python -m raystudy finetune --model vit_base --dataset cifar100 --download --steps 10000 \\
        --batch-size 512 --grad-accum 8 --lr 0.01 --warmup-steps 2000 --eval-every 500
    python -m raystudy finetune --dataset products --data ./photos   # your own images, checked first

The run is recorded in MLflow as a grid trial is (``--no-mlflow``: not at all), its results are
saved under runs/finetune/<condition>-<dataset>-<optimizer>-lr<lr>-s<seed> (``--out``,
``--no-save``), and torch uses one thread (``--threads``), as grid trials do.

Bad input (unknown model, dataset, condition, optimizer or config key) exits with status 2 and
one line naming the bad value and the valid choices, before any weights or data are loaded.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from raystudy.commands import cli
from raystudy.data import userdata
from raystudy.errors import ConfigError
from raystudy.measure import summary
from raystudy.models import components
from raystudy.tracking import connect
from raystudy.tracking.recorder import Recorder
from raystudy.train.config import FinetuneConfig, limit_help, load_config, parse_value, validate

# Flags for the keys people change most; any other key goes through --set key=value.
FLAGS = (
    "model",
    "weights",
    "dataset",
    "data",
    "data_root",
    "condition",
    "optimizer",
    "lr",
    "steps",
    "warmup_steps",
    "batch_size",
    "grad_accum",
    "seed",
    "device",
    "eval_every",
    "probe_pairs",
)


def make_config(args: argparse.Namespace) -> FinetuneConfig:
    """The run's config: the config file (or the demo), then the flags, then ``--set``, validated."""
    overrides = {k: parse_value(k, getattr(args, k)) for k in FLAGS if getattr(args, k) is not None}
    if args.download:
        overrides["download"] = True
    overrides.update(cli.parse_set(args.set or []))
    if overrides.get("data"):  # your own data: a path as typed, from the working directory
        overrides["data"] = userdata.resolve(overrides["data"])
    return validate(load_config(args.config or "demo", **overrides))


def printer(cfg: FinetuneConfig):
    """A report callback that prints progress lines."""

    def report(m: dict[str, Any], state) -> None:
        """Print one report: an evaluation line or a training line with the gradient norms."""
        if "val_acc" in m:
            print(
                f"  step {m['step']:>6}/{cfg.steps}  val acc {m['val_acc']:.4f}  "
                f"val loss {m['val_loss']:.4f}  best {m['best_val_acc']:.4f}",
                flush=True,
            )
            return
        norms = "  ".join(
            f"{k.split('/')[1]} {v:.3g}" for k, v in m.items() if k.startswith("grad_norm/") and not k.endswith("total")
        )
        print(
            f"  step {m['step']:>6}/{cfg.steps}  loss {m['loss']:.4f}  lr {m['scheduled_lr']:.3g}  "
            f"|grad| {m['grad_norm/total']:.3g} ({norms})",
            flush=True,
        )

    return report


def build_parser() -> cli.Parser:
    """The command line's flags: the config file, a flag per common config key, outputs, MLflow."""
    ap = cli.Parser("raystudy finetune", __doc__)
    ap.add_argument("--config", help="YAML config file or bundled name (default: demo)")
    types_ = FinetuneConfig.__annotations__
    for key in FLAGS:  # typed by the config itself (config.parse_value), one parser for every flag
        limit = limit_help(key)
        ap.add_argument(
            "--" + key.replace("_", "-"),
            dest=key,
            metavar=key.upper(),
            help=f"config key {key} ({types_[key]}; default: the config's" + (f"; {limit})" if limit else ")"),
        )
    ap.add_argument("--download", action="store_true", help="let torchvision download the dataset")
    ap.add_argument("--set", action="append", metavar="KEY=VALUE", help="any config key (repeatable)")
    ap.add_argument(
        "--out",
        help="folder for config.yaml, results.json and the plasticity tables "
        "(default: runs/finetune/<condition>-<dataset>-<optimizer>-lr<lr>-s<seed>)",
    )
    ap.add_argument(
        "--no-save", action="store_true", help="write no files (MLflow still records the run); refused with --out"
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads for torch (default 1, as the grid's threads_per_trial: on a "
        f"shared machine more threads are often slower; {cli.bound('--threads')})",
    )
    cli.add_tracking_args(ap)
    ap.add_argument(
        "--no-mlflow",
        action="store_true",
        help="do not record the run in MLflow; refused with --tracking-uri or --experiment",
    )
    ap.add_argument("--quiet", action="store_true", help="print only the results")
    return ap


def run_name(cfg: FinetuneConfig) -> str:
    """The run's folder name: ``<condition>-<dataset>-<optimizer>-lr<lr>-s<seed>``."""
    return f"{components.canonical_condition(cfg.condition)}-{cfg.dataset}-{cfg.optimizer}-lr{cfg.lr:g}-s{cfg.seed}"


def plasticity_summary(results: dict[str, Any]) -> str | None:
    """Per probe mode, each component's plasticity (mean over layers) before and after
    finetuning, most plastic first; None when the run did not probe."""
    import pandas as pd

    tables = {
        when: pd.DataFrame(results[f"plasticity_{when}"])
        for when in ("before", "after")
        if results.get(f"plasticity_{when}")
    }
    if not tables:
        return None
    means = pd.concat({w: summary.layer_means(t, ("mode", "component")) for w, t in tables.items()}, axis=1)
    whens = list(tables)
    lines = [
        "plasticity, mean over layers (most plastic first):",
        f"  {'mode':<8} {'component':<10}" + "".join(f"{w:>9}" for w in whens),
    ]
    for mode, df in means.groupby(level="mode", sort=False):
        df = df.droplevel("mode").sort_values(whens[0], ascending=False)
        lines += [
            f"  {mode:<8} {c:<10}" + "".join(f"{v:>9.3g}" for v in row) for c, row in zip(df.index, df.to_numpy())
        ]
    return "\n".join(lines)


def save(out: Path, cfg: FinetuneConfig, results: dict[str, Any]) -> list[Path]:
    """config.yaml, results.json (without the plasticity rows) and plasticity_*.csv under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "config.yaml", out / "results.json"]
    written[0].write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    written[1].write_text(json.dumps({k: v for k, v in results.items() if not k.startswith("plasticity_")}, indent=2))
    for name in ("plasticity_before", "plasticity_after"):
        if results.get(name):
            import pandas as pd

            written.append(out / f"{name}.csv")
            pd.DataFrame(results[name]).to_csv(written[-1], index=False)
    return written


def prepare(args: argparse.Namespace) -> tuple[FinetuneConfig, Path | None, str | None, str, list[str]]:
    """Every check of the command line, before any weights are loaded: (config, output folder or
    None, tracking URI or None, experiment, notes on your own data). Your own data is checked in
    full (``cli.check_data``). Raises ConfigError or WeightsUnavailable (one line)."""
    from raystudy.models import preflight, registry, sources
    from raystudy.train import pretrain

    cli.check_unused("--no-save", args.no_save, {"--out": args.out})
    cli.check_unused(
        "--no-mlflow", args.no_mlflow, {"--tracking-uri": args.tracking_uri, "--experiment": args.experiment}
    )
    cfg = make_config(args)
    cli.check_device("--device", cfg.device)
    cli.check_count("--threads", args.threads)
    out = None if args.no_save else Path(args.out or Path("runs/finetune") / run_name(cfg))
    cli.check_folder("--out", out)
    uri = None if args.no_mlflow else (args.tracking_uri or connect.default_uri())
    if uri:
        connect.check_uri(uri)
    experiment = args.experiment or f"raystudy-finetune-{sources.short(registry.resolve_name(cfg.model))}"
    preflight.check(cfg.model, cfg.weights)
    vtab1k = [cfg.data] if cfg.low_data and cfg.low_data_split == "vtab1k" else []
    notes = cli.check_data([cfg.data], vtab1k=vtab1k)  # the full scan of your own images, after the quick checks
    if cfg.weights is None and cfg.pretrained:
        pretrain.ensure_weights(cfg.model)
    return cfg, out, uri, experiment, notes


def train(cfg: FinetuneConfig, recorder: Recorder | None, quiet: bool) -> dict[str, Any]:
    """``engine.train`` with each report recorded (``recorder``) and printed (unless ``quiet``);
    a run that fails or is interrupted is marked so in MLflow, and the exception goes on."""
    from raystudy.data.source import DatasetUnavailable
    from raystudy.models import registry
    from raystudy.train import engine
    from raystudy.train.plan import resolve

    show = None if quiet else printer(cfg)

    def report(m: dict[str, Any], state) -> None:
        """Hand one report of the loop to the recorder and the printer."""
        if recorder:
            recorder.report(m)
        if show:
            show(m, state)

    try:
        return engine.train(resolve(cfg), report=report)
    except (registry.WeightsUnavailable, DatasetUnavailable) as e:
        if recorder:
            recorder.fail(str(e))
        raise
    except KeyboardInterrupt:
        if recorder:
            recorder.fail("", status="interrupted")
        raise
    except Exception:
        if recorder:
            import traceback

            recorder.fail(traceback.format_exc())
        raise


def print_results(results: dict[str, Any]) -> None:
    """The run's outcome: trainable parameters, accuracies (or where it diverged), plasticity."""
    counts = {k.split("/")[1]: v for k, v in results.items() if k.startswith("trainable_params/")}
    print(
        f"trainable parameters: {results['trainable_params']:,} ({', '.join(f'{k} {v:,}' for k, v in counts.items())})"
    )
    if results["status"] == "diverged":
        print(f"DIVERGED at step {results['steps_done']} (non-finite loss); no test accuracy")
    else:
        print(
            f"best val acc {results['best_val_acc']:.4f} at step {results['best_step']}; "
            f"test acc {results['test_acc']:.4f}; {results['wall_s']:.1f} s"
        )
    summary = plasticity_summary(results)
    if summary:
        print(summary)


def main(argv: list[str] | None = None) -> int:
    """Run one finetuning from the command line; the exit status (2: bad input, 1: not finished,
    or stopped by a full disk: one line naming it)."""
    args = build_parser().parse_args(argv)
    try:
        return _finetune(args)
    except Exception as e:
        from raystudy.driver import full_disk
        from raystudy.errors import disk_full

        if not disk_full(e):
            raise
        places = full_disk.places(args.tracking_uri or connect.default_uri(), {"the output": args.out or "runs"})
        print(full_disk.line(places, "finetune"), file=sys.stderr)
        return 1


def _finetune(args: argparse.Namespace) -> int:
    """The finetuning ``args`` ask for, checked, run and recorded; the exit status."""
    from raystudy.data.source import DatasetUnavailable
    from raystudy.models import registry

    try:
        cfg, out, uri, experiment, notes = prepare(args)
    except (ConfigError, registry.WeightsUnavailable) as e:
        return cli.fail(e)

    import torch

    torch.set_num_threads(args.threads)  # as a grid trial: the same thread count gives the same numbers
    print(
        f"raystudy finetune: {cfg.model} on {cfg.dataset}, condition "
        f"{components.canonical_condition(cfg.condition)}, {cfg.optimizer} lr {cfg.lr:g}, "
        f"{cfg.steps} steps, seed {cfg.seed}, {args.threads} thread(s)",
        flush=True,
    )
    for note in notes:
        print(note, flush=True)
    recorder = Recorder(uri, experiment, cfg) if uri else None
    try:
        results = train(cfg, recorder, args.quiet)
    except (registry.WeightsUnavailable, DatasetUnavailable) as e:
        return cli.fail(e)
    except userdata.CorruptImage as e:  # changed since the check: the run failed (recorded so), not the input
        print(f"error: {e}", file=sys.stderr)
        return 1
    if recorder:
        recorder.finish(results)
    print_results(results)
    if out is not None:
        print("wrote " + ", ".join(str(p) for p in save(out, cfg, results)))
    if recorder:
        print(f"MLflow: run {recorder.run_id} in experiment {experiment!r} at {uri}")
    return 0 if results["status"] == "finished" else 1


if __name__ == "__main__":
    sys.exit(main())
