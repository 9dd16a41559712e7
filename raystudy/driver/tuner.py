"""A Tune run as the driver runs it, for a grid and a search alike: its Tuner built (new, or an
interrupted run's restored), fitted to its end and closed however it ended, and what an ended run
leaves let go.

Nothing here imports Ray at module level.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from raystudy.driver import full_disk, node_watch, tune_output, tune_state
from raystudy.driver.interrupt import uninterrupted
from raystudy.errors import disk_full


def runs(items: list, name: str, size: int) -> list[tuple[str, list]]:
    """``items`` (a grid's trials, a search's budget) as the Tune runs that hold them, in the order
    they run: (Tune's folder name, its items), at most ``size`` each. One run is all of them, in the
    folder ``name``; more are ``name-partIofK`` (I zero-padded: the names sort in their order).
    Tune keeps every trial of a run in memory and rewrites them all into its experiment checkpoint
    as the run goes, so a study of thousands runs as Tune runs of ``tune.trials_per_run``."""
    chunks = [items[i : i + size] for i in range(0, len(items), size)] or [[]]
    if len(chunks) == 1:
        return [(name, chunks[0])]
    k = len(chunks)
    return [(f"{name}-part{i + 1:0{len(str(k))}d}of{k}", chunk) for i, chunk in enumerate(chunks)]


def trainable(rehearse: float | None, resources):
    """What Tune runs for each trial: ``run_trial`` on ``resources`` (Ray's resources, or a
    function of the trial's config that gives them), or a rehearsal's ``rehearse_trial`` (no
    model, no data, one CPU whatever the trial would ask: it sleeps)."""
    from ray import tune

    if rehearse:
        from raystudy.train import rehearsal

        return rehearsal.tune_trainable()
    from raystudy.train.trial import run_trial

    return tune.with_resources(run_trial, resources)


def shared_config(storage, threads: int, checkpoint_every_s: float, rehearse: float | None, **extra) -> dict[str, Any]:
    """The config every trial of a Tune run shares, beside its own (``trial``): where it keeps its
    checkpoints, its threads, how often it saves; a rehearsal's seconds a trial and ``extra``."""
    shared = {"storage_path": str(storage), "threads": int(threads), "checkpoint_every_s": float(checkpoint_every_s)}
    if rehearse:
        shared.update(rehearse_s=rehearse, **extra)
    return shared


def new(
    trainable,
    *,
    name: str,
    storage,
    param_space: dict[str, Any],
    recorders: list,
    max_failures: int,
    verbose: int,
    **tune_config,
):
    """A Tuner of the driver's: Tune's folder ``name`` under ``storage``; ``recorders``, the
    callbacks that record its trials, in the order they hear of a result; then the checkpoint
    pruner and Tune's result files (``tune_output.result_files``). ``tune_config``: the rest of
    Tune's ``TuneConfig`` (a scheduler, a searcher, a trial count, a cap on concurrent trials...);
    actors are reused."""
    from ray import tune

    from raystudy.driver import checkpoints

    kept, pruner = checkpoints.keep_checkpoints()
    return tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune.TuneConfig(reuse_actors=True, **tune_config),
        run_config=tune.RunConfig(
            name=name,
            storage_path=str(storage),
            verbose=verbose,
            callbacks=[*recorders, pruner, *tune_output.result_files(verbose)],
            failure_config=tune.FailureConfig(max_failures=int(max_failures)),
            checkpoint_config=kept,
        ),
    )


def restored_or_new(storage, name: str, trainable, verbose: int, new_in: Callable[[str], Any], resumed, left: str):
    """The Tuner of the interrupted Tune run in folder ``name`` under ``storage``, restored, with
    ``resumed(tuner)`` called on it (this session's console and recording); else ``new_in(folder
    name)``: where nothing is there, or where what is there cannot be restored (said in one line,
    the folder set aside). ``left`` says what the fresh run takes on (``N unfinished trials``)."""
    from ray import tune

    path = tune_state.folder(storage, name)
    if tune.Tuner.can_restore(str(path)):
        with tune_output.shaped(verbose):  # restoring reads the trials' results back, and warns too
            restored, why = tune_state.restore(path, trainable)
        if restored is not None:
            resumed(restored)
            return restored
        print(
            f"could not restore the interrupted run's Tune state at {path} ({why}); "
            f"starting afresh over the {left} (MLflow knows which are done)",
            flush=True,
        )
        path = tune_state.set_aside(path, storage, name)
    return new_in(Path(str(path)).name)


def fit_each(tuners: Iterable, verbose: int, close: Callable[[], Any], after: Callable[[], Any] | None = None) -> bool:
    """A study's Tune runs, one after another: each Tuner of ``tuners`` (made as it comes, once the
    run before has ended) fitted and closed (``fit``), then ``after()`` where it was not stopped.
    Returns whether one was stopped: the runs after it wait for the same command."""
    for tuner in tuners:
        if fit(tuner, verbose, close):
            return True
        if after is not None:
            after()
    return False


def fit(tuner, verbose: int, close: Callable[[], Any]) -> bool:
    """Run ``tuner`` to its end, then ``close`` (Ctrl-C ignored) however it ended, so that no
    MLflow run stays RUNNING; returns whether the run was stopped (one Ctrl-C, a full disk, the
    driver's Ray node lost)."""
    unwatch = node_watch.watch()
    try:
        with tune_output.shaped(verbose) as notice:
            tuner.fit()
    except Exception:
        if full_disk.said() is None and node_watch.lost() is None:
            raise
        # stopped on a full disk or a lost node: Tune's end, reading back its files or asking its
        # dead trials, may fail too
    finally:
        unwatch()
        with uninterrupted():
            try:
                close()
            except Exception as e:
                if not disk_full(e):
                    raise
                # a full store: its runs stay RUNNING, and the same command, rerun, closes them
        let_go()
    return notice.received or full_disk.said() is not None or node_watch.lost() is not None


ENCODED = "tune_func_encode:"  # Ray's log-once key for each object Tune's JSON encoder pickles


def let_go() -> None:
    """What an ended Tune run leaves in the driver that nothing reads again, let go before the
    next run of a long grid or search: Ray's log-once keys for the objects Tune's encoder could
    not write as JSON (a trial's storage context at each save, a key each, kept for the life of
    the process: a few kB a trial), the run's garbage, and the free pages glibc keeps mapped."""
    import ctypes
    import gc

    from ray.util import debug

    logged = getattr(debug, "_logged", None)
    if isinstance(logged, set):
        logged.difference_update([k for k in logged if k.startswith(ENCODED)])
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def set_console(tuner, lines, verbose: int) -> None:
    """A restored Tuner keeps the first session's run config (Tune has no option to change it):
    give it this session's verbosity and console (``lines``, a ``console.ConsoleTrials``),
    numbered from what MLflow holds now."""
    from raystudy.driver import console

    rc = tuner._local_tuner.get_run_config()
    rc.verbose = verbose
    rc.callbacks = [c for c in rc.callbacks or [] if not isinstance(c, console.ConsoleTrials)] + [lines]


def trial_name(trial) -> str:
    """A grid trial's Tune name and folder: its condition, dataset, optimizer, lr, seed and id."""
    c = trial.config["trial"]["finetune"]
    return f"{c['condition']}_{c['dataset']}_{c['optimizer']}_lr{c['lr']:g}_s{c['seed']}_{trial.trial_id}"
