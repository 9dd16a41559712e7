"""analysis over a real MLflow store (SQLite in a temp folder) written by raystudy.tracking,
the writer the grid's driver uses (so the layout read here is the one the grid writes).

The toy study: 2 datasets × 3 conditions × 2 lrs × 2 seeds of vit_demo, plus one diverged and
one failed run, under one grid parent run. Accuracies are a function of the cell so the CSV path
can be fed the same numbers directly. Writing the store takes ~8 s on 2 cores (the writer tags
every run with package and git versions), the module ~25 s: marked slow.
"""

import mlflow
import numpy as np
import pandas as pd
import pytest

from analysis import AnalysisError, best_config, load, reporting
from analysis.commands import export, report
from analysis.stats import variance
from raystudy.tracking import connect, record
from raystudy.train.config import FinetuneConfig, load_config, trial_key, validate

DATASETS = ("digits_c", "digits")
CONDITIONS = ("MHA", "FC1", "LN1")
LRS = (0.1, 0.3)
SEEDS = (0, 1)
COMPONENTS = ("LN1", "MHA", "LN2", "FC1", "FC2")
EXPERIMENT = "toy-study"
TRAINABLE = {"MHA": 2_000, "FC1": 1_500, "LN1": 40}

# One xdist worker runs this file: its tests share one module-scoped store.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("analysis_mlflow")]


def accuracies(dataset, condition, lr, seed):
    """(val, test): MHA > FC1 > LN1; on digits_c FC1 is best at lr 0.1 on val, 0.3 on test."""
    base = {"digits_c": 0.50, "digits": 0.70}[dataset] + {"MHA": 0.20, "FC1": 0.10, "LN1": 0.0}[condition]
    val = base + {0.1: 0.02, 0.3: 0.0}[lr] + 0.01 * seed
    test = base + {0.1: 0.0, 0.3: 0.01}[lr] + 0.005 * seed
    if dataset == "digits" or condition != "FC1":
        test = val - 0.02  # elsewhere test follows val: lr 0.1 on both
    return round(val, 4), round(test, 4)


def trial_config(dataset, condition, lr, seed) -> dict:
    """Seed 0 runs probe plasticity (and log plasticity_before.csv); the others do not."""
    return FinetuneConfig(
        model="vit_demo",
        pretrained=False,
        dataset=dataset,
        condition=condition,
        lr=lr,
        seed=seed,
        probe_pairs=64 if seed == 0 else 0,
    ).to_dict()


def log_trial(c, exp_id, parent, cfg, status, val=None, test=None, artifacts=True):
    """One trial written by raystudy's own tracking writer, as the grid's driver does."""
    rid = record.open_trial(c, exp_id, parent, trial_key(cfg), cfg)
    for i, step in enumerate(range(10, 70, 10)):
        record.log_steps(
            c,
            rid,
            [
                {
                    "loss": 2.0 / (i + 1),
                    "grad_norm/total": 1.0 + i,
                    f"grad_norm/{cfg['condition']}": 0.5 + i,
                    "step": step,
                }
            ],
        )
    for step in (30, 60):
        record.log_steps(c, rid, [{"val_loss": 1.0 / step, "val_acc": 0.5, "step": step}])
    if status == "failed":
        record.fail_trial(c, rid, "RuntimeError: CUDA out of memory")
        return rid
    # the engine logs the count whether the run finished or diverged (head: 10 classes)
    count = TRAINABLE[cfg["condition"]] + 650
    results = {
        "status": status,
        "trainable_params": count,
        f"trainable_params/{cfg['condition']}": TRAINABLE[cfg["condition"]],
    }
    if status == "finished":
        results.update(best_val_acc=val, test_acc=test, best_step=60)
    if artifacts and cfg["probe_pairs"]:  # what the probe measures: n, mean and std, no interval
        results["plasticity_before"] = [
            {
                "model": "vit_demo",
                "dataset": cfg["dataset"],
                "mode": mode,
                "layer": layer,
                "component": comp,
                "mean": (5 - k) * (1 + 0.1 * layer),
                "std": 0.1,
                "n": 64,
                "bound": 100.0,
            }
            for mode in ("shared", "in_situ")
            for layer in range(4)
            for k, comp in enumerate(COMPONENTS)
        ]
    record.finish_trial(c, rid, results)
    return rid


