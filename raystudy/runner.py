"""The runner: Ray, Tune and the driver's MLflow records, shared by the grid and the searches.

``start_ray`` starts or joins Ray; ``run_grid`` runs a list of trials (a grid, or a search's
test re-evaluation) exactly once each, resuming an interrupted run of the same trials;
``search_condition`` runs one Optuna study under ASHA. In both, ``MlflowTrials`` writes MLflow
from the driver only: one writer, so a SQLite store never sees "database is locked", and runs
are found by trial key, so a rerun never duplicates one. Workers run ``raystudy.trial``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import pickle
import re
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

from ray import tune
from ray.tune.experiment import Trial as TuneTrial
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from raystudy import adaptive, console, paths, tracking
from raystudy.errors import ConfigError
from raystudy.spaces import Sampler, SearchSpace, Trial, grid_key
from raystudy.trial import run_trial
from raystudy.config import FinetuneConfig


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
    """Start a local Ray, or join ``address``.

    A local Ray is a laptop's: every one of its servers (GCS, raylets, workers, agents, dashboard)
    listens on 127.0.0.1 only, and Ray's token authentication stays on (its default for a new
    local cluster; RAY_AUTH_MODE, if set, is respected). A cluster's ports are guarded by its
    network (cluster.yaml's security group, a firewall on-prem).
    """
    import ray

    # Each evaluation checkpoints; Tune then snapshots often and warns about it at length.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    if address in (None, "", "local"):
        _loopback_only()
        ray.init(num_cpus=num_cpus, include_dashboard=dashboard, dashboard_host="127.0.0.1",
                 _temp_dir=temp_dir, log_to_driver=False, configure_logging=False)
        token = Path.home() / ".ray" / "auth_token"  # Ray writes it world-readable
        if token.is_file() and token.stat().st_uid == os.getuid():
            token.chmod(0o600)
    else:
        try:
            ray.init(address=address, log_to_driver=False)
        except ConnectionError as e:
            raise ConfigError(f"--address {address}: {str(e).splitlines()[0]}") from None


def _loopback_only() -> None:
    """Make Ray's node address 127.0.0.1, as on macOS and Windows: its servers then bind the
    loopback interface instead of every one. Ray 2.60 has no public option for this (it turns
    --node-ip-address 127.0.0.1 into the routable address); its "no cluster" switch does it, in
    this process (read at import) and in the processes Ray starts (from the environment)."""
    from ray._private import ray_constants

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


# ---------------------------------------------------------------- one driver per grid

class GridBusy(ConfigError):
    """Another driver runs this grid (same storage and key)."""


_HELD: dict[str, int] = {}


def grid_name(trials: list[Trial], label: str) -> str:
    """The grid's folder under the storage path (and its lock's name)."""
    return f"{label}-{grid_key(trials)}"


def lock_path(storage: Path | str, name: str) -> Path:
    """Next to the grid's Tune folder; for object storage (s3://), in the local cache, keyed by it."""
    if "://" in str(storage):
        digest = hashlib.sha256(f"{storage}/{name}".encode()).hexdigest()[:16]
        return paths.cache() / "locks" / f"{name}-{digest}.lock"
    return Path(storage) / f".{name}.lock"


@contextlib.contextmanager
def grid_lock(storage: Path | str, name: str, log=print):
    """Hold the grid's lock while driving it, or raise ``GridBusy`` naming the driver that does.

    An advisory ``flock`` on a file that names its holder (host, pid, start): the kernel drops it
    when the holder dies, however it dies, so a stale file is simply taken over. On a shared
    folder across hosts this needs a file system with working locks (NFSv4 does). Reentrant in
    one process (the grid holds it before starting Ray; ``run_grid`` takes it again).
    """
    path = lock_path(storage, name)
    key = str(path)
    if key in _HELD:
        _HELD[key] += 1
        try:
            yield
        finally:
            _HELD[key] -= 1
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a+")
    try:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            h = _holder(f.read())
            raise GridBusy(f"grid {name} is already being run by pid {h.get('pid', '?')} on host "
                           f"{h.get('host', '?')} (since {h.get('started', '?')}; lock {path}); "
                           "wait for it to end or stop it first") from None
        f.seek(0)
        old = _holder(f.read())
        if old and log:
            log(f"the grid's last driver (pid {old.get('pid')} on {old.get('host')}) is gone; taking over its lock")
        f.seek(0)
        f.truncate()
        f.write(json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                            "started": time.strftime("%Y-%m-%d %H:%M:%S")}))
        f.flush()
        _HELD[key] = 1
        try:
            yield
        finally:
            del _HELD[key]
            f.seek(0)
            f.truncate()  # an empty file: released cleanly
            f.flush()
    finally:
        f.close()  # drops the flock


