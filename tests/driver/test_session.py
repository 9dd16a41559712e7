"""driver.session: importing it starts nothing; a parent run is never left RUNNING, and says how it ended."""

import subprocess
import sys

import pytest

from raystudy.driver import session
from raystudy.tracking import tags


def test_importing_the_session_loads_no_ray_mlflow_or_torch():
    # the command lines import it for their --help and --dry-run, which need none of them
    code = (
        "import sys, raystudy.driver.session, raystudy.driver.lock, raystudy.driver.local_ray; "
        "print(sorted(m for m in ('ray', 'mlflow', 'torch', 'optuna') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_parent_run_ends_finished_with_its_status_or_interrupted(mlflow_uri):
    cl, exp = session.experiment(mlflow_uri, "s")
    with session.parent_run(cl, exp, "g1", "grid-a", {"trials": 2}, "grid") as parent:
        assert cl.get_run(parent.run_id).data.tags[tags.STATUS] == "running"
        parent.status = "incomplete"
    run = cl.get_run(parent.run_id)
    assert run.info.status == "FINISHED" and run.data.tags[tags.STATUS] == "incomplete"
    with pytest.raises(KeyboardInterrupt), session.parent_run(cl, exp, "g1", "grid-a", {"trials": 2}, "grid") as again:
        raise KeyboardInterrupt
    assert again.run_id == parent.run_id  # found by its key, not created twice
    run = cl.get_run(parent.run_id)
    assert run.info.status == "FINISHED" and run.data.tags[tags.STATUS] == "interrupted"


def test_a_driver_interrupted_outside_a_tune_run_leaves_no_trial_run_running(mlflow_uri):
    # Seen in CI: a SLURM scancel as a trial's run was being opened (a Ctrl-C with no Tune run to
    # close it: the runs the driver records from Tune's files before its Tune run starts) left
    # that run RUNNING.
    from raystudy.tracking import record

    cl, exp = session.experiment(mlflow_uri, "s")
    config = {"model": "vit_demo", "dataset": "digits_c", "condition": "MHA", "lr": 0.1, "seed": 0}
    with pytest.raises(KeyboardInterrupt), session.parent_run(cl, exp, "g1", "grid-a", {"trials": 2}, "grid") as p:
        done = record.open_trial(cl, exp, p.run_id, "k1", config)
        record.finish_trial(cl, done, {"test_acc": 0.5})
        opened = record.open_trial(cl, exp, p.run_id, "k2", config)
        raise KeyboardInterrupt  # the Ctrl-C, right after the run was made
    run = cl.get_run(opened)
    assert run.info.status == "KILLED" and run.data.tags[tags.STATUS] == "interrupted"
    assert cl.get_run(done).data.tags[tags.STATUS] == "finished"  # what had ended stays as it was
