"""Runs from MLflow or a CSV → one tidy DataFrame; step metrics and plasticity artifacts.

The *runs* table has one row per run (``RUN_COLUMNS``, the run record's: ``raystudy.tracking.query``):
run_id, model, optimizer, low_data, dataset, condition, lr, seed, val_acc, test_acc, status.
``val_acc`` is the best validation accuracy (the checkpoint tested), ``test_acc`` its test
accuracy, ``status`` one of finished, diverged, failed, stopped (an adaptive grid's policy, or
a search's ASHA, ended it early) or running (a grid still going). Diverged, failed and stopped
runs are kept, with NaN accuracies; they are never dropped or counted as 0.

Two CSV formats are read:

- *per-run results*: the runs table above. Required: dataset, condition, lr, seed, test_acc.
  Optional: run_id (default: the row number), model and optimizer (default ``unknown``),
  low_data (default false), val_acc (default NaN: the lr can then only be chosen on test),
  status (default: finished where test_acc is a number, failed where it is empty),
  trainable_params (default NaN: no parameter-efficiency table).
  ``raystudy report`` writes its input in this format as ``runs.csv``.
- *per-dataset summary*: ``dataset, condition, mean[, std]``, one row per cell, e.g. a paper's
  published table of per-dataset means at the best lr. Enough for ranks, averages and tests.
- *the paper's table shape*: a ``dataset`` column and one column per condition, one row per
  dataset (no ``condition`` column); a cell is a mean or ``mean ± std``. Read as a per-dataset
  summary; a row named average/avg/mean is a summary row, not a dataset, and is dropped.

MLflow layout read (what ``raystudy``'s grid writes): trial runs tagged ``raystudy.role=trial``
with tags condition, dataset, model, optimizer, ``raystudy.status`` and ``raystudy.error``;
params = the flat FinetuneConfig; metrics best_val_acc and test_acc (final), val_loss and
``grad_norm/<COMPONENT>`` (per step); artifacts config.yaml and plasticity_{before,after}.csv.
The grid's parent run is tagged ``raystudy.role=grid``.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import AnalysisError
from analysis.stats import pooling
from raystudy.errors import check_input_file
from raystudy.tracking import connect, query, tags

# The runs table's columns are the run record's (raystudy.tracking), listed there once.
RUN_COLUMNS, EXTRA_COLUMNS, DIVERGED_TESTED = query.RUN_COLUMNS, query.EXTRA_COLUMNS, query.DIVERGED_TESTED
SETTING = ["model", "optimizer", "low_data"]  # runs that share these are one study
REQUIRED_RUN_CSV = ["dataset", "condition", "lr", "seed", "test_acc"]
REQUIRED_SUMMARY_CSV = ["dataset", "condition", "mean"]
PLASTICITY_COLUMNS = [
    "model",
    "dataset",
    "mode",
    "layer",
    "component",
    "mean",
    "std",
    "n",
    "ci_low",
    "ci_high",
    "bound",
]
INTERVAL = ["ci_low", "ci_high"]  # computed from n, mean and std where a table lacks them


# ---------------------------------------------------------------- one run → one row

# How a run becomes a row is the run record's business (raystudy.tracking); kept here by name.
run_row = query.run_row


NO_TEST_ACC = "finished without a test_acc value"


def dedupe(runs: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """One row per trial key: a rerun of the same trial replaces the earlier try.

    A finished try wins over any other; among equals the latest (``start_time``) wins. Rows
    without a key are all kept. Returns the table and how many rows were replaced.
    """
    if "key" not in runs or not (runs["key"] != "").any():
        return runs, 0
    keyed, loose = runs[runs["key"] != ""], runs[runs["key"] == ""]
    ordered = keyed.assign(_done=keyed["status"] == "finished").sort_values(["_done", "start_time"])
    kept = ordered.drop_duplicates("key", keep="last").drop(columns="_done")
    out = pd.concat([kept, loose]).sort_index()
    return out, len(runs) - len(out)


# ---------------------------------------------------------------- MLflow


def client(tracking_uri: str | None = None):
    """An MLflow client of ``tracking_uri`` (``raystudy.tracking.connect.client``)."""
    return connect.client(tracking_uri)


def experiment_id(experiment: str, tracking_uri: str | None = None) -> str:
    """The id of an experiment given by name (or id); AnalysisError naming the known ones."""
    from mlflow.exceptions import MlflowException

    c = client(tracking_uri)
    exp = c.get_experiment_by_name(experiment)
    if exp is None and str(experiment).isdigit():
        try:
            exp = c.get_experiment(str(experiment))
        except MlflowException:
            exp = None
    if exp is None:
        known = [e.name for e in c.search_experiments()]
        where = tracking_uri or "the default tracking URI"
        raise AnalysisError(
            f"unknown MLflow experiment {experiment!r} at {where}; experiments "
            f"there: {', '.join(known) if known else 'none'}"
        )
    return exp.experiment_id


def from_mlflow(experiment: str, tracking_uri: str | None = None, *, diverged_tested: bool = False) -> pd.DataFrame:
    """The runs table of every trial run of ``experiment`` (name or id).

    Raises AnalysisError for an unknown experiment, one without trial runs, or one where no
    run finished. Reruns of a trial key are reduced to one row (``dedupe``); the frame's
    ``attrs`` record the experiment, tracking URI and how many rows were replaced.
    ``diverged_tested``: a diverged run whose best checkpoint before it diverged was tested counts
    as finished with those accuracies, as the paper's code (which never checks) counts it;
    ``attrs["diverged_tested"]`` says how many.
    """
    c = client(tracking_uri)
    exp_id = experiment_id(experiment, tracking_uri)
    found = query.trial_runs(c, exp_id)
    if not found:
        raise AnalysisError(
            f"experiment {experiment!r} has no trial runs (runs tagged raystudy.role=trial); has the grid started?"
        )
    table = pd.DataFrame(query.rows(found), columns=RUN_COLUMNS + EXTRA_COLUMNS + DIVERGED_TESTED)
    tested = (table["status"] == "diverged") & table["diverged_test_acc"].notna() & diverged_tested
    table.loc[tested, ["val_acc", "test_acc"]] = table.loc[tested, DIVERGED_TESTED].to_numpy()
    table.loc[tested, "status"] = "finished"
    runs, replaced = dedupe(table.drop(columns=DIVERGED_TESTED))
    if diverged_tested:
        runs.attrs["diverged_tested"] = int(tested.sum())
    runs = runs.sort_values(["dataset", "condition", "lr", "seed"], ignore_index=True)
    check_runs(runs, f"experiment {experiment!r}")
    runs.attrs.update(
        source=f"MLflow experiment {experiment!r}",
        experiment=experiment,
        experiment_id=exp_id,
        tracking_uri=tracking_uri,
        replaced=replaced,
        rehearsal=sum(r.tags.get(tags.REHEARSAL) == "1" for r in found),
    )
    return runs


def rehearsal_line(runs: pd.DataFrame, what: str) -> str | None:
    """The first line of ``what`` (``the report of``: then the count) made from a dress rehearsal's runs
    (``raystudy grid --rehearse``, counted by ``from_mlflow``): none of their numbers is a result."""
    n = runs.attrs.get("rehearsal", 0)
    if not n:
        return None
    return (
        f"REHEARSAL: {what} {n} synthetic run(s) of a dress rehearsal (raystudy grid --rehearse): "
        "no model was trained, no number here is a result"
    )


def check_runs(runs: pd.DataFrame, source: str) -> None:
    """Raise AnalysisError when no run of ``runs`` finished, giving the counts by status."""
    counts = runs["status"].value_counts()
    if counts.get("finished", 0) == 0:
        detail = ", ".join(f"{n} {s}" for s, n in counts.items())
        raise AnalysisError(f"{source}: no finished runs ({detail or 'no runs at all'})")


def grid_runs(experiment: str, tracking_uri: str | None = None) -> list[str]:
    """Ids of the experiment's grid parent runs (tag ``raystudy.role=grid``)."""
    c = client(tracking_uri)
    return [r.info.run_id for r in query.find_runs(c, experiment_id(experiment, tracking_uri), raystudy__role="grid")]


