"""The runner's pieces that need no Ray cluster: the resumable searcher, the grid lock, the store's creation."""

import os
import socket
import subprocess
import sys
import time

import pytest

from raystudy import runner, spaces
from raystudy.errors import ConfigError


def test_a_resumed_search_suggests_no_config_twice(tmp_path):
    # Issue #17 item 4: rebuilt with the same seed, the searcher replayed its first suggestions.
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
    # Issue #17 item 6: two drivers creating the SQLite schema at once bricked the store.
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
