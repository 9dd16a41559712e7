"""The report's answer, first: which conditions to finetune on these data, ranked, with the
evidence the data allow, in one paragraph a user can paste into a design doc.

The conditions are ranked by mean test accuracy over the datasets (at the lr chosen as the rest
of the report chooses it). Each is compared with the best: the mean difference with its 95%
stratified-bootstrap interval (datasets and seeds resampled; seeds only on one dataset), and a
ROPE verdict from that interval against ±``--rope`` points: practically equivalent (inside),
the best better (below), undecided (across the margin). The answer is the condition with the
fewest trainable parameters among the best and those practically equivalent to it (the best
itself where the runs logged no counts). Plasticity is shown where the runs probed it. Its
config, as ``raystudy export`` would write it, goes beside report.md and is named in the
paragraph. A per-dataset summary gets the ranking without intervals from seeds, counts or config.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis import AnalysisError, best_config, intervals, tables
from analysis.output import Section, Table, section
from analysis.stats import pooling, selection
from analysis.study import Study

TITLE = "The answer: which parts to finetune"
CONFIG_DIR = "best_config"
EQUIVALENT, UNDECIDED = "practically equivalent", "undecided"


def width(s: Study) -> float:
    """The ROPE's half-width in the accuracies' own unit (fractions where shown in percent)."""
    return s.options.rope / s.scale if s.scale == 100 else s.options.rope


def verdict(low: float, high: float, half: float, best: str) -> str:
    """The ROPE verdict of a difference (condition − ``best``) from its interval."""
    if math.isnan(low) or math.isnan(high):
        return f"{UNDECIDED} (no interval)"
    if high < -half:
        return f"{best} better"
    if low >= -half and high <= half:
        return EQUIVALENT
    return UNDECIDED


def differences(s: Study, best: str) -> pd.DataFrame:
    """Per condition: its mean difference from ``best`` with a 95% bootstrap interval (NaN where
    the runs allow none: one run per cell on one dataset, or datasets fixed)."""
    others = [c for c in s.order if c != best]
    fixed = s.options.over == "seeds" or s.scores.shape[1] == 1
    one_run = int((~np.isnan(s.scores)).sum(axis=-1).max()) == 1
    if not others or (fixed and one_run):
        diff = {c: s.avg[c] - s.avg[best] for c in s.order}
        return pd.DataFrame({"difference": diff, "low": math.nan, "high": math.nan})
    boot = intervals.resample(s.scores, s.options.reps, s.options.seed, datasets=not fixed)
    pairs = intervals.pairwise_intervals(s.scores, s.order, boot=boot, pairs=[(c, best) for c in others])
    out = pd.DataFrame(
        {"difference": pairs["mean_diff"].to_numpy(), "low": pairs["mean_diff_low"], "high": pairs["mean_diff_high"]}
    )
    out.index = others
    out.loc[best] = (0.0, 0.0, 0.0)
    return out


def plasticity(s: Study) -> dict[str, pd.Series]:
    """Per probe mode, each component's plasticity averaged over layers and datasets ({}: not probed)."""
    if s.plasticity is None or not len(s.plasticity):
        return {}
    pooled = pooling.pool_plasticity(s.plasticity)
    return {m: pooling.component_plasticity(pooled, m).mean(axis=0) for m in sorted(pooled["mode"].unique())}


def ranking(s: Study) -> pd.DataFrame:
    """The conditions best first: accuracy, difference from the best with its interval, verdict,
    trainable parameters (mean over datasets; NaN where not logged), plasticity per mode."""
    order = sorted(s.order, key=lambda c: (-s.avg[c], s.order.index(c)))
    best = order[0]
    diff = differences(s, best).loc[order]
    params = selection.trainable_params(s.runs) if s.runs is not None else pd.DataFrame()
    df = pd.DataFrame(
        {
            "accuracy": [s.avg[c] for c in order],
            "difference": diff["difference"].to_numpy(),
            "low": diff["low"].to_numpy(),
            "high": diff["high"].to_numpy(),
            "params": [params[c].mean() if c in params else math.nan for c in order],
        },
        index=pd.Index(order, name="condition"),
    )
    df["verdict"] = ["best" if c == best else verdict(r.low, r.high, width(s), best) for c, r in df.iterrows()]
    for mode, values in plasticity(s).items():
        df[f"plasticity ({mode})"] = [values.get(c, math.nan) for c in order]
    return df


