"""The study's report: tables, significance tests and figures from MLflow runs or a CSV.

    python -m analysis.report --experiment NAME [--tracking-uri URI] [--out DIR]
    python -m analysis.report --csv runs.csv [--select-on test] [--reference MHA]
    python -m analysis.report --csv paper_means.csv --reference MHA      # a per-dataset summary
    python -m analysis.report --csv paper_table.csv --paper-comparison   # dataset + one column per condition

The paper's tables. The main table: datasets × conditions, test accuracy at the best lr, mean ±
std over seeds, an average row and an average-rank row, once with the lr chosen on validation
accuracy (the default, ``main_table_lr_on_val``) and once on test accuracy as the paper did
(``main_table_lr_on_test``), each labelled; ``--select-on`` picks the one the rest of the report
uses. The relative gain of each condition over ``--gain-reference`` (default linear_probe if
present, else ``--reference``), per dataset and on average. Parameter efficiency: mean test
accuracy against the trainable parameter count the runs logged (table, and a figure with a log
x axis, LoRA included); skipped with a line when the input has no counts. Runs of several
settings (model, optimizer, low data) get one subfolder of tables each and, across them, the
optimizer ablation (SGD vs AdamW per condition, mean over datasets at the chosen lr) per model
that has both, and every setting's means side by side (``settings``).

Then learning-rate robustness; the paper's tests of ``--reference`` against each other condition
over the per-dataset means: Wilcoxon signed-rank one-sided (the reference greater) and paired
t-test two-sided, as the paper reports them (``--t-alternative greater`` for the one-sided t-test;
every p column names its alternative); a Friedman test with Holm-corrected pairwise Wilcoxon tests
and a Nemenyi critical-difference diagram. Ranks, paired tests, Friedman and the CD diagram are
over the conditions compared: all analysed (``--conditions``), or the paper's five components
(``--paper-comparison``) while the tables keep every condition. One dataset (or one condition)
gets a line per skipped test instead of numbers: no paired tests, no Friedman test, no CD diagram.
Where the runs probed plasticity, the component ranking by plasticity next to the ranking by
accuracy.

Input: per-run results, a per-dataset summary (``dataset, condition, mean[, std]``) or the
paper's table shape (``dataset`` plus one column per condition, cells ``mean`` or ``mean ±
std``); see ``analysis.load``.

Past the p-values (``analysis.trust``, over every condition analysed): effect sizes beside every test (Hodges-Lehmann shift with
its interval, rank-biserial r); stratified-bootstrap intervals of each condition's mean and IQM,
of every pairwise difference and of the probability of improvement (``--bootstrap-reps``,
``--bootstrap-seed``, ``--bootstrap-over``); Bayesian signed-rank and hierarchical tests with a
region of practical equivalence (``--rope`` accuracy points, ``--no-hierarchical``); the CD
diagram's bars from Nemenyi or from the Wilcoxon-Holm tests (``--cd-cliques``); the expected best
accuracy against the number of lrs tried and lrs chosen at the edge of their grid; the split of
the runs' variance into dataset, lr and seed; rank correlations of plasticity and gradient norm
with accuracy, with bootstrap intervals.

Everything goes to ``--out`` (tables as .md/.csv/.tex, figures as .png/.pdf unless
``--no-figures``, ``report.md``); the report is printed. Read from MLflow, the folder is also
logged as ``analysis/`` artifacts of the grid's parent run. Bad input exits with status 2 and one
line on stderr.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from analysis import AnalysisError, figures, load, stats, tables, trust

# The paper's own comparison: the five single components (--paper-comparison).
PAPER_COMPARISON = ("LN1", "MHA", "LN2", "FC1", "FC2")
CURVE_KEYS = {"val_loss": ("validation loss", False), "grad_norm/total": ("gradient norm (total)", True),
              "grad_norm/{condition}": ("gradient norm of the trained component", True)}


@dataclass
class Report:
    """What ``analyse`` produced: the printed text and the files written."""

    text: str
    files: list[Path] = field(default_factory=list)
    logged_to: list[str] = field(default_factory=list)


def paper_order() -> tuple[str, ...]:
    """The order tables list conditions in: the paper's, then the other components, then LoRA."""
    from raystudy.components import PAPER_CONDITIONS, STUDY_COMPONENTS  # no torch at import

    return tuple(dict.fromkeys(PAPER_CONDITIONS + STUDY_COMPONENTS + ("lora",)))


def _restrict(df: pd.DataFrame, conditions: list[str] | None, datasets: list[str] | None,
              source: str) -> pd.DataFrame:
    for col, wanted in (("condition", conditions), ("dataset", datasets)):
        if wanted:
            unknown = [w for w in wanted if w not in set(df[col])]
            if unknown:
                raise AnalysisError(f"{source}: no {col} {', '.join(map(repr, unknown))}; "
                                    f"there are: {', '.join(sorted(set(df[col])))}")
            df = df[df[col].isin(wanted)]
    return df


def selected_runs(runs: pd.DataFrame, best: pd.DataFrame) -> pd.DataFrame:
    """The finished runs at the chosen lr of each (dataset, condition)."""
    m = runs.merge(best[["dataset", "condition", "lr"]], on=["dataset", "condition", "lr"])
    return m[m["status"] == "finished"]


