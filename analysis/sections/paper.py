"""The report's sections, each a function of the ``analysis.study.Study``.

Each returns an ``analysis.output.Section`` (Markdown, tables, figures), or None where it does
not apply (no runs, no plasticity, no curves); none writes anything. ``SECTIONS`` lists them in
the report's order: the header, the answer (which conditions to finetune, ranked, with the
evidence and the winner's config; ``analysis.sections.answer``), how stable it is
(``analysis.sections.stability``), the
paper's main table, the two lr choices, lr robustness, the
relative gain, parameter efficiency, the paper's tests and the omnibus tests, then intervals,
equivalence, tuning budget and variance (``analysis.sections.trust``), the curves, plasticity and the
gradient norm.
"""

from __future__ import annotations

import functools
import math

import pandas as pd

from analysis import AnalysisError, figures, load, tables
from analysis.output import Csv, Figure, Section, Table, section
from analysis.sections import answer as answer_section
from analysis.sections import stability as stability_section
from analysis.sections import trust
from analysis.stats import pooling
from analysis.stats import selection as stats
from analysis.stats import significance as significance_mod
from analysis.study import Study

CURVE_KEYS = {
    "val_loss": ("validation loss", False),
    "grad_norm/total": ("gradient norm (total)", True),
    "grad_norm/{condition}": ("gradient norm of the trained component", True),
}


def _status_line(runs: pd.DataFrame) -> str:
    counts = runs["status"].value_counts()
    parts = [f"{counts.get(s, 0)} {s}" for s in ("finished", "diverged", "failed")]
    parts += [f"{n} {s}" for s, n in counts.items() if s not in ("finished", "diverged", "failed")]
    return f"{len(runs)} runs ({', '.join(parts)})"


ACCURACY_LABELS = {
    "per_image": "each test image counted once",
    "batch_mean": "the mean of per-batch accuracies, as the paper's code counts",
}
PROBE_FIT_LABELS = {
    "clean": "fitted on clean (eval-transform) features of every training image",
    "augmented": "fitted on one augmented pass of training batches, as the paper's code",
}


def _protocol_lines(s: Study) -> list[str]:
    """How the runs counted accuracy and fitted the linear probe, where the runs say."""
    lines = []
    if s.runs is None:
        return lines
    for col, labels, what in (
        ("accuracy", ACCURACY_LABELS, "Accuracy"),
        ("linear_probe_data", PROBE_FIT_LABELS, "Linear probe"),
    ):
        if col not in s.runs or (col == "linear_probe_data" and "linear_probe" not in s.order):
            continue
        runs = s.runs[s.runs["condition"] == "linear_probe"] if col == "linear_probe_data" else s.runs
        seen = sorted(set(runs[col].astype(str)))
        lines.append(
            f"{what}: "
            + "; ".join(f"{labels.get(v, v)} ({col}: {v})" for v in seen)
            + (" -- mixed across runs" if len(seen) > 1 else "")
        )
    return lines


def _p(p: float) -> str:
    text = tables.fmt_p(p)
    return f"p {text}" if text.startswith("<") else f"p = {text}"


# ---------------------------------------------------------------- the header and the main table


def head(s: Study) -> Section:
    """The title, the source and what was analysed: conditions, datasets, the lr choice."""
    n_d, k = s.table.shape
    lines = [
        f"# {s.title or 'raystudy analysis'}",
        "",
        f"Source: {s.source}" + (f"; {_status_line(s.runs)}" if s.runs is not None else " (per-dataset summary)"),
        f"{k} condition{'s' * (k != 1)} on {n_d} dataset{'s' * (n_d != 1)}"
        + (f"; lr chosen on {s.chosen} accuracy" if s.chosen else ""),
    ]
    lines += _protocol_lines(s)
    if s.compared != s.order:
        lines.append(
            f"Ranks, paired tests, Friedman and the CD diagram over {len(s.compared)} of them: {', '.join(s.compared)}"
        )
    if s.runs is not None and s.runs.attrs.get("replaced"):
        lines.append(f"{s.runs.attrs['replaced']} earlier tries of rerun trials replaced by the rerun")
    if s.summary is not None and s.summary.attrs.get("dropped_rows"):
        lines.append(f"{s.summary.attrs['dropped_rows']} average row(s) of the input table left out (recomputed here)")
    return Section("\n".join(lines) + "\n")


