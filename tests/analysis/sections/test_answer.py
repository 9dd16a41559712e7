"""The answer that opens the report (``analysis.sections.answer``), on hand-built studies whose
paragraph can be checked claim by claim: a clear winner, two conditions within the ROPE, one
dataset against several, with and without plasticity probes, and a per-dataset summary."""

import math

import pandas as pd
import pytest
import yaml

from analysis import output, reporting, study, synthetic
from analysis.load import RUN_COLUMNS
from analysis.sections import answer as answer_section
from raystudy.train.config import load_config

PARAMS = {"MHA": 7_000_000, "FC1": 4_700_000, "LN1": 3_000, "full": 85_000_000}


def runs_of(effects: dict[str, float], datasets=("ds00", "ds01", "ds02"), seeds=(0, 1, 2), noise=0.0005):
    """A runs table: one lr, each condition's test accuracy 0.80 + its effect, a fixed small
    seed wobble, the datasets a little apart; trainable_params as PARAMS gives them."""
    rows = []
    for di, d in enumerate(datasets):
        for c, effect in effects.items():
            for s in seeds:
                acc = 0.80 + 0.02 * di + effect + noise * ((s % 3) - 1)
                rows.append(
                    dict(
                        run_id=f"r{len(rows)}",
                        model="vit_demo",
                        optimizer="sgd",
                        low_data=False,
                        dataset=d,
                        condition=c,
                        lr=0.01,
                        seed=s,
                        val_acc=acc + 0.01,
                        test_acc=acc,
                        status="finished",
                        trainable_params=PARAMS[c],
                    )
                )
    return pd.DataFrame(rows, columns=RUN_COLUMNS + ["trainable_params"])


def plasticity_of(datasets, values: dict[str, float]) -> pd.DataFrame:
    """Plasticity probes of the single components, one layer, one mode, on every dataset."""
    return pd.DataFrame(
        [
            dict(model="vit_demo", dataset=d, mode="shared", layer=0, component=c, mean=m, std=0.1, n=100)
            | dict(ci_low=m - 0.02, ci_high=m + 0.02, bound=math.nan)
            for d in datasets
            for c, m in values.items()
        ]
    )


def answer(**kw):
    s = study.build(**kw)
    return s, answer_section.build(s)


def test_a_clear_winner_is_named_with_its_evidence_and_config(tmp_path):
    s, sec = answer(runs=runs_of({"MHA": 0.0, "FC1": -0.03, "LN1": -0.06}))
    text = sec.markdown
    assert text.startswith("## The answer: which parts to finetune")
    assert "For vit_demo on 3 datasets (ds00, ds01 and ds02), finetune **MHA**: it has the best mean test" in text
    assert "training 7,000,000 parameters" in text
    assert "Ranked by mean test accuracy: MHA 82.00%, FC1 79.00%, LN1 76.00%." in text
    assert "Worse than MHA by more than 0.5 points: FC1 -3.00 [" in text and "]; LN1 -6.00 [" in text
    r = answer_section.ranking(s)
    assert r.loc["FC1", "high"] < -0.025 and r.loc["LN1", "high"] < -0.055  # seeds wobble by 0.05 points
    assert "Undecided" not in text and "Practically equivalent" not in text
    assert "intervals over datasets and seeds" in text
    assert "Plasticity was not probed in these runs." in text
    assert "`best_config/MHA.yaml`" in text
    files = output.write(tmp_path, [sec], draw=False)
    cfg = load_config(tmp_path / "best_config" / "MHA.yaml")  # reruns as it is
    assert (cfg.condition, cfg.lr, cfg.model) == ("MHA", 0.01, "vit_demo")
    assert (tmp_path / "best_config" / "MHA.yaml").read_text().startswith("# python -m raystudy finetune --config")
    table = pd.read_csv(tmp_path / "answer.csv").set_index("condition")
    assert list(table.index) == ["MHA", "FC1", "LN1"]
    assert list(table["verdict"]) == ["best", "MHA better", "MHA better"]
    assert tmp_path / "answer.md" in files


