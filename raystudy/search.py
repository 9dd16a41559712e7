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
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raystudy import components, grid, tracking
from raystudy.config import ConfigError, FinetuneConfig, from_dict, read_yaml, validate

SPACES_DIR = grid.SPACES_DIR / "optuna"
SPACE_KEYS = ("study", "description", "base", "conditions", "params", "budget", "scheduler", "seed",
              "test_seeds", "models", "tune")
DISTRIBUTIONS = ("choice", "uniform", "loguniform", "randint", "lograndint", "subset_of")
PSEUDO_KEYS = ("beta1", "beta2", "components")  # mapped onto config keys (betas, condition)
BUDGET_KEYS = ("num_samples", "time_budget_s")
SCHEDULER_KEYS = ("grace_period", "reduction_factor")


@dataclass(frozen=True)
class Param:
    name: str
    kind: str
    args: tuple
    when: dict[str, tuple] = field(default_factory=dict)


@dataclass(frozen=True)
class SearchSpace:
    name: str
    study: str
    base: dict[str, Any]
    conditions: tuple[str, ...]
    params: tuple[Param, ...]
    num_samples: int
    time_budget_s: float | None
    grace_period: int
    reduction_factor: int
    seed: int
    test_seeds: tuple[int, ...]
    models: dict[str, dict[str, Any]]
    tune: dict[str, Any]


# ---------------------------------------------------------------- the space

def space_path(name_or_path: str) -> Path:
    return grid.space_path(name_or_path, SPACES_DIR)


def _param(where: str, name: str, spec: Any, cfg_keys: tuple[str, ...]) -> Param:
    if name not in cfg_keys and name not in PSEUDO_KEYS:
        raise ConfigError(f"{where}: unknown parameter {name!r}; valid: config keys or {', '.join(PSEUDO_KEYS)}")
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}.{name}: expected {{distribution: args}}, got {spec!r}")
    spec = dict(spec)
    when = spec.pop("when", {}) or {}
    if len(spec) != 1:
        raise ConfigError(f"{where}.{name}: give exactly one distribution of {', '.join(DISTRIBUTIONS)}")
    kind, args = next(iter(spec.items()))
    if kind not in DISTRIBUTIONS:
        raise ConfigError(f"{where}.{name}: unknown distribution {kind!r}; valid: {', '.join(DISTRIBUTIONS)}")
    if kind in ("choice", "subset_of"):
        if not isinstance(args, list) or not args:
            raise ConfigError(f"{where}.{name}: {kind} takes a non-empty list")
        if kind == "subset_of":
            bad = [c for c in args if c not in components.STUDY_COMPONENTS]
            if bad or name != "components":
                raise ConfigError(f"{where}.{name}: subset_of is for 'components' over "
                                  f"{', '.join(components.STUDY_COMPONENTS)}; got {args!r}")
    else:
        if not (isinstance(args, list) and len(args) == 2 and all(isinstance(a, (int, float)) for a in args)):
            raise ConfigError(f"{where}.{name}: {kind} takes [low, high], got {args!r}")
        lo, hi = args
        if lo >= hi:
            raise ConfigError(f"{where}.{name}: lower bound {lo} is not below upper bound {hi}")
        if kind.startswith("log") and lo <= 0:
            raise ConfigError(f"{where}.{name}: {kind} needs a positive lower bound, got {lo}")
        if kind in ("randint", "lograndint") and not all(isinstance(a, int) for a in args):
            raise ConfigError(f"{where}.{name}: {kind} takes integer bounds, got {args!r}")
    if not isinstance(when, dict):
        raise ConfigError(f"{where}.{name}.when: expected {{param: value or [values]}}, got {when!r}")
    when = {k: tuple(v) if isinstance(v, list) else (v,) for k, v in when.items()}
    return Param(name, kind, tuple(args), when)