def _status_line(runs: pd.DataFrame) -> str:
    counts = runs["status"].value_counts()
    parts = [f"{counts.get(s, 0)} {s}" for s in ("finished", "diverged", "failed")]
    parts += [f"{n} {s}" for s, n in counts.items() if s not in ("finished", "diverged", "failed")]
    return f"{len(runs)} runs ({', '.join(parts)})"


def _p(p: float) -> str:
    text = tables.fmt_p(p)
    return f"p {text}" if text.startswith("<") else f"p = {text}"


def _section(title: str, body: str) -> str:
    return f"## {title}\n\n{body.rstrip()}\n"


# ---------------------------------------------------------------- the analysis of one study

def analyse(out_dir: str | Path, *, runs: pd.DataFrame | None = None,
            summary: pd.DataFrame | None = None, select_on: str = "val", reference: str = "MHA",
            conditions: list[str] | None = None, datasets: list[str] | None = None,
            bands: pd.DataFrame | None = None, plasticity: pd.DataFrame | None = None,
            ddof: int = 0, title: str = "", options: trust.Options | None = None,
            t_alternative: str = "two-sided", compare: list[str] | None = None,
            gain_reference: str | None = None, draw_figures: bool = True) -> Report:
    """Write the tables, tests and figures of one study (one model, optimizer) into ``out_dir``.

    Give ``runs`` (the per-run table of ``analysis.load``) or ``summary`` (per-dataset means).
    ``bands`` (``stats.curve_bands`` of the selected runs) and ``plasticity`` (stacked
    plasticity artifacts) add their figures and tables. ``options`` are the flags of the
    interval, equivalence and budget sections (``trust.Options``). ``t_alternative`` is the
    paired t-test's alternative (the paper's: two-sided); ``compare`` the conditions that ranks,
    the paired tests, Friedman and the CD diagram are over (default: all analysed);
    ``gain_reference`` the condition relative gains are over (default: linear_probe if present,
    else ``reference``); ``draw_figures``: off, the tables and tests alone. Raises AnalysisError
    on bad input.
    """
    opts = options or trust.Options()
    if (runs is None) == (summary is None):
        raise AnalysisError("give either per-run results or a per-dataset summary")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    source = (runs if runs is not None else summary).attrs.get("source", "input")
    files = figures.Outputs(draw_figures)
    sections: list[str] = []

    if runs is not None:
        runs = _restrict(runs, conditions, datasets, source)
        load.check_runs(runs, source)
        if select_on == "val" and runs.loc[runs["status"] == "finished", "val_acc"].isna().all():
            raise AnalysisError(f"{source}: no validation accuracies (val_acc) to choose the lr "
                                "on; choose it on test accuracy with --select-on test")
        means = stats.seed_means(runs, ddof=ddof)
        best = stats.best_lr(means, select_on)
        other = "test" if select_on == "val" else "val"
        has_other = runs.loc[runs["status"] == "finished", f"{other}_acc"].notna().any()
        best_other = stats.best_lr(means, other) if has_other else None
        scale = stats.display_scale(runs["test_acc"])
    else:
        summary = _restrict(summary, conditions, datasets, source)
        means, best, best_other = None, summary, None
        scale = stats.display_scale(summary["test_mean"])
    stats.check_complete(best)

    order = stats.order_conditions(best["condition"], paper_order())
    compared = _compared(order, compare, source)
    table = stats.wide(best, conditions=order)
    avg = table.mean(axis=0)
    rk = stats.ranks(table[compared])
    avg_rank = rk.mean(axis=0)
    unit = " (%)" if scale == 100 else ""
    n_d, k = table.shape
    chosen = {"val": "validation", "test": "test"}[select_on] if runs is not None else None

    head = [f"# {title or 'raystudy analysis'}", "",
            f"Source: {source}" + (f"; {_status_line(runs)}" if runs is not None else
                                   " (per-dataset summary)"),
            f"{k} condition{'s' * (k != 1)} on {n_d} dataset{'s' * (n_d != 1)}"
            + (f"; lr chosen on {chosen} accuracy" if chosen else "")]
    if compared != order:
        head.append(f"Ranks, paired tests, Friedman and the CD diagram over {len(compared)} of "
                    f"them: {', '.join(compared)}")
    if runs is not None and runs.attrs.get("replaced"):
        head.append(f"{runs.attrs['replaced']} earlier tries of rerun trials replaced by the rerun")
    if summary is not None and summary.attrs.get("dropped_rows"):
        head.append(f"{summary.attrs['dropped_rows']} average row(s) of the input table left out "
                    "(recomputed here)")
    sections.append("\n".join(head) + "\n")

    # -- the main table (both lr choices where the runs allow), robustness, ranks
    what = f"Test accuracy{unit} at the best lr" + (f" (chosen on {chosen})" if chosen else "")
    shown = tables.accuracy_table(best, order, avg, avg_rank, scale)
    name = f"accuracy_{select_on}_selected" if runs is not None else "accuracy"
    files += tables.write_table(out, name, shown, best)
    sections.append(_main_section(best, best_other, select_on, order, compared, scale, out, files,
                                  runs is not None))
    files.add(figures.accuracy, best, order, out / "figures" / name, scale, what)
    if best_other is not None:
        val_best, test_best = (best, best_other) if select_on == "val" else (best_other, best)
        sections.append(_selection_section(val_best, test_best, order, scale, out, files,
                                           written=select_on, compared=compared))
    if means is not None:
        sections.append(_robustness_section(runs, means, order, scale, out, files))
    files += tables.write_table(out, "ranks", tables.number_table(rk, compared, avg_rank, "average", 1.0, 1), rk)
    if len(compared) >= 2 and reference not in compared:   # before any table names it
        stats.paired_tests(table[compared], reference)
    sections.append(_gain_section(table, order, gain_reference or next(
        (c for c in ("linear_probe", reference) if c in order), None), chosen, out, files))
    sections.append(_efficiency_section(runs, table, scale, chosen, out, files))

    # -- the paper's test and the omnibus tests; then intervals, equivalence, budget, variance
    scores = trust.scores_of(runs, best, table, order)
    if k >= 2 and len(compared) >= 2:
        sections.append(_significance_section(table[compared], avg_rank, reference, scale, out,
                                              files, opts.cd_cliques, t_alternative))
        sections.append(trust.intervals_section(scores, order, reference, scale, opts, out, files)[0])
        sections.append(trust.rope_section(table, scores, order, reference, scale, opts, out, files))
    elif k >= 2:
        sections.append(_section("Significance", f"One condition compared ({compared[0]}): "
                                 "nothing to compare.\nNo paired tests, no Friedman test, no CD "
                                 "diagram."))
    else:
        sections.append(_section("Significance", f"One condition only ({order[0]}): nothing to "
                                 "compare.\nNo paired tests, no Friedman test, no CD diagram."))
    if means is not None:
        sections.append(trust.budget_section(means, best, order, scale, out, files))
        sections.append(trust.variance_section(runs, order, scale, out, files))

    # -- curves and plasticity (MLflow runs)
    if bands is not None and len(bands):
        for key, (label, log) in CURVE_KEYS.items():
            slug = key.replace("/", "_").replace("{condition}", "own")
            files.add(figures.curves, bands, key, order, out / "figures" / f"curves_{slug}", label,
                      log)
    if plasticity is not None and len(plasticity):
        sections.append(_plasticity_section(plasticity, table, out, files, scale, _model_notes(runs),
                                            (scores, order, opts)))
    if bands is not None and len(bands) and (bands["key"] == "grad_norm/{condition}").any():
        text = trust.correlation_text("Components by gradient norm of the trained component",
                                      trust.grad_norms(bands), scores, order, list(table.index),
                                      opts, out, files, "grad_norm")
        sections.append(_section("Gradient norm and accuracy", text))

    text = "\n".join(sections)
    (out / "report.md").write_text(text)
    files.append(out / "report.md")
    return Report(text=text, files=list(files))