def test_two_conditions_within_the_rope_the_cheaper_is_the_answer():
    _, sec = answer(runs=runs_of({"MHA": 0.0, "FC1": -0.001, "LN1": -0.05}))
    text = sec.markdown
    assert "finetune **FC1**: it is practically equivalent to the most accurate condition, MHA" in text
    assert "trains fewer parameters (4,700,000 vs 7,000,000)" in text
    assert "Practically equivalent to MHA (interval within ±0.5 points): FC1 -0.10 [" in text
    assert "`best_config/FC1.yaml`" in text


def test_undecided_where_the_interval_crosses_the_margin():
    # FC1's seeds scatter widely around a small deficit: the interval straddles -0.5 points
    runs = runs_of({"MHA": 0.0, "FC1": -0.004})
    wobble = runs["condition"].eq("FC1") * runs["seed"].map({0: -0.02, 1: 0.0, 2: 0.02})
    runs["test_acc"] += wobble
    s, sec = answer(runs=runs)
    assert "finetune **MHA**" in sec.markdown
    assert "Undecided, the interval crossing the margin" in sec.markdown
    assert answer_section.ranking(s).loc["FC1", "verdict"] == "undecided"


def test_one_dataset_reads_its_seeds_and_names_the_dataset():
    _, sec = answer(runs=runs_of({"MHA": 0.0, "FC1": -0.03}, datasets=("products",)))
    assert "For vit_demo on dataset products, finetune **MHA**" in sec.markdown
    assert "intervals over seeds" in sec.markdown


def test_one_run_per_condition_on_one_dataset_decides_nothing():
    _, sec = answer(runs=runs_of({"MHA": 0.0, "FC1": -0.03}, datasets=("products",), seeds=(0,)))
    assert "no interval can be estimated, so nothing is decided" in sec.markdown
    assert "Without an interval (one run per condition on one dataset): FC1 -3.00." in sec.markdown


def test_many_datasets_are_summarised():
    datasets = tuple(f"ds{i:02d}" for i in range(9))
    _, sec = answer(runs=runs_of({"MHA": 0.0, "FC1": -0.03}, datasets=datasets, seeds=(0, 1)))
    assert "on 9 datasets (ds00, ds01, ds02, ds03 and 5 more)" in sec.markdown


def test_plasticity_where_probed():
    runs = runs_of({"MHA": 0.0, "FC1": -0.03, "LN1": -0.06})
    _, sec = answer(runs=runs, plasticity=plasticity_of(["ds00", "ds01", "ds02"], {"MHA": 9.0, "FC1": 6.0, "LN1": 1.0}))
    assert "Plasticity, highest first (shared: MHA 9.000 > FC1 6.000 > LN1 1.000)." in sec.markdown
    assert "plasticity (shared)" in sec.tables[0].shown


def test_a_per_dataset_summary_gets_the_ranking_without_a_config():
    summary = runs_of({"MHA": 0.0, "FC1": -0.03}, seeds=(0,)).rename(columns={"test_acc": "test_mean"})
    _, sec = answer(summary=summary[["dataset", "condition", "test_mean"]].assign(test_std=math.nan, n=1))
    assert "finetune **MHA**" in sec.markdown
    assert "A per-dataset summary holds no runs, so no configuration is exported." in sec.markdown
    assert len(sec.tables) == 1


@pytest.mark.parametrize("n_datasets", [1, 3])
def test_the_report_opens_with_the_answer(tmp_path, n_datasets):
    runs = synthetic.fake_runs(n_datasets=n_datasets, conditions=("MHA", "FC1", "LN1"), lrs=(0.01, 0.03))
    rep = reporting.analyse(tmp_path, runs=runs, draw_figures=False)
    headings = [line for line in rep.text.splitlines() if line.startswith("## ")]
    assert headings[0] == "## The answer: which parts to finetune"
    if n_datasets > 1:
        assert headings[1] == "## How stable is this answer"
    assert (tmp_path / "best_config").is_dir()
    name = next((tmp_path / "best_config").iterdir())
    assert f"`best_config/{name.name}`" in rep.text
    assert yaml.safe_load(name.read_text())["condition"] == name.stem
