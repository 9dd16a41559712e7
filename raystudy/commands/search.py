"""Extended Optuna searches per component, with ASHA early stopping.

    python -m raystudy search --space optimiser --model vit_demo --dataset digits_c
    python -m raystudy search --space search_spaces/optuna/components.yaml --model vit_demo --dataset digits_c
    python -m raystudy search --space optimiser --model vit_base --dataset cifar100 --num-samples 64 \\
        --time-budget 36000 --address auto
    python -m raystudy search --space optimiser --conditions MHA --num-samples 2000 --rehearse 1 --num-cpus 16

For each condition of the space, Ray Tune's ``OptunaSearch`` (TPE, seeded) proposes configs from
the YAML space, ASHA stops weak trials early on validation accuracy, and every trial is an MLflow
run (exactly once, as in the grid). The Optuna study is persisted (SQLite under the storage
path), so an interrupted search resumes with its history. The best config of each condition is
chosen on validation accuracy and re-evaluated on test with fresh seeds.

``--rehearse`` runs the same driver (Ray, Tune, Optuna and its storage, ASHA, MLflow) over
synthetic trials whose plateau is a known function of the sampled config (``train.rehearsal``):
it says how far the best config found is from the known optimum.
"""

from __future__ import annotations

import sys

from raystudy.bounds import BOUNDS, SEED_END_TEXT, parse_seed_list
from raystudy.commands import cli
from raystudy.commands.search_text import budget_line, stopped, summarize
from raystudy.data import userdata
from raystudy.driver import backlog, local_ray
from raystudy.driver.grid_job import check_data
from raystudy.driver.search_job import Job, check_samples, run
from raystudy.errors import ConfigError
from raystudy.models import preflight, registry, sources
from raystudy.spaces import schema, searches
from raystudy.tracking import connect
from raystudy.train import rehearsal
from raystudy.train.config import FinetuneConfig, from_dict, validate


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
    ap = cli.Parser("raystudy search", __doc__)
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
    cli.add_rehearse_arg(
        ap,
        "the same search and driver (Ray, Tune, Optuna, ASHA, MLflow), its score a known function of the "
        "sampled config whose optimum the summary compares with the best found",
    )
    cli.add_data_change_arg(ap)
    ap.add_argument("--dry-run", action="store_true", help="validate the space and stop")
    ap.add_argument(
        "--quiet",
        action="store_true",
        help="print only the trials that did not finish (failed, diverged, retried), not one line per trial",
    )
    ap.add_argument(
        "--tune-output",
        action="store_true",
        help="Ray Tune's own progress tables and result files (JSON, CSV, TensorBoard) as well",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    """The search command: 0 when done, 2 on bad input, 130 when stopped (the rerun resumes it)."""
    args = build_parser().parse_args(argv)
    try:
        job = prepare(args)
    except (ConfigError, registry.WeightsUnavailable) as e:
        return cli.fail(e)
    return 0 if job is None else run(job, summarize, stopped)


def _base(args, space: searches.SearchSpace, rehearse: bool) -> tuple[dict, str, str, list[str]]:
    """The search's base config with ``--set``, ``--model``, ``--dataset`` and ``--data`` on top,
    its model, dataset and conditions, each checked (your own data cheaply: it exists; the
    weights unless a rehearsal, which loads none)."""
    from raystudy.data.registry import dataset_info

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
    dataset_info(dataset, base.get("data", ""))
    if not rehearse:
        preflight.check(model, base.get("weights"), skip_registered=args.dry_run)
    conditions = list(space.conditions)
    if args.conditions:
        if space.searches_components:
            raise ConfigError("--conditions: this space searches the trained components themselves")
        conditions = cli.parse_list("--conditions", args.conditions, conditions, schema.canonical_condition)
    return base, model, dataset, conditions


def _resources(space: searches.SearchSpace, model: str, rehearse: float | None) -> dict:
    """What a trial of ``model`` takes (the space's ``models``); a rehearsal's sleeps on one CPU."""
    mopts = schema.model_options(space.models, model)
    if mopts["workers"] > 1:
        raise ConfigError("searches run single-worker trials; use the grid for DDP models")
    if rehearse is not None:
        return {"gpu": 0.0, "cpu": 1.0, "workers": 1}
    return {"gpu": float(mopts["gpu"]), "cpu": float(mopts["cpu"]), "workers": 1}


def _notes(base: dict, rehearse: float | None, experiment: str) -> list[str]:
    """What the search says before it starts: of your own data, checked in full
    (``cli.check_data``); or, for a rehearsal, which reads no data, that it is one."""
    if rehearse is not None:
        return [
            f"rehearsal: synthetic trials (about {rehearse:g} s each on one CPU), no model or data; "
            f"recorded in experiment {experiment!r}"
        ]
    low = base.get("low_data") and base.get("low_data_split", "vtab1k") == "vtab1k"
    return cli.check_data([base.get("data", "")], vtab1k=[base.get("data", "")] if low else [])


def prepare(args) -> Job | None:
    """The search ``args`` ask for, checked and stated; None for a dry run. Raises ``ConfigError``."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rehearse = cli.parse_seconds("--rehearse", args.rehearse)
    space = searches.load_search(args.space)
    base, model, dataset, conditions = _base(args, space, rehearse is not None)
    studies = space.studies(conditions)
    validate(from_dict(base))
    resources = _resources(space, model, rehearse)
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
    experiment = args.experiment or f"raystudy-{space.study}-{sources.short(registry.resolve_name(model))}"
    if rehearse is not None:
        experiment = rehearsal.experiment_name(experiment)
    elif base.get("data") and not args.accept_data_change:  # a study's trials all on the data as it was
        check_data(uri, experiment, {base["data"]}, "search")
    notes = _notes(base, rehearse, experiment)
    backlog.limit_s()  # the outage limit (an environment variable) checked with the flags
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
        rehearse,
    )


if __name__ == "__main__":
    sys.exit(main())
