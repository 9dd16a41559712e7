"""What users wait on in a store of the paper's size, SQLite and PostgreSQL side by side.

    python benchmarks/bench_store.py                 # 3,300 trial runs of 100 step points each (~3.6 M metric rows)
    python benchmarks/bench_store.py --runs 1000     # a reduced scale
    python benchmarks/bench_store.py --runs 40 --small 10 --steps 5 --reps 2   # toy size (the test's)

For each store (a SQLite file; a PostgreSQL server of its own, started and stopped here) it makes
one grid parent run and one trial written by ``raystudy.tracking`` (the grid's layout: tags, the
flat config as params, 11 step metrics per step point, final metrics), then clones that trial in
bulk with SQLAlchemy, one clone per synthetic run (``bench_report.synthetic_runs``: condition,
dataset, model, optimizer, lr, seed, status and accuracies substituted). Filling is not timed
among the waits. Then, each apart:

    page      the MLflow runs page's query: one page of runs (``--page``) newest first
    curves    one run's curves: ``get_metric_history`` of each of its step metrics
    load      ``analysis.load.from_mlflow``, the report's load of every trial run
    done      a resumed grid's "what is done": ``query.known_statuses``, and the same read
              through MLflow's search (``query.searched_statuses``, how it was read before), side by side
    trial     the driver's writes for one finished trial (``open_trial``, ``logged_upto``,
              ``log_steps`` once per report, ``finish_trial``), at ``--small`` and at ``--runs``
              recorded runs: it must not grow with the store
    open      of which ``open_trial`` (the one write that searches the experiment, by trial key)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

EXPERIMENT = "bench-store"
COMPONENTS = ("LN1", "MHA", "LN2", "FC1", "FC2")
TABLES = ("runs", "tags", "params", "metrics", "latest_metrics")
STORES = ("sqlite", "postgresql")


def reports(steps: int, seed: int = 0) -> list[dict]:
    """``steps`` step reports as the training loop sends them: 11 step metrics each."""
    out = []
    for s in range(1, steps + 1):
        r = {"step": s * 10, "loss": 1.0 / s + seed * 1e-6, "scheduled_lr": 0.1, "grad_norm/total": 2.0}
        r.update({f"grad_norm/{c}": 0.5 for c in COMPONENTS})
        r.update({"val_loss": 0.5, "val_acc": 0.8, "best_val_acc": 0.8})
        out.append(r)
    return out


def driver_trial(cl, exp_id: str, parent: str, seed: int, steps: int) -> tuple[float, float]:
    """Seconds one finished trial's records take, written as the grid's driver writes them, and
    of those ``open_trial``'s."""
    from raystudy.tracking import query, record
    from raystudy.train.config import FinetuneConfig, trial_key

    cfg = FinetuneConfig(
        model="vit_demo", pretrained=False, dataset="digits", condition="MHA", lr=0.1, seed=seed
    ).to_dict()
    t = time.perf_counter()
    run = record.open_trial(cl, exp_id, parent, trial_key(cfg), cfg)
    opened = time.perf_counter() - t
    upto = query.logged_upto(cl, run)
    for r in reports(steps, seed):
        record.log_steps(cl, run, [r], upto)
    record.finish_trial(cl, run, {"status": "finished", "best_val_acc": 0.8, "test_acc": 0.7, "best_step": 10})
    return time.perf_counter() - t, opened


def start_store(uri: str, root: Path, steps: int) -> tuple[object, str, str, str]:
    """The experiment, its grid parent run and the template trial in the store at ``uri``;
    returns (client, experiment id, parent run id, template run id)."""
    from raystudy.tracking import connect, query, record

    cl = connect.client(uri)
    exp_id = connect.experiment_id(cl, EXPERIMENT, (root / "artifacts").as_uri())
    parent = record.parent_run(cl, exp_id, "bench", "grid-bench", {"space": "bench"})
    driver_trial(cl, exp_id, parent, 0, steps)  # the template every clone copies
    template = query.find_runs(cl, exp_id, raystudy__role="trial")[0].info.run_id
    return cl, exp_id, parent, template


