"""The study grid on Ray: Tune schedules the trials, workers run them, MLflow records each once.

    python -m raystudy.grid                                  # the offline demo grid (local Ray + SQLite)
    python -m raystudy.grid --model vit_huge                 # the paper's grid (search_spaces/paper.yaml)
    python -m raystudy.grid --model vit_base --dry-run       # count trials and GPU-hours, start nothing
    python -m raystudy.grid --space paper --datasets cifar10,pets --conditions MHA,LN1 --optimizers sgd,adamw
    python -m raystudy.grid --address auto                   # on the cluster started by `ray up cluster.yaml`

Rerunning the same command after a crash or a kill resumes the unfinished trials (from their last
checkpoint) and skips the finished ones; MLflow keeps exactly one run per trial config.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raystudy import components, costs, tracking
from raystudy.config import ConfigError, FinetuneConfig, from_dict, read_yaml, validate

SPACES_DIR = Path(__file__).resolve().parent.parent / "search_spaces"
SPACE_KEYS = ("study", "description", "base", "grid", "datasets", "optimizers", "models", "tune",
              "step_times")
GRID_AXES = ("condition", "lr", "seed", "optimizer")
MODEL_KEYS = ("gpu", "cpu", "workers", "step_seconds", "config")
TUNE_KEYS = ("max_failures", "max_concurrent", "threads_per_trial", "checkpoint_every_s")
SAMPLERS = ("choice", "uniform", "loguniform", "quniform", "qloguniform", "randint", "lograndint",
            "randn", "sample_from")


@dataclass(frozen=True)
class Space:
    """A grid as data: base config, grid axes, per-dataset/optimizer/model overrides."""

    name: str
    study: str
    base: dict[str, Any]
    grid: dict[str, list]
    datasets: dict[str, dict[str, Any]]
    optimizers: dict[str, dict[str, Any]]
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    tune: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    step_times: Path | None = None  # measured step times (raystudy.costs), if the space names a file


# ---------------------------------------------------------------- spaces

def space_path(name_or_path: str, folder: Path = SPACES_DIR) -> Path:
    """A space YAML given by path, or by name under ``folder``."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.is_file():
            raise ConfigError(f"search space file {str(p)!r} does not exist")
        return p
    cand = folder / f"{name_or_path}.yaml"
    if not cand.is_file():
        known = sorted(q.stem for q in folder.glob("*.yaml"))
        raise ConfigError(f"unknown search space {name_or_path!r}; valid: {', '.join(known)} or a YAML file")
    return cand


def _grid_values(where: str, value: Any) -> list:
    """A grid axis: ``{grid_search: [...]}`` or one constant (Ray's own names)."""
    if isinstance(value, dict):
        if set(value) == {"grid_search"} and isinstance(value["grid_search"], list) and value["grid_search"]:
            return list(value["grid_search"])
        if len(value) == 1 and next(iter(value)) in SAMPLERS:
            raise ConfigError(f"{where}: {next(iter(value))!r} is a sampling distribution; a grid takes "
                              "grid_search lists (sampled spaces run with python -m raystudy.search)")
        raise ConfigError(f"{where}: expected {{grid_search: [values]}} or a constant, got {value!r}")
    return [value]


def _strict(where: str, d: Any, allowed: tuple[str, ...]) -> dict:
    if d is None:
        return {}
    if not isinstance(d, dict):
        raise ConfigError(f"{where} must be a mapping, got {type(d).__name__}")
    for k in d:
        if k not in allowed:
            raise ConfigError(f"unknown key {k!r} in {where}; valid: {', '.join(allowed)}")
    return d


