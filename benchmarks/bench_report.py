"""How long the report takes on a study of ~10,000 runs in MLflow: loading apart from analysis.

    python benchmarks/bench_report.py   # 3 models × 2 optimizers × 11 datasets × 8 conditions × 4 lrs × 5 seeds
    python benchmarks/bench_report.py --seeds 2 --keep /tmp/bench   # smaller; keep the store and the report
    python benchmarks/bench_report.py --models 1 --datasets 2 --seeds 2 --lrs 2   # toy size (the test's)

Builds a SQLite MLflow store in a temporary folder: one grid parent run and one trial written by
``raystudy.tracking`` (exactly the layout the grid writes: tags, the flat config as params,
final and step metrics), then that trial cloned in bulk with SQL, one clone per synthetic run
(``analysis.synthetic.fake_runs``: condition, dataset, model, optimizer, lr, seed, status and
accuracies substituted). Building the store is not timed. Then it times, each apart:

    load      ``analysis.load.from_mlflow``: every trial run from MLflow into the runs table (SQL)
    search    the same through MLflow's search (a store SQL cannot reach), checked equal
    stats     the report's statistics and tables (``analysis.reporting.analyse_runs``)
    figures   the same call's figures, built and written as PNG + PDF, timed apart
    log       logging the report folder to the grid parent run

Curves (metric histories, one MLflow call per run and key) are left out, as ``--no-curves``.
"""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path

MODELS = ("vit_small", "vit_base", "vit_large")
OPTIMIZERS = ("sgd", "adamw")
CONDITIONS = ("LN1", "MHA", "LN2", "FC1", "FC2", "full", "linear_probe", "lora")
EXPERIMENT = "bench-report"


def synthetic_runs(n_datasets: int, n_seeds: int, n_lrs: int, n_models: int = len(MODELS)):
    import pandas as pd

    from analysis.synthetic import fake_runs

    lrs = tuple(10.0 ** (-4 + i * 0.5) for i in range(n_lrs))
    parts = [
        fake_runs(n_datasets, CONDITIONS, lrs, tuple(range(n_seeds)), seed=100 * i + j, model=m, optimizer=o)
        for i, m in enumerate(MODELS[:n_models])
        for j, o in enumerate(OPTIMIZERS)
    ]
    return pd.concat(parts, ignore_index=True)


def build_store(root: Path, runs) -> tuple[str, str]:
    """An MLflow SQLite store holding ``runs`` as trials of one grid; returns (uri, parent id)."""
    import mlflow

    from raystudy.tracking import connect, record
    from raystudy.train.config import FinetuneConfig, trial_key

    db = root / "mlflow.db"
    uri = f"sqlite:///{db}"
    c = mlflow.MlflowClient(tracking_uri=uri)
    exp_id = connect.experiment_id(c, EXPERIMENT, (root / "artifacts").as_uri())
    parent = record.parent_run(c, exp_id, "bench", "grid-bench", {"space": "bench"})
    cfg = FinetuneConfig(
        model="vit_demo", pretrained=False, dataset="digits", condition="MHA", lr=0.1, seed=0
    ).to_dict()
    template = record.open_trial(c, exp_id, parent, trial_key(cfg), cfg)
    record.log_steps(
        c,
        template,
        [{"loss": 1.0, "grad_norm/total": 2.0, "grad_norm/MHA": 1.0, "val_loss": 0.5, "val_acc": 0.8, "step": 10}],
    )
    record.finish_trial(c, template, {"status": "finished", "best_val_acc": 0.8, "test_acc": 0.7, "best_step": 10})
    c.set_terminated(parent, "FINISHED")

    con = sqlite3.connect(db)
    cols = lambda t: [r[1] for r in con.execute(f"PRAGMA table_info({t})")]  # noqa: E731
    run_cols, tag_cols, param_cols = cols("runs"), cols("tags"), cols("params")
    met_cols, latest_cols = cols("metrics"), cols("latest_metrics")

    def get(t, c_):
        return [dict(zip(c_, r)) for r in con.execute(f"SELECT * FROM {t} WHERE run_uuid = ?", (template,))]

    run_t, tags_t, params_t = get("runs", run_cols)[0], get("tags", tag_cols), get("params", param_cols)
    mets_t, latest_t = get("metrics", met_cols), get("latest_metrics", latest_cols)

    rows = {"runs": [], "tags": [], "params": [], "metrics": [], "latest_metrics": []}
    for r in runs.itertuples():
        rid = uuid.uuid4().hex
        name = f"{r.condition}-{r.dataset}-{r.optimizer}-lr{r.lr}-s{r.seed}"
        sub = {
            "condition": r.condition,
            "dataset": r.dataset,
            "model": r.model,
            "optimizer": r.optimizer,
            "lr": str(r.lr),
            "seed": str(r.seed),
        }
        tag_sub = {
            **{k: v for k, v in sub.items() if k not in ("lr", "seed")},
            "raystudy.key": rid[:16],
            "raystudy.status": r.status,
            "mlflow.runName": name,
        }
        rows["runs"].append(
            {**run_t, "run_uuid": rid, "name": name, "artifact_uri": run_t["artifact_uri"].replace(template, rid)}
        )
        rows["tags"] += [{**t, "run_uuid": rid, "value": tag_sub.get(t["key"], t["value"])} for t in tags_t]
        rows["params"] += [{**p, "run_uuid": rid, "value": sub.get(p["key"], p["value"])} for p in params_t]
        final = {"best_val_acc": r.val_acc, "test_acc": r.test_acc}
        for table, template_rows in (("metrics", mets_t), ("latest_metrics", latest_t)):
            for m in template_rows:
                if m["key"] in final:
                    if r.status != "finished":
                        continue  # a diverged run logs no final accuracies
                    m = {**m, "value": float(final[m["key"]])}
                rows[table].append({**m, "run_uuid": rid})
    for table, cols_ in (
        ("runs", run_cols),
        ("tags", tag_cols),
        ("params", param_cols),
        ("metrics", met_cols),
        ("latest_metrics", latest_cols),
    ):
        con.executemany(
            f"INSERT INTO {table} ({', '.join(cols_)}) VALUES ({', '.join('?' * len(cols_))})",
            [tuple(r[k] for k in cols_) for r in rows[table]],
        )
    for table in ("tags", "params", "metrics", "latest_metrics", "runs"):
        con.execute(f"DELETE FROM {table} WHERE run_uuid = ?", (template,))
    con.commit()
    con.close()
    return uri, parent


