"""The study's report as one call: runs (from MLflow or a CSV) to every table, test and figure
in one folder, logged back to the grid's parent run (``raystudy report`` is its command line).

``analyse`` writes one study setting (model, optimizer, low data); ``analyse_runs`` each setting
found in a runs table, and across them the optimizer ablation and the settings' means;
``report_from_mlflow`` and ``report_from_csv`` read the runs and call it. What each section holds
is ``analysis.sections``'; the report's flags and what they mean are the command's
(``analysis.commands.report``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from analysis import figures, load, output, study, tables
from analysis.sections import paper
from analysis.sections.paper import CURVE_KEYS
from analysis.stats import selection, variance
from analysis.study import paper_order  # noqa: F401 - callers use analysis.reporting.paper_order

# The paper's own comparison: the five single components (--paper-comparison).
PAPER_COMPARISON = ("LN1", "MHA", "LN2", "FC1", "FC2")


@dataclass
class Report:
    """What ``analyse`` produced: the printed text and the files written."""

    text: str
    files: list[Path] = field(default_factory=list)
    logged_to: list[str] = field(default_factory=list)


def selected_runs(runs: pd.DataFrame, best: pd.DataFrame) -> pd.DataFrame:
    """The finished runs at the chosen lr of each (dataset, condition)."""
    m = runs.merge(best[["dataset", "condition", "lr"]], on=["dataset", "condition", "lr"])
    return m[m["status"] == "finished"]


# ---------------------------------------------------------------- the analysis of one study


def analyse(out_dir: str | Path, *, draw_figures: bool = True, **study_args) -> Report:
    """Write the tables, tests and figures of one study (one model, optimizer) into ``out_dir``.

    ``study_args`` are ``analysis.study.build``'s: ``runs`` (the per-run table of
    ``analysis.load``) or ``summary`` (per-dataset means); ``bands`` (``variance.curve_bands`` of the
    selected runs) and ``plasticity`` (stacked plasticity artifacts) add their figures and tables;
    ``options`` are the flags of the interval, equivalence and budget sections
    (``trust.Options``); ``t_alternative`` is the paired t-test's alternative (the paper's:
    two-sided); ``compare`` the conditions that ranks, the paired tests, Friedman and the CD
    diagram are over (default: all analysed); ``gain_reference`` the condition relative gains
    are over (default: linear_probe if present, else ``reference``); also ``select_on``,
    ``reference``, ``conditions``, ``datasets``, ``ddof``, ``title``. ``draw_figures``: off, the
    tables and tests alone. Every section is computed before anything is written: bad input
    raises AnalysisError and writes nothing.
    """
    parts = paper.of(study.build(**study_args))
    return Report(text=output.text(parts), files=output.write(out_dir, parts, draw_figures))


# ---------------------------------------------------------------- sources


def _setting_name(setting: tuple) -> str:
    model, optimizer, low = setting
    return f"{model}_{optimizer}" + ("_low_data" if low == "True" else "")


def _title(setting: tuple) -> str:
    model, optimizer, low = setting
    named = [v for v in (model, optimizer) if v != "unknown"] + (["low data"] if low == "True" else [])
    return "raystudy analysis" + (f": {', '.join(named)}" if named else "")


def analyse_runs(runs: pd.DataFrame, out_dir: str | Path, *, extras=None, draw_figures: bool = True, **kw) -> Report:
    """``analyse`` once per study setting (model, optimizer, low data) found in ``runs``.

    A single setting writes into ``out_dir``; several write one subfolder each, and into
    ``out_dir`` the tables across them (``across_settings``) and a ``report.md`` of it all.
    ``extras(runs_of_one_setting)`` may return (bands, plasticity) for that setting. Every
    setting is checked and computed before any is written.
    """
    found = load.settings(runs)
    planned = []
    for s in found:
        sub = runs[(runs[load.SETTING].astype(str) == list(s)).all(axis=1)].copy()
        sub.attrs = dict(runs.attrs)
        bands, plast = extras(sub) if extras else (None, None)
        target = Path(out_dir) if len(found) == 1 else Path(out_dir) / _setting_name(s)
        planned.append((target, paper.of(study.build(runs=sub, bands=bands, plasticity=plast, title=_title(s), **kw))))
    across = (
        [
            across_settings(
                runs,
                select_on=kw.get("select_on", "val"),
                conditions=kw.get("conditions"),
                datasets=kw.get("datasets"),
                ddof=kw.get("ddof", 0),
                as_paper=kw.get("as_paper", False),
            )
        ]
        if len(found) > 1
        else []
    )
    texts = [output.text(parts) for parts in [across] + [p for _, p in planned] if parts]
    files = [f for target, parts in planned for f in output.write(target, parts, draw_figures)]
    if across:
        files += output.write(out_dir, across, draw_figures, markdown="\n".join(texts))
    return Report(text="\n".join(texts), files=files)


def _optimizer_order(names) -> list[str]:
    return sorted(names, key=lambda o: (o.lower() != "sgd", o.lower()))


def across_settings(
    runs: pd.DataFrame,
    *,
    select_on: str = "val",
    conditions: list[str] | None = None,
    datasets: list[str] | None = None,
    ddof: int = 0,
    as_paper: bool = False,
) -> output.Section:
    """The tables across study settings: per model (and low-data flag) the optimizer ablation
    (mean over datasets at the chosen lr, one column per optimizer) where it has runs of two or
    more optimizers; with several models, every setting's means side by side (``settings``).
    ``as_paper``: as the paper's ablation table, each cell averaged over every lr of one seed
    (``selection.paper_seed``: 0) instead, and beside each mean the mean over datasets of each
    dataset's std over those runs. Each setting's own tables are in its subfolder."""
    runs = study.restrict(runs, conditions, datasets, runs.attrs.get("source", "runs"))
    bests = _setting_cells(runs, select_on, ddof, as_paper)
    order = selection.order_conditions(runs["condition"], study.paper_order())
    scale = selection.display_scale(runs["test_acc"])
    unit = " (%)" if scale == 100 else ""
    how, at = _ablation_wording(runs, select_on, as_paper)
    spread = "test_std" if as_paper else None
    parts = [
        f"Mean test accuracy{unit} over datasets {at}; each "
        "condition over the datasets every column has runs on (column datasets)."
    ]
    groups: dict[tuple, dict[str, pd.DataFrame]] = {}
    for (model, optimizer, low), b in bests.items():
        groups.setdefault((model, low), {})[optimizer] = b
    means = []  # (Markdown, table, figure) of each table of settings' means
    for (model, low), by_opt in groups.items():
        what = model + (", low data" if low == "True" else "")
        if len(by_opt) < 2:
            parts.append(f"Optimizer ablation, {what}: runs of one optimizer only ({', '.join(by_opt)}); no table.")
            continue
        ab = selection.setting_means({o: by_opt[o] for o in _optimizer_order(by_opt)}, order, spread=spread)
        name = "optimizer_ablation_" + model + ("_low_data" if low == "True" else "")
        caption = f"Optimizer ablation, {what}: mean test accuracy{unit}, {how}"
        means.append(_setting_means(ab, name, caption, f"Optimizer ablation, {what}", scale))
        parts.append(means[-1][0])
    if len({m for m, _, _ in bests}) > 1:
        ab = selection.setting_means(
            {
                ", ".join(v for v in (m, o, "low data" if low == "True" else "") if v): b
                for (m, o, low), b in bests.items()
            },
            order,
            spread=spread,
        )
        caption = f"Every setting: mean test accuracy{unit}, {how}"
        means.append(_setting_means(ab, "settings", caption, "Every setting", scale))
        parts.append(means[-1][0])
    parts.append(f"Each setting's own tables and tests: the subfolders {', '.join(_setting_name(s) for s in bests)}.")
    return output.section(
        "Across settings: optimizer ablation and models",
        "\n\n".join(parts),
        [t for _, t, _ in means],
        [f for _, _, f in means],
    )


def _ablation_wording(runs: pd.DataFrame, select_on: str, as_paper: bool) -> tuple[str, str]:
    """How the ablation's cells were computed, for its captions and for its lead line."""
    if as_paper:
        seed = selection.paper_seed(runs)
        return (
            f"every lr of seed {seed} averaged, ± the mean over datasets of each dataset's std over them, as the paper",
            f"averaged over every lr of seed {seed} (± the mean over datasets of each dataset's std over "
            "the lrs), as the paper's ablation table",
        )
    chosen = {"val": "validation", "test": "test"}[select_on]
    return f"lr chosen on {chosen}", f"at the lr chosen on {chosen} accuracy"