def load_space(name_or_path: str) -> SearchSpace:
    """Read and check an Optuna space; every error is one line naming the bad key or value."""
    path = space_path(name_or_path)
    raw = read_yaml(path)
    where = path.name
    grid._strict(f"search space {where}", raw, SPACE_KEYS)
    cfg_keys = tuple(FinetuneConfig.__dataclass_fields__)
    base = grid._strict(f"{where}: base", raw.get("base"), cfg_keys)
    params_raw = raw.get("params")
    if not isinstance(params_raw, dict) or not params_raw:
        raise ConfigError(f"{where}: 'params' must map at least one parameter to a distribution")
    params = tuple(_param(f"{where}: params", n, s, cfg_keys) for n, s in params_raw.items())
    names = {p.name for p in params}
    for p in params:
        for dep, values in p.when.items():
            if dep not in names:
                raise ConfigError(f"{where}: params.{p.name}.when names unknown parameter {dep!r}; "
                                  f"valid: {', '.join(sorted(names - {p.name}))}")
            src = next(q for q in params if q.name == dep)
            if src.when:
                raise ConfigError(f"{where}: params.{p.name}.when depends on {dep!r}, itself conditional; "
                                  "conditions do not chain")
            if src.kind != "choice" or not set(values) <= set(src.args):
                raise ConfigError(f"{where}: params.{p.name}.when: {dep} must be a choice among "
                                  f"{list(src.args)}, got {list(values)}")
    # Suggest a parameter only after those its `when` depends on (YAML order is not a promise).
    params = tuple(sorted(params, key=lambda p: bool(p.when)))
    conds = raw.get("conditions") or ["MHA"]
    if "components" in names:
        conds = ["search"]  # the condition itself is searched
    else:
        try:
            conds = [components.canonical_condition(str(c)) for c in conds]
        except components.ConditionError as e:
            raise ConfigError(f"{where}: conditions: {e}") from None
    budget = grid._strict(f"{where}: budget", raw.get("budget"), BUDGET_KEYS)
    sched = grid._strict(f"{where}: scheduler", raw.get("scheduler"), SCHEDULER_KEYS)
    models = {m: grid._strict(f"{where}: models.{m}", o, grid.MODEL_KEYS) for m, o in (raw.get("models") or {}).items()}
    tune_opts = grid._strict(f"{where}: tune", raw.get("tune"), grid.TUNE_KEYS)
    space = SearchSpace(
        name=path.stem, study=str(raw.get("study") or f"search-{path.stem}"), base=base,
        conditions=tuple(conds), params=params, num_samples=int(budget.get("num_samples", 16)),
        time_budget_s=budget.get("time_budget_s"), grace_period=int(sched.get("grace_period", 1)),
        reduction_factor=int(sched.get("reduction_factor", 3)), seed=int(raw.get("seed", 0)),
        test_seeds=tuple(int(s) for s in raw.get("test_seeds", [100, 101, 102])), models=models,
        tune=tune_opts)
    if space.num_samples < 1:
        raise ConfigError(f"{where}: budget.num_samples must be >= 1, got {space.num_samples}")
    return space


class Sampler:
    """Optuna's define-by-run space: suggests the params (conditionals honoured) and returns the
    whole trial (key, config, resources) as a constant, so the trainable and the MLflow callback
    see the same trial a grid would give them."""

    def __init__(self, space: SearchSpace, condition: str, base: dict[str, Any], resources: dict[str, Any]):
        self.space, self.condition, self.base, self.resources = space, condition, base, resources

    def __call__(self, ot_trial) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for p in self.space.params:
            if any(values.get(dep) not in allowed for dep, allowed in p.when.items()):
                continue  # inactive: its condition does not hold
            values[p.name] = suggest(ot_trial, p)
        return {"trial": make_trial(self.base, self.condition, values, self.resources)}


def suggest(ot_trial, p: Param) -> Any:
    lo_hi = p.args
    if p.kind == "choice":
        return ot_trial.suggest_categorical(p.name, list(p.args))
    if p.kind == "uniform":
        return ot_trial.suggest_float(p.name, *lo_hi)
    if p.kind == "loguniform":
        return ot_trial.suggest_float(p.name, *lo_hi, log=True)
    if p.kind == "randint":  # Ray's convention: upper bound excluded
        return ot_trial.suggest_int(p.name, lo_hi[0], lo_hi[1] - 1)
    if p.kind == "lograndint":
        return ot_trial.suggest_int(p.name, lo_hi[0], lo_hi[1] - 1, log=True)
    # subset_of: one yes/no per component
    return [c for c in p.args if ot_trial.suggest_categorical(f"train_{c}", [True, False])]


