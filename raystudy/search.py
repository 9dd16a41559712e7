"""Extended Optuna searches per component, with ASHA early stopping.

    python -m raystudy.search --space optimiser --model vit_demo --dataset digits_c
    python -m raystudy.search --space search_spaces/optuna/components.yaml --model vit_demo --dataset digits_c
    python -m raystudy.search --space optimiser --model vit_base --dataset cifar100 --num-samples 64 \\
        --time-budget 36000 --address auto

For each condition of the space, Ray Tune's ``OptunaSearch`` (TPE, seeded) proposes configs from
the YAML space, ASHA stops weak trials early on validation accuracy, and every trial is an MLflow
run (exactly once, as in the grid). The Optuna study is persisted (SQLite under the storage
path), so an interrupted search resumes with its history. The best config of each condition is
chosen on validation accuracy and re-evaluated on test with fresh seeds.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from raystudy import cli
from raystudy.bounds import BOUNDS, SEED_END_TEXT, parse_seed_list
from raystudy.data import userdata
from raystudy.driver import backlog, local_ray
from raystudy.errors import ConfigError
from raystudy.models import preflight, registry, sources
from raystudy.spaces import grids, schema, searches
from raystudy.tracking import connect, query, views
from raystudy.train.config import FinetuneConfig, from_dict, trial_key, validate


def parse_seeds(text: str) -> list[int]:
    """``--test-seeds 100,101,102``: distinct seeds (``bounds.parse_seed_list``)."""
    seeds = parse_seed_list(text)
    if seeds is None:
        raise ConfigError(
            f"--test-seeds {text!r}: expected distinct comma-separated integers >= {BOUNDS['seed'].low} "
            f"and < {SEED_END_TEXT}, such as 100,101,102"
        )
    return seeds


def build_parser() -> cli.Parser:
    """The search's command line flags."""
    ap = cli.Parser("python -m raystudy.search", __doc__)
    ap.add_argument("--space", default="optimiser", help="YAML file or name under search_spaces/optuna/")
    ap.add_argument("--model", help="model (default: the space's base model)")
    ap.add_argument("--dataset", help="dataset (default: the space's base dataset)")
    ap.add_argument(
        "--data",
        help="your own images as the dataset --dataset names (a folder of class folders, a CSV or Parquet, "
        "a save_to_disk folder or hf:NAME); checked in full before Ray starts",
    )
    ap.add_argument("--conditions", help="comma-separated subset of the space's conditions")
    ap.add_argument(
        "--num-samples",
        type=int,
        help=f"trials per condition (default: the space's budget; {cli.bound('--num-samples')})",
    )
    ap.add_argument(
        "--time-budget",
        type=float,
        help=f"seconds per condition (default: the space's budget; {cli.bound('--time-budget')})",
    )
    ap.add_argument("--test-seeds", help="comma-separated fresh seeds for the test evaluation (default: the space's)")
    ap.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a base config key")
    cli.add_tracking_args(ap)
    cli.add_ray_args(ap, "./runs/search, with the Optuna study")
    ap.add_argument("--dry-run", action="store_true", help="validate the space and stop")
    ap.add_argument("--quiet", action="store_true", help="less Ray progress output")
    return ap


def budget_line(time_budget: float | None, studies: int, num_samples: int) -> str:
    """What the search may spend: the time budget per study and over all of them."""
    if not time_budget:
        return f"time budget: none; each of the {studies} studies runs its {num_samples} trials to the end"
    total = time_budget * studies
    return (
        f"time budget: {time_budget:g} s per study, at most {total:g} s ({total / 3600:.2g} h) for the "
        f"{studies} studies, then the test re-runs of each best config"
    )


def main(argv: list[str] | None = None) -> int:
    """The search command: 0 when done, 2 on bad input, 130 when stopped (the rerun resumes it)."""
    args = build_parser().parse_args(argv)
    try:
        job = prepare(args)
    except (ConfigError, registry.WeightsUnavailable) as e:
        return cli.fail(e)
    return 0 if job is None else run(job)


@dataclasses.dataclass
class Job:
    """A search command, checked: the space, its studies, the trials' resources and tuning, where they are recorded."""

    args: argparse.Namespace
    space: searches.SearchSpace
    base: dict[str, Any]
    model: str
    dataset: str
    conditions: list[str]
    studies: list[tuple[str, str | None]]
    resources: dict[str, Any]
    num_samples: int
    time_budget: float | None
    test_seeds: list[int]
    tuning: dict[str, Any]
    uri: str
    experiment: str