def _setting_cells(runs: pd.DataFrame, select_on: str, ddof: int, as_paper: bool) -> dict[tuple, pd.DataFrame]:
    """Per study setting, its cells' test accuracy: at the lr chosen on ``select_on``, or with
    ``as_paper`` averaged over every lr of the paper's seed (``selection.lr_averaged``)."""
    cells = {}
    seed = selection.paper_seed(runs) if as_paper else None
    for s in load.settings(runs):
        sub = runs[(runs[load.SETTING].astype(str) == list(s)).all(axis=1)]
        cells[s] = selection.lr_averaged(sub, ddof, seed) if as_paper else selection.choose_lrs(sub, select_on, ddof)
    return cells


def _setting_means(
    ab: pd.DataFrame, name: str, caption: str, title: str, scale: float
) -> tuple[str, output.Table, output.Figure]:
    """One table of settings' means (``selection.setting_means``): its Markdown, table and figure."""
    shown = tables.ablation_table(ab, scale)
    return (
        f"{caption}:\n\n{tables.markdown(shown).rstrip()}",
        output.Table(name, shown, ab, caption=caption),
        output.Figure(name, functools.partial(figures.setting_means, ab, scale=scale, title=title)),
    )


def report_from_mlflow(
    experiment: str,
    out_dir: str | Path,
    tracking_uri: str | None = None,
    *,
    curves: bool = True,
    log: bool = True,
    **kw,
) -> Report:
    """Load the experiment's trial runs, analyse them, and log ``out_dir`` to the grid run(s).

    Curves are read for the finished runs at the chosen lr of each cell; plasticity before
    finetuning from every run that probed (they all probe the same pretrained model).
    """
    runs = load.from_mlflow(experiment, tracking_uri, diverged_tested=kw.get("as_paper", False))

    def extras(sub: pd.DataFrame):
        sub = study.restrict(sub, kw.get("conditions"), kw.get("datasets"), "runs")
        bands = None
        if curves:
            best = selection.choose_lrs(sub, kw.get("select_on", "val"))
            chosen = selected_runs(sub, best)
            hist = load.step_metrics(chosen, list(CURVE_KEYS), tracking_uri)
            bands = variance.curve_bands(hist, chosen) if len(hist) else None
        return bands, load.plasticity(sub, "before", tracking_uri)

    report = analyse_runs(runs, out_dir, extras=extras, **kw)
    if (line := load.rehearsal_line(runs, "the report of")) is not None:  # first, where it is read and logged
        report.text = f"{line}\n\n{report.text}"
        md = Path(out_dir) / "report.md"
        if md.is_file():
            md.write_text(f"**{line}**\n\n{md.read_text()}")
    if log:
        report.logged_to = log_outputs(out_dir, runs, experiment, tracking_uri)
    return report