def _holder(text: str) -> dict:
    try:
        return json.loads(text) if text.strip() else {}
    except ValueError:
        return {}


def run_grid(trials: list[Trial], *, label: str, model: str, tracking_uri: str, experiment: str,
             storage: Path, max_failures: int, max_concurrent: int | None, threads: int,
             checkpoint_every_s: float = 0.0, verbose: int = 0, quiet: bool = False,
             role: str = "grid", policy: adaptive.Policy | None = None) -> dict[str, Any]:
    """Run ``trials`` on the connected Ray; returns counts. Resumes an interrupted run of the same grid.

    ``label`` names the parent run (``<role>-<label>``) and Tune's experiment folder. Raises
    ``GridBusy`` if another driver runs the same grid. One line per trial that ends
    (``console.ConsoleTrials``; ``quiet``: only those that did not finish); ``verbose`` > 0
    brings back Tune's own tables and its result files (JSON, CSV, TensorBoard). ``policy``
    (``raystudy.adaptive``) stops trials the study does not need (``AdaptiveScheduler``); they
    are recorded ``stopped``.
    """
    with grid_lock(storage, grid_name(trials, label)):
        return _run_grid(trials, label=label, model=model, tracking_uri=tracking_uri, experiment=experiment,
                         storage=storage, max_failures=max_failures, max_concurrent=max_concurrent,
                         threads=threads, checkpoint_every_s=checkpoint_every_s, verbose=verbose, quiet=quiet,
                         role=role, policy=policy)


