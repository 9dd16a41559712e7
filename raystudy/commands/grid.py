"""The study grid on Ray: Tune schedules the trials, workers run them, MLflow records each once.

    python -m raystudy.grid                                  # the offline demo grid (local Ray + SQLite)
    python -m raystudy.grid --model vit_huge                 # the paper's ViT-H experiment (search_spaces/paper.yaml)
    python -m raystudy.grid --model vit_base --dry-run       # count trials and GPU-hours, start nothing
    python -m raystudy.grid --space paper --experiments all --dry-run   # the whole paper's budget
    python -m raystudy.grid --space paper --datasets cifar10,pets --conditions MHA,LN1 --optimizers sgd,adamw
    python -m raystudy.grid --address auto                   # on the cluster started by `ray up cluster.yaml`
    python -m raystudy.grid --space demo_adaptive --adaptive race   # stop trials the study does not need
    python -m raystudy.grid --model vit_base --dry-run --adaptive halving        # what that saves on the paper grid
    python -m raystudy.grid --space demo --data products=./photos --dry-run      # your own images (raystudy init)
    python -m raystudy.grid --model vit_base --rehearse 2    # the whole driver, synthetic 2-second trials

Rerunning the same command after a crash, a kill or Ctrl-C resumes the unfinished trials (from
their last checkpoint) and skips the finished ones; MLflow keeps exactly one run per trial config.
A grid MLflow already holds in full answers with its ranking, without starting Ray.
"""

from __future__ import annotations

import sys
from typing import Any

from raystudy.commands import cli
from raystudy.commands.grid_text import run
from raystudy.driver import backlog, local_ray
from raystudy.driver.grid_job import Job, done_trials, experiment_scope
from raystudy.errors import ConfigError
from raystudy.measure import costs
from raystudy.models import components, preflight, registry, sources
from raystudy.spaces import adaptive, grids, schema
from raystudy.tracking import connect, query
from raystudy.train import rehearsal
from raystudy.train.config import FinetuneConfig


def build_parser() -> cli.Parser:
    """The grid's command line flags."""
    ap = cli.Parser("python -m raystudy.grid", __doc__)
    ap.add_argument(
        "--space", help="grid YAML file or name under search_spaces/ (default: demo, or paper when --model is given)"
    )
    ap.add_argument("--model", help="model for every trial (alias, timm ViT name or vit_demo)")
    ap.add_argument("--datasets", help="comma-separated subset of the space's datasets")
    ap.add_argument(
        "--data",
        action="append",
        metavar="NAME=PATH",
        help="your own images as a dataset NAME (repeat the flag for more): a folder of class folders "
        "(or of train/, val/, test/), a .csv/.parquet of path,label[,split], a save_to_disk folder, or hf:NAME; "
        "each with the space's batch and the paper's steps scaled to its size, as raystudy init writes them; "
        "the grid then runs on these datasets only (add --datasets to choose others as well)",
    )
    ap.add_argument("--conditions", help="comma-separated conditions (default: the space's)")
    ap.add_argument("--optimizers", help="comma-separated subset of the space's optimizers")
    ap.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key in every trial")
    ap.add_argument("--dry-run", action="store_true", help="validate, count trials and GPU-hours, start nothing")
    ap.add_argument(
        "--experiments",
        metavar="NAMES",
        help="with --dry-run: price the space's named experiments (comma-separated, or all), each and in total",
    )
    ap.add_argument(
        "--adaptive",
        metavar="POLICY",
        help=f"stop trials the study's answer does not need: {', '.join(adaptive.POLICIES)}",
    )
    cli.add_data_change_arg(ap)
    cli.add_tracking_args(ap)
    cli.add_ray_args(ap, "./runs/ray")
    _add_run_args(ap)
    return ap