def answer(s: Study) -> Section:
    """The question answered first: which conditions to finetune, ranked (``analysis.sections.answer``)."""
    return answer_section.build(s)


def stability(s: Study) -> Section:
    """How stable the answer is under reseeding, lr re-chosen (``analysis.sections.stability``)."""
    return stability_section.build(s)


def main_table(s: Study) -> Section:
    """The paper's main table (datasets × conditions, average and avg rank rows), once per lr
    choice the runs allow, each labelled: on validation (the default), on test (the paper's);
    with the accuracy table and figure and the ranks."""
    what = f"Test accuracy{s.unit} at the best lr" + (f" (chosen on {s.chosen})" if s.chosen else "")
    name = f"accuracy_{s.select_on}_selected" if s.runs is not None else "accuracy"
    accuracy = Table(name, tables.accuracy_table(s.best, s.order, s.avg, s.avg_rank, s.scale), s.best)
    ranks = Table("ranks", tables.number_table(s.ranks, s.compared, s.avg_rank, "average", 1.0, 1), s.ranks)
    body, main = _main_tables(s) if s.runs is not None else _summary_main_table(s)
    return section(
        "Main table",
        body,
        (accuracy, *main, ranks),
        (
            Figure(
                name,
                functools.partial(figures.accuracy, s.best, s.order, scale=s.scale, title=what, paper=s.as_paper),
            ),
        ),
    )


def _digits(s: Study) -> int:
    """The main table's decimals: the paper's code prints its means, stds and averages with 2."""
    return 2 if s.as_paper else 1


def _summary_main_table(s: Study) -> tuple[str, list[Table]]:
    """A per-dataset summary's main table, as given."""
    rk = stats.ranks(stats.wide(s.best, conditions=s.compared)).mean(axis=0)
    shown = tables.main_table(s.best, s.order, rk, s.scale, _digits(s))
    caption = f"Test accuracy{s.unit} per dataset, as given (per-dataset summary)"
    table = Table("main_table", shown, stats.wide(s.best, conditions=s.order), caption=caption)
    return f"{caption}:\n\n{tables.markdown(shown)}", [table]


def _main_tables(s: Study) -> tuple[str, list[Table]]:
    """The main table of each lr choice the runs allow, the chosen one first."""
    label = {
        "val": "lr chosen on validation accuracy (the default)",
        "test": "lr chosen on test accuracy (as the paper did)",
    }
    parts, written = [], []
    for on, b in ((s.select_on, s.best), ({"val": "test", "test": "val"}[s.select_on], s.best_other)):
        if b is None:
            continue
        rk = stats.ranks(stats.wide(b, conditions=s.compared)).mean(axis=0)
        shown = tables.main_table(b, s.order, rk, s.scale, _digits(s))
        caption = f"Test accuracy{s.unit}, mean ± std over seeds, {label[on]}"
        written.append(Table(f"main_table_lr_on_{on}", shown, b, caption=caption))
        used = " — used by the rest of this report" if on == s.select_on else ""
        parts.append(f"{caption}{used}:\n\n{tables.markdown(shown).rstrip()}")
    if s.best_other is None:
        parts.append(
            f"(No {'test' if s.select_on == 'val' else 'validation'} accuracies to choose the lr on the other way.)"
        )
    return "\n\n".join(parts), written


