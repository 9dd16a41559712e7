"""One home for every bound: a config, a space file and a command line's flags check the same row
of ``bounds.BOUNDS``, and every list of seeds is checked by the one seed check."""

import pytest

from raystudy import bounds
from raystudy.bounds import BOUNDS
from raystudy.commands import cli, search
from raystudy.errors import ConfigError
from raystudy.spaces import schema
from raystudy.train import config

SHARED = {  # a count that a space file and a flag both take: (its space key, its flag)
    "max_failures": (schema.TUNE["max_failures"], "--max-failures"),
    "max_concurrent": (schema.TUNE["max_concurrent"], "--max-concurrent"),
    "num_samples": (schema.SEARCH["budget"].keys["num_samples"], "--num-samples"),
    "threads_per_trial": (schema.TUNE["threads_per_trial"], "--threads"),
}


def in_space(key, *path):
    """The space file check of ``key`` at ``path``, as a function of the value."""
    return lambda v: schema.check("s.yaml", path, v, key)


def refused(f, *args) -> bool:
    try:
        f(*args)
    except ConfigError:
        return True
    return False


@pytest.mark.parametrize("name", SHARED)
def test_a_space_key_and_its_flag_are_one_row(name):
    key, flag = SHARED[name]
    row = BOUNDS[name]
    assert key.bound is row and cli.FLAGS[flag] is row
    # Read from the row, not from a number of their own: each place accepts its ends, refuses past them.
    check = in_space(key, "tune", name)
    assert not refused(check, row.high) and refused(check, row.high + 1) and refused(check, row.least() - 1)
    assert not refused(cli.check_count, flag, row.high) and refused(cli.check_count, flag, row.high + 1)
    assert not refused(cli.check_count, flag, row.least()) and refused(cli.check_count, flag, row.least() - 1)
    assert f"at most {row.high:,}" in cli.bound(flag)


def test_the_time_budget_is_one_row():
    row = BOUNDS["time_budget_s"]
    assert schema.SEARCH["budget"].keys["time_budget_s"].bound is row and cli.FLAGS["--time-budget"] is row
    check = in_space(schema.SEARCH["budget"].keys["time_budget_s"], "budget", "time_budget_s")
    for ok, v in ((True, row.high), (False, row.high + 1), (False, row.low)):
        assert refused(check, v) is not ok and refused(cli.check_seconds, "--time-budget", v) is not ok


def test_a_config_key_and_its_flag_are_one_row():
    row = BOUNDS["num_workers"]
    assert cli.FLAGS["--num-workers"] is row and "num_workers" in config.LIMITED + config.LOWER_BOUNDED
    assert config.check_value("num_workers", row.high) == row.high
    assert refused(config.check_value, "num_workers", row.high + 1)
    assert refused(cli.check_count, "--num-workers", row.high + 1) and not refused(cli.check_count, "--num-workers", 0)
    assert config.limit_help("num_workers") == f"at most {row.high:,}"


def test_every_seed_check_reads_the_seed_row():
    row = BOUNDS["seed"]
    assert schema.SEARCH["seed"].bound is row and schema.SEARCH["test_seeds"].bound is row
    last, past = row.high, row.high + 1
    space_seeds = in_space(schema.SEARCH["test_seeds"], "test_seeds")
    places = (
        lambda v: config.check_value("seed", v),  # a config's seed, a grid's seed axis
        lambda v: cli.check_seed("--seed", v),  # a seed flag
        lambda v: search.parse_seeds(f"1,{v}"),  # --test-seeds
        lambda v: space_seeds([1, v]),  # a search file's test_seeds
        in_space(schema.SEARCH["seed"], "seed"),  # a search file's seed
    )
    for check in places:
        assert not refused(check, row.low) and not refused(check, last)
        assert refused(check, row.low - 1) and refused(check, past)
    assert bounds.is_seed(last) and not bounds.is_seed(past) and not bounds.is_seed(True)
    assert bounds.parse_seed_list(f"0, {last}") == [0, last] and bounds.parse_seed_list("1,1") is None
    assert bounds.is_seed_list([1, 1]) and not bounds.is_seed_list([1, 1], distinct=True)  # a space file's may repeat


def test_every_row_is_plain_data_of_a_known_kind():
    for name, row in BOUNDS.items():
        assert row.kind in bounds.KINDS and row.low is not None, name
        assert row.high is None or row.high > row.low, name
        assert set(row.says) <= set(bounds.PLACES), name
    assert set(config.LIMITED) | set(config.LOWER_BOUNDED) <= set(config.FinetuneConfig.__dataclass_fields__)
