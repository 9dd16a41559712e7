"""Spot preemption on a multi-node Ray cluster simulated on this machine (slow).

A head without CPUs (the driver's) and two one-CPU worker nodes share a checkpoint folder. Mid-grid
one worker node gets notice (SIGTERM to its trial's worker process: the trial checkpoints the
step it is on and stops) and is then removed; a fresh node joins, as an autoscaler would bring one;
then the other worker node is removed without notice, losing the work since its last checkpoint.
The grid must complete exactly once: every trial finished, no metric point logged twice, no run
left RUNNING, the preempted trial resumed from the step it had reached.
"""

import os
import shutil
import signal
import sys
import tempfile
import time

import pytest
import yaml

from tests.helpers import checkpoint_steps, free_port, kill_group, output_of, search_runs, start, wait_for

pytestmark = pytest.mark.slow

SPACE = {
    "study": "pre",
    "base": {"model": "vit_demo", "steps": 300, "warmup_steps": 4, "eval_every": 20, "log_every": 10, "batch_size": 32},
    "grid": {"condition": {"grid_search": ["MHA", "LN2"]}, "lr": 0.1, "seed": {"grid_search": [0, 1]}},
    "datasets": {"digits_c": {}},
    "tune": {"max_failures": 3, "checkpoint_every_s": 2},
}


def _raylet_of(pid, nodes):
    """The node whose raylet is an ancestor of process ``pid``."""
    import psutil

    raylets = {n.all_processes["raylet"][0].process.pid: n for n in nodes}
    p = psutil.Process(pid)
    while p is not None:
        if p.pid in raylets:
            return raylets[p.pid]
        p = p.parent()
    return None


def _runs(uri):
    return search_runs(uri, "raystudy-pre-vit_demo")