def _base(args, space: searches.SearchSpace) -> tuple[dict, str, str, list[str]]:
    """The search's base config with ``--set``, ``--model``, ``--dataset`` and ``--data`` on top,
    its model, dataset and conditions, each checked (your own data cheaply: it exists)."""
    from raystudy.data import datasets

    base = {**space.base, **cli.parse_set(args.set or [])}
    if args.model:
        base["model"] = args.model
    if args.dataset:
        base["dataset"] = args.dataset
    if args.data:
        base["data"] = args.data
    if base.get("data"):  # a path typed on the command line, from the working directory
        base["data"] = userdata.resolve(base["data"])
    model = base.get("model", FinetuneConfig.model)
    dataset = base.get("dataset", FinetuneConfig.dataset)
    registry.check_model(model)
    datasets.dataset_info(dataset, base.get("data", ""))
    preflight.check(model, base.get("weights"), skip_registered=args.dry_run)
    conditions = list(space.conditions)
    if args.conditions:
        if space.searches_components:
            raise ConfigError("--conditions: this space searches the trained components themselves")
        conditions = cli.parse_list("--conditions", args.conditions, conditions, schema.canonical_condition)
    return base, model, dataset, conditions


def prepare(args) -> Job | None:
    """The search ``args`` ask for, checked and stated; None for a dry run. Raises ``ConfigError``."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = searches.load_search(args.space)
    base, model, dataset, conditions = _base(args, space)
    studies = space.studies(conditions)
    validate(from_dict(base))
    mopts = schema.model_options(space.models, model)
    if mopts["workers"] > 1:
        raise ConfigError("searches run single-worker trials; use the grid for DDP models")
    resources = {"gpu": float(mopts["gpu"]), "cpu": float(mopts["cpu"]), "workers": 1}
    cli.check_count("--num-samples", args.num_samples)
    cli.check_seconds("--time-budget", args.time_budget)
    cli.check_count("--num-cpus", args.num_cpus)
    cli.check_folder("--storage", args.storage or "runs/search")
    cli.check_folder("--ray-temp-dir", args.ray_temp_dir)
    num_samples = args.num_samples if args.num_samples is not None else space.num_samples
    time_budget = args.time_budget if args.time_budget is not None else space.time_budget_s
    test_seeds = parse_seeds(args.test_seeds) if args.test_seeds is not None else list(space.test_seeds)
    tuning = {**schema.tune_options(space), "max_failures": space.tune.get("max_failures", 1)}
    check_samples(space, studies, base, resources)
    uri = args.tracking_uri or connect.default_uri()
    connect.check_uri(uri)  # before any summary line: a refusal is its one line
    low = base.get("low_data") and base.get("low_data_split", "vtab1k") == "vtab1k"
    notes = cli.check_data([base.get("data", "")], vtab1k=[base.get("data", "")] if low else [])
    backlog.limit_s()  # the outage limit (an environment variable) checked with the flags
    experiment = args.experiment or f"raystudy-{space.study}-{sources.short(registry.resolve_name(model))}"
    print(
        f"search {space.name}: {model} on {dataset}; studies {', '.join(label for label, _ in studies)}; "
        f"{num_samples} trials each; best re-evaluated on test with seeds {test_seeds}"
    )
    print(budget_line(time_budget, len(studies), num_samples))
    for note in notes:
        print(note)
    if args.dry_run:
        print("dry run: nothing started")
        return None
    local_ray.check_address(args.address)
    return Job(
        args,
        space,
        base,
        model,
        dataset,
        conditions,
        studies,
        resources,
        num_samples,
        time_budget,
        test_seeds,
        tuning,
        uri,
        experiment,
    )


def check_samples(space: searches.SearchSpace, studies: list, base: dict[str, Any], resources: dict[str, Any]) -> None:
    """A dry sample through the sampler: catches configs the space can produce but ``validate`` refuses."""
    import optuna

    probe = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(8):
        for _, cond in studies:
            validate(from_dict(searches.Sampler(space, cond, base, resources)(probe.ask())["trial"]["finetune"]))


def run(job: Job) -> int:
    """Every study of the search on Ray (``driver.session``), then the best config per condition;
    then, on a cluster, a snapshot of MLflow's store (``driver.snapshot``), however the search
    ended once it had started; the exit status."""
    from raystudy.driver import session, snapshot

    args = job.args
    storage = Path(args.storage or "runs/search").resolve()
    skey = trial_key(
        {
            "space": job.space.name,
            "model": job.model,
            "dataset": job.dataset,
            "base": job.base,
            "conditions": job.conditions,
        }
    )
    s = session.Session(
        storage,
        f"search-{job.space.study}-{skey}",
        job.model,
        address=args.address,
        num_cpus=args.num_cpus,
        temp_dir=args.ray_temp_dir,
    )
    try:
        return _run_studies(job, s, storage, skey)
    finally:
        if s.started is not None:  # it held the search's lock: a search refused before it started wrote nothing
            snapshot.take(what="search")


def _run_studies(job: Job, s, storage: Path, skey: str) -> int:
    """The search's studies in the session ``s`` (one driver per search: a second one refuses
    before starting anything), their summary; the exit status."""
    from raystudy.driver import session

    try:
        with s:
            cl, exp_id = session.experiment(job.uri, job.experiment)
            with session.parent_run(
                cl,
                exp_id,
                skey,
                f"search-{job.space.name}-{job.model}-{job.dataset}",
                {"space": job.space.name, "model": job.model, "dataset": job.dataset, "num_samples": job.num_samples},
                role="search",
            ) as parent:
                summary = [study(job, label, cond, storage, cl, exp_id, parent.run_id) for label, cond in job.studies]
    except (ConfigError, registry.WeightsUnavailable) as e:
        return cli.fail(e)
    except KeyboardInterrupt:  # Ctrl-C: Optuna's studies and MLflow keep what is done; the rerun goes on from there
        print("\nsearch stopped; run the same command to resume it", flush=True)
        return 130
    print_summary(summary)
    optuna_db = storage / "optuna" / "optuna.db"
    browse = [*views.browse_lines(job.uri, exp_id), f"Optuna studies: optuna-dashboard sqlite:///{optuna_db}"]
    print("\n" + "\n".join(browse))
    return 0


def study(job: Job, label: str, cond: str | None, storage: Path, cl, exp_id: str, parent: str) -> dict[str, Any]:
    """One condition's Optuna study, then its best config re-run on test with fresh seeds; its summary."""
    from raystudy.driver import grid_run, optuna_search

    tuning = job.tuning
    best = optuna_search.search_condition(
        job.space,
        label,
        cond,
        model=job.model,
        dataset=job.dataset,
        base=job.base,
        tracking_uri=job.uri,
        exp_id=exp_id,
        parent=parent,
        storage=storage,
        num_samples=job.num_samples,
        time_budget_s=job.time_budget,
        resources=job.resources,
        tuning=tuning,
        verbose=0 if job.args.quiet else 1,
    )
    if "config" not in best:
        print(f"[{label}] no trial finished: nothing to evaluate on test")
        return {"condition": label, **best}
    trials = [
        grids.Trial(trial_key(c), c, job.resources["gpu"], job.resources["cpu"], 1)
        for c in ({**best["config"], "seed": s} for s in job.test_seeds)
    ]
    counts = grid_run.run_grid(
        trials,
        label=f"{best['study']}-test",
        model=job.model,
        tracking_uri=job.uri,
        experiment=job.experiment,
        storage=storage,
        max_failures=int(tuning["max_failures"]),
        max_concurrent=tuning["max_concurrent"],
        threads=int(tuning["threads_per_trial"]),
        checkpoint_every_s=float(tuning["checkpoint_every_s"]),
        verbose=0,
        role="search-test",
    )
    keys = {t.key for t in trials}
    rows = [
        r
        for r in query.rows(query.find_runs(cl, exp_id, raystudy__role="trial"))
        if r["key"] in keys and r["status"] == "finished"
    ]
    acc = [r["test_acc"] for r in rows]
    return {
        "condition": best["config"]["condition"],
        **best,
        "test_acc": sum(acc) / len(acc) if acc else math.nan,
        "test_std": statistics.stdev(acc) if len(acc) > 1 else math.nan,
        "test_runs": counts["finished"],
    }


def print_summary(summary: list[dict[str, Any]]) -> None:
    """The best configuration per condition: validation and test accuracy, its knobs, the trial counts."""
    print("\nbest configuration per condition (chosen on validation, tested with fresh seeds):")
    for s in summary:
        if "config" not in s:
            print(f"  {s['condition']:<16} no finished trial ({s['trials']} trials, {s['stopped']} stopped early)")
            continue
        c = s["config"]
        knobs = ", ".join(
            f"{k}={c[k]:.3g}" if isinstance(c[k], float) else f"{k}={c[k]}"
            for k in ("optimizer", "lr", "weight_decay", "warmup_steps", "batch_size")
            if k in c
        )
        print(
            f"  {s['condition']:<16} val {s['val_acc']:.4f}  test {s['test_acc']:.4f} ± {s['test_std']:.4f} "
            f"({s['test_runs']} seeds)  [{knobs}]  trials: {s['finished']} finished, "
            f"{s['stopped']} stopped early by ASHA"
        )


if __name__ == "__main__":
    sys.exit(main())
