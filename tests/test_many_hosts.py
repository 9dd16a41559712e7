"""The study on a cluster of several hosts (cluster/hosts.py): a head with no CPUs for trials and
two worker hosts, each with its own address, host name and /tmp, sharing one folder; Ray started on
each as a user starts it, the grid run on the head."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import yaml

from tests.helpers import REPO, driver_env, search_runs

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
    pytest.mark.xdist_group("many_hosts"),
]

SPACE = {
    "study": "t",
    "base": {"model": "vit_demo", "steps": 40, "warmup_steps": 4, "eval_every": 20, "log_every": 10, "batch_size": 32},
    "grid": {"condition": "MHA", "lr": 0.1, "seed": 0},
    "datasets": {"digits_c": {}},
    "tune": {"max_failures": 1, "checkpoint_every_s": 0},
}


def _hosts_module():
    spec = importlib.util.spec_from_file_location("hosts", REPO / "cluster" / "hosts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, demo_weights):
    """Three hosts: Ray's head on h1 with no CPUs for trials, one CPU on each of h2 and h3."""
    hosts = _hosts_module().Hosts(3, tmp_path_factory.mktemp("hosts"), keep=[REPO, sys.prefix]).up()
    env = driver_env(RAY_USAGE_STATS_ENABLED="0")
    try:
        head = "ray start --head --node-ip-address=10.77.0.1 --port=6379 --num-cpus=0"
        started = [hosts.sh(1, head, env=env, timeout=180)]
        for k in (2, 3):
            join = (
                f"ray start --address=10.77.0.1:6379 --node-ip-address=10.77.0.{k} --num-cpus=1 --disable-usage-stats"
            )
            started.append(hosts.sh(k, join, env=env, timeout=180))
        assert all(p.returncode == 0 for p in started), [p.stderr[-2000:] for p in started]
        yield hosts, env
    finally:
        hosts.down()


def test_a_trial_trains_across_two_hosts_and_is_recorded_once(cluster):
    # 2 DDP workers of 1 CPU on two 1-CPU hosts: one worker a host, so the process group spans both
    # (over gloo it forms only on the hosts' addresses), and the trial's own process takes no CPU
    # (had it taken 0.01, neither host would hold a worker: the trial would wait forever)
    hosts, env = cluster
    work = hosts.shared / "ddp"
    work.mkdir()
    space = {**SPACE, "models": {"vit_demo": {"workers": 2, "cpu": 1}}}
    (work / "space.yaml").write_text(yaml.safe_dump(space))
    storage = hosts.shared / "checkpoints"
    cmd = [sys.executable, "-m", "raystudy.grid", "--space", "space.yaml", "--address", "10.77.0.1:6379"]
    p = hosts.run(1, [*cmd, "--storage", str(storage)], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "(2 DDP workers)" in p.stdout and "1 finished" in p.stdout
    df = search_runs(f"sqlite:///{work}/mlflow.db", "raystudy-t-vit_demo")
    df = df[df["tags.raystudy.role"] == "trial"]
    assert len(df) == 1 and df.iloc[0]["tags.raystudy.status"] == "finished"
    workers = df.iloc[0]["tags.raystudy.worker"].split(",")
    assert sorted(w.split(":")[0] for w in workers) == ["10.77.0.2", "10.77.0.3"], workers
    # the checkpoint is in the folder every host shares, named by the trial key
    key = df.iloc[0]["tags.raystudy.key"]
    assert list(storage.glob(f"ddp-{key}/checkpoint_*/state.pt"))
