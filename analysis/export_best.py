"""Export the best configuration of each condition as YAML that reruns as it is.

    python -m analysis.export_best --experiment NAME [--tracking-uri URI] --out best/
    python -m analysis.export_best --experiment NAME --per-dataset --select-on test --out best/

Per dataset (``--per-dataset``): for each (dataset, condition), the lr with the best seed-mean
accuracy (validation by default, test with ``--select-on test``) and, at that lr, the seed whose
run scored best; written to ``OUT/<dataset>/<condition>.yaml``. Over all datasets (default):
for each condition, the lr with the best mean over datasets among the lrs tried on every
dataset, and the seed best on average there; written to ``OUT/<condition>.yaml``, with the
first dataset's run as the file's dataset (a comment lists the others).

Each file is the winning run's own config (its ``config.yaml`` artifact, or its params turned
back into typed values), begins with the command that reruns it, and loads with
``raystudy.config.load_config``:

    python -m raystudy.finetune --config best/MHA.yaml

Bad input exits with status 2 and one line on stderr.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from analysis import AnalysisError, load, stats
from raystudy.config import ConfigError, from_dict, validate

# ---------------------------------------------------------------- params → config


def coerce_params(params: dict[str, str]) -> dict[str, Any]:
    """MLflow's string params back to the types of ``FinetuneConfig``; other keys are left out.

    >>> coerce_params({"lr": "0.01", "betas": "[0.9, 0.999]", "weights": "None", "compile": "False"})
    {'lr': 0.01, 'betas': [0.9, 0.999], 'weights': None, 'compile': False}
    """
    from raystudy import tracking

    try:
        return tracking.run_config(params)
    except ConfigError as e:
        raise AnalysisError(f"a run's params do not read back as a config: {e}") from None


def run_config(run_id: str, tracking_uri: str | None = None) -> dict[str, Any]:
    """The config a run trained with: its ``config.yaml`` artifact, else its params."""
    text = load.read_artifact(run_id, "config.yaml", tracking_uri)
    raw = yaml.safe_load(text) if text else coerce_params(load.run_params(run_id, tracking_uri))
    try:
        return from_dict(raw).to_dict()
    except ConfigError as e:
        raise AnalysisError(f"run {run_id}: its config does not load: {e}") from None


# ---------------------------------------------------------------- choosing the runs


def _best_seed(runs: pd.DataFrame, select_on: str) -> pd.Series:
    """Among finished runs, the one with the highest ``select_on`` accuracy (lowest seed on ties)."""
    col = f"{select_on}_acc"
    ok = runs[(runs["status"] == "finished") & runs[col].notna()].sort_values("seed")
    return ok.loc[ok[col].idxmax()]


def best_per_dataset(runs: pd.DataFrame, select_on: str = "val") -> pd.DataFrame:
    """One row per (dataset, condition): the best-seed run at the lr chosen for that cell."""
    best = stats.best_lr(stats.seed_means(runs), select_on)
    rows = []
    for b in best.itertuples():
        if math.isnan(b.lr):
            continue
        cell = runs[(runs["dataset"] == b.dataset) & (runs["condition"] == b.condition) & (runs["lr"] == b.lr)]
        run = _best_seed(cell, select_on)
        rows.append({**run.to_dict(), "datasets": [b.dataset], "mean": b.test_mean, "std": b.test_std, "n": b.n})
    return pd.DataFrame(rows)


def best_overall(runs: pd.DataFrame, select_on: str = "val") -> pd.DataFrame:
    """One row per condition: the lr best on average over datasets, and its best seed.

    Candidate lrs are those with a finished run on every dataset the condition ran on (the
    DomainNet grid differs from the others, so an lr tried on one dataset only cannot win).
    """
    means = stats.seed_means(runs)
    col = f"{select_on}_mean"
    rows = []
    for condition, g in means.groupby("condition", sort=False):
        datasets = sorted(g["dataset"].unique())
        ok = g.dropna(subset=[col])
        per_lr = ok.groupby("lr").agg(
            n_datasets=("dataset", "nunique"), score=(col, "mean"), mean=("test_mean", "mean")
        )
        common = per_lr[per_lr["n_datasets"] == len(datasets)]
        if common.empty:
            raise AnalysisError(
                f"condition {condition!r}: no lr has a finished run on all of "
                f"{', '.join(datasets)}; export per dataset with --per-dataset"
            )
        lr = float(common["score"].idxmax())
        at = runs[(runs["condition"] == condition) & (runs["lr"] == lr) & (runs["status"] == "finished")]
        seed_score = at.groupby("seed")[f"{select_on}_acc"].mean()
        seed = int(seed_score.idxmax())
        first = at[(at["seed"] == seed)].sort_values("dataset").iloc[0]
        rows.append(
            {
                **first.to_dict(),
                "datasets": datasets,
                "mean": common.loc[lr, "mean"],
                "std": math.nan,
                "n": len(datasets),
            }
        )
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- writing


def _slug(name: str) -> str:
    """A tag value (anyone can set MLflow tags) as one safe path component: never '.', '..',
    a separator or a hidden name."""
    s = "".join(ch if ch.isalnum() or ch in "+-_." else "_" for ch in str(name))
    return "_" + s[1:] if not s or s.startswith(".") else s


def header(path: Path, row: dict, select_on: str, per_dataset: bool, scale: float) -> str:
    """The comment block a YAML file starts with: the rerun command, then why this config."""
    on = {"val": "validation", "test": "test"}[select_on]
    pct = "%" if scale == 100 else ""
    lines = [f"# python -m raystudy.finetune --config {path}"]
    if per_dataset:
        lines.append(
            f"# Best {row['condition']} on {row['dataset']}: lr {row['lr']:g} chosen on {on} "
            f"accuracy (seed-mean test acc {row['mean'] * scale:.2f}{pct} over {row['n']} seeds);"
        )
    else:
        lines.append(
            f"# Best {row['condition']} over {len(row['datasets'])} dataset(s): lr "
            f"{row['lr']:g} chosen on mean {on} accuracy over datasets (mean test acc "
            f"{row['mean'] * scale:.2f}{pct});"
        )
        lines.append(f"# datasets: {', '.join(row['datasets'])};")
        if len(row["datasets"]) > 1:
            lines.append(f"# this file trains on {row['dataset']}: rerun on another with --dataset NAME;")
    lines.append(
        f"# seed {row['seed']} scored best there (val acc {row['val_acc'] * scale:.2f}{pct}, "
        f"test acc {row['test_acc'] * scale:.2f}{pct}; MLflow run {row['run_id']})."
    )
    return "\n".join(lines) + "\n"


def export(
    runs: pd.DataFrame,
    out_dir: str | Path,
    tracking_uri: str | None = None,
    *,
    per_dataset: bool = False,
    select_on: str = "val",
) -> list[Path]:
    """Write the best config of each condition (per dataset or over all) as YAML files."""
    out = Path(out_dir)
    found = load.settings(runs)
    written = []
    scale = stats.display_scale(runs["test_acc"])
    for s in found:
        sub = runs[(runs[load.SETTING].astype(str) == list(s)).all(axis=1)]
        base = out if len(found) == 1 else out / _slug("_".join(s[:2]) + ("_low_data" if s[2] == "True" else ""))
        chosen = best_per_dataset(sub, select_on) if per_dataset else best_overall(sub, select_on)
        for row in chosen.to_dict("records"):
            cfg = run_config(row["run_id"], tracking_uri)
            cfg.update(lr=float(row["lr"]), seed=int(row["seed"]))
            path = (base / _slug(row["dataset"]) if per_dataset else base) / f"{_slug(row['condition'])}.yaml"
            if out.resolve() not in path.resolve().parents:  # e.g. a symlink planted in out
                raise AnalysisError(f"refusing to write {path}: it resolves outside --out {out}")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(header(path, row, select_on, per_dataset, scale) + yaml.safe_dump(cfg, sort_keys=False))
            written.append(path)
    return written


def check(paths: list[Path]) -> list[str]:
    """Load and validate each written file; the one-line problems of those that fail here."""
    from raystudy.config import load_config

    problems = []
    for p in paths:
        try:
            validate(load_config(p))
        except ConfigError as e:
            problems.append(f"{p}: {e}")
    return problems


def build_parser():
    """The command line of ``python -m analysis.export_best``."""
    from raystudy import cli

    ap = cli.Parser("python -m analysis.export_best", __doc__)
    ap.add_argument("--experiment", required=True, help="MLflow experiment name (or id)")
    ap.add_argument(
        "--tracking-uri",
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///./mlflow.db, as the grid)",
    )
    ap.add_argument("--per-dataset", action="store_true", help="one file per dataset and condition")
    ap.add_argument(
        "--select-on",
        choices=stats.SELECT_ON,
        default="val",
        help="choose the lr and seed on validation (default) or test accuracy",
    )
    ap.add_argument("--conditions", help="comma-separated conditions (default: all)")
    ap.add_argument("--datasets", help="comma-separated datasets (default: all)")
    ap.add_argument("--out", required=True, help="folder for the YAML files")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Export the best config of each condition (or dataset and condition) as YAML; returns the
    exit status: 0, or 2 with one ``error:`` line on bad input."""
    from raystudy import cli

    args = build_parser().parse_args(argv)
    from raystudy import tracking

    try:  # before MLflow's seconds of imports
        cli.check_folder("--out", args.out)
        uri = args.tracking_uri or tracking.default_uri()
        tracking.check_uri(uri, must_exist=True)
    except ConfigError as e:
        return cli.fail(e)
    from mlflow.exceptions import MlflowException

    try:
        runs = load.from_mlflow(args.experiment, uri)
        for col, wanted in (("condition", args.conditions), ("dataset", args.datasets)):
            if wanted:
                names = [w.strip() for w in wanted.split(",") if w.strip()]
                unknown = [n for n in names if n not in set(runs[col])]
                if unknown:
                    raise AnalysisError(
                        f"no {col} {', '.join(map(repr, unknown))} in experiment "
                        f"{args.experiment!r}; there are: {', '.join(sorted(set(runs[col])))}"
                    )
                runs = runs[runs[col].isin(names)]
        if args.select_on == "val" and runs["val_acc"].isna().all():
            raise AnalysisError("no validation accuracies to choose on; use --select-on test")
        paths = export(runs, args.out, uri, per_dataset=args.per_dataset, select_on=args.select_on)
    except (AnalysisError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except MlflowException as e:
        print(f"error: MLflow: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    for p in paths:
        print(p)
    for problem in check(paths):
        print(f"warning: does not validate on this machine: {problem}", file=sys.stderr)
    print(
        f"wrote {len(paths)} config(s); rerun one with: python -m raystudy.finetune --config "
        f"{paths[0] if paths else 'FILE'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