def run_params(run_id: str, tracking_uri: str | None = None) -> dict[str, str]:
    """The params a run logged, as strings."""
    return dict(client(tracking_uri).get_run(run_id).data.params)


def read_artifact(run_id: str, path: str, tracking_uri: str | None = None) -> str | None:
    """The text of one artifact of a run, or None when the run has no such file."""
    c = client(tracking_uri)
    parent = os.path.dirname(path) or None
    if path not in {f.path for f in c.list_artifacts(run_id, parent)}:
        return None
    with tempfile.TemporaryDirectory() as tmp, _no_progress_bars():
        return Path(c.download_artifacts(run_id, path, dst_path=tmp)).read_text()


@contextlib.contextmanager
def _no_progress_bars():
    """MLflow draws a progress bar per download on stderr; not for hundreds of small files."""
    key = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    before = os.environ.get(key)
    os.environ[key] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


def step_metrics(runs: pd.DataFrame, keys: Iterable[str], tracking_uri: str | None = None) -> pd.DataFrame:
    """Metric histories of ``runs`` as a tidy table (run_id, key, step, value).

    A key may name the run's condition, ``grad_norm/{condition}``: the gradient norm of the
    component a single-component condition trains. Keys a run did not log give no rows.
    """
    c = client(tracking_uri)
    wanted = [(run.run_id, t, t.format(condition=run.condition)) for run in runs.itertuples() for t in keys]
    # on a database store, a query per 500 runs; else MLflow's call per run and key
    found = query.metric_histories(c, [w[0] for w in wanted], [w[2] for w in wanted])
    rows = []
    for run_id, template, key in wanted:
        if found is None:
            points = [(m.step, m.value) for m in c.get_metric_history(run_id, key)]
        else:
            points = found.get((run_id, key), [])
        rows += [(run_id, template, step, value) for step, value in points]
    return pd.DataFrame(rows, columns=["run_id", "key", "step", "value"])