def _run_grid(trials: list[Trial], *, label: str, model: str, tracking_uri: str, experiment: str,
              storage: Path, max_failures: int, max_concurrent: int | None, threads: int,
              checkpoint_every_s: float, verbose: int, quiet: bool, role: str,
              policy: adaptive.Policy | None = None) -> dict[str, Any]:
    cl = tracking.client(tracking_uri)
    exp_id = tracking.experiment_id(cl, experiment, tracking.default_artifact_location(tracking_uri))
    gkey = grid_key(trials)
    name = grid_name(trials, label)
    parent = tracking.parent_run(cl, exp_id, gkey, f"{role}-{label}",
                                 {"label": label, "model": model, "trials": len(trials)}, role=role)
    cl.set_tag(parent, tracking.STATUS, "running")

    known = tracking.statuses(cl, exp_id)
    done = {t.key for t in trials if known.get(t.key) in tracking.TERMINAL}
    pending = [t for t in trials if t.key not in done]
    path = f"{str(storage).rstrip('/')}/{name}" if "://" in str(storage) else storage / name
    counts = {"trials": len(trials), "already_done": len(done), "interrupted": 0}
    asked_to_stop = False
    if pending:
        base = {"storage_path": str(storage), "threads": threads, "checkpoint_every_s": checkpoint_every_s}

        def resources(config):
            t = config["trial"]
            if t["workers"] > 1:  # the trial only drives its TorchTrainer, whose workers hold the devices
                return tune.PlacementGroupFactory([{"CPU": 0.01}])
            return tune.PlacementGroupFactory([{"CPU": t["cpu"], "GPU": t["gpu"]}])

        trainable = tune.with_resources(run_trial, resources)
        lines = console.ConsoleTrials(len(trials), done, console.varying(t.config for t in trials), quiet=quiet)
        tuner = None
        if tune.Tuner.can_restore(str(path)):
            with _tune_output(verbose):  # restoring reads the trials' results back, and warns too
                tuner, why = _restore(path, trainable)
            if tuner is None:
                print(f"could not restore the interrupted run's Tune state at {path} ({why}); "
                      f"starting afresh over the {len(pending)} unfinished trials (MLflow knows which are done)",
                      flush=True)
                path = _set_aside(path, storage, name)
            else:
                print(f"resuming {path}: {len(pending)} of {len(trials)} trials unfinished", flush=True)
                _set_console(tuner, lines, verbose)
        if tuner is None:
            scheduler = None
            if policy is not None:  # earlier seeds first: decisions on them come before later seeds start
                pending = sorted(pending, key=_seed_major(trials))
                scheduler = AdaptiveScheduler(policy, trials, tracking_uri, exp_id)
            kept, pruner = keep_checkpoints()
            tuner = tune.Tuner(
                trainable,
                param_space={**base, "trial": tune.grid_search([t.as_dict() for t in pending])},
                tune_config=tune.TuneConfig(reuse_actors=True, max_concurrent_trials=max_concurrent,
                                            scheduler=scheduler,
                                            trial_name_creator=_trial_name, trial_dirname_creator=_trial_name),
                run_config=tune.RunConfig(
                    name=Path(str(path)).name, storage_path=str(storage), verbose=verbose,
                    callbacks=[MlflowTrials(tracking_uri, exp_id, parent), lines, pruner, *_result_files(verbose)],
                    failure_config=tune.FailureConfig(max_failures=max_failures),
                    checkpoint_config=kept),
            )
        try:
            with _tune_output(verbose) as notice:
                tuner.fit()
            asked_to_stop = notice.received
        except BaseException:
            # A crash or an interrupt of the driver: the parent says so (the finally closes it).
            cl.set_tag(parent, tracking.STATUS, "interrupted")
            raise
        finally:
            # Tune has ended every trial (or the driver is going down): no run stays RUNNING.
            with uninterrupted():
                counts["interrupted"] = tracking.close_stale(cl, exp_id, mlflow__parentRunId=parent)
                cl.set_terminated(parent, status="FINISHED")
    if policy is not None:
        late = stop_late(cl, exp_id, trials, policy)
        if late:
            print(f"{late} trial(s) ended before the policy's decision to stop them; recorded stopped", flush=True)
    known = tracking.statuses(cl, exp_id)
    statuses = [known.get(t.key) for t in trials]
    for s in ("finished", "diverged", "failed", "stopped"):
        counts[s] = statuses.count(s)
    counts["unfinished"] = len(trials) - sum(counts[s] for s in ("finished", "diverged", "failed", "stopped"))
    if counts["interrupted"] and not counts["unfinished"]:  # Tune ended them, yet MLflow had no end
        print(f"{counts['interrupted']} trial run(s) had no end from Tune; marked interrupted", flush=True)
    stopped = asked_to_stop and counts["unfinished"]
    status = "interrupted" if stopped else "incomplete" if counts["unfinished"] else "finished"
    cl.set_tag(parent, tracking.STATUS, status)
    if stopped:
        raise Stopped(f"{counts['unfinished']} of {len(trials)} trials unfinished")
    counts.update(experiment_id=exp_id, parent_run_id=parent)
    return counts


class Stopped(KeyboardInterrupt):
    """A Tune run the user stopped with one Ctrl-C: Tune's graceful stop returns from ``fit()``
    as if the run were done. Raised once MLflow is closed, so that a command line ends as it does
    on a second Ctrl-C, instead of going on to its next stage."""


@contextlib.contextmanager
def uninterrupted():
    """Ctrl-C ignored while MLflow is being closed: a user pressing it again (Tune's graceful stop
    is slow) would otherwise cut the closing short and leave runs RUNNING."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _restore(path, trainable):
    """(the Tuner of an interrupted run of this grid, "") or (None, why not): its state cannot
    be read (half written: a full disk) or is not a grid's (no ``trial`` grid in its param
    space: Tune would start trials without their config)."""
    try:
        if isinstance(path, Path):  # Tune keeps the param space's shape in tuner.pkl; it does not check it
            with open(path / "tuner.pkl", "rb") as f:
                shape = pickle.load(f).get("__flattened_param_space_keys")
            if shape is not None and "trial/grid_search" not in shape:
                return None, f"its param space ({', '.join(shape)}) has no trial grid"
        return tune.Tuner.restore(str(path), trainable, resume_unfinished=True, resume_errored=True), ""
    except Exception as e:  # noqa: BLE001 - any unreadable state is handled the same way
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        return None, f"{type(e).__name__}: {first}"


def _set_console(tuner, lines: console.ConsoleTrials, verbose: int) -> None:
    """A restored Tuner keeps the first session's run config (Tune has no option to change it):
    give it this session's verbosity and console, numbered from what MLflow holds now."""
    rc = tuner._local_tuner.get_run_config()
    rc.verbose = verbose
    rc.callbacks = [c for c in rc.callbacks or [] if not isinstance(c, console.ConsoleTrials)] + [lines]


