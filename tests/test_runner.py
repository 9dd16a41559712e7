"""The runner: a local Ray on loopback with token auth; the pieces that need no Ray cluster
(the resumable searcher, the grid lock, the store's creation)."""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest
from drivers import driver_env

from raystudy import runner, spaces

CODE = r"""
import json, sys
import psutil
from raystudy import runner
runner.start_ray(None, 1, sys.argv[1], dashboard=True)
import ray
from ray._raylet import AuthenticationMode, get_authentication_mode
me = psutil.Process()
socks = []
for p in [me] + me.children(recursive=True):
    try:
        socks += [(p.name(), c.laddr.ip, c.laddr.port) for c in p.net_connections(kind="tcp")
                  if c.status == psutil.CONN_LISTEN]
    except psutil.Error:
        pass
raylet = [p for p in me.children(recursive=True) if p.name() == "raylet"]
print(json.dumps({"socks": socks, "token": get_authentication_mode() == AuthenticationMode.TOKEN,
                  "raylet_auth": raylet[0].environ().get("RAY_AUTH_MODE") if raylet else None}))
ray.shutdown()
"""


def test_an_adaptive_grid_starts_its_seeds_one_after_another():
    # decisions on a cell's earlier seeds come before its later seeds start
    trials = [spaces.Trial(f"{c}/{lr}/{s}", {"dataset": "d", "condition": c, "optimizer": "sgd", "lr": lr,
                                             "seed": s}, 1.0, 1.0, 1)
              for s in (7, 0, 3) for c in ("MHA", "FC1") for lr in (0.3, 0.1)]
    order = sorted(trials, key=runner._seed_major(trials))
    assert [t.config["seed"] for t in order] == [0] * 4 + [3] * 4 + [7] * 4
    assert [t.key for t in order[:4]] == ["FC1/0.1/0", "FC1/0.3/0", "MHA/0.1/0", "MHA/0.3/0"]


@pytest.mark.slow
def test_local_ray_listens_on_loopback_only_with_token_auth(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    env.update(HOME=str(home), OMP_NUM_THREADS="1")
    temp = tempfile.mkdtemp(prefix="rlb", dir="/tmp")  # Ray's socket paths must stay short
    p = subprocess.run([sys.executable, "-c", CODE, temp], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    names = {name for name, _, _ in got["socks"]}
    assert {"gcs_server", "raylet"} <= names, got["socks"]
    exposed = [s for s in got["socks"] if s[1] not in ("127.0.0.1", "::1", "::ffff:127.0.0.1")]
    assert not exposed, exposed
    assert got["token"] and got["raylet_auth"] == "token"
    token = home / ".ray" / "auth_token"
    assert token.is_file() and token.stat().st_mode & 0o077 == 0  # the token: its owner's alone


def test_a_resumed_search_suggests_no_config_twice(tmp_path):
    # Rebuilt with the same seed, a searcher would replay its first suggestions.
    space = spaces.load_search("optimiser")
    base = {**space.base, "model": "vit_demo", "dataset": "digits_c"}
    res = {"gpu": 0.0, "cpu": 1.0, "workers": 1}
    store = runner.optuna_storage(tmp_path)

    def session(n, first):
        s = runner.make_searcher(space, "MHA", base, res, store, "s")
        keys = []
        for i in range(n):
            cfg = s.suggest(f"{first + i}")
            keys.append(cfg["trial"]["key"])
            s.on_trial_complete(f"{first + i}", {"score": 0.1 * i, "step": 1})
        return keys

    first = session(3, 0)
    runner.completed_trials(store, "s")
    second = session(3, 3)  # the search killed and run again: same space, same seed
    assert len(set(first + second)) == 6, (first, second)


def _open_store_at(uri, at):
    code = ("import time, sys; from raystudy import tracking; time.sleep(max(0, %r - time.time())); "
            "tracking.experiment_id(tracking.client(%r), 'e')" % (at, uri))
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_drivers_creating_a_new_store_at_once_leave_it_usable(tmp_path):
    # Two drivers creating the SQLite schema at once must not leave a broken store.
    from raystudy import tracking

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    at = time.time() + 8  # after every interpreter has imported MLflow
    procs = [_open_store_at(uri, at) for _ in range(3)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], "\n".join(o[-1500:] for o in outs)
    assert tracking.experiment_id(tracking.client(uri), "e")


def _hold(storage, name, then="time.sleep(120)"):
    code = ("import time; from raystudy import runner\n"
            f"with runner.grid_lock({str(storage)!r}, {name!r}):\n    print('held', flush=True); {then}")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_grid_lock_names_its_holder_and_a_dead_holders_lock_is_taken_over(tmp_path):
    holder = _hold(tmp_path, "g")
    try:
        with pytest.raises(runner.GridBusy, match=f"pid {holder.pid} on host {socket.gethostname()}"):
            with runner.grid_lock(tmp_path, "g"):
                pass
    finally:
        holder.kill()  # dies holding it: no cleanup ran
        holder.wait()
    said = []
    with runner.grid_lock(tmp_path, "g", log=said.append):
        assert f"pid {holder.pid}" in said[0] and "gone" in said[0]
        with runner.grid_lock(tmp_path, "g"):  # reentrant in the holding process
            pass
    with runner.grid_lock(tmp_path, "g", log=said.append):  # released cleanly: nothing to take over
        assert len(said) == 1


def test_closing_the_runs_is_not_cut_short_by_another_ctrl_c():
    # A user who presses Ctrl-C again while the grid closes its MLflow runs must not interrupt
    # the closing (a KeyboardInterrupt inside the finally would leave runs RUNNING).

    closed = []
    with runner.uninterrupted():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)  # the signal is delivered here, and ignored
        closed.append(True)
    assert closed == [True]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Ctrl-C works again after
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)