def load_space(name_or_path: str) -> Space:
    """Read and check a grid space; every error is one line naming the bad key or value."""
    path = space_path(name_or_path)
    raw = read_yaml(path)
    _strict(f"search space {path.name}", raw, SPACE_KEYS)
    cfg_keys = tuple(FinetuneConfig.__dataclass_fields__)
    base = _strict(f"{path.name}: base", raw.get("base"), cfg_keys)
    grid_raw = _strict(f"{path.name}: grid", raw.get("grid"), cfg_keys)
    grid = {k: _grid_values(f"{path.name}: grid.{k}", v) for k, v in grid_raw.items()}
    datasets = {}
    for ds, over in _strict(f"{path.name}: datasets", raw.get("datasets"),
                            tuple(raw.get("datasets") or ())).items():
        over = _strict(f"{path.name}: datasets.{ds}", over, cfg_keys)
        datasets[ds] = over
    if not datasets:
        raise ConfigError(f"{path.name}: 'datasets' must list at least one dataset")
    optimizers = {}
    for opt, over in (raw.get("optimizers") or {"sgd": {}}).items():
        over = _strict(f"{path.name}: optimizers.{opt}", over, cfg_keys + ("lr_scale",))
        optimizers[opt] = over
    models = {}
    for m, over in (raw.get("models") or {}).items():
        over = _strict(f"{path.name}: models.{m}", over, MODEL_KEYS)
        _strict(f"{path.name}: models.{m}.config", over.get("config"), cfg_keys)
        models[m] = over
    tune_opts = _strict(f"{path.name}: tune", raw.get("tune"), TUNE_KEYS)
    step_times = raw.get("step_times")
    if step_times is not None and not (isinstance(step_times, str) and step_times.strip()):
        raise ConfigError(f"{path.name}: step_times must be a file path, got {step_times!r}")
    space = Space(name=path.stem, study=str(raw.get("study") or path.stem), base=base, grid=grid,
                  datasets=datasets, optimizers=optimizers, models=models, tune=tune_opts,
                  description=str(raw.get("description") or ""),
                  step_times=path.parent / step_times if step_times else None)
    return space


def _parse_list(flag: str, value: str | None, allowed: list[str], canon=lambda s: s) -> list[str] | None:
    if value is None:
        return None
    items = [canon(v.strip()) for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise ConfigError(f"{flag}: {', '.join(bad) or 'empty list'} not in this space; valid: {', '.join(allowed)}")
    return items


@dataclass(frozen=True)
class Trial:
    key: str
    config: dict[str, Any]
    gpu: float
    cpu: float
    workers: int

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "config": self.config, "gpu": self.gpu, "cpu": self.cpu,
                "workers": self.workers}


def model_options(section: dict[str, dict[str, Any]], model: str) -> dict[str, Any]:
    """A space's per-model ``section`` entry for ``model`` (by alias or full name), defaults filled."""
    from raystudy import models

    opts = section.get(model) or section.get(models.resolve_name(model)) or {}
    return {"gpu": 0, "cpu": 1, "workers": 1, "step_seconds": None, "config": {}, **opts}


def expand(space: Space, model: str | None = None, datasets: list[str] | None = None,
           conditions: list[str] | None = None, optimizers: list[str] | None = None,
           overrides: dict[str, Any] | None = None) -> list[Trial]:
    """Every trial of the grid, each a validated flat config with its key and resources."""
    model = model or space.base.get("model", FinetuneConfig.model)
    mopts = model_options(space.models, model)
    ds_list = datasets or list(space.datasets)
    opt_list = optimizers or [o for o in space.grid.get("optimizer", list(space.optimizers))]
    trials = []
    for ds in ds_list:
        dover = space.datasets[ds]
        for opt in opt_list:
            if opt not in space.optimizers:
                raise ConfigError(f"optimizer {opt!r} has no section in the space's 'optimizers'; "
                                  f"valid: {', '.join(space.optimizers)}")
            oover = dict(space.optimizers[opt])
            lr_scale = float(oover.pop("lr_scale", 1.0))
            axes = {**space.grid, **{k: _grid_values(f"datasets.{ds}.{k}", v) for k, v in dover.items()}}
            axes.pop("optimizer", None)
            if conditions is not None:
                axes["condition"] = conditions
            names = list(axes)
            for values in itertools.product(*(axes[n] for n in names)):
                cfg = {**space.base, **mopts["config"], "model": model, "dataset": ds, "optimizer": opt,
                       **oover, **dict(zip(names, values)), **(overrides or {})}
                if "lr" in cfg and "lr" not in (overrides or {}):
                    cfg["lr"] = float(cfg["lr"]) * lr_scale
                cfg["condition"] = components.canonical_condition(str(cfg.get("condition", "MHA")))
                full = validate(from_dict(cfg)).to_dict()
                trials.append(Trial(tracking.trial_key(full), full, float(mopts["gpu"]),
                                    float(mopts["cpu"]), int(mopts["workers"])))
    keys = [t.key for t in trials]
    if len(set(keys)) != len(keys):
        raise ConfigError("the grid repeats a trial config (two axes give the same values)")
    if not trials:
        raise ConfigError("the grid is empty: no dataset × condition × lr × seed × optimizer left")
    return trials


def grid_key(trials: list[Trial]) -> str:
    return hashlib.sha256(json.dumps(sorted(t.key for t in trials)).encode()).hexdigest()[:12]