def _add_run_args(ap: cli.Parser) -> None:
    """How the trials run: retries, concurrency, what is printed, a dress rehearsal."""
    ap.add_argument(
        "--max-failures",
        type=int,
        help=f"retries of a failing trial (default: the space's, or 2; {cli.bound('--max-failures')})",
    )
    ap.add_argument(
        "--max-concurrent",
        type=int,
        help=f"cap on concurrent trials (default: by resources; {cli.bound('--max-concurrent')})",
    )
    ap.add_argument(
        "--quiet",
        action="store_true",
        help="print only the trials that did not finish (failed, diverged, retried), not one line per trial",
    )
    cli.add_rehearse_arg(
        ap,
        "the same grid and driver (Ray, Tune, MLflow, checkpoints, recovery, --adaptive) on the real schedule",
    )
    ap.add_argument(
        "--tune-output",
        action="store_true",
        help="Ray Tune's own progress tables and result files (JSON, CSV, TensorBoard) as well",
    )


def main(argv: list[str] | None = None) -> int:
    """The grid command: 0 when every trial finished, 1 when some failed, 2 on bad input, 130 when stopped."""
    args = build_parser().parse_args(argv)
    try:
        if args.experiments is not None:
            return experiments_budget(args)
        job = prepare(args)
    except ConfigError as e:
        return cli.fail(e)
    return run(job)


def experiments_budget(args) -> int:
    """``--experiments``: each named experiment's trials and GPU-hours, per model, and the total."""
    cli.check_unused(
        "--experiments",
        True,
        {
            "--model": args.model,
            "--datasets": args.datasets,
            "--optimizers": args.optimizers,
            "--rehearse": args.rehearse,
        },
    )
    if not args.dry_run:
        raise ConfigError("--experiments prices experiments with --dry-run; run each model's grid with --model M")
    space = grids.load_grid(args.space or "paper")
    names = cli.parse_list("--experiments", args.experiments, list(space.experiments))
    if not space.experiments:
        raise ConfigError(f"--experiments: the space {space.name!r} names no experiments")
    conds = _conditions(args, space)
    overrides = cli.parse_set(args.set or [])
    print(f"the experiments of {space.name}" + (f" ({space.description})" if space.description else "") + ":")
    trials, hours, priced = 0, 0.0, True
    for name in names:
        e = space.experiments[name]
        for model in e["models"] or [space.base.get("model", FinetuneConfig.model)]:
            registry.check_model(model)
            plan = grids.plan(space, model, e["datasets"] or None, conds, e["optimizers"] or None, overrides)
            cost = grids.gpu_hours(space, model, plan["costs"])
            trials += plan["trials"]
            priced = priced and cost.hours is not None
            hours += cost.hours or 0.0
            gpu_hours = (
                f"{costs.hours_text(cost.hours)} GPU-hours" if cost.hours is not None else "no GPU-hour estimate"
            )
            print(
                f"  {name:<12} {model:<10} {','.join(plan['optimizers']):<10} {len(plan['datasets']):>3} datasets "
                f"{plan['trials']:>7,} trials  {gpu_hours}" + (f"  ({e['description']})" if e["description"] else "")
            )
    print(f"  total: {trials:,} trials" + (f", {costs.hours_text(hours)} GPU-hours" if priced else ""))
    print("dry run: nothing started")
    return 0


def _conditions(args, space) -> list[str]:
    """The conditions ``--conditions`` names, or the space's."""
    return cli.parse_list(
        "--conditions",
        args.conditions,
        [schema.canonical_condition(c) for c in space.grid.get("condition", [])] or list(components.PAPER_CONDITIONS),
        schema.canonical_condition,
    )