def choice(df: pd.DataFrame) -> str:
    """The answer: the fewest trainable parameters among the best and those practically
    equivalent to it; the best where any of them has no count."""
    near = df[df["verdict"].isin(["best", EQUIVALENT])]
    if near["params"].isna().any():
        return str(df.index[0])
    return str(near.sort_values(["params", "accuracy"], ascending=[True, False]).index[0])


def _names(items: list[str], k: int = 4) -> str:
    """``a, b and c``; past ``k``, the first ``k`` and how many more."""
    if len(items) > k:
        return f"{', '.join(items[:k])} and {len(items) - k} more"
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _pts(s: Study, r) -> str:
    """A difference and its interval in points (or the accuracy's unit)."""
    return tables.interval(r["difference"], r["low"], r["high"], 2, s.scale)


def _subject(s: Study) -> str:
    """What the answer is about: the model(s) and the dataset(s)."""
    datasets = [str(d) for d in s.table.index]
    on = f"dataset {datasets[0]}" if len(datasets) == 1 else f"{len(datasets)} datasets ({_names(datasets)})"
    models = sorted({str(m) for m in s.runs["model"]} - {"unknown"}) if s.runs is not None else []
    return (f"{_names(models)} on " if models else "") + on


def _groups(s: Study, df: pd.DataFrame) -> list[str]:
    """One sentence per verdict group: the conditions in it, each with its difference."""
    pts = "points" if s.scale == 100 else "(accuracy units)"
    best, lines = df.index[0], []
    for label, key in (
        (f"Practically equivalent to {best} (interval within ±{s.options.rope:g} {pts})", EQUIVALENT),
        (f"Worse than {best} by more than {s.options.rope:g} {pts}", f"{best} better"),
        ("Undecided, the interval crossing the margin (more seeds or datasets would decide)", UNDECIDED),
        ("Without an interval (one run per condition on one dataset)", f"{UNDECIDED} (no interval)"),
    ):
        rows = df[df["verdict"] == key]
        if len(rows):
            lines.append(f"{label}: " + "; ".join(f"{c} {_pts(s, r)}" for c, r in rows.iterrows()) + ".")
    return lines


def _basis(s: Study) -> str:
    """How the differences and their intervals were made, in one sentence."""
    seeds = int((~np.isnan(s.scores)).sum(axis=-1).max())
    if s.scores.shape[1] == 1 and seeds == 1:
        return "One run per condition on one dataset: no interval can be estimated, so nothing is decided."
    over = "seeds" if s.options.over == "seeds" or s.scores.shape[1] == 1 else "datasets and seeds"
    chosen = f", lr chosen on {s.chosen} accuracy" if s.chosen else ""
    return (
        f"Differences are in mean test accuracy over datasets{chosen}, with 95% stratified-bootstrap "
        f"intervals over {over} ({s.options.reps} replicates, seed {s.options.seed})."
    )


def _plasticity_line(df: pd.DataFrame) -> str:
    """Where probed, each mode's components by plasticity; else that it was not probed."""
    cols = [c for c in df if c.startswith("plasticity (")]
    if not cols:
        return "Plasticity was not probed in these runs."
    parts = []
    for col in cols:
        v = df[col].dropna().sort_values(ascending=False)
        parts.append(f"{col[len('plasticity (') : -1]}: " + " > ".join(f"{c} {x:.3f}" for c, x in v.items()))
    return "Plasticity, highest first (" + "; ".join(parts) + ")."