def log_outputs(out_dir: str | Path, runs: pd.DataFrame, experiment: str, tracking_uri: str | None = None) -> list[str]:
    """Log ``out_dir`` as ``analysis/`` artifacts of the grid parent run(s) of ``runs``, and its
    ``report.md`` into their description (what the UI shows on the run's page)."""
    from raystudy.tracking import record

    grids = load.grid_runs(experiment, tracking_uri)
    parents = [p for p in dict.fromkeys(runs["parent_run_id"]) if p in grids] or grids
    c = load.client(tracking_uri)
    md = Path(out_dir) / "report.md"
    for pid in parents:
        c.log_artifacts(pid, str(out_dir), artifact_path="analysis")
        if md.is_file():
            record.attach_report(c, pid, md.read_text())
    return parents


def report_from_csv(path: str | Path, out_dir: str | Path, *, plasticity: pd.DataFrame | None = None, **kw) -> Report:
    """The report of a per-run results CSV or a per-dataset summary CSV (``analysis.load``); with
    ``as_paper`` its diverged rows that were tested count, as ``report_from_mlflow`` counts them."""
    kind, df = load.read_csv(path, diverged_tested=kw.get("as_paper", False))
    if kind == "summary":
        kw.pop("select_on", None)
        return analyse(out_dir, summary=df, plasticity=plasticity, **kw)
    extras = None
    if plasticity is not None:

        def extras(sub):
            same = plasticity[plasticity["model"].isin(set(sub["model"]))]
            return None, same if len(same) else plasticity

    return analyse_runs(df, out_dir, extras=extras, **kw)
