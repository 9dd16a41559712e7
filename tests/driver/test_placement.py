"""driver.placement: a trial no node can hold is refused in one line naming what it needs and what
the nodes have, before Tune waits for it forever; an autoscaler's node types count as nodes."""

import pytest

from raystudy.driver import placement
from raystudy.errors import ConfigError

GIB = 2.0**30


def nodes(*cpus_gpus, memory=4 * GIB):
    """A cluster of nodes 10.0.0.1.. with the given (CPU, GPU) each."""
    found = [(f"10.0.0.{i + 1}", {"CPU": c, "GPU": g, "memory": memory}) for i, (c, g) in enumerate(cpus_gpus)]
    return placement.Cluster(found, [], [], [f"n{i}" for i in range(len(found))])


def test_two_workers_of_two_cpus_are_refused_on_one_cpu_nodes_naming_need_and_nodes():
    c = nodes((0, 0), (1, 0), (1, 0))
    why = placement.problem(placement.shape(2, 2, 0), c)
    assert why is not None and "\n" not in why
    assert "2 workers of {CPU: 2} each (placed PACK" in why
    assert "{CPU: 0} on 10.0.0.1" in why and "{CPU: 1} on 10.0.0.2, 10.0.0.3" in why
    with pytest.raises(ConfigError, match="cannot be placed"):
        placement.check([placement.shape(2, 2, 0)], c)


def test_pack_and_spread_place_workers_across_nodes_each_worker_on_one():
    # PACK (the project's) and SPREAD are soft: 2 x 1 CPU fit on two 1-CPU hosts, not on one
    two_hosts, one_host = nodes((0, 0), (1, 0), (1, 0)), nodes((1, 0))
    for strategy in ("PACK", "SPREAD"):
        s = placement.Shape({"CPU": 0.0, "memory": 2.0**28}, {"CPU": 1.0}, 2, strategy)
        assert placement.problem(s, two_hosts) is None
        assert placement.problem(s, one_host) is not None
    # a worker is never split across nodes: 2 CPUs a worker on two 1-CPU hosts do not fit
    assert not placement.fits(placement.Shape({}, {"CPU": 2.0}, 1, "SPREAD"), [r for _, r in two_hosts.nodes])
    # the strict ones, for completeness
    strict = [r for _, r in nodes((2, 0), (1, 0)).nodes]
    assert placement.fits(placement.Shape({}, {"CPU": 1.0}, 2, "STRICT_PACK"), strict)
    assert not placement.fits(placement.Shape({}, {"CPU": 1.0}, 3, "STRICT_PACK"), strict)
    assert placement.fits(placement.Shape({}, {"CPU": 1.0}, 2, "STRICT_SPREAD"), strict)
    assert not placement.fits(placement.Shape({}, {"CPU": 1.0}, 3, "STRICT_SPREAD"), strict)


def test_a_single_node_short_of_one_trial_and_gpus_where_none_exist_are_refused():
    why = placement.problem(placement.shape(1, 4, 0), nodes((2, 0)))
    assert "{CPU: 4} on one node" in why and "{CPU: 2} on 10.0.0.1" in why
    why = placement.problem(placement.shape(1, 1, 1), nodes((8, 0), (8, 0)))
    assert "{CPU: 1, GPU: 1} on one node" in why and "{CPU: 8, GPU: 0} on 10.0.0.1, 10.0.0.2" in why
    # a multi-worker GPU trial asks a whole GPU a worker
    assert "2 workers of {CPU: 1, GPU: 1}" in placement.problem(placement.shape(2, 1, 1), nodes((8, 0)))
    # what fits passes; a rehearsal asks one CPU whatever the trial would
    assert placement.problem(placement.shape(2, 1, 0), nodes((2, 0))) is None
    assert placement.problem(placement.shape(2, 4, 1, rehearse=True), nodes((1, 0))) is None


def test_an_autoscaler_node_type_that_holds_the_trial_is_not_refused_and_one_of_unknown_size_only_noted():
    config = {
        "max_workers": 4,
        "head_node_type": "head",
        "available_node_types": {
            "head": {"resources": {"CPU": 8}, "max_workers": 0},
            "gpu_8x": {"resources": {"CPU": 192, "GPU": 8}, "max_workers": 2},
            "spare": {"max_workers": 0, "resources": {"CPU": 1000}},
        },
    }
    addable, unknown = placement.autoscaling(config)
    assert addable == [("gpu_8x", {"memory": float("inf"), "CPU": 192.0, "GPU": 8.0}, 2)] and unknown == []
    head_only = nodes((8, 0))
    vit_huge = placement.shape(4, 8, 1)
    assert placement.problem(vit_huge, head_only) is not None
    grown = placement.Cluster(head_only.nodes, addable, [])
    assert placement.problem(vit_huge, grown) is None
    # 17 workers of a GPU: more than the 2 nodes of 8 it may add
    why = placement.problem(placement.shape(17, 1, 1), grown)
    assert "up to 2 x {CPU: 192, GPU: 8} to add (gpu_8x)" in why
    # a type without its resources (the provider fills them in): the check cannot know; it says so
    said = []
    placement.check([vit_huge], placement.Cluster(head_only.nodes, [], ["gpu_x"]), log=said.append)
    assert len(said) == 1 and "wait for the autoscaler" in said[0] and "gpu_x" in said[0]


