"""Tables as Markdown, CSV and LaTeX, and the study's tables built from ``analysis.stats`` output.

Every table is written three ways: ``NAME.md`` and ``NAME.tex`` show formatted cells
(``90.8 ± 0.3``); ``NAME.csv`` keeps the numbers. No dependency beyond pandas (pandas'
``to_markdown`` would need tabulate).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pandas as pd

from analysis import load
from analysis.stats import selection

DASH = "—"
_LATEX = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "±": r"$\pm$",
    DASH: "--",
    "−": "-",
}


def closing_ranking(runs: pd.DataFrame) -> pd.DataFrame:
    """Per condition, the study's answer as the report computes it, for a grid's closing table:
    one row per trial key (``load.dedupe``), the lr chosen on validation per dataset, the test
    accuracy there (mean over seeds), averaged over datasets (the report's ``average`` column),
    and the average rank over datasets; best first."""
    cols = ["condition", "test_acc", "avg_rank", "best_lr", "runs"]
    runs = load.dedupe(runs)[0] if not runs.empty else runs
    best = selection.choose_lrs(runs, "val") if not runs.empty else pd.DataFrame()
    best = best[best["test_mean"].notna()] if len(best) else best
    if best.empty:
        return pd.DataFrame(columns=cols)
    table = selection.wide(best)
    out = pd.DataFrame(
        {
            "test_acc": table.mean(axis=0),
            "avg_rank": selection.ranks(table).mean(axis=0),
            "best_lr": {c: _lrs(c, lrs) for c, lrs in best.groupby("condition")["lr"]},
            "runs": best.groupby("condition")["n"].sum(),
        }
    )
    out.index.name = "condition"
    return out.sort_values("test_acc", ascending=False).reset_index()[cols]


def _lrs(condition: str, chosen) -> str:
    """The lrs a condition's ranking used (one per dataset, when they differ); "-" for a
    condition with no lr (the linear probe's closed form)."""
    from raystudy.models import components

    if not components.has_lr(condition):
        return "-"
    return ",".join(f"{v:g}" for v in sorted(set(chosen)))


def fmt(x, digits: int = 1) -> str:
    """A number with ``digits`` decimals; NaN and None as a dash."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return DASH
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return f"{x:.{digits}f}"
    return str(x)


def mean_std(mean: float, std: float, digits: int = 1) -> str:
    """``mean ± std``; the mean alone when std is NaN; a dash when the mean is NaN."""
    if mean is None or math.isnan(mean):
        return DASH
    if std is None or math.isnan(std):
        return fmt(mean, digits)
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def fmt_p(p: float) -> str:
    """A p-value: three significant digits, ``<1e-4`` below that."""
    if p is None or math.isnan(p):
        return DASH
    return "<1e-4" if p < 1e-4 else f"{p:.3g}"


def fmt_lr(lr: float) -> str:
    """A learning rate as ``%g`` (``0.001``, ``3e-05``); NaN and None as a dash."""
    return DASH if lr is None or math.isnan(lr) else f"{lr:g}"


def interval(est: float, low: float, high: float, digits: int = 1, scale: float = 1.0) -> str:
    """``est [low, high]`` scaled; the estimate alone when the interval is NaN."""
    if est is None or math.isnan(est):
        return DASH
    if low is None or high is None or math.isnan(low) or math.isnan(high):
        return fmt(est * scale, digits)
    return f"{est * scale:.{digits}f} [{low * scale:.{digits}f}, {high * scale:.{digits}f}]"


# ---------------------------------------------------------------- writers


def _cells(df: pd.DataFrame, index: bool) -> tuple[list[str], list[list[str]]]:
    header = ([str(df.index.name or "")] if index else []) + [str(c) for c in df.columns]
    rows = [
        ([str(i)] if index else []) + [fmt(v, 4) if isinstance(v, float) else str(v) for v in row]
        for i, row in zip(df.index, df.itertuples(index=False))
    ]
    return header, rows


def markdown(df: pd.DataFrame, index: bool = True) -> str:
    """A GitHub Markdown table, columns padded to line up."""
    header, rows = _cells(df, index)
    esc = [[c.replace("|", r"\|") for c in r] for r in [header] + rows]
    widths = [max(3, *(len(r[j]) for r in esc)) for j in range(len(header))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    return (
        "\n".join([line(esc[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in esc[1:]])
        + "\n"
    )


def latex_escape(text: str) -> str:
    """``text`` with LaTeX's special characters escaped, and ±, the dash and − as LaTeX writes them."""
    return "".join(_LATEX.get(ch, ch) for ch in text)


def latex(df: pd.DataFrame, index: bool = True, caption: str | None = None) -> str:
    """A booktabs ``tabular`` (first column left-aligned, the others right-aligned)."""
    header, rows = _cells(df, index)
    spec = "l" + "r" * (len(header) - 1)
    body = [" & ".join(latex_escape(c) for c in r) + r" \\" for r in rows]
    out = [
        r"\begin{tabular}{" + spec + "}",
        r"\toprule",
        " & ".join(latex_escape(c) for c in header) + r" \\",
        r"\midrule",
        *body,
        r"\bottomrule",
        r"\end{tabular}",
    ]
    if caption:
        out = [f"% {caption}"] + out
    return "\n".join(out) + "\n"


def write_table(
    out_dir: str | os.PathLike,
    name: str,
    shown: pd.DataFrame,
    data: pd.DataFrame | None = None,
    index: bool = True,
    caption: str | None = None,
) -> list[Path]:
    """Write NAME.md and NAME.tex from ``shown`` and NAME.csv from ``data`` (default: shown).

    A ``caption`` heads the Markdown file and is a comment above the LaTeX tabular.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.md", out / f"{name}.tex", out / f"{name}.csv"]
    paths[0].write_text((f"{caption}\n\n" if caption else "") + markdown(shown, index))
    paths[1].write_text(latex(shown, index, caption))
    if data is None:
        shown.to_csv(paths[2], index=index)
    else:
        data.to_csv(paths[2], index=not isinstance(data.index, pd.RangeIndex))
    return paths


# ---------------------------------------------------------------- the study's tables


def accuracy_table(
    best: pd.DataFrame,
    conditions: list[str],
    avg: pd.Series,
    avg_rank: pd.Series | None,
    scale: float = 1.0,
    digits: int = 1,
) -> pd.DataFrame:
    """Conditions × (datasets, average, avg rank): ``mean ± std`` at the best lr."""
    datasets = sorted(best["dataset"].unique())
    cell = {
        (r.dataset, r.condition): mean_std(r.test_mean * scale, r.test_std * scale, digits) for r in best.itertuples()
    }
    rows = {}
    for c in conditions:
        row = {d: cell.get((d, c), DASH) for d in datasets}
        row["average"] = fmt(avg.get(c, math.nan) * scale, digits)
        if avg_rank is not None:
            row["avg rank"] = fmt(avg_rank.get(c, math.nan), 2)
        rows[c] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "condition"
    return table


def number_table(
    table: pd.DataFrame,
    conditions: list[str],
    summary: pd.Series | None,
    summary_name: str,
    scale: float = 1.0,
    digits: int = 1,
) -> pd.DataFrame:
    """A datasets × conditions table of numbers turned to conditions × datasets, formatted."""
    t = table.T.reindex([c for c in conditions if c in table.columns])
    shown = t.map(lambda v: fmt(v * scale, digits))
    if summary is not None:
        shown[summary_name] = [fmt(summary.get(c, math.nan) * scale, digits) for c in shown.index]
    shown.index.name = "condition"
    shown.columns = [str(c) for c in shown.columns]
    return shown


def status_table(runs: pd.DataFrame, conditions: list[str]) -> pd.DataFrame:
    """Conditions × status: how many runs finished, diverged, failed (nothing dropped)."""
    counts = pd.crosstab(runs["condition"], runs["status"])
    for s in ("finished", "diverged", "failed"):
        if s not in counts:
            counts[s] = 0
    others = [c for c in counts.columns if c not in ("finished", "diverged", "failed")]
    counts = counts[["finished", "diverged", "failed", *others]]
    counts.insert(0, "runs", counts.sum(axis=1))
    counts = counts.reindex([c for c in conditions if c in counts.index])
    counts.columns.name = None
    counts.index.name = "condition"
    return counts


def chosen_lr_table(val_best: pd.DataFrame, test_best: pd.DataFrame, conditions: list[str]) -> pd.DataFrame:
    """Conditions × datasets: the lr chosen on validation, ``val / test`` where test differs."""
    key = ["dataset", "condition"]
    m = val_best[key + ["lr"]].merge(test_best[key + ["lr"]], on=key, suffixes=("_val", "_test"))
    m["shown"] = [
        fmt_lr(a) if (a == b or (math.isnan(a) and math.isnan(b))) else f"{fmt_lr(a)} / {fmt_lr(b)}"
        for a, b in zip(m["lr_val"], m["lr_test"])
    ]
    t = m.pivot(index="condition", columns="dataset", values="shown")
    t = t.reindex([c for c in conditions if c in t.index])
    t.columns.name = None
    return t


ALTERNATIVE_LABEL = {
    "greater": "one-sided, reference greater",
    "two-sided": "two-sided",
    "less": "one-sided, reference smaller",
}


def tests_table(tests: pd.DataFrame, scale: float = 1.0, digits: int = 2) -> pd.DataFrame:
    """The paired tests of the reference condition, formatted; every p column names its
    alternative (``significance.paired_tests``' ``wilcoxon_alternative`` and ``t_alternative``)."""
    w_alt = tests["wilcoxon_alternative"].iloc[0] if "wilcoxon_alternative" in tests and len(tests) else "greater"
    t_alt = tests["t_alternative"].iloc[0] if "t_alternative" in tests and len(tests) else "greater"
    shown = pd.DataFrame(
        {
            "comparison": [f"{r} vs {o}" for r, o in zip(tests["reference"], tests["other"])],
            "n": tests["n"].astype(int).astype(str),
            "mean diff": [fmt(v * scale, digits) for v in tests["mean_diff"]],
            "Wilcoxon W+": [fmt(v, 1) for v in tests["wilcoxon_W"]],
            f"Wilcoxon p ({ALTERNATIVE_LABEL[w_alt]})": [fmt_p(p) for p in tests["wilcoxon_p"]],
            "t": [fmt(v, 2) for v in tests["t"]],
            f"t-test p ({ALTERNATIVE_LABEL[t_alt]})": [fmt_p(p) for p in tests["t_p"]],
        }
    )
    if t_alt != "two-sided":
        shown["t-test p (two-sided)"] = [fmt_p(p) for p in tests["t_p_two_sided"]]
    for k, v in _effect_columns(tests, scale, digits).items():
        shown[k] = v
    return shown.set_index("comparison")


def main_table(
    best: pd.DataFrame, conditions: list[str], avg_rank: pd.Series | None = None, scale: float = 1.0, digits: int = 1
) -> pd.DataFrame:
    """The paper's main table: datasets × conditions of ``mean ± std`` at the chosen lr, then an
    ``average`` row (mean over datasets of the means) and, given ranks, an ``avg rank`` row."""
    datasets = sorted(best["dataset"].unique())
    cell = {
        (r.dataset, r.condition): mean_std(r.test_mean * scale, r.test_std * scale, digits) for r in best.itertuples()
    }
    avg = best.groupby("condition")["test_mean"].mean()
    rows = {d: {c: cell.get((d, c), DASH) for c in conditions} for d in datasets}
    rows["average"] = {c: fmt(avg.get(c, math.nan) * scale, digits) for c in conditions}
    if avg_rank is not None:
        rows["avg rank"] = {c: fmt(avg_rank.get(c, math.nan), 2) for c in conditions}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "dataset"
    return table


def dataset_table(
    table: pd.DataFrame, conditions: list[str], summary_name: str = "average", digits: int = 1
) -> pd.DataFrame:
    """A datasets × conditions table of numbers, formatted, with a row of column means."""
    t = table[[c for c in conditions if c in table.columns]].astype(float)
    shown = t.map(lambda v: fmt(v, digits))
    shown.loc[summary_name] = [fmt(v, digits) for v in t.mean(axis=0)]
    shown.index.name = "dataset"
    return shown


def ablation_table(ab: pd.DataFrame, scale: float = 1.0, digits: int = 1) -> pd.DataFrame:
    """``selection.setting_means`` formatted, ``mean ± std`` where it has a setting's spread
    column; with two settings, their difference (second − first) as a last column."""
    opts = [c for c in ab.columns if c != "datasets" and not c.endswith(selection.SPREAD)]

    def cells(o: str) -> list[str]:
        if o + selection.SPREAD not in ab:
            return [fmt(v * scale, digits) for v in ab[o]]
        return [mean_std(m * scale, d * scale, digits) for m, d in zip(ab[o], ab[o + selection.SPREAD])]

    shown = pd.DataFrame({o: cells(o) for o in opts}, index=ab.index)
    if len(opts) == 2:
        a, b = opts
        shown[f"{b} − {a}"] = [fmt((y - x) * scale, digits) for x, y in zip(ab[a], ab[b])]
    shown["datasets"] = ab["datasets"].astype(int).astype(str)
    return shown


def efficiency_table(eff: pd.DataFrame, scale: float = 1.0, digits: int = 1) -> pd.DataFrame:
    """``selection.parameter_efficiency`` formatted: the count with thousands separators."""
    return pd.DataFrame(
        {
            "trainable params": [DASH if math.isnan(v) else f"{v:,.0f}" for v in eff["params"]],
            "% of full": [fmt(v * 100, 3) if not math.isnan(v) else DASH for v in eff["share_of_full"]],
            "accuracy": [fmt(v * scale, digits) for v in eff["accuracy"]],
            "datasets": eff["datasets"].astype(int).astype(str),
        },
        index=eff.index,
    )


HL_NO_INTERVAL = "no CI: n < 6"


def _hl_cell(est: float, low: float, high: float, digits: int, scale: float) -> str:
    """The Hodges-Lehmann shift with its interval, or with the reason it has none (too few pairs)."""
    shown = interval(est, low, high, digits, scale)
    if not math.isnan(est) and (math.isnan(low) or math.isnan(high)):
        return f"{shown} ({HL_NO_INTERVAL})"
    return shown


def _effect_columns(df: pd.DataFrame, scale: float, digits: int) -> dict[str, list[str]]:
    """Hodges-Lehmann shift [95% interval] and rank-biserial r, where ``df`` has them."""
    if "hl" not in df:
        return {}
    return {
        "HL shift [95% CI]": [
            _hl_cell(e, lo, hi, digits, scale) for e, lo, hi in zip(df["hl"], df["hl_low"], df["hl_high"])
        ],
        "rank-biserial r": [fmt(v, 2) for v in df["rank_biserial"]],
    }


def posthoc_table(pairs: pd.DataFrame, scale: float = 1.0, digits: int = 2) -> pd.DataFrame:
    """``significance.pairwise_wilcoxon`` formatted: one row per pair, raw and Holm-corrected p, whether
    significant, and the effect sizes where present."""
    shown = pd.DataFrame(
        {
            "pair": [f"{a} vs {b}" for a, b in zip(pairs["a"], pairs["b"])],
            "n": pairs["n"].astype(int).astype(str),
            "mean diff": [fmt(v * scale, digits) for v in pairs["mean_diff"]],
            "Wilcoxon p": [fmt_p(p) for p in pairs["p"]],
            "Holm p": [fmt_p(p) for p in pairs["p_holm"]],
            "significant": ["yes" if s else "no" for s in pairs["significant"]],
            **_effect_columns(pairs, scale, digits),
        }
    )
    return shown.set_index("pair")


__all__ = [
    "markdown",
    "latex",
    "write_table",
    "fmt",
    "mean_std",
    "fmt_p",
    "interval",
    "accuracy_table",
    "number_table",
    "status_table",
    "chosen_lr_table",
    "tests_table",
    "posthoc_table",
    "main_table",
    "dataset_table",
    "ablation_table",
    "efficiency_table",
]