def gpu_hours(space: Space, model: str, trials: list[Trial]) -> costs.Estimate:
    """Estimated GPU-hours of ``trials``: from the space's measured step times (``step_times``)
    where they cover a trial, else from its FLOP-based ``step_seconds``; see raystudy.costs."""
    return costs.estimate(model, [costs.TrialCost(t.config["condition"], t.config["steps"],
                                                  t.config["batch_size"], t.workers,
                                                  max(t.gpu, 1) * t.workers, t.config["compile"])
                                  for t in trials],
                          step_times=space.step_times,
                          fallback=model_options(space.models, model)["step_seconds"])


# ---------------------------------------------------------------- Ray

def check_address(address: str | None) -> None:
    """An explicit HOST:PORT must answer before Ray spends a minute retrying."""
    if address in (None, "", "auto", "local") or address.startswith(("ray://", "anyscale://")):
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--address {address!r}: expected auto, local or HOST:PORT")
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            pass
    except OSError as e:
        raise ConfigError(f"--address {address}: no Ray cluster answers there ({e.strerror or e}); "
                          "start one with `ray up cluster.yaml`, or omit --address for a local Ray") from None


def start_ray(address: str | None, num_cpus: int | None, temp_dir: str | None, dashboard: bool) -> None:
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # Each evaluation checkpoints; Tune then snapshots often and warns about it at length.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    if address in (None, "", "local"):
        ray.init(num_cpus=num_cpus, include_dashboard=dashboard, _temp_dir=temp_dir,
                 log_to_driver=False, configure_logging=False)
    else:
        try:
            ray.init(address=address, log_to_driver=False)
        except ConnectionError as e:
            raise ConfigError(f"--address {address}: {str(e).splitlines()[0]}") from None


def run_grid(trials: list[Trial], *, label: str, model: str, tracking_uri: str, experiment: str,
             storage: Path, max_failures: int, max_concurrent: int | None, threads: int,
             checkpoint_every_s: float = 0.0, verbose: int = 1, role: str = "grid") -> dict[str, Any]:
    """Run ``trials`` on the connected Ray; returns counts. Resumes an interrupted run of the same grid.

    ``label`` names the parent run (``<role>-<label>``) and Tune's experiment folder.
    """
    from ray import tune

    from raystudy.trial import MlflowTrials, run_trial

    cl = tracking.client(tracking_uri)
    exp_id = tracking.experiment_id(cl, experiment, tracking.default_artifact_location(tracking_uri))
    gkey = grid_key(trials)
    parent = tracking.parent_run(cl, exp_id, gkey, f"{role}-{label}",
                                 {"label": label, "model": model, "trials": len(trials)}, role=role)
    cl.set_tag(parent, "raystudy.status", "running")

    known = tracking.statuses(cl, exp_id)
    done = {t.key for t in trials if known.get(t.key) in tracking.TERMINAL}
    pending = [t for t in trials if t.key not in done]
    name = f"{label}-{gkey}"
    path = f"{str(storage).rstrip('/')}/{name}" if "://" in str(storage) else storage / name
    counts = {"trials": len(trials), "already_done": len(done)}
    if pending:
        base = {"storage_path": str(storage), "threads": threads, "checkpoint_every_s": checkpoint_every_s}

        def resources(config):
            t = config["trial"]
            if t["workers"] > 1:  # the trial only drives its TorchTrainer, whose workers hold the devices
                return tune.PlacementGroupFactory([{"CPU": 0.01}])
            return tune.PlacementGroupFactory([{"CPU": t["cpu"], "GPU": t["gpu"]}])

        trainable = tune.with_resources(run_trial, resources)
        if tune.Tuner.can_restore(str(path)):
            print(f"resuming {path}: {len(pending)} of {len(trials)} trials unfinished", flush=True)
            tuner = tune.Tuner.restore(str(path), trainable, resume_unfinished=True, resume_errored=True)
        else:
            tuner = tune.Tuner(
                trainable,
                param_space={**base, "trial": tune.grid_search([t.as_dict() for t in pending])},
                tune_config=tune.TuneConfig(reuse_actors=True, max_concurrent_trials=max_concurrent,
                                            trial_name_creator=_trial_name, trial_dirname_creator=_trial_name),
                run_config=tune.RunConfig(
                    name=name, storage_path=str(storage), verbose=verbose,
                    callbacks=[MlflowTrials(tracking_uri, exp_id, parent)],
                    failure_config=tune.FailureConfig(max_failures=max_failures),
                    checkpoint_config=tune.CheckpointConfig(num_to_keep=1)),
            )
        tuner.fit()
        # Tune has ended every trial; a run it never reported an end for must not stay RUNNING.
        stale = tracking.close_stale(cl, exp_id, mlflow__parentRunId=parent)
        if stale:
            print(f"{stale} trial run(s) had no end from Tune; marked interrupted", flush=True)
    known = tracking.statuses(cl, exp_id)
    statuses = [known.get(t.key) for t in trials]
    for s in ("finished", "diverged", "failed"):
        counts[s] = statuses.count(s)
    counts["unfinished"] = len(trials) - sum(counts[s] for s in ("finished", "diverged", "failed"))
    cl.set_tag(parent, "raystudy.status", "finished" if not counts["unfinished"] else "incomplete")
    cl.set_terminated(parent, status="FINISHED")
    counts.update(experiment_id=exp_id, parent_run_id=parent)
    return counts


