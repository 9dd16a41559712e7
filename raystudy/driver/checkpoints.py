"""Checkpoints a restore can find: Tune deletes none itself, ``CheckpointPruner`` deletes what no
saved experiment state names any more."""

from __future__ import annotations

import re
from typing import Any

from ray import tune

_CHECKPOINT_DIR = re.compile(r"checkpoint_(\d+)$")


def checkpoint_index(path: str | None) -> int | None:
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
        self._trials: dict[str, Any] = {}  # trial id -> Tune trial that has checkpointed
        self._named: dict[str, int] = {}  # trial id -> checkpoint index the last snapshot names
        self._below: dict[str, int] = {}  # trial id -> checkpoints below this index are gone

    def __getstate__(self):  # Tune pickles callbacks with its experiment state
        return {"_trials": {}, "_named": {}, "_below": {}}

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
        """Notes ``trial`` as one whose old checkpoints may go."""
        self._trials[trial.trial_id] = trial

    def get_state(self):
        """Called by Tune just after it saved a snapshot; returns None: nothing of ours to save
        (a restored driver starts from the names in the snapshot it restores)."""
        for tid, trial in self._trials.items():
            named = self._named.get(tid)
            if named is not None and named > self._below.get(tid, 0) and delete_checkpoints(trial, named):
                self._below[tid] = named
            index = checkpoint_index(trial.checkpoint.path if trial.checkpoint else None)
            if index is not None:
                self._named[tid] = index


def delete_checkpoints(trial, below: int) -> bool:
    """Delete ``trial``'s checkpoint directories numbered below ``below`` on its storage (any
    left by an earlier, killed driver too), and drop them from Tune's list of the trial's
    checkpoints, which every snapshot would otherwise carry. False if storage refused."""
    from pyarrow.fs import FileSelector, FileType

    fs, root = trial.storage.storage_filesystem, trial.storage.trial_fs_path
    try:
        for info in fs.get_file_info(FileSelector(root, allow_not_found=True)):
            index = checkpoint_index(info.path)
            if info.type == FileType.Directory and index is not None and index < below:
                fs.delete_dir(info.path)
    except OSError as e:  # a later snapshot tries again
        print(f"could not delete old checkpoints of trial {trial.trial_id} in {root}: {e}", flush=True)
        return False
    manager = trial.run_metadata.checkpoint_manager
    kept = getattr(manager, "_checkpoint_results", None)
    if isinstance(kept, list):

        def stays(r):  # a result whose path is no numbered checkpoint is not ours to drop
            index = checkpoint_index(r.checkpoint.path if r.checkpoint else None)
            return index is None or index >= below

        manager._checkpoint_results = [r for r in kept if stays(r)]
        trial.run_metadata.invalidate_cache()
    return True
