"""The driver: the process that runs a grid or a search on Ray and writes every MLflow record.

One concern a module: ``local_ray`` (start or join Ray), ``lock`` (one driver per grid),
``session`` (a driver's lifecycle: weights, lock, Ray, its parent run), ``grid_run`` (a list of
trials, each run once), ``optuna_search`` (one Optuna study under ASHA), ``scheduler`` (the
adaptive policy on Tune), ``records`` (the trial runs' MLflow records, written from the driver
only), ``tune_glue`` (Tune's output, restore and Ctrl-C), ``checkpoints`` (pruning what no
saved state names). Workers run ``raystudy.train.trial``. Importing the package does nothing.
"""