def selection(s: Study) -> Section | None:
    """Both lr choices side by side: the averages, ranks, and where the chosen lr moved."""
    if s.best_other is None:
        return None
    val_best, test_best = (s.best, s.best_other) if s.select_on == "val" else (s.best_other, s.best)
    summaries, written = {}, []
    for on, b in (("val", val_best), ("test", test_best)):
        t = stats.wide(b, conditions=s.order)
        summaries[on] = (t.mean(axis=0), stats.ranks(t[s.compared]).mean(axis=0))
        if on != s.select_on:
            shown = tables.accuracy_table(b, s.order, *summaries[on], s.scale)
            written.append(Table(f"accuracy_{on}_selected", shown, b))
    written.append(Table("chosen_lr", tables.chosen_lr_table(val_best, test_best, s.order)))
    key = ["dataset", "condition"]
    lrs = val_best[key + ["lr"]].merge(test_best[key + ["lr"]], on=key, suffixes=("_val", "_test"))
    moved = (lrs["lr_val"] != lrs["lr_test"]).groupby(lrs["condition"]).sum()
    (a_val, r_val), (a_test, r_test) = summaries["val"], summaries["test"]
    n_d = val_best["dataset"].nunique()
    gap = pd.DataFrame(
        {
            "average, lr on val": [tables.fmt(a_val[c] * s.scale, 2) for c in s.order],
            "average, lr on test": [tables.fmt(a_test[c] * s.scale, 2) for c in s.order],
            "test − val": [tables.fmt((a_test[c] - a_val[c]) * s.scale, 2) for c in s.order],
            "avg rank (val)": [tables.fmt(r_val.get(c, math.nan), 2) for c in s.order],
            "avg rank (test)": [tables.fmt(r_test.get(c, math.nan), 2) for c in s.order],
            "datasets where the lr differs": [f"{int(moved.get(c, 0))}/{n_d}" for c in s.order],
        },
        index=pd.Index(s.order, name="condition"),
    )
    written.append(Table("selection", gap))
    return section(
        "Choosing the lr on validation vs on test (the reference code chose on test)", tables.markdown(gap), written
    )


def robustness(s: Study) -> Section | None:
    """Learning-rate robustness, and the runs by status (nothing dropped silently)."""
    if s.means is None:
        return None
    gaps = stats.lr_gaps(s.means)
    robust = gaps.mean(axis=0)
    status = tables.status_table(s.runs, s.order)
    cols = load.RUN_COLUMNS + (["trainable_params"] if "trainable_params" in s.runs else [])
    rob = ", ".join(f"{c} {tables.fmt(robust.get(c, math.nan) * s.scale, 2)}" for c in s.order)
    body = (
        f"Mean over datasets of (max − min over lrs) of the seed-mean test accuracy; lower is more robust.\n\n{rob}\n"
    )
    if (status["finished"] < status["runs"]).any():
        body += "\nRuns by status (not finished: kept, left out of the means):\n\n" + tables.markdown(status)
    errors = s.runs["error"] if "error" in s.runs else pd.Series("", index=s.runs.index)
    empty = errors.astype(str).str.startswith("finished without a test_acc")
    if empty.any():
        first = s.runs[empty].iloc[0]
        body += (
            f"\n{int(empty.sum())} run(s) recorded as finished have no test accuracy: counted as failed, "
            f"not averaged (first: {first['condition']} on {first['dataset']}, lr {first['lr']}, "
            f"seed {first['seed']}).\n"
        )
    return section(
        "Learning-rate robustness",
        body,
        (
            Table("lr_robustness", tables.number_table(gaps, s.order, robust, "mean", s.scale, 2), gaps),
            Table("run_status", status),
            Csv("runs", s.runs[cols]),
        ),
    )