def _acc(s: Study, df: pd.DataFrame, c: str) -> str:
    """Condition ``c``'s mean test accuracy as shown."""
    return tables.fmt(df.loc[c, "accuracy"] * s.scale, 2) + ("%" if s.scale == 100 else "")


def _lead(s: Study, df: pd.DataFrame, pick: str) -> str:
    """The answer's first sentence: what to finetune, and why that one."""
    best, n = df.index[0], df["params"]
    lead = f"**Which parts to finetune.** For {_subject(s)}, finetune **{pick}**"
    if pick == best:
        count = f", training {n[pick]:,.0f} parameters" if not math.isnan(n[pick]) else ""
        return f"{lead}: it has the best mean test accuracy ({_acc(s, df, best)}{count})."
    return (
        f"{lead}: it is practically equivalent to the most accurate condition, {best} ({_acc(s, df, pick)} vs "
        f"{_acc(s, df, best)}), and trains fewer parameters ({n[pick]:,.0f} vs {n[best]:,.0f})."
    )


def paragraph(s: Study, df: pd.DataFrame, pick: str, config_line: str) -> str:
    """The answer in one paragraph: the choice, the ranking, the verdicts, the basis, plasticity, the config."""
    ranked = "Ranked by mean test accuracy: " + ", ".join(f"{c} {_acc(s, df, c)}" for c in df.index) + "."
    parts = [_lead(s, df, pick), ranked, *_groups(s, df), _basis(s), _plasticity_line(df), config_line]
    return " ".join(parts)


def winner_config(s: Study, pick: str) -> tuple[best_config.WinnerConfig | None, str]:
    """The config file of ``pick``'s best run (lr best on average over datasets, its best seed)
    and the sentence naming it; (None, why) where there is none."""
    if s.runs is None:
        return None, "A per-dataset summary holds no runs, so no configuration is exported."
    try:
        row = best_config.best_overall(s.runs[s.runs["condition"] == pick], s.select_on).iloc[0].to_dict()
    except AnalysisError as e:
        return None, f"No configuration exported: {e}."
    name = f"{CONFIG_DIR}/{best_config.slug(pick)}.yaml"
    attrs = s.runs.attrs
    config = best_config.WinnerConfig(
        name, row, s.select_on, s.scale, mlflow="experiment" in attrs, tracking_uri=attrs.get("tracking_uri")
    )
    return config, (
        f"The configuration that reruns it (one lr for every dataset, {row['lr']:g}, the best on average; seed "
        f"{row['seed']}) is `{name}`, beside this report: `python -m raystudy finetune --config {name}`."
    )


def shown(s: Study, df: pd.DataFrame) -> pd.DataFrame:
    """The answer's table as shown."""
    out = pd.DataFrame(
        {
            f"mean test acc{s.unit}": [_acc(s, df, c).rstrip("%") for c in df.index],
            f"vs best{' (points)' if s.scale == 100 else ''} [95% CI]": [
                tables.DASH if r["verdict"] == "best" else _pts(s, r) for _, r in df.iterrows()
            ],
            "verdict": df["verdict"],
            "trainable params": df["params"].map(lambda v: tables.DASH if math.isnan(v) else f"{v:,.0f}"),
        },
        index=df.index,
    )
    for col in (c for c in df if c.startswith("plasticity (")):
        out[col] = df[col].map(lambda v: tables.fmt(v, 3))
    return out


def build(s: Study) -> Section:
    """The section: the paragraph, its table (answer.md/.csv/.tex) and the winner's config file."""
    df = ranking(s)
    pick = choice(df)
    config, line = winner_config(s, pick)
    table = shown(s, df)
    return section(
        TITLE,
        paragraph(s, df, pick, line) + "\n\n" + tables.markdown(table),
        (Table("answer", table, df.reset_index()), *([config] if config else [])),
    )