def make_trial(base: dict[str, Any], condition: str, values: dict[str, Any],
               resources: dict[str, Any]) -> dict[str, Any]:
    """A trial dict (as the grid makes them) from base config + sampled values."""
    cfg = {**base, **{k: v for k, v in values.items() if k not in PSEUDO_KEYS}}
    if "components" in values:
        condition = "+".join(values["components"]) or "linear_probe"
    cfg["condition"] = components.canonical_condition(condition)
    if "beta1" in values or "beta2" in values:
        b1, b2 = FinetuneConfig.betas
        cfg["betas"] = [values.get("beta1", b1), values.get("beta2", b2)]
    full = from_dict(cfg).to_dict()
    return {"key": tracking.trial_key(full), "config": full, **resources}


# ---------------------------------------------------------------- running

def optuna_storage(folder: Path):
    import optuna

    folder.mkdir(parents=True, exist_ok=True)
    return optuna.storages.RDBStorage(f"sqlite:///{folder / 'optuna.db'}")


def completed_trials(storage, study_name: str) -> int:
    """Trials of the persisted study that finished; stale RUNNING ones (a killed search) are failed."""
    import optuna

    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        return 0
    done = 0
    for t in study.get_trials(deepcopy=False):
        if t.state == optuna.trial.TrialState.RUNNING:
            storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
        elif t.state == optuna.trial.TrialState.COMPLETE:
            done += 1
    return done