def test_nodes_lost_mid_grid_with_and_without_notice(tmp_path, demo_weights, mlflow_uri, monkeypatch):
    import mlflow
    import psutil
    from ray.cluster_utils import Cluster

    ray_tmp = tempfile.mkdtemp(prefix="rs", dir="/tmp")
    monkeypatch.setenv("RAY_TMPDIR", ray_tmp)  # the cluster's address file too: no other Ray finds it
    os.makedirs(os.path.join(ray_tmp, "ray"))
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    port = free_port()
    common = {"temp_dir": ray_tmp, "object_store_memory": 80 * 1024 * 1024}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            **common,
            "num_cpus": 0,
            "gcs_server_port": port,
            "include_dashboard": False,
            "dashboard_agent_listen_port": free_port(),
        },
    )
    driver = None
    try:
        workers = [cluster.add_node(**common, num_cpus=1) for _ in range(2)]
        space = tmp_path / "space.yaml"
        space.write_text(yaml.safe_dump(SPACE))
        shared = tmp_path / "shared"  # every node's checkpoint folder
        t0 = time.time()
        driver = start(
            [
                sys.executable,
                "-m",
                "raystudy.grid",
                "--space",
                str(space),
                "--address",
                f"127.0.0.1:{port}",
                "--storage",
                str(shared),
                "--quiet",
            ],
            tmp_path,
        )
        uri = f"sqlite:///{tmp_path}/mlflow.db"
        cl = mlflow.MlflowClient(uri)

        def a_trial_past_step_60():
            df = _runs(uri)
            for _, r in df[df["tags.raystudy.worker"].notna() & (df["status"] == "RUNNING")].iterrows():
                if max((m.step for m in cl.get_metric_history(r["run_id"], "val_acc")), default=0) >= 60:
                    return r.to_dict()
            return None

        victim = wait_for(a_trial_past_step_60, driver)
        assert victim is not None, "no trial got far enough:\n" + output_of(driver)
        pid = int(victim["tags.raystudy.worker"].rsplit(":", 1)[1])
        node = _raylet_of(pid, workers)
        assert node is not None
        noticed = time.time()
        os.kill(pid, signal.SIGTERM)  # the notice
        try:
            psutil.Process(pid).wait(timeout=60)
        except psutil.TimeoutExpired:
            pass
        exited_s = time.time() - noticed
        reached = max((m.step for m in cl.get_metric_history(victim["run_id"], "loss")), default=0)
        cluster.remove_node(node)  # the node is gone, and whatever else ran on it
        cluster.add_node(**common, num_cpus=1)  # its replacement

        # The other node goes without notice, once its trial has checkpointed twice: the work since
        # the newest checkpoint Tune had is lost, and no more. Counted in steps, not seconds: on a
        # loaded machine a step's seconds vary, the steps a checkpoint holds do not.
        other, lost_s, floor = next(n for n in workers if n is not node), None, None
        deadline = time.time() + 300
        while time.time() < deadline and driver.poll() is None and lost_s is None:
            time.sleep(0.3)
            df = _runs(uri)
            for _, r in df[df["tags.raystudy.worker"].notna() & (df["status"] == "RUNNING")].iterrows():
                try:
                    on = _raylet_of(int(r["tags.raystudy.worker"].rsplit(":", 1)[1]), [other])
                except psutil.NoSuchProcess:
                    continue
                if on is None:
                    continue
                cks = checkpoint_steps(shared.glob(f"*/*_{r['tags.raystudy.tune_trial']}/checkpoint_*/state.pt"))
                if len(cks) >= 2:
                    # (remove_node's own seconds of waiting for processes to exit are not work)
                    lost_s = time.time() - max(cks.values())
                    cluster.remove_node(other)
                    # The newest may still be on its way to Tune (persisted, its save not yet
                    # processed); the one before it Tune had, or the trial could not have gone on.
                    floor = sorted(cks)[-2]
                    unnoticed = r["run_id"]
                    break
        assert lost_s is not None, "no trial on the other node to lose"
        out, _ = driver.communicate(timeout=600)
        wall = time.time() - t0
        assert driver.returncode == 0, out[-4000:]
    finally:
        if driver is not None:
            kill_group(driver)
        cluster.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)

    df = _runs(uri)
    trials = df[df["tags.raystudy.role"] == "trial"]
    assert len(trials) == 4 and trials["tags.raystudy.key"].nunique() == 4
    assert set(trials["tags.raystudy.status"]) == {"finished"}
    running = int((df["status"] == "RUNNING").sum())
    dupes = 0
    for run_id in trials["run_id"]:
        for key in ("loss", "val_acc", "grad_norm/total"):
            steps = [m.step for m in cl.get_metric_history(run_id, key)]
            dupes += len(steps) - len(set(steps))
            assert sorted(set(steps)) == list(
                range(20 if key == "val_acc" else 10, 301, 20 if key == "val_acc" else 10)
            )
    v = trials[trials["run_id"] == victim["run_id"]].iloc[0]
    resumed = int(v.get("tags.raystudy.resumed_from") or -1)  # -1: not said
    step_s = v["metrics.wall_s"] / (300 - max(resumed, 0))
    retries = int(sum(int(a) - 1 for a in trials["tags.raystudy.attempts"]))
    print(
        f"\nnode loss: trials={len(trials)} finished={int((trials['tags.raystudy.status'] == 'finished').sum())} "
        f"retries={retries} notice-to-exit={exited_s:.1f}s reached_step={reached} resumed_from={resumed} "
        f"lost_steps={max(0, reached - resumed)} lost_s~{max(0, reached - resumed) * step_s:.2f} "
        f"duplicates={dupes} RUNNING={running} wall={wall:.0f}s"
    )
    u = trials[trials["run_id"] == unnoticed].iloc[0]
    print(
        f"node loss without notice: lost_s={lost_s:.2f} (checkpoint_every_s=2, an evaluation every 20 steps of "
        f"~{step_s:.3f}s) newest_checkpoint_tune_had>={floor} resumed_from={u.get('tags.raystudy.resumed_from')}"
    )
    assert running == 0 and dupes == 0
    assert int(u.get("tags.raystudy.resumed_from") or 0) >= floor  # nothing lost before Tune's newest checkpoint
    assert resumed >= reached - 10  # checkpointed where the notice found it, not at the last interval