def _compared(order: list[str], compare: list[str] | None, source: str) -> list[str]:
    """The conditions the tests and ranks are over: ``compare`` in table order, all if None."""
    if not compare:
        return list(order)
    missing = [c for c in compare if c not in order]
    if missing:
        raise AnalysisError(f"{source}: the compared condition(s) {', '.join(missing)} are not "
                            f"among the conditions analysed: {', '.join(order)}")
    return [c for c in order if c in compare]


def _main_section(best: pd.DataFrame, best_other: pd.DataFrame | None, select_on: str,
                  order: list[str], compared: list[str], scale: float, out: Path, files: list,
                  from_runs: bool) -> str:
    """The paper's main table (datasets × conditions, average and avg rank rows), once per lr
    choice the runs allow, each labelled: on validation (the default), on test (the paper's)."""
    unit = " (%)" if scale == 100 else ""
    if not from_runs:
        rk = stats.ranks(stats.wide(best, conditions=compared)).mean(axis=0)
        shown = tables.main_table(best, order, rk, scale)
        caption = f"Test accuracy{unit} per dataset, as given (per-dataset summary)"
        files += tables.write_table(out, "main_table", shown, stats.wide(best, conditions=order),
                                    caption=caption)
        return _section("Main table", f"{caption}:\n\n{tables.markdown(shown)}")
    label = {"val": "lr chosen on validation accuracy (the default)",
             "test": "lr chosen on test accuracy (as the paper did)"}
    parts = []
    for on, b in ((select_on, best), ({"val": "test", "test": "val"}[select_on], best_other)):
        if b is None:
            continue
        rk = stats.ranks(stats.wide(b, conditions=compared)).mean(axis=0)
        shown = tables.main_table(b, order, rk, scale)
        caption = f"Test accuracy{unit}, mean ± std over seeds, {label[on]}"
        files += tables.write_table(out, f"main_table_lr_on_{on}", shown, b, caption=caption)
        used = " — used by the rest of this report" if on == select_on else ""
        parts.append(f"{caption}{used}:\n\n{tables.markdown(shown).rstrip()}")
    if best_other is None:
        parts.append(f"(No {'test' if select_on == 'val' else 'validation'} accuracies to choose "
                     "the lr on the other way.)")
    return _section("Main table", "\n\n".join(parts))


