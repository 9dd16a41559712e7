"""Run one finetuning of one study condition end to end.

    python -m raystudy.finetune                                  # the offline demo (MHA)
    python -m raystudy.finetune --condition FC1 --lr 0.3 --seed 42
    python -m raystudy.finetune --config run.yaml --set steps=500 --out runs/one
    python -m raystudy.finetune --model vit_base --dataset cifar100 --download --steps 10000 \\
        --batch-size 512 --grad-accum 8 --lr 0.01 --warmup-steps 2000 --eval-every 500

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

from raystudy import cli, components
from raystudy.config import FinetuneConfig, load_config, parse_value, validate
from raystudy.errors import ConfigError

# Flags for the keys people change most; any other key goes through --set key=value.
FLAGS = ("model", "weights", "dataset", "data_root", "condition", "optimizer", "lr", "steps",
         "warmup_steps", "batch_size", "grad_accum", "seed", "device", "eval_every", "probe_pairs")


def make_config(args: argparse.Namespace) -> FinetuneConfig:
    overrides = {k: parse_value(k, getattr(args, k)) for k in FLAGS if getattr(args, k) is not None}
    if args.download:
        overrides["download"] = True
    overrides.update(cli.parse_set(args.set or []))
    return validate(load_config(args.config or "demo", **overrides))


def printer(cfg: FinetuneConfig):
    """A report callback that prints progress lines."""
    def report(m: dict[str, Any], state) -> None:
        if "val_acc" in m:
            print(f"  step {m['step']:>6}/{cfg.steps}  val acc {m['val_acc']:.4f}  "
                  f"val loss {m['val_loss']:.4f}  best {m['best_val_acc']:.4f}", flush=True)
            return
        norms = "  ".join(f"{k.split('/')[1]} {v:.3g}" for k, v in m.items()
                          if k.startswith("grad_norm/") and not k.endswith("total"))
        print(f"  step {m['step']:>6}/{cfg.steps}  loss {m['loss']:.4f}  lr {m['scheduled_lr']:.3g}  "
              f"|grad| {m['grad_norm/total']:.3g} ({norms})", flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = cli.Parser("python -m raystudy.finetune", __doc__)
    ap.add_argument("--config", help="YAML config file or bundled name (default: demo)")
    types_ = FinetuneConfig.__annotations__
    for key in FLAGS:  # typed by the config itself (config.parse_value), one parser for every flag
        ap.add_argument("--" + key.replace("_", "-"), dest=key, metavar=key.upper(),
                        help=f"config key {key} ({types_[key]}; default: the config's)")
    ap.add_argument("--download", action="store_true", help="let torchvision download the dataset")
    ap.add_argument("--set", action="append", metavar="KEY=VALUE", help="any config key (repeatable)")
    ap.add_argument("--out", help="folder for config.yaml and results.json")
    ap.add_argument("--quiet", action="store_true", help="print only the results")
    args = ap.parse_args(argv)

    from raystudy import datasets, engine, models, pretrain

    try:
        cfg = make_config(args)
        cli.check_device("--device", cfg.device)
        cli.check_folder("--out", args.out)
        if cfg.weights is None and cfg.pretrained:
            pretrain.ensure_weights(cfg.model)
    except (ConfigError, models.WeightsUnavailable) as e:
        return cli.fail(e)

    print(f"raystudy finetune: {cfg.model} on {cfg.dataset}, condition "
          f"{components.canonical_condition(cfg.condition)}, {cfg.optimizer} lr {cfg.lr:g}, "
          f"{cfg.steps} steps, seed {cfg.seed}", flush=True)
    try:
        results = engine.train(cfg, report=None if args.quiet else printer(cfg))
    except (models.WeightsUnavailable, datasets.DatasetUnavailable) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    counts = {k.split("/")[1]: v for k, v in results.items() if k.startswith("trainable_params/")}
    print(f"trainable parameters: {results['trainable_params']:,} "
          f"({', '.join(f'{k} {v:,}' for k, v in counts.items())})")
    if results["status"] == "diverged":
        print(f"DIVERGED at step {results['steps_done']} (non-finite loss); no test accuracy")
    else:
        print(f"best val acc {results['best_val_acc']:.4f} at step {results['best_step']}; "
              f"test acc {results['test_acc']:.4f}; {results['wall_s']:.1f} s")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        (out / "results.json").write_text(json.dumps(results, indent=2))
        print(f"wrote {out / 'config.yaml'} and {out / 'results.json'}")
    return 0 if results["status"] == "finished" else 1


if __name__ == "__main__":
    sys.exit(main())