def search_condition(space: SearchSpace, condition: str, *, model: str, dataset: str, base: dict[str, Any],
                     tracking_uri: str, exp_id: str, parent: str, storage: Path, num_samples: int,
                     time_budget_s: float | None, resources: dict[str, Any], tuning: dict[str, Any],
                     verbose: int) -> dict[str, Any]:
    """One Optuna search (one condition); returns the best finished trial's config and score."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    from raystudy.trial import MlflowTrials, run_trial

    study_name = f"{space.study}-{model}-{dataset}-{condition}"
    cl = tracking.client(tracking_uri)
    # Runs a killed search left RUNNING: their configs are not resampled, so close them.
    tracking.close_stale(cl, exp_id, raystudy__search=study_name)
    ostore = optuna_storage(storage / "optuna")
    done = completed_trials(ostore, study_name)
    remaining = num_samples - done
    print(f"\n[{condition}] Optuna study {study_name!r}: {done} trials done, {max(remaining, 0)} to run", flush=True)
    if remaining > 0:
        steps = int(base.get("steps", FinetuneConfig.steps))
        searcher = OptunaSearch(space=Sampler(space, condition, base, resources), metric="score", mode="max",
                                seed=space.seed, storage=ostore, study_name=study_name)
        # max_t past the last step: a trial that reaches the end finishes itself (and is tested)
        scheduler = ASHAScheduler(time_attr="step", metric="score", mode="max", max_t=steps + 1,
                                  grace_period=min(space.grace_period, steps),
                                  reduction_factor=space.reduction_factor)
        cpu, gpu = resources["cpu"], resources["gpu"]
        tuner = tune.Tuner(
            tune.with_resources(run_trial, {"cpu": cpu, "gpu": gpu}),
            param_space={"storage_path": str(storage), "threads": int(tuning["threads_per_trial"]),
                         "checkpoint_every_s": float(tuning["checkpoint_every_s"])},
            tune_config=tune.TuneConfig(search_alg=searcher, scheduler=scheduler, num_samples=remaining,
                                        time_budget_s=time_budget_s, reuse_actors=True,
                                        max_concurrent_trials=tuning["max_concurrent"]),
            run_config=tune.RunConfig(
                name=f"{study_name}-{int(time.time())}", storage_path=str(storage), verbose=verbose,
                callbacks=[MlflowTrials(tracking_uri, exp_id, parent, {"raystudy.search": study_name})],
                failure_config=tune.FailureConfig(max_failures=int(tuning["max_failures"])),
                checkpoint_config=tune.CheckpointConfig(num_to_keep=2)),
        )
        tuner.fit()
        stale = tracking.close_stale(cl, exp_id, raystudy__search=study_name)
        if stale:  # every trial of this session has ended: none may stay RUNNING
            print(f"[{condition}] {stale} trial run(s) had no end from Tune; marked interrupted", flush=True)
    return best_of(cl, exp_id, study_name)


def best_of(cl, exp_id: str, study_name: str) -> dict[str, Any]:
    """The finished trial of ``study_name`` with the best validation accuracy, and the counts."""
    runs = tracking.find_runs(cl, exp_id, raystudy__role="trial", raystudy__search=study_name)
    status = [r.data.tags.get("raystudy.status") for r in runs]
    finished = [r for r, s in zip(runs, status) if s == "finished" and "best_val_acc" in r.data.metrics]
    out = {"study": study_name, "trials": len(runs), "stopped": status.count("stopped"),
           "finished": len(finished), "diverged": status.count("diverged"), "failed": status.count("failed")}
    if finished:
        best = max(finished, key=lambda r: r.data.metrics["best_val_acc"])
        import yaml

        text = cl.download_artifacts(best.info.run_id, "config.yaml")
        out.update(best_run=best.info.run_id, val_acc=best.data.metrics["best_val_acc"],
                   config=yaml.safe_load(Path(text).read_text()))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m raystudy.search", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--space", default="optimiser", help="YAML file or name under search_spaces/optuna/")
    ap.add_argument("--model", help="model (default: the space's base model)")
    ap.add_argument("--dataset", help="dataset (default: the space's base dataset)")
    ap.add_argument("--conditions", help="comma-separated subset of the space's conditions")
    ap.add_argument("--num-samples", type=int, help="trials per condition (default: the space's budget)")
    ap.add_argument("--time-budget", type=float, help="seconds per condition (default: the space's budget)")
    ap.add_argument("--test-seeds", help="comma-separated fresh seeds for the test evaluation (default: the space's)")
    ap.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a base config key")
    ap.add_argument("--address", default=None, help="Ray cluster (auto, HOST:PORT); default: a local Ray")
    ap.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or ./mlflow.db)")
    ap.add_argument("--experiment", help="MLflow experiment (default: raystudy-<study>-<model>)")
    ap.add_argument("--storage", help="storage path for checkpoints and the Optuna study (default: ./runs/search)")
    ap.add_argument("--num-cpus", type=int, help="CPUs of a local Ray")
    ap.add_argument("--ray-temp-dir", help="temp dir of a local Ray")
    ap.add_argument("--dry-run", action="store_true", help="validate the space and stop")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    from raystudy import data, models
    from raystudy.finetune import parse_set

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        space = load_space(args.space)
        base = {**space.base, **parse_set(args.set or [])}
        if args.model:
            base["model"] = args.model
        if args.dataset:
            base["dataset"] = args.dataset
        model = base.get("model", FinetuneConfig.model)
        dataset = base.get("dataset", FinetuneConfig.dataset)
        models.check_model(model)
        data.check_dataset(dataset)
        conditions = list(space.conditions)
        if args.conditions:
            conditions = grid._parse_list("--conditions", args.conditions, conditions, grid._canon_condition)
        validate(from_dict(base))
        mopts = grid.model_options(space.models, model)
        if mopts["workers"] > 1:
            raise ConfigError("searches run single-worker trials; use the grid for DDP models")
        resources = {"gpu": float(mopts["gpu"]), "cpu": float(mopts["cpu"]), "workers": 1}
        num_samples = args.num_samples or space.num_samples
        if num_samples < 1:
            raise ConfigError(f"--num-samples must be >= 1, got {num_samples}")
        time_budget = args.time_budget or space.time_budget_s
        test_seeds = [int(s) for s in args.test_seeds.split(",")] if args.test_seeds else list(space.test_seeds)
        tuning = {"max_failures": 1, "max_concurrent": None, "threads_per_trial": 1,
                  "checkpoint_every_s": 60.0, **space.tune}
        # a dry sample through the sampler catches configs the space can produce but validate refuses
        probe = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        for _ in range(8):
            for cond in conditions:
                validate(from_dict(Sampler(space, cond, base, resources)(probe.ask())["trial"]["config"]))
        uri = args.tracking_uri or tracking.default_uri()
        experiment = args.experiment or f"raystudy-{space.study}-{models.resolve_name(model).split('.')[0]}"
        print(f"search {space.name}: {model} on {dataset}; conditions {', '.join(conditions)}; "
              f"{num_samples} trials each" + (f", at most {time_budget:g} s each" if time_budget else "")
              + f"; best re-evaluated on test with seeds {test_seeds}")
        if args.dry_run:
            print("dry run: nothing started")
            return 0
        tracking.check_uri(uri)
        grid.check_address(args.address)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    storage = Path(args.storage or "runs/search").resolve()
    grid.start_ray(args.address, args.num_cpus, args.ray_temp_dir, dashboard=False)
    import ray

    cl = tracking.client(uri)
    exp_id = tracking.experiment_id(cl, experiment, tracking.default_artifact_location(uri))
    skey = tracking.trial_key({"space": space.name, "model": model, "dataset": dataset, "base": base,
                               "conditions": conditions})
    parent = tracking.parent_run(cl, exp_id, skey, f"search-{space.name}-{model}-{dataset}",
                                 {"space": space.name, "model": model, "dataset": dataset,
                                  "num_samples": num_samples}, role="search")
    summary = []
    try:
        for cond in conditions:
            best = search_condition(space, cond, model=model, dataset=dataset, base=base, tracking_uri=uri,
                                    exp_id=exp_id, parent=parent, storage=storage, num_samples=num_samples,
                                    time_budget_s=time_budget, resources=resources, tuning=tuning,
                                    verbose=0 if args.quiet else 1)
            if "config" not in best:
                print(f"[{cond}] no trial finished: nothing to evaluate on test")
                summary.append({"condition": cond, **best})
                continue
            trials = [grid.Trial(tracking.trial_key(c), c, resources["gpu"], resources["cpu"], 1)
                      for c in ({**best["config"], "seed": s} for s in test_seeds)]
            counts = grid.run_grid(trials, label=f"{best['study']}-test", model=model, tracking_uri=uri,
                                   experiment=experiment, storage=storage, max_failures=int(tuning["max_failures"]),
                                   max_concurrent=None, threads=int(tuning["threads_per_trial"]),
                                   checkpoint_every_s=float(tuning["checkpoint_every_s"]),
                                   verbose=0, role="search-test")
            df = grid.results_frame(uri, exp_id, [t.key for t in trials])
            acc = df[df["status"] == "finished"]["test_acc"]
            summary.append({"condition": best["config"]["condition"] if cond == "search" else cond, **best,
                            "test_acc": float(acc.mean()) if len(acc) else math.nan,
                            "test_std": float(acc.std()) if len(acc) > 1 else math.nan,
                            "test_runs": counts["finished"]})
    finally:
        cl.set_terminated(parent, status="FINISHED")
        ray.shutdown()
    print("\nbest configuration per condition (chosen on validation, tested with fresh seeds):")
    for s in summary:
        if "config" not in s:
            print(f"  {s['condition']:<16} no finished trial ({s['trials']} trials, {s['stopped']} stopped early)")
            continue
        c = s["config"]
        knobs = ", ".join(f"{k}={c[k]:.3g}" if isinstance(c[k], float) else f"{k}={c[k]}"
                          for k in ("optimizer", "lr", "weight_decay", "warmup_steps", "batch_size") if k in c)
        print(f"  {s['condition']:<16} val {s['val_acc']:.4f}  test {s['test_acc']:.4f} ± {s['test_std']:.4f} "
              f"({s['test_runs']} seeds)  [{knobs}]  trials: {s['finished']} finished, "
              f"{s['stopped']} stopped early by ASHA")
    return 0


if __name__ == "__main__":
    sys.exit(main())