def prepare(args) -> Job:
    """The grid ``args`` ask for, every flag checked; raises ``ConfigError`` naming what is wrong."""
    rehearse = cli.parse_seconds("--rehearse", args.rehearse)
    space = grids.load_grid(args.space or ("paper" if args.model else "demo"))
    own = cli.parse_data(args.data)
    space = grids.with_data(space, own) if own else space
    model = args.model or space.base.get("model", FinetuneConfig.model)
    registry.check_model(model)
    conds = _conditions(args, space)
    datasets = cli.parse_list("--datasets", args.datasets, list(space.datasets))
    if own and datasets is None:
        datasets = list(own)
    optimizers = cli.parse_list("--optimizers", args.optimizers, list(space.optimizers))
    overrides = cli.parse_set(args.set or [])
    scope = experiment_scope(space, model, datasets, optimizers)
    plan = grids.plan(space, model, datasets, conds, optimizers, overrides, scope)
    if rehearse is None:  # a rehearsal loads no weights
        preflight.check(model, overrides.get("weights", space.base.get("weights")), skip_registered=args.dry_run)
    mopts = schema.model_options(space.models, model)
    hours = grids.gpu_hours(space, model, plan["costs"])
    tuning = schema.tune_options(space)
    max_failures = _check_run_flags(args, tuning)
    policy = adaptive.policy(args.adaptive) if args.adaptive else None
    notes = _check_data(space, plan, overrides) if rehearse is None else []  # nor reads any data
    uri = args.tracking_uri or connect.default_uri()
    connect.check_uri(uri)
    backlog.limit_s()  # the outage limit (an environment variable) checked with the flags
    experiment = args.experiment or f"raystudy-{space.study}-{sources.short(registry.resolve_name(model))}"
    if rehearse is not None:  # never among the study's real runs
        experiment = rehearsal.experiment_name(experiment)
    known = query.known_statuses(uri, experiment)
    # Only a store that knows some of the study's trials is matched against the grid's keys:
    # a dry run of a huge new grid stays a count.
    trials = (
        grids.expand(space, model, datasets, conds, optimizers, overrides, scope) if known or not args.dry_run else []
    )
    done = done_trials(uri, experiment, known, trials, args.accept_data_change)
    if not args.dry_run and len(done) < len(trials):  # Ray only when there is something to run
        local_ray.check_address(args.address)
    return Job(
        args,
        space,
        model,
        (datasets, conds, optimizers, overrides, scope),
        plan,
        mopts,
        hours,
        tuning,
        max_failures,
        policy,
        uri,
        experiment,
        known,
        trials,
        done,
        notes,
        rehearse,
        ranking=closing_ranking,  # the analysis's table, handed down: the driver imports no analysis
    )


def closing_ranking(runs):
    """The ranking a grid closes with (``analysis.tables.closing_ranking``), imported once shown."""
    from analysis import tables

    return tables.closing_ranking(runs)


def _check_run_flags(args, tuning: dict[str, Any]) -> int:
    """The flags of how trials run and where Ray keeps them, checked; the retries of a trial."""
    max_failures = args.max_failures if args.max_failures is not None else tuning["max_failures"]
    cli.check_count("--max-failures", max_failures)  # the space's value has the same row (bounds.BOUNDS)
    cli.check_count("--max-concurrent", args.max_concurrent)
    cli.check_count("--num-cpus", args.num_cpus)
    cli.check_folder("--storage", args.storage or "runs/ray")
    cli.check_folder("--ray-temp-dir", args.ray_temp_dir)
    return max_failures


def _check_data(space, plan: dict[str, Any], overrides: dict[str, Any]) -> list[str]:
    """The data checks before anything runs: your own data (``cli.check_data``), then each registry
    folder's image count where the space expects one (the seeded split depends on it); the notes."""
    from raystudy.data.sources.domainnet import check_image_count

    notes = cli.check_data(data_locations(space, plan["datasets"], overrides), vtab1k=plan["vtab1k_data"])
    for name, root, expected in plan["image_counts"]:
        check_image_count(name, root or None, expected)
    return notes


def data_locations(space, datasets: list[str], overrides: dict[str, Any]) -> list[str]:
    """Where the grid's own data lives (``data`` of its datasets, its axis, its base or ``--set``), each once."""
    if "data" in overrides:
        return [overrides["data"]] if overrides["data"] else []
    found: list[str] = []
    for ds in datasets:
        entry = space.datasets.get(ds, {})
        if "data" in entry:
            values = schema.axis_values(f"datasets.{ds}.data", entry["data"])
        else:
            values = space.grid.get("data", [space.base.get("data", "")])
        found += [v for v in values if v and v not in found]
    return found


if __name__ == "__main__":
    sys.exit(main())
