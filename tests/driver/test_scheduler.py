"""raystudy.driver.scheduler: the order an adaptive grid starts its trials in."""

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
