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
``raystudy.train.config.load_config``:

    python -m raystudy.finetune --config best/MHA.yaml

Bad input exits with status 2 and one line on stderr.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from analysis import AnalysisError, load
from analysis.best_config import (  # noqa: F401 - callers use them as export_best's
    best_overall,
    best_per_dataset,
    coerce_params,
    header,
    run_config,
    slug,
)
from analysis.best_config import write as write_config
from analysis.stats import selection
from raystudy.train.config import ConfigError, validate


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
            written.append(write_config(path, row, cfg, select_on, per_dataset, scale))
            if rehearsal is not None:  # a file read on its own says it too
                path.write_text(f"# {rehearsal}\n{path.read_text()}")
    return written


def check(paths: list[Path]) -> list[str]:
    """Load and validate each written file; the one-line problems of those that fail here."""
    from raystudy.train.config import load_config

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
    from raystudy import cli

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
        f"wrote {len(paths)} config(s); rerun one with: python -m raystudy.finetune --config "
        f"{paths[0] if paths else 'FILE'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
