"""Export the best configuration of each condition as YAML that reruns as it is.

    python -m raystudy export --experiment NAME [--tracking-uri URI] --out best/
    python -m raystudy export --experiment NAME --per-dataset --select-on test --out best/

Per dataset (``--per-dataset``): for each (dataset, condition), the lr with the best seed-mean
accuracy (validation by default, test with ``--select-on test``) and, at that lr, the seed whose
run scored best; written to ``OUT/<dataset>/<condition>.yaml``. Over all datasets (default):
for each condition, the lr with the best mean over datasets among the lrs tried on every
dataset, and the seed best on average there; written to ``OUT/<condition>.yaml``, with the
first dataset's run as the file's dataset (a comment lists the others).

Each file is the winning run's own config (its ``config.yaml`` artifact, or its params turned
back into typed values), begins with the command that reruns it, and loads with
``raystudy.train.config.load_config``:

    python -m raystudy finetune --config best/MHA.yaml

Bad input exits with status 2 and one line on stderr.
"""

from __future__ import annotations

import sys

from analysis import AnalysisError, load
from analysis.best_config import check, export
from analysis.stats import selection
from raystudy.errors import ConfigError


def build_parser():
    """The command line of ``python -m raystudy export``."""
    from raystudy.commands import cli

    ap = cli.Parser("raystudy export", __doc__)
    ap.add_argument("--experiment", required=True, help="MLflow experiment name (or id)")
    ap.add_argument(
        "--tracking-uri",
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///./mlflow.db, as the grid)",
    )
    ap.add_argument("--per-dataset", action="store_true", help="one file per dataset and condition")
    ap.add_argument(
        "--select-on",
        choices=selection.SELECT_ON,
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
    from raystudy.commands import cli

    args = build_parser().parse_args(argv)
    from raystudy.tracking import connect

    try:  # before MLflow's seconds of imports
        cli.check_folder("--out", args.out)
        uri = args.tracking_uri or connect.default_uri()
        connect.check_uri(uri, must_exist=True)
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
        rehearsal = load.rehearsal_line(runs, "the export of")
    except (AnalysisError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except MlflowException as e:
        print(f"error: MLflow: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    if rehearsal is not None:  # its configs are real, the numbers that chose them are not
        print(rehearsal)
    for p in paths:
        print(p)
    for problem in check(paths):
        print(f"warning: does not validate on this machine: {problem}", file=sys.stderr)
    print(
        f"wrote {len(paths)} config(s); rerun one with: python -m raystudy finetune --config "
        f"{paths[0] if paths else 'FILE'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