def toy_rows():
    for d in DATASETS:
        for cond in CONDITIONS:
            for lr in LRS:
                for seed in SEEDS:
                    yield d, cond, lr, seed


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root}/mlflow.db"
    c = mlflow.MlflowClient(tracking_uri=uri)
    exp_id = connect.experiment_id(c, EXPERIMENT, (root / "artifacts").as_uri())
    parent = record.parent_run(c, exp_id, "gridkey", "grid-toy", {"space": "toy"})
    ids = {}
    for d, cond, lr, seed in toy_rows():
        val, test = accuracies(d, cond, lr, seed)
        ids[(d, cond, lr, seed)] = log_trial(c, exp_id, parent, trial_config(d, cond, lr, seed), "finished", val, test)
    ids["diverged"] = log_trial(c, exp_id, parent, trial_config("digits", "LN1", 0.3, 2), "diverged")
    ids["failed"] = log_trial(c, exp_id, parent, trial_config("digits_c", "MHA", 0.3, 2), "failed")
    c.set_terminated(parent, "FINISHED")
    # an experiment whose grid has not started trials, and one where every trial failed
    empty = connect.experiment_id(c, "empty", (root / "a2").as_uri())
    c.set_terminated(record.parent_run(c, empty, "g2", "grid-empty", {}))
    broken = connect.experiment_id(c, "broken", (root / "a3").as_uri())
    bparent = record.parent_run(c, broken, "g3", "grid-broken", {})
    for seed in (0, 1):
        log_trial(c, broken, bparent, trial_config("digits", "MHA", 0.1, seed), "failed", artifacts=False)
    log_trial(c, broken, bparent, trial_config("digits", "MHA", 0.3, 0), "diverged", artifacts=False)
    return {"uri": uri, "parent": parent, "ids": ids, "root": root}


def test_loader_keeps_diverged_and_failed_runs(store):
    runs = load.from_mlflow(EXPERIMENT, store["uri"])
    assert len(runs) == 26 and runs["run_id"].is_unique
    assert runs["status"].value_counts().to_dict() == {"finished": 24, "diverged": 1, "failed": 1}
    bad = runs[runs["status"] != "finished"].set_index("status")
    assert bad[["val_acc", "test_acc"]].isna().all().all()
    assert bad.loc["failed", "error"] == "RuntimeError: CUDA out of memory"
    assert bad.loc["diverged", "seed"] == 2 and bad.loc["diverged", "lr"] == 0.3
    one = runs.set_index("run_id").loc[store["ids"][("digits_c", "FC1", 0.3, 1)]]
    assert (one["val_acc"], one["test_acc"]) == accuracies("digits_c", "FC1", 0.3, 1)
    assert (one["model"], one["optimizer"], one["low_data"]) == ("vit_demo", "sgd", False)
    assert set(runs["parent_run_id"]) == {store["parent"]}
    assert load.grid_runs(EXPERIMENT, store["uri"]) == [store["parent"]]


def test_step_metrics_and_plasticity_artifacts(store):
    runs = load.from_mlflow(EXPERIMENT, store["uri"])
    two = runs[(runs["dataset"] == "digits") & (runs["lr"] == 0.1) & (runs["seed"] == 0)]
    hist = load.step_metrics(two, ["val_loss", "grad_norm/{condition}"], store["uri"])
    assert len(hist) == 3 * (2 + 6)
    own = hist[hist["key"] == "grad_norm/{condition}"]
    assert sorted(own["step"].unique()) == [10, 20, 30, 40, 50, 60] and own["value"].max() == 5.5
    bands = variance.curve_bands(hist, two)
    assert set(bands["condition"]) == set(CONDITIONS) and (bands["n"] == 1).all()
    plast = load.plasticity(two, "before", store["uri"])
    assert len(plast) == 3 * 2 * 4 * 5 and set(plast["condition"]) == set(CONDITIONS)
    from scipy import stats as st

    half = st.t.ppf(0.975, 63) * 0.1 / 8  # the interval the report shows, from n, mean and std alone
    assert np.allclose(plast["ci_low"], plast["mean"] - half, rtol=1e-12, atol=0)
    assert np.allclose(plast["ci_high"], plast["mean"] + half, rtol=1e-12, atol=0)
    assert load.plasticity(two, "after", store["uri"]).empty  # no such artifact: nothing, no error