def gain(s: Study) -> Section:
    """Each condition's relative gain over the gain reference per dataset and on average."""
    ref = s.gain_reference
    if ref is None:
        return section(
            "Relative gain",
            "Skipped: neither linear_probe nor the reference condition is analysed (--gain-reference names one).",
        )
    title = f"Relative gain over {ref}"
    if len(s.order) < 2:
        return section(title, "One condition only: no gain to compute.")
    gains = stats.relative_gain(s.table[s.order], ref)
    shown = tables.dataset_table(gains, s.order, "average", 2)
    lr = f" at the lr chosen on {s.chosen}" if s.chosen else ""
    return section(
        title,
        f"100 · (accuracy − {ref}'s) / {ref}'s, per dataset{lr}; average: the "
        f"mean over datasets of the per-dataset gains (%).\n\n" + tables.markdown(shown),
        (Table("relative_gain", shown, gains, caption=f"Relative gain over {ref} (%)"),),
        (Figure("relative_gain", functools.partial(figures.gains, gains.mean(axis=0), reference=ref)),),
    )


def efficiency(s: Study) -> Section:
    """Accuracy against trainable parameter count (table and log-x figure), LoRA included."""
    title = "Parameter efficiency"
    params = stats.trainable_params(s.runs) if s.runs is not None else pd.DataFrame()
    if params.empty:
        why = (
            "a per-dataset summary has no parameter counts"
            if s.runs is None
            else "the runs have no trainable parameter counts (trainable_params)"
        )
        return section(title, f"Skipped: {why}.")
    eff = stats.parameter_efficiency(params, s.table)
    if eff.empty:
        return section(title, "Skipped: no condition has both a parameter count and an accuracy.")
    shown = tables.efficiency_table(eff, s.scale)
    return section(
        title,
        "Trainable parameters (mean over datasets: the classifier head's size "
        "follows the number of classes) and mean test accuracy over the same "
        f"datasets{f', lr chosen on {s.chosen}' if s.chosen else ''}.\n\n" + tables.markdown(shown),
        (
            Table("parameter_efficiency", shown, eff, caption="Trainable parameters and mean test accuracy"),
            Table("trainable_params", tables.dataset_table(params, list(eff.index), "mean", 0), params),
        ),
        (Figure("parameter_efficiency", functools.partial(figures.parameter_efficiency, eff, scale=s.scale)),),
    )


# ---------------------------------------------------------------- the paper's tests


def _compares(s: Study) -> bool:
    """Whether there is anything to compare: two conditions analysed and two compared."""
    return len(s.order) >= 2 and len(s.compared) >= 2


def significance(s: Study) -> Section:
    """The paper's tests, Friedman, Holm-corrected pairs and the CD diagram, over the conditions
    compared; one line instead where there is one condition, one compared or one dataset.

    The paper's tests: Wilcoxon signed-rank one-sided (the reference greater) and the paired
    t-test two-sided (``t_alternative="greater"`` for one-sided). The CD diagram places
    conditions by mean rank; its bars join conditions the Nemenyi test does not separate, or
    (``cd_cliques="wilcoxon"``) those among which no Holm-corrected Wilcoxon pair is significant.
    """
    none = "\nNo paired tests, no Friedman test, no CD diagram."
    if len(s.order) < 2:
        return section("Significance", f"One condition only ({s.order[0]}): nothing to compare.{none}")
    if len(s.compared) < 2:
        return section("Significance", f"One condition compared ({s.compared[0]}): nothing to compare.{none}")
    table = s.table[s.compared]
    if table.shape[0] < 2:
        return _one_dataset(table.index[0], s.reference)
    return _tests(s, table)


def _one_dataset(dataset: str, reference: str) -> Section:
    """Every test across datasets skipped, a line each."""
    return section(
        "Significance",
        "\n".join(
            [
                f"One dataset ({dataset}): every test here compares conditions across datasets.",
                (
                    f"- No paired tests of {reference} against the others (Wilcoxon, t-test): they need "
                    "two or more datasets."
                ),
                "- No Friedman test: it needs two or more datasets.",
                (
                    "- No post-hoc pairwise tests and no critical-difference diagram: the average ranks "
                    f"are {dataset}'s own ranks."
                ),
            ]
        ),
    )