def test_the_first_ctrl_c_is_the_grids_line_and_tunes_other_warnings_stay_muted(capsys):
    # Tune's Ctrl-C warning names Tuner.restore, which a grid's user never calls: while the grid
    # keeps Tune quiet, the warning becomes one line of the grid's, and Tune's errors still show.
    import logging

    tune_log = logging.getLogger("ray.tune.tune")
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    keep = Keep()
    tune_log.addHandler(keep)
    try:
        with runner._tune_output(0) as notice:
            tune_log.warning("Stop signal received (e.g. via SIGINT/Ctrl+C), ending Ray Tune run. Press CTRL+C")
            tune_log.warning("call Tuner.restore(...) to resume")
            tune_log.error("a trial failed")
        assert notice.received  # the runner then ends the command as stopped, not as done
        tune_log.warning("outside the grid's Tune run")
        with runner._tune_output(1) as loud:  # --tune-output: Tune's own words
            tune_log.warning("call Tuner.restore(...) to resume")
            assert not loud.received
            tune_log.warning("Stop signal received (e.g. via SIGINT/Ctrl+C), ending Ray Tune run.")
        assert loud.received
    finally:
        tune_log.removeHandler(keep)
    assert seen == ["a trial failed", "outside the grid's Tune run", "call Tuner.restore(...) to resume",
                    "Stop signal received (e.g. via SIGINT/Ctrl+C), ending Ray Tune run."]
    out = capsys.readouterr().out
    assert out == "\nstopping: saving Tune's state and ending the running trials; Ctrl-C again to stop at once\n"


CHECKPOINTS = r"""
import json, sys, tempfile, time
from pathlib import Path
import ray
from ray import tune
from ray.tune.experiment import Trial
from raystudy import runner


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
        runner.keep_checkpoints()[0], [runner.keep_checkpoints()[1]])
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
    p = subprocess.run([sys.executable, "-c", CHECKPOINTS, shared_ray[1], str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    # Tune's pruning: states that name a deleted checkpoint (the witness sees the failure)
    assert got["tune"]["missing"] > 0, got["tune"]
    ours = got["raystudy"]
    assert ours["looks"] >= 30 and ours["named"] >= 4, ours   # several snapshots, each naming newer ones
    assert ours["missing"] == 0, ours
    # old checkpoints still go: of each trial's 30, only those since the last snapshots remain
    assert 2 <= len(ours["left"]) <= 2 * 15 and "checkpoint_000000" not in ours["left"], ours["left"]


def test_a_tune_runs_ctrl_c_handler_ends_with_it():
    # Tune installs its Ctrl-C handler for a run and leaves it there when the run ends unstopped:
    # a search's next Ctrl-C (between studies, or in its next Tune run, whose handler hands the
    # second Ctrl-C to the stale one) then only set the ended run's flag, and the search went on.
    from ray.tune import tune as tune_run

    with runner._tune_output(0):
        tune_run._setup_signal_catching()  # what each Tune run does first
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)