def test_report_from_mlflow_logs_to_the_grid_run(store, tmp_path, capsys):
    out = tmp_path / "out"
    assert report.main(["--experiment", EXPERIMENT, "--tracking-uri", store["uri"], "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "26 runs (24 finished, 1 diverged, 1 failed)" in printed
    assert "raystudy analysis: vit_demo, sgd" in printed
    # the lr choice differs on (digits_c, FC1): val picks 0.1, test 0.3
    assert "0.1 / 0.3" in (out / "chosen_lr.md").read_text()
    for fig in (
        "accuracy_val_selected",
        "cd_diagram",
        "curves_val_loss",
        "curves_grad_norm_total",
        "curves_grad_norm_own",
        "plasticity",
    ):
        assert (out / "figures" / f"{fig}.png").is_file() and (out / "figures" / f"{fig}.pdf").is_file(), fig
    # toy plasticity is LN1 > MHA > LN2 > FC1 > FC2; accuracy MHA > FC1 > LN1
    ranking = pd.read_csv(out / "plasticity_ranking_shared.csv", index_col=0)
    assert list(ranking.index) == ["LN1", "MHA", "FC1"]
    corr = pd.read_csv(out / "plasticity_correlation_shared.csv").set_index("dataset")
    assert corr.loc["digits", "rho"] == pytest.approx(-0.5)
    assert "Components by plasticity (highest first): LN1 > MHA > FC1" in printed
    # gradient norms of the trained component (0.5 .. 5.5 for all three here) against accuracy
    assert "## Gradient norm and accuracy" in printed
    gn = pd.read_csv(out / "grad_norm_correlation_ci.csv").set_index("dataset")
    assert list(gn.index) == ["digits", "digits_c", "mean"]
    assert (out / "plasticity_shared_correlation_ci.csv").is_file()
    c = mlflow.MlflowClient(tracking_uri=store["uri"])
    logged = {f.path for f in c.list_artifacts(store["parent"], "analysis")}
    assert {"analysis/report.md", "analysis/accuracy_val_selected.md", "analysis/figures"} <= logged
    assert f"logged them to run(s) {store['parent']}" in printed
    note = c.get_run(store["parent"]).data.tags["mlflow.note.content"]  # the run page's description
    assert "## Analysis report" in note and "analysis/report.md" in note and "# " in note.split("## Analysis report")[1]
    # trainable parameter counts read back from the runs: the parameter-efficiency table
    eff = pd.read_csv(out / "parameter_efficiency.csv", index_col=0)
    assert eff["params"].to_dict() == {"LN1": 690, "FC1": 2_150, "MHA": 2_650}
    assert (out / "figures" / "parameter_efficiency.pdf").is_file()


def test_csv_path_gives_the_same_tables_as_mlflow(store, tmp_path):
    """The same runs given as a CSV of per-run results (as published elsewhere) → same tables."""
    rows = [
        dict(
            dataset=d,
            condition=cond,
            lr=lr,
            seed=seed,
            model="vit_demo",
            optimizer="sgd",
            val_acc=accuracies(d, cond, lr, seed)[0],
            test_acc=accuracies(d, cond, lr, seed)[1],
            status="finished",
        )
        for d, cond, lr, seed in toy_rows()
    ]
    rows += [
        dict(dataset="digits", condition="LN1", lr=0.3, seed=2, model="vit_demo", optimizer="sgd", status="diverged"),
        dict(dataset="digits_c", condition="MHA", lr=0.3, seed=2, model="vit_demo", optimizer="sgd", status="failed"),
    ]
    csv = tmp_path / "elsewhere.csv"
    pd.DataFrame(rows).to_csv(csv, index=False)
    a, b = tmp_path / "mlflow", tmp_path / "csv"
    # tables only: test_report_from_mlflow_logs_to_the_grid_run draws these runs' figures
    reporting.report_from_mlflow(EXPERIMENT, a, store["uri"], curves=False, log=False, draw_figures=False)
    reporting.report_from_csv(csv, b, draw_figures=False)
    for name in (
        "accuracy_val_selected.md",
        "accuracy_test_selected.csv",
        "selection.md",
        "chosen_lr.md",
        "ranks.csv",
        "lr_robustness.csv",
        "run_status.md",
        "tests.csv",
        "posthoc.csv",
        "omnibus.csv",
    ):
        assert (a / name).read_text() == (b / name).read_text(), name


@pytest.mark.parametrize(
    "experiment,needle",
    [
        ("nope", "unknown MLflow experiment 'nope' at sqlite:"),
        ("empty", "experiment 'empty' has no trial runs"),
        ("broken", "experiment 'broken': no finished runs (2 failed, 1 diverged)"),
    ],
)
def test_bad_experiments_exit_2_with_one_line(store, tmp_path, capsys, experiment, needle):
    for main in (report.main, export.main):
        assert main(["--experiment", experiment, "--tracking-uri", store["uri"], "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err
    with pytest.raises(AnalysisError, match="experiments there: .*toy-study"):
        load.from_mlflow("nope", store["uri"])


def test_coerce_params_round_trips_every_config_key():
    cfg = FinetuneConfig(weights=None, data_root="/data", low_data=True, betas=(0.8, 0.99), lr=3e-3)
    params = {k: str(v) for k, v in cfg.to_dict().items()}  # what MLflow stores
    assert best_config.coerce_params(params) == cfg.to_dict()
    with pytest.raises(AnalysisError, match="'steps' must be an integer, got 1.5"):
        best_config.coerce_params({"steps": "1.5"})


def test_run_config_from_params_when_there_is_no_config_artifact(store):
    from mlflow.entities import Param

    c = mlflow.MlflowClient(tracking_uri=store["uri"])
    exp = connect.experiment_id(c, "params-only", (store["root"] / "a4").as_uri())
    cfg = FinetuneConfig(
        model="vit_demo", pretrained=False, weights=None, betas=(0.8, 0.99), lr=3e-3, low_data=True
    ).to_dict()
    rid = c.create_run(exp).info.run_id
    c.log_batch(rid, params=[Param(k, str(v)) for k, v in cfg.items()])
    assert load.read_artifact(rid, "config.yaml", store["uri"]) is None
    assert best_config.run_config(rid, store["uri"]) == cfg
    with_artifact = store["ids"][("digits", "MHA", 0.1, 0)]
    assert best_config.run_config(with_artifact, store["uri"]) == trial_config("digits", "MHA", 0.1, 0)


def test_export_per_dataset(store, tmp_path, capsys):
    out = tmp_path / "best"
    assert (
        export.main(["--experiment", EXPERIMENT, "--tracking-uri", store["uri"], "--per-dataset", "--out", str(out)])
        == 0
    )
    assert "warning" not in capsys.readouterr().err
    files = sorted(out.rglob("*.yaml"))
    assert len(files) == len(DATASETS) * len(CONDITIONS)
    for f in files:
        text = f.read_text()
        assert text.splitlines()[0] == f"# python -m raystudy finetune --config {f}"
        cfg = validate(load_config(f))
        # the winner: lr 0.1 (val) and seed 1 (the better seed), and otherwise the run's own config
        assert (cfg.lr, cfg.seed) == (0.1, 1), f
        assert cfg.to_dict() == trial_config(f.parent.name, f.stem, 0.1, 1)
    on_test = tmp_path / "best_test"
    assert (
        export.main(
            [
                "--experiment",
                EXPERIMENT,
                "--tracking-uri",
                store["uri"],
                "--per-dataset",
                "--select-on",
                "test",
                "--out",
                str(on_test),
            ]
        )
        == 0
    )
    assert load_config(on_test / "digits_c" / "FC1.yaml").lr == 0.3
    assert load_config(on_test / "digits" / "FC1.yaml").lr == 0.1


def test_export_over_all_datasets_and_rerun(store, tmp_path, capsys):
    from raystudy.commands import finetune

    out = tmp_path / "best"
    assert export.main(["--experiment", EXPERIMENT, "--tracking-uri", store["uri"], "--out", str(out)]) == 0
    files = {p.stem: p for p in out.glob("*.yaml")}
    assert set(files) == set(CONDITIONS)
    text = files["FC1"].read_text()
    assert "datasets: digits, digits_c" in text and "rerun on another with --dataset NAME" in text
    cfg = validate(load_config(files["FC1"]))
    assert (cfg.dataset, cfg.lr, cfg.seed, cfg.pretrained) == ("digits", 0.1, 1, False)
    capsys.readouterr()
    assert (
        finetune.main(
            [
                "--config",
                str(files["MHA"]),
                "--quiet",
                "--set",
                "steps=6",
                "--set",
                "warmup_steps=1",
                "--set",
                "eval_every=3",
                "--no-mlflow",
                "--no-save",
            ]
        )
        == 0
    )
    assert "test acc" in capsys.readouterr().out


def test_export_bad_condition(store, tmp_path, capsys):
    assert (
        export.main(
            ["--experiment", EXPERIMENT, "--tracking-uri", store["uri"], "--conditions", "LN2", "--out", str(tmp_path)]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert err == "error: no condition 'LN2' in experiment 'toy-study'; there are: FC1, LN1, MHA"
