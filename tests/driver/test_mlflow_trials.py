"""driver.mlflow_trials: the Tune callback's helpers (what a trial's run record holds is tracking/test_record.py's)."""

from types import SimpleNamespace

from raystudy.driver import mlflow_trials


def test_a_trials_error_text_is_its_error_file_or_says_there_is_none(tmp_path):
    f = tmp_path / "error.txt"
    f.write_text("Traceback ...\nRuntimeError: boom\n")
    assert mlflow_trials.error_text(SimpleNamespace(error_file=str(f))) == "Traceback ...\nRuntimeError: boom"
    assert mlflow_trials.error_text(SimpleNamespace(error_file=None)) == "trial failed (no error file)"