def _gain_section(table: pd.DataFrame, order: list[str], ref: str | None, chosen: str | None,
                  out: Path, files: list) -> str:
    """Each condition's relative gain over ``ref`` per dataset and on average."""
    if ref is None:
        return _section("Relative gain", "Skipped: neither linear_probe nor the reference "
                                         "condition is analysed (--gain-reference names one).")
    title = f"Relative gain over {ref}"
    if ref not in order:
        raise AnalysisError(f"gain reference {ref!r} is not among the conditions: {', '.join(order)}")
    if len(order) < 2:
        return _section(title, "One condition only: no gain to compute.")
    gain = stats.relative_gain(table[order], ref)
    shown = tables.dataset_table(gain, order, "average", 2)
    files += tables.write_table(out, "relative_gain", shown, gain,
                                caption=f"Relative gain over {ref} (%)")
    files.add(figures.gains, gain.mean(axis=0), out / "figures" / "relative_gain", ref)
    lr = f" at the lr chosen on {chosen}" if chosen else ""
    return _section(title, f"100 · (accuracy − {ref}'s) / {ref}'s, per dataset{lr}; average: the "
                           f"mean over datasets of the per-dataset gains (%).\n\n" + tables.markdown(shown))


def _efficiency_section(runs: pd.DataFrame | None, table: pd.DataFrame, scale: float,
                        chosen: str | None, out: Path, files: list) -> str:
    """Accuracy against trainable parameter count (table and log-x figure), LoRA included."""
    title = "Parameter efficiency"
    params = stats.trainable_params(runs) if runs is not None else pd.DataFrame()
    if params.empty:
        why = ("a per-dataset summary has no parameter counts" if runs is None else
               "the runs have no trainable parameter counts (trainable_params)")
        return _section(title, f"Skipped: {why}.")
    eff = stats.parameter_efficiency(params, table)
    if eff.empty:
        return _section(title, "Skipped: no condition has both a parameter count and an accuracy.")
    shown = tables.efficiency_table(eff, scale)
    files += tables.write_table(out, "parameter_efficiency", shown, eff,
                                caption="Trainable parameters and mean test accuracy")
    files += tables.write_table(out, "trainable_params", tables.dataset_table(params, list(eff.index), "mean", 0),
                                params)
    files.add(figures.parameter_efficiency, eff, out / "figures" / "parameter_efficiency", scale)
    return _section(title, "Trainable parameters (mean over datasets: the classifier head's size "
                           "follows the number of classes) and mean test accuracy over the same "
                           f"datasets{f', lr chosen on {chosen}' if chosen else ''}.\n\n"
                    + tables.markdown(shown))


def _selection_section(val_best: pd.DataFrame, test_best: pd.DataFrame, order: list[str],
                       scale: float, out: Path, files: list, written: str,
                       compared: list[str] | None = None) -> str:
    """Both lr choices side by side: the averages, ranks, and where the chosen lr moved."""
    summaries = {}
    for on, b in (("val", val_best), ("test", test_best)):
        stats.check_complete(b)
        t = stats.wide(b, conditions=order)
        summaries[on] = (t.mean(axis=0), stats.ranks(t[compared or order]).mean(axis=0))
        if on != written:
            shown = tables.accuracy_table(b, order, *summaries[on], scale)
            files += tables.write_table(out, f"accuracy_{on}_selected", shown, b)
    files += tables.write_table(out, "chosen_lr", tables.chosen_lr_table(val_best, test_best, order))
    key = ["dataset", "condition"]
    lrs = val_best[key + ["lr"]].merge(test_best[key + ["lr"]], on=key, suffixes=("_val", "_test"))
    moved = (lrs["lr_val"] != lrs["lr_test"]).groupby(lrs["condition"]).sum()
    (a_val, r_val), (a_test, r_test) = summaries["val"], summaries["test"]
    n_d = val_best["dataset"].nunique()
    gap = pd.DataFrame({
        "average, lr on val": [tables.fmt(a_val[c] * scale, 2) for c in order],
        "average, lr on test": [tables.fmt(a_test[c] * scale, 2) for c in order],
        "test − val": [tables.fmt((a_test[c] - a_val[c]) * scale, 2) for c in order],
        "avg rank (val)": [tables.fmt(r_val.get(c, math.nan), 2) for c in order],
        "avg rank (test)": [tables.fmt(r_test.get(c, math.nan), 2) for c in order],
        "datasets where the lr differs": [f"{int(moved.get(c, 0))}/{n_d}" for c in order],
    }, index=pd.Index(order, name="condition"))
    files += tables.write_table(out, "selection", gap)
    return _section("Choosing the lr on validation vs on test (the reference code chose on test)",
                    tables.markdown(gap))


def _robustness_section(runs: pd.DataFrame, means: pd.DataFrame, order: list[str], scale: float,
                        out: Path, files: list) -> str:
    """Learning-rate robustness, and the runs by status (nothing dropped silently)."""
    gaps = stats.lr_gaps(means)
    robust = gaps.mean(axis=0)
    files += tables.write_table(out, "lr_robustness",
                                tables.number_table(gaps, order, robust, "mean", scale, 2), gaps)
    status = tables.status_table(runs, order)
    files += tables.write_table(out, "run_status", status)
    cols = load.RUN_COLUMNS + (["trainable_params"] if "trainable_params" in runs else [])
    runs[cols].to_csv(out / "runs.csv", index=False)
    files.append(out / "runs.csv")
    rob = ", ".join(f"{c} {tables.fmt(robust.get(c, math.nan) * scale, 2)}" for c in order)
    body = ("Mean over datasets of (max − min over lrs) of the seed-mean test accuracy; "
            f"lower is more robust.\n\n{rob}\n")
    if (status["finished"] < status["runs"]).any():
        body += ("\nRuns by status (not finished: kept, left out of the means):\n\n"
                 + tables.markdown(status))
    return _section("Learning-rate robustness", body)