def _tests(s: Study, table: pd.DataFrame) -> Section:
    """The significance section over two or more datasets: tables, CD diagram and the text."""
    n_d, k = table.shape
    # the paper ran its tests on the table it printed, rounded to 2 decimals
    tested = stats.printed(table, s.scale) if s.as_paper else table
    tests = significance_mod.paired_tests(tested, s.reference, t_alternative=s.t_alternative)
    fr = significance_mod.friedman(table)
    cd = significance_mod.nemenyi_cd(k, n_d)
    pairs = significance_mod.pairwise_wilcoxon(table)
    nemenyi_groups = significance_mod.cd_cliques(s.avg_rank, cd)
    wilcoxon = s.options.cd_cliques == "wilcoxon"
    cliques = significance_mod.wilcoxon_cliques(s.avg_rank, pairs) if wilcoxon else nemenyi_groups
    omnibus = pd.DataFrame([{"test": "friedman", **fr}, {"test": "nemenyi_cd", "statistic": cd, "k": k, "n": n_d}])
    bars = "bars: no Holm-corrected Wilcoxon pair significant" if wilcoxon else "bars: Nemenyi, mean ranks within CD"
    cd_figure = functools.partial(
        figures.cd_diagram,
        s.avg_rank,
        cd,
        cliques,
        n_datasets=n_d,
        title=f"Mean-rank based: average ranks over {n_d} datasets; {bars} (5%)",
    )
    lines = _tests_text(s, tests, n_d) + _omnibus_text(
        fr, significance_mod.friedman_skip(table), k, n_d, pairs, cd, nemenyi_groups, cliques if wilcoxon else None
    )
    return section(
        "Significance",
        "\n".join(lines),
        (
            Table("tests", tables.tests_table(tests, s.scale), tests),
            Table("posthoc", tables.posthoc_table(pairs, s.scale), pairs),
            Csv("omnibus", omnibus),
        ),
        (Figure("cd_diagram", cd_figure),),
    )


def _tests_text(s: Study, tests: pd.DataFrame, n_d: int) -> list[str]:
    """The paper's paired tests: what they are, and their table."""
    t_text = (
        "two-sided, as in the paper (--t-alternative greater: one-sided)"
        if s.t_alternative == "two-sided"
        else f"one-sided, {s.reference} greater (--t-alternative; the paper's is two-sided, also shown)"
    )
    return [
        (
            f"{s.reference} against each other condition over the {n_d} per-dataset means: "
            f"Wilcoxon signed-rank one-sided, {s.reference} greater, as in the paper; paired "
            f"t-test {t_text}."
            + (" Both on the means as printed, rounded to 2 decimals (--as-paper)." if s.as_paper else "")
        ),
        "",
        tables.markdown(tables.tests_table(tests, s.scale)).rstrip(),
        "",
    ]