def test_off_the_head_an_autoscaler_of_a_cluster_config_is_known_by_its_node_types():
    import json

    report = {"active_nodes": {"head": 1}, "idle_nodes": {}, "pending_launches": {"gpu_8x": 1}, "pending_nodes": []}
    assert placement.autoscaler_types(json.dumps({"autoscaler_report": report})) == ["gpu_8x", "head"]
    # `ray start` without a cluster config: Ray's read-only stand-in, a type per node
    readonly = {"active_nodes": {"node_ab12": 1}, "pending_nodes": [["10.0.0.2", "node_cd34", "setting-up"]]}
    assert placement.autoscaler_types(json.dumps({"autoscaler_report": readonly})) == []
    assert placement.autoscaler_types(None) == [] and placement.autoscaler_types("{}") == []


def test_the_nodes_that_run_trials_exclude_a_head_of_no_cpus():
    c = nodes((0, 0), (1, 0), (1, 0))
    assert placement.hosts(c, [placement.shape(2, 1, 0)]) == [1, 2]
    assert placement.hosts(c, [placement.shape(1, 1, 0)]) == [1, 2]


def test_the_grid_refuses_a_trial_its_local_ray_cannot_hold_before_anything_runs(tmp_path, demo_weights, ray_tmp):
    # a Ray of one CPU, trials of two: before, Tune waited for them forever, saying nothing
    import subprocess
    import sys

    import yaml

    from tests.helpers import driver_env, search_runs

    space = {
        "study": "t",
        "base": {"model": "vit_demo", "steps": 4, "warmup_steps": 1, "eval_every": 2, "batch_size": 8},
        "grid": {"condition": "MHA", "lr": 0.1, "seed": 0},
        "datasets": {"digits_c": {}},
        "models": {"vit_demo": {"cpu": 2}},
    }
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    cmd = [sys.executable, "-m", "raystudy.grid", "--space", "space.yaml", "--num-cpus", "1", "--ray-temp-dir", ray_tmp]
    snapped = tmp_path / "snapshot-taken"  # a grid refused before it starts takes no snapshot of the store
    env = driver_env(RAYSTUDY_SNAPSHOT_CMD=f"touch {snapped}")
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-2000:]
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "{CPU: 2} on one node" in errors[0] and "{CPU: 1} on 127.0.0.1" in errors[0], errors
    # nothing recorded: no trial ran, no parent run was made
    db = tmp_path / "mlflow.db"
    assert not db.exists() or search_runs(f"sqlite:///{db}", "raystudy-t-vit_demo").empty
    assert not snapped.exists()


@pytest.mark.slow  # about 20 s: a Ray start, as the grid's test above; the same check
def test_a_search_refuses_a_trial_its_local_ray_cannot_hold_before_anything_runs(tmp_path, demo_weights, ray_tmp):
    import subprocess
    import sys

    import yaml

    from tests.helpers import driver_env

    space = {
        "study": "ts",
        "base": {
            "model": "vit_demo",
            "dataset": "digits_c",
            "steps": 4,
            "warmup_steps": 1,
            "eval_every": 2,
            "batch_size": 8,
        },
        "conditions": ["MHA"],
        "params": {"lr": {"loguniform": [1.0e-3, 0.5]}},
        "budget": {"num_samples": 2},
        "test_seeds": [100],
        "models": {"vit_demo": {"cpu": 2}},
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(space))
    cmd = [
        sys.executable,
        "-m",
        "raystudy",
        "search",
        "--space",
        "s.yaml",
        "--num-cpus",
        "1",
        "--ray-temp-dir",
        ray_tmp,
    ]
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=driver_env())
    assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-2000:]
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "{CPU: 2} on one node" in errors[0] and "{CPU: 1} on 127.0.0.1" in errors[0], errors
    assert not (tmp_path / "runs" / "search" / "optuna").exists()  # no study begun


def test_the_trials_a_cluster_holds_at_once_count_every_node_and_what_its_autoscaler_may_add():
    c = nodes((4, 0), (2, 1), (0, 0))
    assert placement.at_once(placement.shape(1, 1, 0), c) == 6
    assert placement.at_once(placement.shape(1, 2, 0), c) == 3
    assert placement.at_once(placement.shape(1, 1, 1), c) == 1
    # a rehearsal's trial asks one CPU whatever the trial would
    assert placement.at_once(placement.shape(1, 4, 1, rehearse=True), c) == 6
    # a multi-worker trial: its workers' bundles over the nodes (PACK: any nodes), not its own process
    assert placement.at_once(placement.shape(2, 1, 0), c) == 3
    assert placement.at_once(placement.Shape({"CPU": 0.0}, {"CPU": 1.0}, 3, "STRICT_PACK"), c) == 1
    # none known holds one: 0
    assert placement.at_once(placement.shape(1, 8, 0), c) == 0
    # the autoscaler's node types count, as many as it may add
    auto = placement.Cluster(c.nodes, [("gpu", {"CPU": 8.0, "GPU": 2.0, "memory": GIB}, 3)], [], [])
    assert placement.at_once(placement.shape(1, 1, 1), auto) == 1 + 3 * 2