def plasticity(runs: pd.DataFrame, which: str = "before", tracking_uri: str | None = None) -> pd.DataFrame:
    """The ``plasticity_{which}.csv`` artifacts of ``runs``, stacked, with run_id, condition, seed,
    and the 95% t interval of each mean (``pooling.t_interval``) where an artifact lacks it.

    Runs that did not probe (``probe_pairs=0``) have no such artifact and are not asked.
    """
    if "probe_pairs" in runs:
        runs = runs[runs["probe_pairs"] != 0]  # -1: unknown, asked
    frames = []
    for run in runs.itertuples():
        text = read_artifact(run.run_id, f"plasticity_{which}.csv", tracking_uri)
        if text is None:
            continue
        df = _with_interval(pd.read_csv(io.StringIO(text)))
        frames.append(df.assign(run_id=run.run_id, condition=run.condition, seed=run.seed))
    if not frames:
        return pd.DataFrame(columns=PLASTICITY_COLUMNS + ["run_id", "condition", "seed"])
    return pd.concat(frames, ignore_index=True)


# ---------------------------------------------------------------- CSV


def _head(p: Path) -> bytes:
    """The first bytes of ``p`` as pandas reads them: decompressed where the name says the file is
    compressed (``.gz``, ``.bz2``, ``.xz``, ``.zip``, ``.zst``, ``.tar``...: pandas' inference)."""
    from pandas.io.common import get_handle

    with get_handle(p, "rb", compression="infer", is_text=False) as h:
        return h.handle.read(8192)


def _read_table(p: Path, what: str) -> pd.DataFrame:
    """A CSV file, compressed or not, as a table, or AnalysisError in one line (missing, binary,
    empty, malformed)."""
    check_input_file(what, p, AnalysisError)
    try:
        if b"\x00" in _head(p):
            raise AnalysisError(f"{what} {str(p)!r} is not a readable CSV (binary)")
        return pd.read_csv(p)
    except AnalysisError:
        raise
    except pd.errors.EmptyDataError:
        raise AnalysisError(f"{what} {str(p)!r} is empty") from None
    # a damaged archive: gzip's OSError or EOFError, zip's or tar's ValueError; zstd's missing module
    except (pd.errors.ParserError, UnicodeDecodeError, OSError, EOFError, ValueError, ImportError) as e:
        why = (str(e).splitlines() or [type(e).__name__])[0]
        raise AnalysisError(f"{what} {str(p)!r} is not a readable CSV: {why}") from None


def read_csv(path: str | os.PathLike, *, diverged_tested: bool = False) -> tuple[str, pd.DataFrame]:
    """A CSV of per-run results or a per-dataset summary: ("runs" | "summary", table).
    ``diverged_tested``: diverged rows with a tested accuracy count as finished (``runs_frame``)."""
    p = Path(path)
    df = _read_table(p, "CSV file")
    df.columns = [str(c).strip() for c in df.columns]
    if "mean" in df.columns and "lr" not in df.columns:
        return "summary", summary_frame(df, str(p))
    if is_wide(df):
        return "summary", wide_frame(df, str(p))
    return "runs", runs_frame(df, str(p), diverged_tested=diverged_tested)


def _require(df: pd.DataFrame, required: list[str], source: str, kind: str) -> None:
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise AnalysisError(
            f"{source}: missing column(s) {', '.join(missing)} for {kind} "
            f"(has: {', '.join(df.columns)}; needs at least {', '.join(required)})"
        )