def _trial_name(trial) -> str:
    c = trial.config["trial"]["config"]
    return f"{c['condition']}_{c['dataset']}_{c['optimizer']}_lr{c['lr']:g}_s{c['seed']}_{trial.trial_id}"


# ---------------------------------------------------------------- results

def results_frame(tracking_uri: str, experiment_id: str, keys: list[str]):
    """One row per trial of this grid: condition, dataset, optimizer, lr, seed, status, accuracies."""
    import pandas as pd

    cl = tracking.client(tracking_uri)
    rows = []
    for run in tracking.find_runs(cl, experiment_id, raystudy__role="trial"):
        t = run.data.tags
        if t.get("raystudy.key") not in keys:
            continue
        p, m = run.data.params, run.data.metrics
        rows.append({"run_id": run.info.run_id, "model": p.get("model"), "dataset": p.get("dataset"),
                     "condition": p.get("condition"), "optimizer": p.get("optimizer"),
                     "lr": float(p.get("lr", "nan")), "seed": int(p.get("seed", -1)),
                     "status": t.get("raystudy.status"), "val_acc": m.get("best_val_acc"),
                     "test_acc": m.get("test_acc")})
    return pd.DataFrame(rows)


def ranking(df):
    """Per condition: the lr with the best mean validation accuracy (per dataset), then the mean ±
    std test accuracy over seeds at that lr, averaged over datasets; best first."""
    import pandas as pd

    ok = df[df["status"] == "finished"]
    if ok.empty:
        return pd.DataFrame(columns=["condition", "test_acc", "test_std", "best_lr", "runs"])
    by_lr = ok.groupby(["dataset", "condition", "lr"]).agg(val=("val_acc", "mean"), test=("test_acc", "mean"),
                                                           std=("test_acc", "std"), n=("test_acc", "size"))
    best = by_lr.loc[by_lr.groupby(level=["dataset", "condition"])["val"].idxmax()].reset_index()
    out = best.groupby("condition").agg(test_acc=("test", "mean"), test_std=("std", "mean"),
                                        best_lr=("lr", lambda s: ",".join(f"{v:g}" for v in sorted(set(s)))),
                                        runs=("n", "sum"))
    return out.sort_values("test_acc", ascending=False).reset_index()


# ---------------------------------------------------------------- CLI

