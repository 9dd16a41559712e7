"""The best configuration of a condition, as YAML that reruns as it is: which run wins
(``best_overall``, ``best_per_dataset``), the config it trained with (``run_config``: its
``config.yaml`` artifact or its params), and the file (``write``: the rerun command and why
this run, in a comment block, then the config). ``export`` writes every condition's
(``raystudy export``); the report's answer (``analysis.sections.answer``) writes the winner's beside report.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from analysis import AnalysisError, load
from analysis.stats import selection
from raystudy.train.config import ConfigError, from_dict

# ---------------------------------------------------------------- params → config


def coerce_params(params: dict[str, str]) -> dict[str, Any]:
    """MLflow's string params back to the types of ``FinetuneConfig``; other keys are left out.

    >>> coerce_params({"lr": "0.01", "betas": "[0.9, 0.999]", "weights": "None", "compile": "False"})
    {'lr': 0.01, 'betas': [0.9, 0.999], 'weights': None, 'compile': False}
    """
    from raystudy.tracking import query

    try:
        return query.run_config(params)
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
    best = selection.choose_lrs(runs, select_on)
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
    means = selection.seed_means(runs)
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


def slug(name: str) -> str:
    """A tag value (anyone can set MLflow tags) as one safe path component: never '.', '..',
    a separator or a hidden name."""
    s = "".join(ch if ch.isalnum() or ch in "+-_." else "_" for ch in str(name))
    return "_" + s[1:] if not s or s.startswith(".") else s


def header(path: Path, row: dict, select_on: str, per_dataset: bool, scale: float) -> str:
    """The comment block a YAML file starts with: the rerun command, then why this config."""
    on = {"val": "validation", "test": "test"}[select_on]
    pct = "%" if scale == 100 else ""
    lines = [f"# python -m raystudy finetune --config {path}"]
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


def write(
    path: Path,
    row: dict,
    cfg: dict[str, Any],
    select_on: str,
    per_dataset: bool,
    scale: float,
    shown: Path | None = None,
) -> Path:
    """Write ``cfg`` (with the winning row's lr and seed) to ``path`` under its header, whose
    rerun command names ``shown`` (default: ``path``); returns ``path``."""
    cfg = {**cfg, "lr": float(row["lr"]), "seed": int(row["seed"])}
    path.parent.mkdir(parents=True, exist_ok=True)
    text = header(shown or path, row, select_on, per_dataset, scale) + yaml.safe_dump(cfg, sort_keys=False)
    path.write_text(text)
    return path


def row_config(row: dict) -> dict[str, Any]:
    """A config rebuilt from a runs-table row (a CSV holds no run config): its model, dataset,
    condition and optimizer, every other key at its default."""
    keys = {
        k: row[k] for k in ("model", "dataset", "condition", "optimizer") if str(row.get(k, "unknown")) != "unknown"
    }
    try:
        return from_dict(keys).to_dict()
    except ConfigError as e:
        raise AnalysisError(f"the runs table's row does not read back as a config: {e}") from None


@dataclass(frozen=True)
class WinnerConfig:
    """One condition's best config as a report output (like ``analysis.output.Table``): written
    by ``write`` into the report's folder at ``name``; the run's own config where the runs come
    from MLflow (``mlflow``), else the runs table's row (``row_config``)."""

    name: str
    row: dict
    select_on: str
    scale: float
    mlflow: bool = False
    tracking_uri: str | None = None

    def write(self, out: Path) -> list[Path]:
        """Write the YAML file into ``out``; returns its path. Its rerun command is relative to
        ``out``, so a report folder moved elsewhere still says how to rerun it."""
        cfg = run_config(self.row["run_id"], self.tracking_uri) if self.mlflow else row_config(self.row)
        return [write(Path(out) / self.name, self.row, cfg, self.select_on, False, self.scale, Path(self.name))]


# ---------------------------------------------------------------- every condition's file


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
    scale = selection.display_scale(runs["test_acc"])
    rehearsal = load.rehearsal_line(runs, "this config chosen among")
    for s in found:
        sub = runs[(runs[load.SETTING].astype(str) == list(s)).all(axis=1)]
        base = out if len(found) == 1 else out / slug("_".join(s[:2]) + ("_low_data" if s[2] == "True" else ""))
        chosen = best_per_dataset(sub, select_on) if per_dataset else best_overall(sub, select_on)
        for row in chosen.to_dict("records"):
            cfg = run_config(row["run_id"], tracking_uri)
            path = (base / slug(row["dataset"]) if per_dataset else base) / f"{slug(row['condition'])}.yaml"
            if out.resolve() not in path.resolve().parents:  # e.g. a symlink planted in out
                raise AnalysisError(f"refusing to write {path}: it resolves outside --out {out}")
            written.append(write(path, row, cfg, select_on, per_dataset, scale))
            if rehearsal is not None:  # a file read on its own says it too
                path.write_text(f"# {rehearsal}\n{path.read_text()}")
    return written


def check(paths: list[Path]) -> list[str]:
    """Load and validate each written file; the one-line problems of those that fail here."""
    from raystudy.train.config import load_config, validate

    problems = []
    for p in paths:
        try:
            validate(load_config(p))
        except ConfigError as e:
            problems.append(f"{p}: {e}")
    return problems