def runs_frame(df: pd.DataFrame, source: str = "CSV", *, diverged_tested: bool = False) -> pd.DataFrame:
    """Normalise a per-run results table (see the module docstring) to the runs table.

    ``diverged_tested``: a diverged row with a tested accuracy (``diverged_test_acc`` and
    ``diverged_val_acc`` where the file has them, as the run record names them, else its
    ``test_acc`` and ``val_acc``) counts as finished with it, as ``from_mlflow`` counts a diverged
    run; ``attrs["diverged_tested"]`` says how many.
    """
    _require(df, REQUIRED_RUN_CSV, source, "per-run results (or dataset, condition, mean for a per-dataset summary)")
    out = pd.DataFrame(
        {
            "run_id": df["run_id"].astype(str) if "run_id" in df else [f"row{i}" for i in range(len(df))],
            "model": df["model"].astype(str) if "model" in df else "unknown",
            "optimizer": df["optimizer"].astype(str) if "optimizer" in df else "unknown",
            "low_data": (df["low_data"].astype(str).str.lower() == "true") if "low_data" in df else False,
            "dataset": df["dataset"].astype(str),
            "condition": df["condition"].astype(str),
            "lr": pd.to_numeric(df["lr"], errors="coerce").astype(float),
            "seed": pd.to_numeric(df["seed"], errors="coerce").fillna(-1).astype(int),
            "val_acc": pd.to_numeric(df["val_acc"], errors="coerce") if "val_acc" in df else np.nan,
            "test_acc": pd.to_numeric(df["test_acc"], errors="coerce").astype(float),
        }
    )
    if "status" in df:
        out["status"] = df["status"].fillna("failed").astype(str).str.strip().str.lower()
    else:
        out["status"] = np.where(out["test_acc"].notna(), "finished", "failed")
    tested = _count_diverged(df, out) if diverged_tested else 0
    done = out["status"] == "finished"
    out["val_acc"] = out["val_acc"].astype(float).where(done)
    out["test_acc"] = out["test_acc"].where(done)
    bad = out[done & out["lr"].isna()]
    if len(bad):
        raise AnalysisError(
            f"{source}: {len(bad)} finished row(s) have no numeric lr "
            f"(first: dataset {bad['dataset'].iloc[0]!r}, condition "
            f"{bad['condition'].iloc[0]!r})"
        )
    for col in ("parent_run_id", "key", "error"):
        out[col] = df[col].fillna("").astype(str) if col in df else ""
    for col, default in (("accuracy", "per_image"), ("linear_probe_data", "clean")):
        if col in df:  # how the runs counted accuracy and fitted the linear probe, where the file says
            out[col] = df[col].fillna(default).astype(str).str.strip()
    # a run that says it finished but has no test accuracy is no finished run: counted as failed,
    # with the reason, as the MLflow reader counts it (query.run_status_of)
    empty = (out["status"] == "finished") & out["test_acc"].isna()
    out.loc[empty, "status"] = "failed"
    out.loc[empty, "error"] = NO_TEST_ACC
    out["probe_pairs"], out["start_time"] = -1, 0
    out["trainable_params"] = (
        pd.to_numeric(df["trainable_params"], errors="coerce").astype(float) if "trainable_params" in df else np.nan
    )
    check_runs(out, source)
    out.attrs.update(source=source)
    if diverged_tested:
        out.attrs["diverged_tested"] = tested
    return out


def _count_diverged(df: pd.DataFrame, out: pd.DataFrame) -> int:
    """Turn ``out``'s diverged rows that have a tested accuracy into finished ones, in place, with
    the accuracies the file gives them; returns how many."""
    diverged = out["status"] == "diverged"
    for col in ("val_acc", "test_acc"):
        if f"diverged_{col}" in df:
            given = pd.to_numeric(df[f"diverged_{col}"], errors="coerce").astype(float)
            out[col] = out[col].astype(float).mask(diverged & given.notna(), given)
    tested = diverged & out["test_acc"].notna()
    out.loc[tested, "status"] = "finished"
    return int(tested.sum())