def _omnibus_text(
    fr: dict,
    skip: str | None,
    k: int,
    n_d: int,
    pairs: pd.DataFrame,
    cd: float,
    nemenyi_groups: list,
    wilcoxon_cliques: list | None,
) -> list[str]:
    """Friedman, the Holm-corrected pairs and the Nemenyi CD, a line each, and how to read them."""
    if skip is not None or math.isnan(fr["p"]):
        lines = [f"Friedman test: not run: {skip or 'scipy gave no p-value'}."]
    else:
        lines = [f"Friedman test over {k} conditions and {n_d} datasets: chi2 = {fr['statistic']:.3f}, {_p(fr['p'])}."]
    sig = pairs[pairs["significant"]]
    lines.append(
        "Post-hoc pairwise Wilcoxon, Holm-corrected at 5%: "
        + (
            ", ".join(f"{a} vs {b} ({_p(p)})" for a, b, p in zip(sig["a"], sig["b"], sig["p_holm"]))
            if len(sig)
            else "no significant pair"
        )
        + "."
    )
    lines.append(
        f"Nemenyi critical difference at 5% (mean-rank based): CD = {cd:.2f} average "
        "ranks; not significantly different: "
        + ("; ".join(", ".join(g) for g in nemenyi_groups) if nemenyi_groups else "none")
        + "."
    )
    if wilcoxon_cliques is not None:
        wil = "; ".join(", ".join(g) for g in wilcoxon_cliques) if wilcoxon_cliques else "none"
        lines.append(f"The CD diagram's bars come from the Holm-corrected Wilcoxon tests: {wil}.")
    lines.append(
        "The pairwise Wilcoxon-Holm tests are the primary all-pairs result; the "
        "Nemenyi test compares mean ranks, so its verdict on two conditions depends on "
        "which others are in the study (Benavoli, Corani and Mangili, 2016). Effect "
        "sizes: the Hodges-Lehmann shift (median of Walsh averages of the per-dataset "
        "differences) with its exact 95% interval, and the rank-biserial r."
    )
    if (pairs["hl"].notna() & pairs["hl_low"].isna()).any():
        lines.append(
            f"A shift marked '{tables.HL_NO_INTERVAL}' has no interval: the exact 95% interval "
            "inverts the signed-rank test, which cannot reach 5% with fewer than 6 datasets."
        )
    return lines


# ---------------------------------------------------------------- past the p-values (analysis.sections.trust)


def intervals(s: Study) -> Section | None:
    """Bootstrap intervals (``trust.intervals_section``), where there is something to compare."""
    if not _compares(s):
        return None
    return trust.intervals_section(s.scores, s.order, s.reference, s.scale, s.options)


def rope(s: Study) -> Section | None:
    """The Bayesian tests with a ROPE (``trust.rope_section``), where there is something to compare."""
    if not _compares(s):
        return None
    return trust.rope_section(s.table, s.scores, s.order, s.reference, s.scale, s.options)


def budget(s: Study) -> Section | None:
    """The tuning budget and lrs at the grid's edges (``trust.budget_section``), from runs."""
    return trust.budget_section(s.means, s.best, s.order, s.scale) if s.means is not None else None


def variance(s: Study) -> Section | None:
    """Where the runs' spread comes from (``trust.variance_section``), from runs."""
    return trust.variance_section(s.runs, s.order, s.scale) if s.means is not None else None


# ---------------------------------------------------------------- curves and plasticity (MLflow runs)


def curves(s: Study) -> Section | None:
    """The metric curves of the selected runs: figures only."""
    if s.bands is None or not len(s.bands):
        return None
    figs = []
    for key, (label, log) in CURVE_KEYS.items():
        slug = key.replace("/", "_").replace("{condition}", "own")
        figs.append(
            Figure(f"curves_{slug}", functools.partial(figures.curves, s.bands, key, s.order, ylabel=label, log=log))
        )
    return Section("", figures=tuple(figs))


def plasticity(s: Study) -> Section | None:
    """Plasticity per layer, and per input mode the components ranked by plasticity next to
    their ranking by accuracy, with rank correlations."""
    if s.plasticity is None or not len(s.plasticity):
        return None
    pooled = pooling.pool_plasticity(s.plasticity)
    comps = [c for c in ("LN1", "MHA", "LN2", "FC1", "FC2") if c in set(pooled["component"])]
    comps += sorted(set(pooled["component"]) - set(comps))
    parts = [_plasticity_mode(s, pooled, mode) for mode in sorted(pooled["mode"].unique())]
    text = [p.markdown for p in parts]
    if "pairing" in s.plasticity and s.plasticity["pairing"].notna().any():
        used = sorted(set(s.plasticity["pairing"].dropna().astype(str)) - {""})
        text.append(
            "Pairs: " + (", ".join(used) or "not recorded") + " (random: seeded draws; "
            "sequential: the first N images of each split, the paper's)."
        )
    text += [f"Note: {n}" for n in _model_notes(s.runs)]
    return section(
        "Plasticity and accuracy",
        "\n\n".join(text),
        (Table("plasticity_per_layer", pooled, index=False), *(t for p in parts for t in p.tables)),
        (Figure("plasticity", functools.partial(figures.plasticity_layers, pooled, comps)),),
    )


