"""raystudy.driver.scheduler: the order an adaptive grid starts its trials in; the trial Tune starts
next under a cap on concurrent trials."""

from raystudy.driver import scheduler
from raystudy.spaces import grids


def test_an_adaptive_grid_starts_its_seeds_one_after_another():
    # decisions on a cell's earlier seeds come before its later seeds start
    trials = [
        grids.Trial(
            f"{c}/{lr}/{s}", {"dataset": "d", "condition": c, "optimizer": "sgd", "lr": lr, "seed": s}, 1.0, 1.0, 1
        )
        for s in (7, 0, 3)
        for c in ("MHA", "FC1")
        for lr in (0.3, 0.1)
    ]
    order = sorted(trials, key=scheduler.seed_major(trials))
    assert [t.config["seed"] for t in order] == [0] * 4 + [3] * 4 + [7] * 4
    assert [t.key for t in order[:4]] == ["FC1/0.1/0", "FC1/0.3/0", "MHA/0.1/0", "MHA/0.3/0"]


class Controller:
    """What Tune hands a scheduler to choose from: its trials, in the order it added them."""

    def __init__(self, *statuses):
        from ray.tune.experiment import Trial as TuneTrial

        self.trials = []
        for i, status in enumerate(statuses):
            t = TuneTrial("__fake", stub=True, trial_id=f"t{i}")
            t.set_status(status)
            self.trials.append(t)

    def get_trials(self):
        return self.trials


def test_under_a_cap_the_newest_pending_trial_starts_first_then_the_oldest_paused():
    # Tune gives an ended trial's process to the trial chosen: the one just added has no actor yet,
    # while an older pending one's is already starting (Tune would kill it for the reused one)
    from ray.tune.schedulers import FIFOScheduler

    c = Controller("TERMINATED", "PENDING", "RUNNING", "PAUSED", "PENDING", "TERMINATED")
    assert scheduler.newest_pending(c).trial_id == "t4"
    for s in (scheduler.NewestFirst(), scheduler.NewestFirstASHA(time_attr="step", metric="score", mode="max")):
        assert s.choose_trial_to_run(c).trial_id == "t4"
    assert FIFOScheduler().choose_trial_to_run(c).trial_id == "t1"  # Tune's own: the oldest
    # no pending trial: the oldest paused one, as Tune's; neither: none
    paused = Controller("RUNNING", "PAUSED", "PAUSED")
    assert scheduler.newest_pending(paused) is None
    assert scheduler.NewestFirst().choose_trial_to_run(paused).trial_id == "t1"
    assert scheduler.NewestFirst().choose_trial_to_run(Controller("RUNNING", "TERMINATED")) is None
