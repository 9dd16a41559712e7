"""The study's report: tables, significance tests and figures from MLflow runs or a CSV.

    python -m raystudy report --experiment NAME [--tracking-uri URI] [--out DIR]
    python -m raystudy report --csv runs.csv [--select-on test] [--reference MHA]
    python -m raystudy report --csv paper_means.csv --reference MHA      # a per-dataset summary
    python -m raystudy report --csv paper_table.csv --paper-comparison   # dataset + one column per condition

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

import math
import sys

from analysis import AnalysisError, load
from analysis.reporting import PAPER_COMPARISON, report_from_csv, report_from_mlflow
from analysis.sections import trust
from analysis.stats import selection, significance

# ---------------------------------------------------------------- CLI


def _names(text: str | None) -> list[str] | None:
    return [t.strip() for t in text.split(",") if t.strip()] if text else None


def build_parser():
    """The command line of ``python -m raystudy report``."""
    from raystudy.commands import cli

    ap = cli.Parser("raystudy report", __doc__)
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
    from raystudy.commands import cli

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
    from raystudy.commands import cli
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
    from raystudy.commands import cli

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
