"""driver.records: what the driver writes of a trial beyond ``tracking``'s run record."""

from types import SimpleNamespace

from raystudy import tracking
from raystudy.config import trial_key
from raystudy.driver import records, session

CFG = {"model": "vit_demo", "dataset": "digits_c", "condition": "MHA", "optimizer": "sgd", "lr": 0.1,
       "seed": 0, "steps": 10, "device": "auto"}


def test_a_trial_the_policy_stopped_after_it_finished_is_recorded_stopped_late(mlflow_uri):
    cl, exp = session.experiment(mlflow_uri, "r")
    run = tracking.open_trial(cl, exp, None, trial_key(CFG), CFG)
    tracking.finish_trial(cl, run, {"status": "finished", "final": 1, "best_val_acc": 0.5, "test_acc": 0.5})
    records.mark_stopped_late(cl, run, 20, "race")
    tags = cl.get_run(run).data.tags
    assert tags[tracking.STATUS] == "stopped" and tags[tracking.STOPPED_AT] == "20"
    assert tags["raystudy.stopped_late"] == "1" and tags["raystudy.stop_rule"] == "race"
    assert tracking.statuses(cl, exp) == {trial_key(CFG): "stopped"}


def test_a_trials_error_text_is_its_error_file_or_says_there_is_none(tmp_path):
    f = tmp_path / "error.txt"
    f.write_text("Traceback ...\nRuntimeError: boom\n")
    assert records.error_text(SimpleNamespace(error_file=str(f))) == "Traceback ...\nRuntimeError: boom"
    assert records.error_text(SimpleNamespace(error_file=None)) == "trial failed (no error file)"