def _result_files(verbose: int) -> list:
    """Tune's result files: only the JSON one, which Tune reads back at the end, unless Tune's
    own output is asked for (MLflow holds every result; its TensorBoard writer only warns)."""
    from ray.tune.logger import JsonLoggerCallback

    return [] if verbose else [JsonLoggerCallback()]


@contextlib.contextmanager
def _tune_output(verbose: int):
    """Tune silent but for errors when ``verbose`` is 0: its new output engine prints an
    experiment header even then, the classic one does not, and no default result loggers.
    Yields a ``_StopNotice``: whether the user stopped the run (Tune's first-Ctrl-C handler ran)."""
    quiet = {"RAY_AIR_NEW_OUTPUT": "0", "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1"} if not verbose else {}
    saved = {k: os.environ.get(k) for k in quiet}
    os.environ.update(quiet)
    # On Ctrl-C, Tune's warnings tell the user to call Tuner.restore and list the trials that
    # never started as missing metrics; the driver says instead what the first Ctrl-C does, and at
    # the end that its command resumes it.
    muted, tune_log = logging.getLogger("ray.tune.analysis.experiment_analysis"), logging.getLogger("ray.tune.tune")
    level, notice = muted.level, _StopNotice(quiet=bool(quiet))
    if quiet:
        muted.setLevel(logging.ERROR)
    tune_log.addFilter(notice)
    # Tune leaves its Ctrl-C handler installed after a run that was not stopped: the next Ctrl-C
    # (between a search's studies, in the next Tune run) would only set that ended run's flag.
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGINT) if main else None
    try:
        yield notice
    finally:
        if main and handler is not None:  # None: a handler not set from Python, left alone
            signal.signal(signal.SIGINT, handler)
        muted.setLevel(level)
        tune_log.removeFilter(notice)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class _StopNotice(logging.Filter):
    """Notes Tune's Ctrl-C warning (``received``). ``quiet``: Tune's log, errors only, and the
    warning becomes the driver's line."""

    def __init__(self, quiet: bool):
        super().__init__()
        self.quiet, self.received = quiet, False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("Stop signal received"):
            self.received = True
            if self.quiet:
                print("\nstopping: saving Tune's state and ending the running trials; Ctrl-C again to stop at once",
                      flush=True)
            return not self.quiet
        return not self.quiet or record.levelno >= logging.ERROR


