"""driver.optuna_search: a resumed search goes on from the persisted study."""

from raystudy.driver import optuna_search, reconcile
from raystudy.spaces import searches


def test_a_resumed_search_suggests_no_config_twice(tmp_path):
    # Rebuilt with the same seed, a searcher would replay its first suggestions.
    space = searches.load_search("optimiser")
    base = {**space.base, "model": "vit_demo", "dataset": "digits_c"}
    res = {"gpu": 0.0, "cpu": 1.0, "workers": 1}
    store = optuna_search.optuna_storage(tmp_path)

    def session(n, first):
        s = optuna_search.make_searcher(space, "MHA", base, res, store, "s")
        keys = []
        for i in range(n):
            cfg = s.suggest(f"{first + i}")
            keys.append(cfg["trial"]["key"])
            s.on_trial_complete(f"{first + i}", {"score": 0.1 * i, "step": 1})
        return keys

    first = session(3, 0)
    reconcile.completed_trials(store, "s")
    second = session(3, 3)  # the search killed and run again: same space, same seed
    assert len(set(first + second)) == 6, (first, second)