def _significance_section(table: pd.DataFrame, avg_rank: pd.Series, reference: str, scale: float,
                          out: Path, files: list, clique_source: str = "nemenyi",
                          t_alternative: str = "two-sided") -> str:
    """The paper's tests, Friedman, Holm-corrected pairs and the CD diagram, over the columns
    of ``table`` (the conditions compared).

    The paper's tests: Wilcoxon signed-rank one-sided (the reference greater) and the paired
    t-test two-sided (``t_alternative="greater"`` for one-sided). The CD diagram places
    conditions by mean rank; its bars join conditions the Nemenyi test does not separate, or
    (``clique_source="wilcoxon"``) those among which no Holm-corrected Wilcoxon pair is
    significant. One dataset: every test across datasets is skipped with a line saying so.
    """
    n_d, k = table.shape
    if n_d < 2:
        d = table.index[0]
        return _section("Significance", "\n".join([
            f"One dataset ({d}): every test here compares conditions across datasets.",
            (f"- No paired tests of {reference} against the others (Wilcoxon, t-test): they need "
             "two or more datasets."),
            "- No Friedman test: it needs two or more datasets.",
            ("- No post-hoc pairwise tests and no critical-difference diagram: the average ranks "
             f"are {d}'s own ranks."),
        ]))
    tests = stats.paired_tests(table, reference, t_alternative=t_alternative)
    files += tables.write_table(out, "tests", tables.tests_table(tests, scale), tests)
    fr = stats.friedman(table)
    cd = stats.nemenyi_cd(k, n_d)
    pairs = stats.pairwise_wilcoxon(table)
    nemenyi_groups = stats.cd_cliques(avg_rank, cd)
    cliques = stats.wilcoxon_cliques(avg_rank, pairs) if clique_source == "wilcoxon" else nemenyi_groups
    files += tables.write_table(out, "posthoc", tables.posthoc_table(pairs, scale), pairs)
    pd.DataFrame([{"test": "friedman", **fr},
                  {"test": "nemenyi_cd", "statistic": cd, "k": k, "n": n_d}]
                 ).to_csv(out / "omnibus.csv", index=False)
    files.append(out / "omnibus.csv")
    bars = ("bars: no Holm-corrected Wilcoxon pair significant" if clique_source == "wilcoxon"
            else "bars: Nemenyi, mean ranks within CD")
    files.add(figures.cd_diagram, avg_rank, cd, cliques, out / "figures" / "cd_diagram",
              f"Mean-rank based: average ranks over {n_d} datasets; {bars} (5%)", n_datasets=n_d)
    t_text = ("two-sided, as in the paper (--t-alternative greater: one-sided)"
              if t_alternative == "two-sided" else
              f"one-sided, {reference} greater (--t-alternative; the paper's is two-sided, also shown)")
    lines = [(f"{reference} against each other condition over the {n_d} per-dataset means: "
              f"Wilcoxon signed-rank one-sided, {reference} greater, as in the paper; paired "
              f"t-test {t_text}."), "",
             tables.markdown(tables.tests_table(tests, scale)).rstrip(), ""]
    if math.isnan(fr["p"]):
        lines.append(f"Friedman test: needs at least 3 conditions and 2 datasets (have {k}, {n_d}).")
    else:
        lines.append(f"Friedman test over {k} conditions and {n_d} datasets: chi2 = "
                     f"{fr['statistic']:.3f}, {_p(fr['p'])}.")
    sig = pairs[pairs["significant"]]
    lines.append("Post-hoc pairwise Wilcoxon, Holm-corrected at 5%: " + (
        ", ".join(f"{a} vs {b} ({_p(p)})" for a, b, p in zip(sig["a"], sig["b"], sig["p_holm"]))
        if len(sig) else "no significant pair") + ".")
    lines.append(f"Nemenyi critical difference at 5% (mean-rank based): CD = {cd:.2f} average "
                 "ranks; not significantly different: " +
                 ("; ".join(", ".join(g) for g in nemenyi_groups) if nemenyi_groups else "none") + ".")
    if clique_source == "wilcoxon":
        wil = "; ".join(", ".join(g) for g in cliques) if cliques else "none"
        lines.append(f"The CD diagram's bars come from the Holm-corrected Wilcoxon tests: {wil}.")
    lines.append("The pairwise Wilcoxon-Holm tests are the primary all-pairs result; the "
                 "Nemenyi test compares mean ranks, so its verdict on two conditions depends on "
                 "which others are in the study (Benavoli, Corani and Mangili, 2016). Effect "
                 "sizes: the Hodges-Lehmann shift (median of Walsh averages of the per-dataset "
                 "differences) with its exact 95% interval, and the rank-biserial r.")
    return _section("Significance", "\n".join(lines))