def clone(engine, template: str, runs, first: int) -> None:
    """Insert one copy of run ``template`` per row of ``runs`` (its settings substituted), in
    bulk: a transaction per hundred runs. ``first`` numbers the clones' start times."""
    from sqlalchemy import MetaData, select

    meta = MetaData()
    meta.reflect(engine, only=TABLES)
    tables = {t: meta.tables[t] for t in TABLES}
    with engine.connect() as c:
        tmpl = {
            t: [dict(r._mapping) for r in c.execute(select(tb).where(tb.c.run_uuid == template))]
            for t, tb in tables.items()
        }
    run_t = tmpl["runs"][0]
    for lo in range(0, len(runs), 100):
        rows: dict[str, list[dict]] = {t: [] for t in TABLES}
        for i, r in enumerate(runs.iloc[lo : lo + 100].itertuples(), first + lo):
            rid = uuid.uuid4().hex
            sub = {k: str(getattr(r, k)) for k in ("condition", "dataset", "model", "optimizer", "lr", "seed")}
            tag_sub = {
                **{k: v for k, v in sub.items() if k not in ("lr", "seed")},
                "raystudy.key": rid[:16],
                "raystudy.status": r.status,
                "mlflow.runName": rid[:8],
            }
            start = run_t["start_time"] + 1000 * i
            rows["runs"].append(
                {
                    **run_t,
                    "run_uuid": rid,
                    "name": rid[:8],
                    "start_time": start,
                    "end_time": start + 500,
                    "artifact_uri": run_t["artifact_uri"].replace(template, rid),
                }
            )
            rows["tags"] += [{**t, "run_uuid": rid, "value": tag_sub.get(t["key"], t["value"])} for t in tmpl["tags"]]
            rows["params"] += [{**p, "run_uuid": rid, "value": sub.get(p["key"], p["value"])} for p in tmpl["params"]]
            final = {"best_val_acc": float(r.val_acc), "test_acc": float(r.test_acc)}
            for table in ("metrics", "latest_metrics"):
                for m in tmpl[table]:
                    if m["key"] in final and (table == "latest_metrics" or m["step"] == 0):
                        if r.status != "finished":
                            continue  # a diverged run logs no final accuracies
                        m = {**m, "value": final[m["key"]]}
                    rows[table].append({**m, "run_uuid": rid})
        with engine.begin() as c:
            for t in TABLES:
                c.execute(tables[t].insert(), rows[t])


def median_time(f, reps: int) -> float:
    """The median of ``reps`` timings of ``f()``, in seconds."""
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def waits(uri: str, cl, exp_id: str, page: int, reps: int) -> dict[str, float]:
    """Seconds of each wait but the driver's (module docstring) on the store as it is now."""
    from analysis import load
    from raystudy.tracking import query, tags

    newest = cl.search_runs([exp_id], max_results=1, order_by=["attributes.start_time DESC"])[0]
    keys = [k for k in newest.data.metrics if k in tags.STEP_METRICS or k.startswith("grad_norm/")]
    return {
        "page": median_time(
            lambda: cl.search_runs([exp_id], max_results=page, order_by=["attributes.start_time DESC"]), reps
        ),
        "curves": median_time(lambda: [cl.get_metric_history(newest.info.run_id, k) for k in keys], reps),
        "load": median_time(lambda: load.from_mlflow(EXPERIMENT, uri), 1),
        "done": median_time(lambda: query.known_statuses(uri, EXPERIMENT), 1),
        "done by search": median_time(lambda: query.searched_statuses(cl, exp_id), 1),
    }


def driver_costs(cl, exp_id: str, parent: str, args, size: int, seed: int) -> dict[str, float]:
    """The median of ``--reps`` driver trials: ``trial@SIZE`` and its ``open@SIZE`` part, seconds."""
    costs = [driver_trial(cl, exp_id, parent, seed + i, args.steps) for i in range(args.reps)]
    return {
        f"trial@{size}": statistics.median(c[0] for c in costs),
        f"open@{size}": statistics.median(c[1] for c in costs),
    }


