"""driver.checkpoints: no saved experiment state ever names a checkpoint that was deleted."""

import json
import subprocess
import sys

import pytest

from tests.helpers import driver_env

CHECKPOINTS = r"""
import json, sys, tempfile, time
from pathlib import Path
import ray
from ray import tune
from ray.tune.experiment import Trial
from raystudy.driver import checkpoints


def trainable(config):
    for i in range(30):
        time.sleep(0.1)
        with tempfile.TemporaryDirectory() as d:
            Path(d, "state").write_text(str(i))
            tune.report({"i": i}, checkpoint=tune.Checkpoint.from_directory(d))


class Witness(tune.Callback):
    # What a driver killed at this moment leaves behind: the experiment state on storage, whose
    # checkpoints a restore needs. Looked at after each result and each checkpoint is processed.
    def __init__(self, exp):
        self.exp, self.looks, self.named, self.missing = Path(exp), 0, set(), set()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.look()

    def on_trial_save(self, iteration, trials, trial, **info):
        self.look()

    def look(self):
        files = sorted(self.exp.glob("experiment_state-*.json"))
        try:
            state = json.loads(files[-1].read_text()) if files else None
        except ValueError:  # being copied to storage this instant
            state = None
        if state is None:
            return
        self.looks += 1
        for trial_state, metadata in state["trial_data"]:
            t = Trial.from_json_state(trial_state, stub=True)  # as Tuner.restore reads it
            t.restore_run_metadata(metadata)
            if t.checkpoint is not None:
                self.named.add(t.checkpoint.path)
                if not Path(t.checkpoint.path).exists():
                    self.missing.add(t.checkpoint.path)


ray.init(address=sys.argv[1], log_to_driver=False)
out = {}
for how in ("tune", "raystudy"):
    kept, extra = (tune.CheckpointConfig(num_to_keep=1), []) if how == "tune" else (
        checkpoints.keep_checkpoints()[0], [checkpoints.keep_checkpoints()[1]])
    w = Witness(Path(sys.argv[2], how))
    tune.Tuner(trainable, param_space={"seed": tune.grid_search([0, 1])},
               run_config=tune.RunConfig(name=how, storage_path=sys.argv[2], verbose=0, callbacks=[w, *extra],
                                         checkpoint_config=kept)).fit()
    left = sorted(p.name for p in Path(sys.argv[2], how).glob("*/checkpoint_*"))
    out[how] = {"looks": w.looks, "named": len(w.named), "missing": len(w.missing), "left": left}
print(json.dumps(out))
ray.shutdown()
"""


@pytest.mark.slow
def test_a_saved_experiment_state_never_names_a_deleted_checkpoint(tmp_path, shared_ray):
    # Seen in CI: a driver killed mid-grid; on resume one trial failed twice with "Could not
    # recover from checkpoint as it does not exist on storage anymore". Tune's own num_to_keep
    # deletes the old checkpoint before the next snapshot names the new one. A witness reads the
    # saved state after every result and checkpoint: what a kill at that instant would restore.
    env = driver_env(TUNE_GLOBAL_CHECKPOINT_S="1", OMP_NUM_THREADS="1")  # a snapshot a second
    p = subprocess.run(
        [sys.executable, "-c", CHECKPOINTS, shared_ray[1], str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    # Tune's pruning: states that name a deleted checkpoint (the witness sees the failure)
    assert got["tune"]["missing"] > 0, got["tune"]
    ours = got["raystudy"]
    assert ours["looks"] >= 30 and ours["named"] >= 4, ours  # several snapshots, each naming newer ones
    assert ours["missing"] == 0, ours
    # old checkpoints still go: of each trial's 30, only those since the last snapshots remain
    assert 2 <= len(ours["left"]) <= 2 * 15 and "checkpoint_000000" not in ours["left"], ours["left"]