def _plasticity_section(plast: pd.DataFrame, table: pd.DataFrame, out: Path, files: list,
                        scale: float = 1.0, notes: list[str] = (), boot=None) -> str:
    pooled = stats.pool_plasticity(plast)
    files += tables.write_table(out, "plasticity_per_layer", pooled, index=False)
    comps = [c for c in ("LN1", "MHA", "LN2", "FC1", "FC2") if c in set(pooled["component"])]
    comps += sorted(set(pooled["component"]) - set(comps))
    parts = []
    files.add(figures.plasticity_layers, pooled, comps, out / "figures" / "plasticity")
    for mode in sorted(pooled["mode"].unique()):
        comp_p = stats.component_plasticity(pooled, mode)
        try:
            ranking, corr = stats.plasticity_vs_accuracy(comp_p, table)
        except AnalysisError as e:
            parts.append(f"{mode} input: {e}")
            continue
        ranking.index.name = "component"
        shown = pd.DataFrame({
            "plasticity": ranking["plasticity"].map(lambda v: tables.fmt(v, 3)),
            "plasticity rank": ranking["plasticity_rank"].map(lambda v: tables.fmt(v, 2)),
            "accuracy": (ranking["accuracy"] * scale).map(lambda v: tables.fmt(v, 1)),
            "accuracy rank": ranking["accuracy_rank"].map(lambda v: tables.fmt(v, 2)),
        })
        files += tables.write_table(out, f"plasticity_ranking_{mode}", shown, ranking)
        files += tables.write_table(out, f"plasticity_correlation_{mode}",
                                    corr.set_index("dataset").map(lambda v: tables.fmt(v, 3)),
                                    corr, index=True)
        rho = corr.set_index("dataset").loc["all"]
        per = corr[corr["dataset"] != "all"]["rho"]
        parts.append(
            f"{mode} input. Components by plasticity (highest first): "
            f"{' > '.join(ranking.index)}; by accuracy: "
            f"{' > '.join(ranking.sort_values('accuracy_rank').index)}. Spearman rho between "
            f"plasticity and accuracy: {tables.fmt(per.mean(), 2)} on average over "
            f"{per.notna().sum()} datasets; {tables.fmt(rho['rho'], 2)} ({_p(rho['p'])}) "
            "between the means over datasets.\n\n"
            + tables.markdown(shown))
        if boot is not None:
            scores, order, opts = boot
            parts.append(trust.correlation_text(f"{mode} input, with intervals. Components by "
                                                "plasticity", comp_p, scores, order,
                                                list(table.index), opts, out, files,
                                                f"plasticity_{mode}"))
    if "pairing" in plast and plast["pairing"].notna().any():
        used = sorted(set(plast["pairing"].dropna().astype(str)) - {""})
        parts.append("Pairs: " + (", ".join(used) or "not recorded") + " (random: seeded draws; "
                     "sequential: the first N images of each split, the paper's).")
    parts += [f"Note: {n}" for n in notes]
    return _section("Plasticity and accuracy", "\n\n".join(parts))


def _model_notes(runs: pd.DataFrame | None) -> list[str]:
    """What the models' registry says a reader of their plasticity should know."""
    from raystudy import models

    names = sorted(set(runs["model"].dropna())) if runs is not None and "model" in runs else []
    return [n for n in (models.plasticity_note(m) for m in names) if n]


# ---------------------------------------------------------------- sources

def _setting_name(setting: tuple) -> str:
    model, optimizer, low = setting
    return f"{model}_{optimizer}" + ("_low_data" if low == "True" else "")


def _title(setting: tuple) -> str:
    model, optimizer, low = setting
    named = [v for v in (model, optimizer) if v != "unknown"] + (["low data"] if low == "True" else [])
    return "raystudy analysis" + (f": {', '.join(named)}" if named else "")


def analyse_runs(runs: pd.DataFrame, out_dir: str | Path, *, extras=None, **kw) -> Report:
    """``analyse`` once per study setting (model, optimizer, low data) found in ``runs``.

    A single setting writes into ``out_dir``; several write one subfolder each, and into
    ``out_dir`` the tables across them (``across_settings``) and a ``report.md`` of it all.
    ``extras(runs_of_one_setting)`` may return (bands, plasticity) for that setting.
    """
    found = load.settings(runs)
    texts, files = [], figures.Outputs(kw.get("draw_figures", True))
    for s in found:
        sub = runs[(runs[load.SETTING].astype(str) == list(s)).all(axis=1)].copy()
        sub.attrs = dict(runs.attrs)
        bands, plast = extras(sub) if extras else (None, None)
        target = Path(out_dir) if len(found) == 1 else Path(out_dir) / _setting_name(s)
        r = analyse(target, runs=sub, bands=bands, plasticity=plast, title=_title(s), **kw)
        texts.append(r.text)
        files += r.files
    if len(found) > 1:
        texts.insert(0, across_settings(runs, out_dir, files, select_on=kw.get("select_on", "val"),
                                        conditions=kw.get("conditions"), datasets=kw.get("datasets"),
                                        ddof=kw.get("ddof", 0)))
        text = "\n".join(texts)
        (Path(out_dir) / "report.md").write_text(text)
        files.append(Path(out_dir) / "report.md")
    return Report(text="\n".join(texts), files=list(files))


def _optimizer_order(names) -> list[str]:
    return sorted(names, key=lambda o: (o.lower() != "sgd", o.lower()))