def summary_frame(df: pd.DataFrame, source: str = "CSV") -> pd.DataFrame:
    """Normalise a per-dataset summary (dataset, condition, mean[, std]) to a best-lr table."""
    _require(df, REQUIRED_SUMMARY_CSV, source, "a per-dataset summary")
    out = pd.DataFrame(
        {
            "dataset": df["dataset"].astype(str),
            "condition": df["condition"].astype(str),
            "lr": np.nan,
            "test_mean": pd.to_numeric(df["mean"], errors="coerce").astype(float),
            "test_std": pd.to_numeric(df["std"], errors="coerce").astype(float) if "std" in df else np.nan,
            "val_mean": np.nan,
            "val_std": np.nan,
            "n": 0,
            "n_diverged": 0,
            "n_failed": 0,
        }
    )
    dup = out.duplicated(["dataset", "condition"])
    if dup.any():
        d = out[dup].iloc[0]
        raise AnalysisError(
            f"{source}: dataset {d['dataset']!r}, condition {d['condition']!r} "
            "appears more than once; a summary has one row per cell"
        )
    if out["test_mean"].isna().all():
        raise AnalysisError(f"{source}: column mean has no numbers")
    out.attrs.update(source=source)
    return out


AVERAGE_ROWS = ("average", "avg", "mean", "avg.")


def is_wide(df: pd.DataFrame) -> bool:
    """A table in the paper's shape: a ``dataset`` column, condition columns, no ``condition``."""
    cols = [c.lower() for c in df.columns]
    return "dataset" in cols and "condition" not in cols and "lr" not in cols and len(cols) >= 2


def _cell(text) -> tuple[float, float]:
    """A cell of a published table: ``90.8``, ``90.8 ± 0.3`` (or ``+-``) → (mean, std)."""
    if isinstance(text, (int, float, np.number)):
        return float(text), np.nan
    s = str(text).strip().replace("+/-", "±").replace("+-", "±")
    mean, _, std = s.partition("±")
    m, d = pd.to_numeric(mean.strip(), errors="coerce"), pd.to_numeric(std.strip() or "nan", errors="coerce")
    return float(m), float(d)


def wide_frame(df: pd.DataFrame, source: str = "CSV") -> pd.DataFrame:
    """The paper's table shape (``dataset`` + one column per condition) as a per-dataset summary.

    Rows named average/avg/mean are the table's own summary, not datasets: dropped (recorded in
    ``attrs["dropped_rows"]``). A cell that is not a number (or ``mean ± std``) is an error.
    """
    df = df.rename(columns={c: "dataset" for c in df.columns if c.lower() == "dataset"})
    datasets = df["dataset"].astype(str).str.strip()
    summary_rows = datasets.str.lower().isin(AVERAGE_ROWS)
    df, datasets = df[~summary_rows], datasets[~summary_rows]
    conditions = [c for c in df.columns if c != "dataset"]
    rows = []
    for d, (_, r) in zip(datasets, df.iterrows()):
        for c in conditions:
            m, s = _cell(r[c])
            if math.isnan(m) and not pd.isna(r[c]):
                raise AnalysisError(
                    f"{source}: dataset {d!r}, condition {c!r}: {r[c]!r} is not a number (nor mean ± std)"
                )
            rows.append({"dataset": d, "condition": c, "mean": m, "std": s})
    out = summary_frame(pd.DataFrame(rows, columns=["dataset", "condition", "mean", "std"]), source)
    out.attrs["dropped_rows"] = int(summary_rows.sum())
    return out


def read_plasticity(path: str | os.PathLike) -> pd.DataFrame:
    """A tidy plasticity CSV (``PLASTICITY_COLUMNS``; ``bound`` optional, the interval computed
    from n, mean and std where the file lacks it)."""
    p = Path(path)
    df = _read_table(p, "plasticity CSV")
    _require(df, [c for c in PLASTICITY_COLUMNS if c != "bound" and c not in INTERVAL], str(p), "plasticity")
    return _with_interval(df)


def _with_interval(df: pd.DataFrame) -> pd.DataFrame:
    """A table the probe wrote (n, mean, std) with its interval; one written with it, as it is."""
    return df if all(c in df for c in INTERVAL) else pooling.t_interval(df)


def settings(runs: pd.DataFrame) -> list[tuple]:
    """The distinct (model, optimizer, low_data) studies in ``runs``, sorted."""
    return sorted(set(map(tuple, runs[SETTING].astype(str).to_numpy().tolist())))


__all__ = [
    "RUN_COLUMNS",
    "from_mlflow",
    "read_csv",
    "runs_frame",
    "summary_frame",
    "run_row",
    "dedupe",
    "step_metrics",
    "plasticity",
    "read_plasticity",
    "grid_runs",
    "read_artifact",
    "settings",
    "check_runs",
    "experiment_id",
    "is_wide",
    "wide_frame",
]