def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m raystudy.grid", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--space", help="grid YAML file or name under search_spaces/ (default: demo, "
                                    "or paper when --model is given)")
    ap.add_argument("--model", help="model for every trial (alias, timm ViT name or vit_demo)")
    ap.add_argument("--datasets", help="comma-separated subset of the space's datasets")
    ap.add_argument("--conditions", help="comma-separated conditions (default: the space's)")
    ap.add_argument("--optimizers", help="comma-separated subset of the space's optimizers")
    ap.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key in every trial")
    ap.add_argument("--dry-run", action="store_true", help="validate, count trials and GPU-hours, start nothing")
    ap.add_argument("--address", default=os.environ.get("RAY_ADDRESS"),
                    help="Ray cluster: auto, HOST:PORT (default: $RAY_ADDRESS, else a local Ray)")
    ap.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else "
                                           "sqlite:///./mlflow.db)")
    ap.add_argument("--experiment", help="MLflow experiment (default: raystudy-<study>-<model>)")
    ap.add_argument("--storage", help="Ray storage path for checkpoints (default: ./runs/ray)")
    ap.add_argument("--max-failures", type=int, help="retries of a failing trial (default: the space's, or 2)")
    ap.add_argument("--max-concurrent", type=int, help="cap on concurrent trials (default: by resources)")
    ap.add_argument("--num-cpus", type=int, help="CPUs of a local Ray (default: all)")
    ap.add_argument("--ray-temp-dir", help="temp dir of a local Ray (default: Ray's)")
    ap.add_argument("--quiet", action="store_true", help="less Ray progress output")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from raystudy.finetune import parse_set

    try:
        space = load_space(args.space or ("paper" if args.model else "demo"))
        model = args.model or space.base.get("model", FinetuneConfig.model)
        from raystudy import models as models_mod

        models_mod.check_model(model)
        conds = _parse_list("--conditions", args.conditions,
                            [components.canonical_condition(c) for c in space.grid.get("condition", [])]
                            or list(components.PAPER_CONDITIONS), _canon_condition)
        datasets = _parse_list("--datasets", args.datasets, list(space.datasets))
        optimizers = _parse_list("--optimizers", args.optimizers, list(space.optimizers))
        trials = expand(space, model, datasets, conds, optimizers, parse_set(args.set or []))
        mopts = model_options(space.models, model)
        hours = gpu_hours(space, model, trials)
        tuning = {"max_failures": 2, "max_concurrent": None, "threads_per_trial": 1,
                  "checkpoint_every_s": 60.0, **space.tune}
        max_failures = args.max_failures if args.max_failures is not None else tuning["max_failures"]
        if max_failures < 0:
            raise ConfigError(f"--max-failures must be >= 0, got {max_failures}")
        uri = args.tracking_uri or tracking.default_uri()
        experiment = args.experiment or f"raystudy-{space.study}-{models_mod.resolve_name(model).split('.')[0]}"
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    ds_seen = sorted({t.config["dataset"] for t in trials}, key=list(space.datasets).index)
    gpus = mopts["gpu"] * mopts["workers"] if mopts["workers"] > 1 else mopts["gpu"]
    print(f"grid {space.name} for {model}: {len(trials)} trials = {len(ds_seen)} datasets × "
          f"{len({t.config['condition'] for t in trials})} conditions × "
          f"{len({t.config['optimizer'] for t in trials})} optimizers × lrs × seeds")
    print(f"  datasets: {', '.join(ds_seen)}")
    print(f"  GPUs per trial: {gpus:g}" + (f" ({mopts['workers']} DDP workers)" if mopts["workers"] > 1 else "")
          + f"; {hours.describe()}")
    if hours.measured:  # per condition: frozen components cost less
        print("  GPU-hours per condition: " + ", ".join(f"{c} {h:,.0f}" for c, h in hours.by_condition.items()))
    if args.dry_run:
        print("dry run: nothing started")
        return 0

    try:
        tracking.check_uri(uri)
        check_address(args.address)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    storage = Path(args.storage or "runs/ray").resolve() if not (args.storage or "").startswith(("s3://", "gs://")) else args.storage
    print(f"MLflow: {uri} (experiment {experiment!r}); checkpoints: {storage}", flush=True)
    t0 = time.time()
    try:
        start_ray(args.address, args.num_cpus, args.ray_temp_dir,
                  dashboard=any(t.workers > 1 for t in trials))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import ray

    try:
        max_conc = args.max_concurrent or tuning["max_concurrent"]
        if max_conc is None and mopts["workers"] > 1:  # nested TorchTrainers: one per free set of devices
            total = ray.cluster_resources().get("GPU" if mopts["gpu"] else "CPU", 0)
            # An autoscaling cluster may have no GPU node yet: then its max_workers is the cap.
            max_conc = max(1, int(total // max(1, mopts["workers"]))) if total else None
        counts = run_grid(trials, label=f"{space.study}-{model}", model=model, tracking_uri=uri, experiment=experiment,
                          storage=Path(storage) if isinstance(storage, Path) else storage,
                          max_failures=max_failures, max_concurrent=max_conc,
                          threads=int(tuning["threads_per_trial"]),
                          checkpoint_every_s=float(tuning["checkpoint_every_s"]), verbose=0 if args.quiet else 1)
    finally:
        ray.shutdown()
    print(f"\ndone in {time.time() - t0:.0f} s: {counts['finished']} finished, {counts['diverged']} diverged, "
          f"{counts['failed']} failed, {counts['unfinished']} unfinished "
          f"({counts['already_done']} were already done)")
    df = results_frame(uri, counts["experiment_id"], [t.key for t in trials])
    table = ranking(df)
    if not table.empty:
        print("\nranking (lr chosen on validation; mean test accuracy over seeds and datasets):")
        print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    if model == "vit_demo":
        print("\nnote: this is the tiny offline demo; the paper's claims are about large pretrained ViTs.")
    print(f"\nbrowse: mlflow ui --backend-store-uri {uri}" if uri.startswith("sqlite") else f"\nbrowse: {uri}")
    return 0 if counts["unfinished"] == 0 and counts["failed"] == 0 else 1


def _canon_condition(c: str) -> str:
    try:
        return components.canonical_condition(c)
    except components.ConditionError as e:
        raise ConfigError(str(e)) from None


if __name__ == "__main__":
    sys.exit(main())
