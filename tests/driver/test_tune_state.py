"""driver.tune_state: what a restore refuses (no first save, a search state missing or cut short)."""

from raystudy.driver import tune_state


def test_a_tune_state_without_its_first_save_or_its_last_search_is_not_restored(tmp_path):
    import pickle

    (tmp_path / "tuner.pkl").write_bytes(pickle.dumps({"__flattened_param_space_keys": ["trial/grid_search"]}))
    # tuner.pkl alone: the driver was killed before Tune's first save
    assert tune_state.restore(tmp_path, None) == (
        None,
        "it has no experiment state: the driver stopped before Tune's first save",
    )
    # a session's trials saved, its search not (Tune saves them in that order): the older session's
    # search would not know the trials made since
    for name in ("experiment_state-2026-12-04_10-00-00", "basic-variant-state-2026-12-04_10-00-00"):
        (tmp_path / f"{name}.json").write_text("{}")
    (tmp_path / "experiment_state-2026-12-04_11-00-00.json").write_text("{}")
    assert tune_state.restore(tmp_path, None) == (
        None,
        "its search state of the last session is missing: the driver stopped while Tune saved",
    )
    # both of the last session there: what Tune makes of the (here fake) state decides
    _search_state(tmp_path, "2026-12-04_11-00-00")
    tuner, why = tune_state.restore(tmp_path, None)
    assert tuner is None and "experiment state" not in why and "search state" not in why, why


def _trainable(config):
    """A grid's trial, never run here."""


def _search_state(folder, session: str):
    """The search state Tune saves for a grid (a real ``BasicVariantGenerator``'s), returned."""
    from ray import tune
    from ray.tune.search.basic_variant import BasicVariantGenerator

    gen = BasicVariantGenerator()
    gen.add_configurations([tune.Experiment("grid", _trainable, config={"trial": tune.grid_search(list(range(300)))})])
    gen.save_to_dir(str(folder), session)
    return folder / f"basic-variant-state-{session}.json"


def test_a_tune_state_whose_search_state_a_full_disk_cut_short_is_not_restored(tmp_path):
    # seen in the nemesis (seed 5, grid, SQLite): the disk filled as a Tune run began; Tune copies
    # its state from the driver's staging folder to the storage and the copy left the search's file
    # cut at a page, under its final name. Restored, Tune made trials with no config (KeyError 'trial')
    import pickle

    (tmp_path / "tuner.pkl").write_bytes(pickle.dumps({"__flattened_param_space_keys": ["trial/grid_search"]}))
    (tmp_path / "experiment_state-2026-12-06_15-47-18.json").write_text("{}")
    search = _search_state(tmp_path, "2026-12-06_15-47-18")
    whole = search.read_bytes()
    search.write_bytes(whole[: len(whole) // 4096 * 4096 or len(whole) // 2])
    assert tune_state.restore(tmp_path, None) == (
        None,
        f"its search state of the last session is cut short ({search.stat().st_size} bytes): "
        "the disk filled as Tune saved",
    )
    search.write_bytes(whole)  # whole, it is not what refuses the (here fake) state
    assert "search state" not in tune_state.restore(tmp_path, None)[1]
