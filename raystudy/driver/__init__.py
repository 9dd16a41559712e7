"""The driver: the process that runs a grid or a search on Ray and writes every MLflow record.

One concern a module: ``local_ray`` (start or join Ray), ``lock`` (one driver per grid),
``session`` (a driver's lifecycle: weights, lock, Ray, its parent run), ``study_loop`` (a
study's trials from a source, run and counted alike), its sources ``grid_run`` (a list of trials,
each run once) and ``optuna_search`` (one Optuna study under ASHA), ``scheduler`` (the
adaptive policy on Tune), ``mlflow_trials`` (the Tune callback that writes each trial's MLflow
run, from the driver only), ``ledger`` (every result a trial reported, on storage),
``reconcile`` (what a killed driver left, put right), ``tuner`` (a Tune run fitted and closed),
``tune_state`` (restore or set aside Tune's saved state), ``tune_output`` (Tune's output),
``interrupt`` (Ctrl-C), ``full_disk`` and ``node_watch`` (two ways a run stops), ``faults``
(fault points for tests), ``checkpoints`` (pruning what no saved state names). Workers run
``raystudy.train.trial``. Importing the package does nothing.
"""