def _set_aside(path, storage, name: str):
    """A folder for a fresh run: the unusable one is renamed (kept for a post-mortem), or on
    object storage a new name is used."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if isinstance(path, Path):
        os.replace(path, path.with_name(f"{name}.unrestorable-{stamp}"))
        return path
    return f"{str(storage).rstrip('/')}/{name}-{stamp}"


def _seed_major(trials: list[Trial]):
    """Sort key: a trial's seed's index in its cell, then its cell and lr."""
    seeds: dict[tuple, list] = {}
    for t in trials:
        seeds.setdefault(tuple(t.config[c] for c in adaptive.CELL), []).append(t.config["seed"])

    def key(t: Trial):
        cell = tuple(t.config[c] for c in adaptive.CELL)
        return (sorted(set(seeds[cell])).index(t.config["seed"]), *map(str, cell), t.config["lr"])
    return key


# ---------------------------------------------------------------- study-level early stopping

def recorded_view(cl, exp_id: str, trials: list[Trial]) -> dict[str, adaptive.Seen]:
    """What MLflow holds of ``trials``, as the policy sees it (a resumed driver starts from it)."""
    keys = {t.key for t in trials}
    seen = {}
    for run in tracking.find_runs(cl, exp_id, raystudy__role="trial"):
        key, status = run.data.tags.get(tracking.KEY), run.data.tags.get(tracking.STATUS)
        if key in keys and (key not in seen or status in tracking.TERMINAL):
            seen[key] = tracking.policy_view(cl, run)
    return seen


def stop_late(cl, exp_id: str, trials: list[Trial], policy: adaptive.Policy) -> int:
    """Runs the policy stops that finished before its decision came (their rung completed after
    they ended): recorded ``stopped`` too, so the analysis sees what the policy decided."""
    from mlflow.entities import RunTag

    decisions = adaptive.decide(policy, [adaptive.trial_of(t.key, t.config) for t in trials],
                                recorded_view(cl, exp_id, trials))
    n = 0
    for key, stop in decisions.items():
        status, run = tracking.trial_status(cl, exp_id, key)
        if status == "finished":
            cl.log_batch(run.info.run_id, tags=[RunTag(tracking.STATUS, "stopped"),
                                                RunTag(tracking.STOPPED_AT, str(stop.step)),
                                                RunTag("raystudy.stopped_late", "1"),
                                                RunTag("raystudy.stop_rule", stop.rule)])
            n += 1
    return n


class AdaptiveScheduler(FIFOScheduler):
    """Tune's side of ``raystudy.adaptive``: on every result, the policy over everything seen of
    the grid; a running trial it stops ends there, a pending one it stops never starts.

    What it has seen lives in MLflow too (the driver logs every evaluation), so a restored
    driver rebuilds it from there instead of from Tune's pickle.
    """

    def __init__(self, policy: adaptive.Policy, trials: list[Trial], tracking_uri: str, experiment_id: str):
        super().__init__()
        self.policy, self.tracking_uri, self.experiment_id = policy, tracking_uri, experiment_id
        self.trials = [adaptive.trial_of(t.key, t.config) for t in trials]
        self._grid = trials
        self._seen: dict[str, adaptive.Seen] | None = None
        self.decisions: dict[str, adaptive.Stop] = {}

    def __getstate__(self):
        return {**self.__dict__, "_seen": None}

    @property
    def seen(self) -> dict[str, adaptive.Seen]:
        if self._seen is None:
            self._seen = recorded_view(tracking.client(self.tracking_uri), self.experiment_id, self._grid)
        return self._seen

    def _observe(self, key: str, result: dict) -> None:
        s = self.seen.get(key, adaptive.Seen())
        points = s.points
        if "val_acc" in result and not result.get("final"):
            points = tuple(p for p in points if p[0] != int(result["step"])) + (
                (int(result["step"]), float(result["val_acc"])),)
        ended = s.ended or bool(result.get("final"))
        best = float(result.get("best_val_acc", float("nan"))) if result.get("final") and \
            result.get("status", "finished") == "finished" else s.best
        self.seen[key] = adaptive.Seen(tuple(sorted(points)), ended, best)
        self.decisions = adaptive.decide(self.policy, self.trials, self.seen)

    def on_trial_result(self, tune_controller, trial, result):
        key = trial.config["trial"]["key"]
        self._observe(key, result)
        return TrialScheduler.STOP if key in self.decisions and not result.get("final") else TrialScheduler.CONTINUE

    def on_trial_complete(self, tune_controller, trial, result):
        if result:
            self._observe(trial.config["trial"]["key"], result)

    def on_trial_error(self, tune_controller, trial):
        """Failed for good: it has ended, so decisions waiting for it (the seed rule) can come.
        Tune calls this for a retried failure too, after marking the trial ERROR: not an end."""
        if trial.status != TuneTrial.ERROR:
            self._observe(trial.config["trial"]["key"], {"final": 1, "status": "failed"})

    def choose_trial_to_run(self, tune_controller):
        for trial in list(tune_controller.get_trials()):
            if trial.status == TuneTrial.PENDING and trial.config["trial"]["key"] in self.decisions:
                tune_controller.stop_trial(trial)   # recorded stopped at step 0; never started
        return super().choose_trial_to_run(tune_controller)

    def debug_string(self) -> str:
        return f"raystudy.adaptive policy {self.policy.name}: {len(self.decisions)} trials stopped"


def _trial_name(trial) -> str:
    c = trial.config["trial"]["finetune"]
    return f"{c['condition']}_{c['dataset']}_{c['optimizer']}_lr{c['lr']:g}_s{c['seed']}_{trial.trial_id}"



# ---------------------------------------------------------------- checkpoints a restore can find

_CHECKPOINT_DIR = re.compile(r"checkpoint_(\d+)$")


def _checkpoint_index(path: str | None) -> int | None:
    """The number Tune gave a checkpoint directory (``.../checkpoint_000012`` -> 12); None for another path."""
    m = _CHECKPOINT_DIR.search(path.rstrip("/")) if path else None
    return int(m.group(1)) if m else None


def keep_checkpoints() -> tuple[tune.CheckpointConfig, CheckpointPruner]:
    """The checkpoint config and callback of every Tuner here: Tune deletes nothing itself,
    ``CheckpointPruner`` deletes what no saved experiment state names."""
    return tune.CheckpointConfig(num_to_keep=None), CheckpointPruner()


class CheckpointPruner(tune.Callback):
    """Deletes a trial's superseded checkpoints once Tune's saved experiment state no longer names them.

    Tune's own pruning (``num_to_keep``) deletes a checkpoint the moment a newer one arrives,
    while the experiment state on storage, saved between result batches, still names the old one:
    a driver killed in between leaves a trial that cannot be restored ("Could not recover from
    checkpoint as it does not exist on storage anymore"), and that trial fails on every retry.
    Tune asks its callbacks for their state right after writing each snapshot (``get_state``),
    so here a checkpoint is deleted at the second snapshot after a newer one was named: by then
    the first of the two has had a whole snapshot period (10 s or more) to reach storage.
    """

    def __init__(self):
        self._trials: dict[str, Any] = {}   # trial id -> Tune trial that has checkpointed
        self._named: dict[str, int] = {}    # trial id -> checkpoint index the last snapshot names
        self._below: dict[str, int] = {}    # trial id -> checkpoints below this index are gone

    def __getstate__(self):  # Tune pickles callbacks with its experiment state
        return {"_trials": {}, "_named": {}, "_below": {}}

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
        self._trials[trial.trial_id] = trial

    def get_state(self):
        """Called by Tune just after it saved a snapshot; returns None: nothing of ours to save
        (a restored driver starts from the names in the snapshot it restores)."""
        for tid, trial in self._trials.items():
            named = self._named.get(tid)
            if named is not None and named > self._below.get(tid, 0) and _delete_checkpoints(trial, named):
                self._below[tid] = named
            index = _checkpoint_index(trial.checkpoint.path if trial.checkpoint else None)
            if index is not None:
                self._named[tid] = index


def _delete_checkpoints(trial, below: int) -> bool:
    """Delete ``trial``'s checkpoint directories numbered below ``below`` on its storage (any
    left by an earlier, killed driver too), and drop them from Tune's list of the trial's
    checkpoints, which every snapshot would otherwise carry. False if storage refused."""
    from pyarrow.fs import FileSelector, FileType

    fs, root = trial.storage.storage_filesystem, trial.storage.trial_fs_path
    try:
        for info in fs.get_file_info(FileSelector(root, allow_not_found=True)):
            index = _checkpoint_index(info.path)
            if info.type == FileType.Directory and index is not None and index < below:
                fs.delete_dir(info.path)
    except OSError as e:  # a later snapshot tries again
        print(f"could not delete old checkpoints of trial {trial.trial_id} in {root}: {e}", flush=True)
        return False
    manager = trial.run_metadata.checkpoint_manager
    kept = getattr(manager, "_checkpoint_results", None)
    if isinstance(kept, list):
        def stays(r):  # a result whose path is no numbered checkpoint is not ours to drop
            index = _checkpoint_index(r.checkpoint.path if r.checkpoint else None)
            return index is None or index >= below
        manager._checkpoint_results = [r for r in kept if stays(r)]
        trial.run_metadata.invalidate_cache()
    return True


# ---------------------------------------------------------------- MLflow, from the driver

class MlflowTrials(tune.Callback):
    """Writes every trial to MLflow from the driver, exactly once per trial key."""

    def __init__(self, tracking_uri: str, experiment_id: str, parent_id: str | None,
                 tags: dict[str, str] | None = None):
        self.tracking_uri, self.experiment_id, self.parent_id = tracking_uri, experiment_id, parent_id
        self.tags = dict(tags or {})
        self._runs: dict[str, str | None] = {}
        self._where: dict[str, str] = {}
        self._upto: dict[str, dict[str, int]] = {}  # run -> last step logged, by kind
        self._cl = None

    def __getstate__(self):  # Tune pickles callbacks with its experiment state
        return {"tracking_uri": self.tracking_uri, "experiment_id": self.experiment_id,
                "parent_id": self.parent_id, "tags": self.tags, "_runs": {}, "_where": {}, "_upto": {},
                "_cl": None}

    @property
    def cl(self):
        if self._cl is None:
            self._cl = tracking.client(self.tracking_uri)
        return self._cl

    def _run(self, trial) -> str | None:
        """The MLflow run of ``trial``; None if its key already finished (it will skip)."""
        if trial.trial_id not in self._runs:
            t = trial.config["trial"]
            status, _ = tracking.trial_status(self.cl, self.experiment_id, t["key"])
            self._runs[trial.trial_id] = (None if status in tracking.TERMINAL else
                                          tracking.open_trial(self.cl, self.experiment_id, self.parent_id,
                                                              t["key"], t["finetune"],
                                                              {"raystudy.tune_trial": trial.trial_id, **self.tags},
                                                              name=t.get("name")))
        return self._runs[trial.trial_id]

    def on_trial_start(self, iteration, trials, trial, **info):
        self._run(trial)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        run_id = self._run(trial)
        if run_id is None:
            return
        where = f"{result.get('node_ip')}:{result.get('pid')}"
        if self._where.get(trial.trial_id) != where:  # which node and process run it (debugging)
            self._where[trial.trial_id] = where
            self.cl.set_tag(run_id, "raystudy.worker", where)
        steps = list(result.get("history") or [])
        if not result.get("final"):
            steps.append(result)
        if run_id not in self._upto:  # a run reopened by a retry or a rerun: what it already has
            self._upto[run_id] = tracking.logged_upto(self.cl, run_id)
        tracking.log_steps(self.cl, run_id, steps, self._upto[run_id])

    def on_trial_complete(self, iteration, trials, trial, **info):
        run_id = self._run(trial)
        last = trial.last_result or {}
        if run_id is None:
            return
        if not last.get("final"):  # a scheduler stopped it early (or before it started): no test accuracy
            last = {**last, "status": "stopped", "steps_done": int(last.get("step", 0))}
            self.cl.set_tag(run_id, tracking.STOPPED_AT, str(last["steps_done"]))
        tracking.finish_trial(self.cl, run_id, last)
        if last.get("resumed_from"):
            self.cl.set_tag(run_id, "raystudy.resumed_from", str(int(last["resumed_from"])))
        self._runs.pop(trial.trial_id, None)
        self._upto.pop(run_id, None)

    def on_trial_recover(self, iteration, trials, trial, **info):
        """A failed attempt that Tune retries: count it and keep its error."""
        run_id = self._run(trial)
        if run_id is not None:
            attempts = int(self.cl.get_run(run_id).data.tags.get(tracking.ATTEMPTS, "1")) + 1
            self.cl.set_tag(run_id, tracking.ATTEMPTS, str(attempts))
            self.cl.set_tag(run_id, "raystudy.last_error", _error_text(trial)[-5000:])

    def on_trial_error(self, iteration, trials, trial, **info):
        run_id = self._run(trial)
        if run_id is not None:
            tracking.fail_trial(self.cl, run_id, _error_text(trial)[-5000:])
            self._runs.pop(trial.trial_id, None)


def _error_text(trial) -> str:
    path = getattr(trial, "error_file", None)
    if path and os.path.exists(path):
        return Path(path).read_text().strip()
    return "trial failed (no error file)"


# ---------------------------------------------------------------- searches

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


def make_searcher(space: SearchSpace, condition: str | None, base: dict[str, Any], resources: dict[str, Any],
                  storage, study_name: str):
    """Ray's OptunaSearch over the persisted study ``study_name``, resumed with its history.

    The sampler's seed is the space's plus the number of trials the study already holds: a
    resumed search draws on from there instead of replaying the first session's draws
    (TPE's random start-up trials), and the same history still gives the same suggestions.
    """
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    try:
        held = len(optuna.load_study(study_name=study_name, storage=storage).get_trials(deepcopy=False))
    except KeyError:
        held = 0
    seed = None if space.seed is None else space.seed + held
    return OptunaSearch(space=Sampler(space, condition, base, resources), metric="score", mode="max",
                        sampler=optuna.samplers.TPESampler(seed=seed), storage=storage, study_name=study_name)


def search_condition(space: SearchSpace, label: str, condition: str | None, *, model: str, dataset: str, base: dict[str, Any],
                     tracking_uri: str, exp_id: str, parent: str, storage: Path, num_samples: int,
                     time_budget_s: float | None, resources: dict[str, Any], tuning: dict[str, Any],
                     verbose: int) -> dict[str, Any]:
    """One Optuna study (``label``: a condition, or ``components`` when the condition itself is
    searched); returns the best finished trial's config and score."""
    from ray.tune.schedulers import ASHAScheduler

    study_name = f"{space.study}-{model}-{dataset}-{label}"
    cl = tracking.client(tracking_uri)
    # Runs a killed search left RUNNING: their configs are not resampled, so close them.
    tracking.close_stale(cl, exp_id, raystudy__search=study_name)
    ostore = optuna_storage(storage / "optuna")
    done = completed_trials(ostore, study_name)
    remaining = num_samples - done
    print(f"\n[{label}] Optuna study {study_name!r}: {done} trials done, {max(remaining, 0)} to run", flush=True)
    if remaining > 0:
        steps = int(base.get("steps", FinetuneConfig.steps))
        searcher = make_searcher(space, condition, base, resources, ostore, study_name)
        # max_t past the last step: a trial that reaches the end finishes itself (and is tested)
        scheduler = ASHAScheduler(time_attr="step", metric="score", mode="max", max_t=steps + 1,
                                  grace_period=min(space.grace_period, steps),
                                  reduction_factor=space.reduction_factor)
        cpu, gpu = resources["cpu"], resources["gpu"]
        kept, pruner = keep_checkpoints()
        tuner = tune.Tuner(
            tune.with_resources(run_trial, {"cpu": cpu, "gpu": gpu}),
            param_space={"storage_path": str(storage), "threads": int(tuning["threads_per_trial"]),
                         "checkpoint_every_s": float(tuning["checkpoint_every_s"])},
            tune_config=tune.TuneConfig(search_alg=searcher, scheduler=scheduler, num_samples=remaining,
                                        time_budget_s=time_budget_s, reuse_actors=True,
                                        max_concurrent_trials=tuning["max_concurrent"]),
            run_config=tune.RunConfig(
                name=f"{study_name}-{int(time.time())}", storage_path=str(storage), verbose=verbose,
                callbacks=[MlflowTrials(tracking_uri, exp_id, parent, {"raystudy.search": study_name}), pruner],
                failure_config=tune.FailureConfig(max_failures=int(tuning["max_failures"])),
                checkpoint_config=kept),
        )
        try:
            with _tune_output(verbose) as notice:
                tuner.fit()
        finally:  # every trial of this session has ended, or the driver is going down: none stays RUNNING
            with uninterrupted():
                stale = tracking.close_stale(cl, exp_id, raystudy__search=study_name)
            if stale:
                print(f"[{label}] {stale} trial run(s) had no end from Tune; marked interrupted", flush=True)
        if notice.received and completed_trials(ostore, study_name) < num_samples:
            raise Stopped(f"study {study_name!r} stopped before its budget")
    return best_of(cl, exp_id, study_name)


def best_of(cl, exp_id: str, study_name: str) -> dict[str, Any]:
    """The finished trial of ``study_name`` with the best validation accuracy, and the counts."""
    runs = tracking.find_runs(cl, exp_id, raystudy__role="trial", raystudy__search=study_name)
    status = [r.data.tags.get(tracking.STATUS) for r in runs]
    finished = [r for r, s in zip(runs, status) if s == "finished" and "best_val_acc" in r.data.metrics]
    out = {"study": study_name, "trials": len(runs), "stopped": status.count("stopped"),
           "finished": len(finished), "diverged": status.count("diverged"), "failed": status.count("failed")}
    if finished:
        best = max(finished, key=lambda r: r.data.metrics["best_val_acc"])
        out.update(best_run=best.info.run_id, val_acc=best.data.metrics["best_val_acc"],
                   config=tracking.run_config(best.data.params))
    return out


