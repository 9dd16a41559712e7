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

Past the p-values (``analysis.sections.trust``, over every condition analysed): effect sizes beside every
test (Hodges-Lehmann shift with its interval, rank-biserial r); stratified-bootstrap intervals of
each condition's mean and IQM, of every pairwise difference and of the probability of improvement
(``--bootstrap-reps``, ``--bootstrap-seed``, ``--bootstrap-over``); Bayesian signed-rank and
hierarchical tests with a region of practical equivalence (``--rope`` accuracy points,
``--no-hierarchical``); the CD diagram's bars from Nemenyi or from the Wilcoxon-Holm tests
(``--cd-cliques``); the expected best accuracy against the number of lrs tried and lrs chosen at
the edge of their grid; the split of the runs' variance into dataset, lr and seed; rank
correlations of plasticity and gradient norm with accuracy, with bootstrap intervals.

Everything goes to ``--out`` (tables as .md/.csv/.tex, figures as .png/.pdf unless
``--no-figures``, ``report.md``); the report is printed. Read from MLflow, the folder is also
logged as ``analysis/`` artifacts of the grid's parent run. Bad input exits with status 2 and one
line on stderr.
"""

from __future__ import annotations

import functools
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from analysis import AnalysisError, figures, load, output, study, tables
from analysis.sections import paper, trust
from analysis.sections.paper import CURVE_KEYS
from analysis.stats import selection, significance, variance
from analysis.study import paper_order  # noqa: F401 - callers use analysis.report.paper_order

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
    ``as_paper``: each cell averaged over every lr and seed instead (``selection.lr_averaged``), as
    the paper's ablation table. Each setting's own tables are in its subfolder."""
    runs = study.restrict(runs, conditions, datasets, runs.attrs.get("source", "runs"))
    bests = _setting_cells(runs, select_on, ddof, as_paper)
    order = selection.order_conditions(runs["condition"], study.paper_order())
    scale = selection.display_scale(runs["test_acc"])
    unit = " (%)" if scale == 100 else ""
    chosen = {"val": "validation", "test": "test"}[select_on]
    how = "every lr and seed averaged, as the paper" if as_paper else f"lr chosen on {chosen}"
    at = "averaged over every lr and seed, as the paper's ablation table" if as_paper else ""
    parts = [
        f"Mean test accuracy{unit} over datasets {at or f'at the lr chosen on {chosen} accuracy'}; each "
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
        ab = selection.setting_means({o: by_opt[o] for o in _optimizer_order(by_opt)}, order)
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


def _setting_cells(runs: pd.DataFrame, select_on: str, ddof: int, as_paper: bool) -> dict[tuple, pd.DataFrame]:
    """Per study setting, its cells' test accuracy: at the lr chosen on ``select_on``, or with
    ``as_paper`` averaged over every lr and seed (``selection.lr_averaged``)."""
    cells = {}
    for s in load.settings(runs):
        sub = runs[(runs[load.SETTING].astype(str) == list(s)).all(axis=1)]
        cells[s] = (
            selection.lr_averaged(sub, ddof)
            if as_paper
            else selection.best_lr(selection.seed_means(sub, ddof), select_on)
        )
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
            best = selection.best_lr(selection.seed_means(sub), kw.get("select_on", "val"))
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
    """The command line of ``python -m analysis.report``."""
    from raystudy import cli

    ap = cli.Parser("python -m analysis.report", __doc__)
    _add_source_args(ap)
    _add_comparison_args(ap)
    _add_trust_args(ap)
    _add_output_args(ap)
    return ap


def _add_source_args(ap) -> None:
    """Add where the runs come from: the MLflow experiment or the CSV, and the tracking URI."""
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--experiment", help="MLflow experiment name (or id)")
    src.add_argument("--csv", help="per-run results or per-dataset summary CSV")
    ap.add_argument(
        "--tracking-uri",
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///./mlflow.db, as the grid)",
    )


def _add_comparison_args(ap) -> None:
    """Add how the lr is chosen, which conditions are compared and against which, and what is read."""
    ap.add_argument(
        "--select-on",
        choices=selection.SELECT_ON,
        help="choose the lr on validation (default; test with --as-paper) or test accuracy",
    )
    ap.add_argument(
        "--as-paper",
        action="store_true",
        help="the tables and figures as the paper computed them: lr chosen on test, the five "
        "components compared, tests on the means rounded to 2 decimals, the optimizer ablation "
        "averaged over every lr, the paper's error bars (docs/study.md lists each)",
    )
    ap.add_argument("--reference", default="MHA", help="condition tested against the others (MHA)")
    ap.add_argument(
        "--t-alternative",
        choices=significance.T_ALTERNATIVES,
        default="two-sided",
        help="paired t-test: two-sided (default, the paper's) or one-sided, the "
        "reference greater (the Wilcoxon test is one-sided, as in the paper)",
    )
    ap.add_argument(
        "--paper-comparison",
        action="store_true",
        help="ranks, paired tests, Friedman and the CD diagram over the paper's five "
        "components (LN1, MHA, LN2, FC1, FC2); tables keep every condition",
    )
    ap.add_argument(
        "--gain-reference",
        help="condition the relative gains are over (default: linear_probe if present, else --reference)",
    )
    ap.add_argument("--conditions", help="comma-separated conditions to analyse (default: all)")
    ap.add_argument("--datasets", help="comma-separated datasets to analyse (default: all)")
    ap.add_argument("--plasticity", help="tidy plasticity CSV to add (with --csv)")
    ap.add_argument("--no-curves", action="store_true", help="skip reading metric histories")


def _add_trust_args(ap) -> None:
    """Add the settings of the trust sections: ROPE, CD cliques, bootstrap and the hierarchical test."""
    from raystudy import cli

    ap.add_argument(
        "--rope",
        type=float,
        default=0.5,
        help="half-width of the region of practical equivalence, in accuracy points (0.5)",
    )
    ap.add_argument(
        "--cd-cliques",
        choices=trust.CD_CLIQUES,
        default="nemenyi",
        help="bars of the CD diagram: Nemenyi mean ranks (default) or Wilcoxon-Holm pairs",
    )
    ap.add_argument(
        "--bootstrap-reps", type=int, default=2000, help=f"bootstrap replicates (2000; {cli.bound('--bootstrap-reps')})"
    )
    ap.add_argument(
        "--bootstrap-seed",
        type=int,
        default=0,
        help="seed of the bootstrap and the Bayesian tests' sampling (0; 0 <= seed < 2**32)",
    )
    ap.add_argument(
        "--bootstrap-over",
        choices=trust.BOOTSTRAP_OVER,
        default="datasets+seeds",
        help="resample datasets and seeds (default) or seeds within fixed datasets",
    )
    ap.add_argument(
        "--no-hierarchical", action="store_true", help="skip the hierarchical Bayesian test over datasets and seeds"
    )


def _add_output_args(ap) -> None:
    """Add what is written and where: figures, MLflow logging and the output folder."""
    ap.add_argument(
        "--no-figures",
        action="store_true",
        help="write the tables, tests and report.md only: draw no figures (each takes a second or so)",
    )
    ap.add_argument("--no-log", action="store_true", help="do not log the outputs to MLflow")
    ap.add_argument("--out", default="analysis_out", help="output folder (default: analysis_out)")


def main(argv: list[str] | None = None) -> int:
    """Write the report of an MLflow experiment or a CSV and print it; returns the exit status:
    0, or 2 with one ``error:`` line on bad input (nothing written then)."""
    from raystudy import cli
    from raystudy.errors import ConfigError

    args = build_parser().parse_args(argv)
    try:
        _check_args(args)
    except (AnalysisError, ConfigError) as e:
        return cli.fail(e)
    kw = _report_kwargs(args)
    from raystudy.tracking import connect

    uri = None
    if args.experiment:
        uri = args.tracking_uri or connect.default_uri()
        try:  # before MLflow's seconds of imports
            connect.check_uri(uri, must_exist=True)
        except ConfigError as e:
            return cli.fail(e)
    return _write_report(args, uri, kw)


def _check_args(args) -> None:
    """Raise ``AnalysisError`` or ``ConfigError`` on the first bad value or contradicting flags."""
    from raystudy import cli

    if not (math.isfinite(args.rope) and args.rope >= 0):
        raise AnalysisError(f"--rope must be a finite number >= 0, got {args.rope}")
    cli.check_count("--bootstrap-reps", args.bootstrap_reps)
    cli.check_seed("--bootstrap-seed", args.bootstrap_seed)
    cli.check_unused(
        "--csv",
        args.csv is not None,
        {"--tracking-uri": args.tracking_uri, "--no-curves": args.no_curves, "--no-log": args.no_log},
    )
    cli.check_unused("--experiment", args.experiment is not None, {"--plasticity": args.plasticity})
    cli.check_folder("--out", args.out)


def _report_kwargs(args) -> dict:
    """The keyword arguments both ``report_from_mlflow`` and ``report_from_csv`` take, from the parsed flags."""
    opts = trust.Options(
        rope=args.rope,
        reps=args.bootstrap_reps,
        seed=args.bootstrap_seed,
        over=args.bootstrap_over,
        hierarchical=not args.no_hierarchical,
        cd_cliques=args.cd_cliques,
    )
    return dict(
        select_on=args.select_on or ("test" if args.as_paper else "val"),
        reference=args.reference,
        conditions=_names(args.conditions),
        datasets=_names(args.datasets),
        options=opts,
        t_alternative=args.t_alternative,
        gain_reference=args.gain_reference,
        compare=list(PAPER_COMPARISON) if args.paper_comparison or args.as_paper else None,
        draw_figures=not args.no_figures,
        as_paper=args.as_paper,
    )


def _write_report(args, uri: str | None, kw: dict) -> int:
    """Write the report from the experiment at ``uri`` or from the CSV and print it and what was written;
    returns 0, or 2 after one ``error:`` line."""
    from mlflow.exceptions import MlflowException

    from raystudy.errors import ConfigError

    try:
        if args.experiment:
            report = report_from_mlflow(
                args.experiment, args.out, uri, curves=not args.no_curves, log=not args.no_log, **kw
            )
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
    print(
        f"wrote {len(report.files)} files to {args.out}"
        + (f"; logged them to run(s) {', '.join(report.logged_to)} under analysis/" if report.logged_to else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