def across_settings(runs: pd.DataFrame, out_dir: str | Path, files: list, *, select_on: str = "val",
                    conditions: list[str] | None = None, datasets: list[str] | None = None,
                    ddof: int = 0) -> str:
    """The tables across study settings: per model (and low-data flag) the optimizer ablation
    (mean over datasets at the chosen lr, one column per optimizer) where it has runs of two or
    more optimizers; with several models, every setting's means side by side (``settings``).
    Each setting's own tables are in its subfolder. Returns the Markdown."""
    out = Path(out_dir)
    runs = _restrict(runs, conditions, datasets, runs.attrs.get("source", "runs"))
    bests = {}
    for s in load.settings(runs):
        sub = runs[(runs[load.SETTING].astype(str) == list(s)).all(axis=1)]
        bests[s] = stats.best_lr(stats.seed_means(sub, ddof=ddof), select_on)
    order = stats.order_conditions(runs["condition"], paper_order())
    scale = stats.display_scale(runs["test_acc"])
    unit = " (%)" if scale == 100 else ""
    chosen = {"val": "validation", "test": "test"}[select_on]
    parts = [(f"Mean test accuracy{unit} over datasets at the lr chosen on {chosen} accuracy; each "
              "condition over the datasets every column has runs on (column datasets).")]
    groups: dict[tuple, dict[str, pd.DataFrame]] = {}
    for (model, optimizer, low), b in bests.items():
        groups.setdefault((model, low), {})[optimizer] = b
    for (model, low), by_opt in groups.items():
        what = model + (", low data" if low == "True" else "")
        if len(by_opt) < 2:
            parts.append(f"Optimizer ablation, {what}: runs of one optimizer only "
                         f"({', '.join(by_opt)}); no table.")
            continue
        ab = stats.setting_means({o: by_opt[o] for o in _optimizer_order(by_opt)}, order)
        shown = tables.ablation_table(ab, scale)
        name = "optimizer_ablation_" + model + ("_low_data" if low == "True" else "")
        caption = f"Optimizer ablation, {what}: mean test accuracy{unit}, lr chosen on {chosen}"
        files += tables.write_table(out, name, shown, ab, caption=caption)
        files.add(figures.setting_means, ab, out / "figures" / name, scale,
                  f"Optimizer ablation, {what}")
        parts.append(f"{caption}:\n\n{tables.markdown(shown).rstrip()}")
    if len({m for m, _, _ in bests}) > 1:
        ab = stats.setting_means({", ".join(v for v in (m, o, "low data" if low == "True" else "")
                                            if v): b for (m, o, low), b in bests.items()}, order)
        shown = tables.ablation_table(ab, scale)
        caption = f"Every setting: mean test accuracy{unit}, lr chosen on {chosen}"
        files += tables.write_table(out, "settings", shown, ab, caption=caption)
        files.add(figures.setting_means, ab, out / "figures" / "settings", scale, "Every setting")
        parts.append(f"{caption}:\n\n{tables.markdown(shown).rstrip()}")
    parts.append(f"Each setting's own tables and tests: the subfolders "
                 f"{', '.join(_setting_name(s) for s in bests)}.")
    return _section("Across settings: optimizer ablation and models", "\n\n".join(parts))


def report_from_mlflow(experiment: str, out_dir: str | Path, tracking_uri: str | None = None,
                       *, curves: bool = True, log: bool = True, **kw) -> Report:
    """Load the experiment's trial runs, analyse them, and log ``out_dir`` to the grid run(s).

    Curves are read for the finished runs at the chosen lr of each cell; plasticity before
    finetuning from every run that probed (they all probe the same pretrained model).
    """
    runs = load.from_mlflow(experiment, tracking_uri)

    def extras(sub: pd.DataFrame):
        sub = _restrict(sub, kw.get("conditions"), kw.get("datasets"), "runs")
        bands = None
        if curves:
            best = stats.best_lr(stats.seed_means(sub), kw.get("select_on", "val"))
            chosen = selected_runs(sub, best)
            hist = load.step_metrics(chosen, list(CURVE_KEYS), tracking_uri)
            bands = stats.curve_bands(hist, chosen) if len(hist) else None
        return bands, load.plasticity(sub, "before", tracking_uri)

    report = analyse_runs(runs, out_dir, extras=extras, **kw)
    if log:
        report.logged_to = log_outputs(out_dir, runs, experiment, tracking_uri)
    return report


def log_outputs(out_dir: str | Path, runs: pd.DataFrame, experiment: str,
                tracking_uri: str | None = None) -> list[str]:
    """Log ``out_dir`` as ``analysis/`` artifacts of the grid parent run(s) of ``runs``, and its
    ``report.md`` into their description (what the UI shows on the run's page)."""
    from raystudy import tracking

    grids = load.grid_runs(experiment, tracking_uri)
    parents = [p for p in dict.fromkeys(runs["parent_run_id"]) if p in grids] or grids
    c = load.client(tracking_uri)
    md = Path(out_dir) / "report.md"
    for pid in parents:
        c.log_artifacts(pid, str(out_dir), artifact_path="analysis")
        if md.is_file():
            tracking.attach_report(c, pid, md.read_text())
    return parents


def report_from_csv(path: str | Path, out_dir: str | Path, *, plasticity: pd.DataFrame | None = None,
                    **kw) -> Report:
    """The report of a per-run results CSV or a per-dataset summary CSV (``analysis.load``)."""
    kind, df = load.read_csv(path)
    if kind == "summary":
        kw.pop("select_on", None)
        return analyse(out_dir, summary=df, plasticity=plasticity, **kw)
    extras = None
    if plasticity is not None:
        def extras(sub):
            same = plasticity[plasticity["model"].isin(set(sub["model"]))]
            return None, same if len(same) else plasticity
    return analyse_runs(df, out_dir, extras=extras, **kw)


# ---------------------------------------------------------------- CLI

