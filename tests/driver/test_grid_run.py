"""How a grid splits into Tune runs (``grid_run.parts``): no Ray needed."""

import pytest

from raystudy.driver import grid_run
from raystudy.spaces import grids
from tests.helpers import REPO

DEMO = REPO / "search_spaces" / "demo.yaml"


@pytest.fixture(scope="module")
def demo():
    """The demo grid's 104 trials: 4 datasets x (6 conditions x 2 lrs + the linear probe) x 2 seeds."""
    return grids.expand(grids.load_grid(str(DEMO)), "vit_demo", None, None, None, {})


def test_a_grid_that_fits_is_one_run_in_the_grids_own_folder(demo):
    assert grid_run.parts(demo, "g", len(demo)) == [("g", demo)]
    assert grid_run.parts(demo, "g", 10 * len(demo)) == [("g", demo)]


def test_a_larger_grid_runs_in_parts_of_at_most_the_size_each_trial_once_in_the_grids_order(demo):
    n = len(demo)
    runs = grid_run.parts(demo, "g", 8)
    k = -(-n // 8)
    assert [name for name, _ in runs] == [f"g-part{i:02d}of{k}" for i in range(1, k + 1)]
    assert all(len(part) == 8 for _, part in runs[:-1]) and 1 <= len(runs[-1][1]) <= 8
    assert [t.key for _, part in runs for t in part] == [t.key for t in demo]


def test_part_names_sort_in_their_order_past_nine_parts(demo):
    names = [name for name, _ in grid_run.parts(demo, "g", 2)]
    assert len(names) >= 10 and names == sorted(names) and names[0] == f"g-part01of{len(names)}"


def test_a_policys_parts_hold_earlier_seeds_first(demo):
    assert len(demo) == 104 and {t.config["seed"] for t in demo} == {0, 1}
    runs = grid_run.parts(demo, "g", 52, seed_major=True)
    assert [{t.config["seed"] for t in part} for _, part in runs] == [{0}, {1}]
    assert sorted(t.key for _, part in runs for t in part) == sorted(t.key for t in demo)
    plain = grid_run.parts(demo, "g", 52)
    assert len({t.config["seed"] for t in plain[0][1]}) > 1  # the grid's own order mixes them