@contextlib.contextmanager
def timed_figures(acc: list):
    """Time every figure the report draws (building it and writing PNG + PDF) into ``acc``:
    (wall, CPU) seconds per figure."""
    from analysis import figures

    names = [n for n in figures.__all__ if n not in ("save", "colors")]
    originals = {n: getattr(figures, n) for n in names}

    def timed(f):
        def wrapper(*a, **k):
            t, cpu = time.perf_counter(), time.process_time()
            try:
                return f(*a, **k)
            finally:
                acc.append((time.perf_counter() - t, time.process_time() - cpu))

        return wrapper

    for n, f in originals.items():
        setattr(figures, n, timed(f))
    try:
        yield
    finally:
        for n, f in originals.items():
            setattr(figures, n, f)


@contextlib.contextmanager
def by_search():
    """The trial runs read through MLflow's search, and their curves by MLflow's call per run and
    key, instead of SQL: as from a store SQL cannot reach."""
    from raystudy.tracking import query

    originals = query._database_of, query.metric_histories
    query._database_of = lambda cl, exp_id: None
    query.metric_histories = lambda cl, run_ids, keys: None
    try:
        yield
    finally:
        query._database_of, query.metric_histories = originals


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--models",
        type=int,
        default=len(MODELS),
        choices=range(1, len(MODELS) + 1),
        help=f"the first N of {', '.join(MODELS)}; each model is two studies (sgd, adamw)",
    )
    ap.add_argument("--datasets", type=int, default=11)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--lrs", type=int, default=4)
    ap.add_argument("--bootstrap-reps", type=int, default=2000)
    ap.add_argument("--keep", help="build the store and write the report here (default: a temp folder)")
    args = ap.parse_args(argv)

    import pandas as pd

    from analysis import load, reporting
    from analysis.sections import trust

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep or tmp)
        root.mkdir(parents=True, exist_ok=True)
        runs = synthetic_runs(args.datasets, args.seeds, args.lrs, args.models)
        t = time.perf_counter()
        uri, parent = build_store(root, runs)
        print(
            f"built an MLflow store of {len(runs)} trial runs ({args.models} models × "
            f"{len(OPTIMIZERS)} optimizers × {args.datasets} datasets × {len(CONDITIONS)} conditions × "
            f"{args.lrs} lrs × {args.seeds} seeds) in {time.perf_counter() - t:.1f} s (not timed below)"
        )

        t, cpu = time.perf_counter(), time.process_time()
        loaded = load.from_mlflow(EXPERIMENT, uri)
        t_load, cpu_load = time.perf_counter() - t, time.process_time() - cpu
        assert len(loaded) == len(runs), (len(loaded), len(runs))
        # the same table through MLflow's search (a store read without SQL: a tracking server's,
        # when the database behind it is out of reach), side by side
        t, cpu = time.perf_counter(), time.process_time()
        with by_search():
            searched = load.from_mlflow(EXPERIMENT, uri)
        t_search, cpu_search = time.perf_counter() - t, time.process_time() - cpu
        pd.testing.assert_frame_equal(loaded, searched)
        assert loaded.attrs == searched.attrs

        fig_times: list[float] = []
        opts = trust.Options(reps=args.bootstrap_reps)
        t, cpu = time.perf_counter(), time.process_time()
        with timed_figures(fig_times):
            rep = reporting.analyse_runs(loaded, root / "report", options=opts)
        t_analysis, cpu_analysis = time.perf_counter() - t, time.process_time() - cpu
        t_fig, cpu_fig = sum(w for w, _ in fig_times), sum(c for _, c in fig_times)

        t = time.perf_counter()
        reporting.log_outputs(root / "report", loaded, EXPERIMENT, uri)
        t_log = time.perf_counter() - t

    n_settings = len(load.settings(loaded))
    # Wall and CPU (this process) apart: on a shared machine the wall time also counts waiting.
    print("stage      wall      CPU")
    print(f"load     {t_load:6.1f} s {cpu_load:6.1f} s   {len(loaded)} runs from MLflow into the runs table (SQL)")
    print(
        f"search   {t_search:6.1f} s {cpu_search:6.1f} s   the same through MLflow's search_runs, not in the total "
        f"(SQL: {t_load / t_search:.2f}x its wall time; the same table)"
    )
    print(
        f"stats    {t_analysis - t_fig:6.1f} s {cpu_analysis - cpu_fig:6.1f} s   statistics and "
        f"tables of {n_settings} studies ({opts.reps} bootstrap replicates, both ROPE tests)"
    )
    print(f"figures  {t_fig:6.1f} s {cpu_fig:6.1f} s   {len(fig_times)} figures built and written as PNG + PDF")
    print(f"log      {t_log:6.1f} s            {len(rep.files)} files logged to the grid run")
    print(f"analysis {t_analysis:6.1f} s {cpu_analysis:6.1f} s   stats + figures")
    print(f"total    {t_load + t_analysis + t_log:6.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