def _names(text: str | None) -> list[str] | None:
    return [t.strip() for t in text.split(",") if t.strip()] if text else None


def build_parser():
    from raystudy import cli

    ap = cli.Parser("python -m analysis.report", __doc__)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--experiment", help="MLflow experiment name (or id)")
    src.add_argument("--csv", help="per-run results or per-dataset summary CSV")
    ap.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, "
                                           "else sqlite:///./mlflow.db, as the grid)")
    ap.add_argument("--select-on", choices=stats.SELECT_ON, default="val",
                    help="choose the lr on validation (default) or test accuracy")
    ap.add_argument("--reference", default="MHA", help="condition tested against the others (MHA)")
    ap.add_argument("--t-alternative", choices=stats.T_ALTERNATIVES, default="two-sided",
                    help="paired t-test: two-sided (default, the paper's) or one-sided, the "
                         "reference greater (the Wilcoxon test is one-sided, as in the paper)")
    ap.add_argument("--paper-comparison", action="store_true",
                    help="ranks, paired tests, Friedman and the CD diagram over the paper's five "
                         "components (LN1, MHA, LN2, FC1, FC2); tables keep every condition")
    ap.add_argument("--gain-reference",
                    help="condition the relative gains are over (default: linear_probe if present, "
                         "else --reference)")
    ap.add_argument("--conditions", help="comma-separated conditions to analyse (default: all)")
    ap.add_argument("--datasets", help="comma-separated datasets to analyse (default: all)")
    ap.add_argument("--plasticity", help="tidy plasticity CSV to add (with --csv)")
    ap.add_argument("--no-curves", action="store_true", help="skip reading metric histories")
    ap.add_argument("--rope", type=float, default=0.5,
                    help="half-width of the region of practical equivalence, in accuracy points (0.5)")
    ap.add_argument("--cd-cliques", choices=trust.CD_CLIQUES, default="nemenyi",
                    help="bars of the CD diagram: Nemenyi mean ranks (default) or Wilcoxon-Holm pairs")
    ap.add_argument("--bootstrap-reps", type=int, default=2000,
                    help=f"bootstrap replicates (2000; {cli.bound('--bootstrap-reps')})")
    ap.add_argument("--bootstrap-seed", type=int, default=0,
                    help="seed of the bootstrap and the Bayesian tests' sampling (0; 0 <= seed < 2**32)")
    ap.add_argument("--bootstrap-over", choices=trust.BOOTSTRAP_OVER, default="datasets+seeds",
                    help="resample datasets and seeds (default) or seeds within fixed datasets")
    ap.add_argument("--no-hierarchical", action="store_true",
                    help="skip the hierarchical Bayesian test over datasets and seeds")
    ap.add_argument("--no-figures", action="store_true",
                    help="write the tables, tests and report.md only: draw no figures (each takes "
                         "a second or so)")
    ap.add_argument("--no-log", action="store_true", help="do not log the outputs to MLflow")
    ap.add_argument("--out", default="analysis_out", help="output folder (default: analysis_out)")
    return ap


def main(argv: list[str] | None = None) -> int:
    from raystudy import cli
    from raystudy.errors import ConfigError

    args = build_parser().parse_args(argv)
    try:
        if not (math.isfinite(args.rope) and args.rope >= 0):
            raise AnalysisError(f"--rope must be a finite number >= 0, got {args.rope}")
        cli.check_count("--bootstrap-reps", args.bootstrap_reps)
        cli.check_seed("--bootstrap-seed", args.bootstrap_seed)
        cli.check_unused("--csv", args.csv is not None, {"--tracking-uri": args.tracking_uri,
                                                         "--no-curves": args.no_curves, "--no-log": args.no_log})
        cli.check_unused("--experiment", args.experiment is not None, {"--plasticity": args.plasticity})
        cli.check_folder("--out", args.out)
    except (AnalysisError, ConfigError) as e:
        return cli.fail(e)
    opts = trust.Options(rope=args.rope, reps=args.bootstrap_reps, seed=args.bootstrap_seed,
                         over=args.bootstrap_over, hierarchical=not args.no_hierarchical,
                         cd_cliques=args.cd_cliques)
    kw = dict(select_on=args.select_on, reference=args.reference,
              conditions=_names(args.conditions), datasets=_names(args.datasets), options=opts,
              t_alternative=args.t_alternative, gain_reference=args.gain_reference,
              compare=list(PAPER_COMPARISON) if args.paper_comparison else None,
              draw_figures=not args.no_figures)
    from raystudy import tracking

    if args.experiment:
        uri = args.tracking_uri or tracking.default_uri()
        try:  # before MLflow's seconds of imports
            tracking.check_uri(uri, must_exist=True)
        except ConfigError as e:
            return cli.fail(e)
    from mlflow.exceptions import MlflowException

    try:
        if args.experiment:
            report = report_from_mlflow(args.experiment, args.out, uri,
                                        curves=not args.no_curves, log=not args.no_log, **kw)
        else:
            plast = load.read_plasticity(args.plasticity) if args.plasticity else None
            report = report_from_csv(args.csv, args.out, plasticity=plast, **kw)
    except (AnalysisError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except MlflowException as e:
        print(f"error: MLflow: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    print(report.text)
    print(f"wrote {len(report.files)} files to {args.out}"
          + (f"; logged them to run(s) {', '.join(report.logged_to)} under analysis/"
             if report.logged_to else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
