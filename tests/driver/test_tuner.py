"""driver.tuner: a Tune run as the driver runs it: what an ended run leaves let go."""

from raystudy.driver import tuner


def test_an_ended_tune_run_lets_go_of_the_log_once_keys_of_what_tunes_encoder_pickled():
    # Tune's JSON encoder pickles what JSON cannot hold (a trial's storage context at each save)
    # and keeps a log-once key of its text for the life of the process: a few kB a trial.
    import json

    from ray.tune.utils.serialization import TuneFunctionEncoder
    from ray.util import debug

    class Unwritable:
        def __str__(self):
            return "a trial's storage context at checkpoint 7"

    json.dumps({"storage": Unwritable()}, cls=TuneFunctionEncoder)
    debug.log_once("raystudy test: another key")
    assert tuner.ENCODED + "a trial's storage context at checkpoint 7" in debug._logged
    tuner.let_go()
    assert not [k for k in debug._logged if k.startswith(tuner.ENCODED)]
    assert "raystudy test: another key" in debug._logged  # Ray's other once-only warnings stay once-only


def test_a_study_runs_as_tune_runs_of_at_most_trials_per_run_named_in_their_order():
    assert tuner.runs(list(range(12)), "s", 5) == [
        ("s-part1of3", [0, 1, 2, 3, 4]),
        ("s-part2of3", [5, 6, 7, 8, 9]),
        ("s-part3of3", [10, 11]),
    ]
    assert [len(part) for _, part in tuner.runs(list(range(10)), "s", 5)] == [5, 5]
    assert tuner.runs([1, 2, 3], "s", 500) == [("s", [1, 2, 3])]  # one run: the folder is the study's own
    assert tuner.runs([], "s", 5) == [("s", [])]
    names = [name for name, _ in tuner.runs(list(range(12)), "s", 1)]
    assert names[0] == "s-part01of12" and names == sorted(names)  # zero-padded: they sort in order