def _plasticity_mode(s: Study, pooled: pd.DataFrame, mode: str) -> Section:
    """One input mode's rankings and correlations: paragraphs (no heading) and their tables."""
    comp_p = pooling.component_plasticity(pooled, mode)
    try:
        ranking, corr = pooling.plasticity_vs_accuracy(comp_p, s.table)
    except AnalysisError as e:
        return Section(f"{mode} input: {e}")
    ranking.index.name = "component"
    shown = pd.DataFrame(
        {
            "plasticity": ranking["plasticity"].map(lambda v: tables.fmt(v, 3)),
            "plasticity rank": ranking["plasticity_rank"].map(lambda v: tables.fmt(v, 2)),
            "accuracy": (ranking["accuracy"] * s.scale).map(lambda v: tables.fmt(v, 1)),
            "accuracy rank": ranking["accuracy_rank"].map(lambda v: tables.fmt(v, 2)),
        }
    )
    rho = corr.set_index("dataset").loc["all"]
    per = corr[corr["dataset"] != "all"]["rho"]
    text = (
        f"{mode} input. Components by plasticity (highest first): "
        f"{' > '.join(ranking.index)}; by accuracy: "
        f"{' > '.join(ranking.sort_values('accuracy_rank').index)}. Spearman rho between "
        f"plasticity and accuracy: {tables.fmt(per.mean(), 2)} on average over "
        f"{per.notna().sum()} datasets; {tables.fmt(rho['rho'], 2)} ({_p(rho['p'])}) "
        "between the means over datasets.\n\n" + tables.markdown(shown)
    )
    with_ci = trust.correlation(
        f"{mode} input, with intervals. Components by plasticity",
        comp_p,
        s.scores,
        s.order,
        list(s.table.index),
        s.options,
        f"plasticity_{mode}",
    )
    return Section(
        f"{text}\n\n{with_ci.markdown}",
        (
            Table(f"plasticity_ranking_{mode}", shown, ranking),
            Table(
                f"plasticity_correlation_{mode}",
                corr.set_index("dataset").map(lambda v: tables.fmt(v, 3)),
                corr,
                index=True,
            ),
            *with_ci.tables,
        ),
    )


def _model_notes(runs: pd.DataFrame | None) -> list[str]:
    """What the models' registry says a reader of their plasticity should know."""
    from raystudy.models import registry

    names = sorted(set(runs["model"].dropna())) if runs is not None and "model" in runs else []
    return [n for n in (registry.plasticity_note(m) for m in names) if n]


def grad_norm(s: Study) -> Section | None:
    """The components ranked by the gradient norm of the trained component, against accuracy."""
    if s.bands is None or not len(s.bands) or not (s.bands["key"] == "grad_norm/{condition}").any():
        return None
    part = trust.correlation(
        "Components by gradient norm of the trained component",
        trust.grad_norms(s.bands),
        s.scores,
        s.order,
        list(s.table.index),
        s.options,
        "grad_norm",
    )
    return section("Gradient norm and accuracy", part.markdown, part.tables)


SECTIONS = (
    head,
    answer,
    stability,
    main_table,
    selection,
    robustness,
    gain,
    efficiency,
    significance,
    intervals,
    rope,
    budget,
    variance,
    curves,
    plasticity,
    grad_norm,
)


def of(s: Study) -> list[Section]:
    """The sections of ``s`` that apply, in the report's order."""
    return [part for f in SECTIONS if (part := f(s)) is not None]