def measure(uri: str, root: Path, runs, args) -> dict[str, float]:
    """Fill the store at ``uri`` to ``--small`` then ``--runs`` trial runs, timing the driver at
    both sizes and the other waits at the full size; returns seconds by row of the table."""
    from sqlalchemy import create_engine, func, select, table

    t = time.perf_counter()
    cl, exp_id, parent, template = start_store(uri, root, args.steps)
    engine = create_engine(uri)
    clone(engine, template, runs.iloc[: args.small - 1], 1)
    fill = time.perf_counter() - t
    out = driver_costs(cl, exp_id, parent, args, args.small, 1000)
    t = time.perf_counter()
    clone(engine, template, runs.iloc[args.small - 1 :], args.small)
    fill += time.perf_counter() - t
    out.update(waits(uri, cl, exp_id, args.page, args.reps))
    out.update(driver_costs(cl, exp_id, parent, args, args.runs, 2000))
    with engine.connect() as c:
        out["metric rows"] = c.execute(select(func.count()).select_from(table("metrics"))).scalar()
    out["fill"] = fill
    engine.dispose()
    return out


ROWS = (
    ("fill", "filling the store (bulk; not a wait)"),
    ("page", "the runs page's query: {page} runs newest first"),
    ("curves", "one run's curves: the history of each step metric"),
    ("load", "analysis.load.from_mlflow: every trial run"),
    ("done", "a resumed grid's 'what is done' (query.known_statuses: one SQL query over the tags)"),
    ("done by search", "the same through MLflow's search_runs (query.searched_statuses), as before 2026-12-03"),
    ("trial@{small}", "the driver's writes for one finished trial, {small} runs recorded"),
    ("trial@{runs}", "the same, {runs} runs recorded"),
    ("open@{small}", "of which open_trial (finds the trial by key), {small} runs recorded"),
    ("open@{runs}", "the same, {runs} runs recorded"),
)


def parse(argv: list[str] | None):
    """The arguments, or one ``error:`` line and exit status 2."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3300, help="trial runs in the full store (at most 10,560)")
    ap.add_argument("--small", type=int, default=100, help="trial runs recorded at the driver's first timing")
    ap.add_argument("--steps", type=int, default=100, help="step points per run (11 metrics each)")
    ap.add_argument("--page", type=int, default=100, help="runs per page of the runs page's query")
    ap.add_argument("--reps", type=int, default=3, help="timings per fast wait and driver trials per size")
    ap.add_argument("--stores", default=",".join(STORES), help=f"comma-separated, of {', '.join(STORES)}")
    args = ap.parse_args(argv)
    problem = None
    if not 2 <= args.small < args.runs <= 10560:
        problem = f"--small {args.small} and --runs {args.runs}: need 2 <= small < runs <= 10560"
    elif min(args.steps, args.page, args.reps) < 1:
        problem = "--steps, --page and --reps must be >= 1"
    from pg_server import stores_problem

    stores, problem = stores_problem(args.stores, STORES, problem)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    args.stores = stores
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (module docstring); prints the table."""
    args = parse(argv)
    from bench_report import synthetic_runs
    from pg_server import postgres

    runs = synthetic_runs(11, 5, 4).sample(n=args.runs - 1, random_state=0)
    results = {}
    for store in args.stores:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            if store == "sqlite":
                results[store] = measure(f"sqlite:///{root / 'mlflow.db'}", root, runs, args)
            else:
                with postgres(root) as uri:
                    results[store] = measure(uri, root, runs, args)
        print(f"measured {store}: {results[store]['metric rows']:,} metric rows", flush=True)
    names = {k: k.format(small=args.small, runs=args.runs) for k, _ in ROWS}
    print(f"{'':15}" + "".join(f"{s:>12}" for s in args.stores))
    for key, what in ROWS:
        name = names[key]
        cells = "".join(f"{results[s][name]:>10.3f} s" for s in args.stores)
        print(f"{name:15}{cells}   {what.format(page=args.page, small=args.small, runs=args.runs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
