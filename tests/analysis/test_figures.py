"""Figures: files written as PNG and PDF, one colour per condition, sorted by rank, log axes."""

import math

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgba

from analysis import AnalysisError, figures
from analysis.reporting import analyse
from analysis.stats import significance
from analysis.synthetic import fake_runs

CONDITIONS = ["LN1", "MHA", "LN2", "FC1", "FC2", "full", "linear_probe"]


def test_palette_gives_each_condition_one_colour_whatever_else_is_shown():
    everyone = figures.palette(CONDITIONS + ["lora"])
    assert len(set(everyone.values())) == len(everyone)
    # the same condition keeps its colour in a figure of five components and in one of two
    assert figures.palette(["FC2", "LN1"]) == {"FC2": everyone["FC2"], "LN1": everyone["LN1"]}
    assert figures.palette(list(reversed(CONDITIONS))) == {c: everyone[c] for c in CONDITIONS}
    # other names (settings) take colours no condition has, in the order given
    other = figures.palette(["sgd", "adamw", "MHA"])
    assert other["MHA"] == everyone["MHA"] and len({other["sgd"], other["adamw"]} | set(everyone.values())) == 10


def _best(means: dict[str, dict[str, float]], std: float = 0.01) -> pd.DataFrame:
    return pd.DataFrame(
        [dict(dataset=d, condition=c, test_mean=m, test_std=std) for d, row in means.items() for c, m in row.items()]
    )


def test_rank_order_is_by_average_rank_then_mean_then_given_order():
    best = _best(
        {"a": {"MHA": 0.95, "LN1": 0.8, "FC1": 0.7, "FC2": 0.7}, "b": {"MHA": 0.5, "LN1": 0.6, "FC1": 0.4, "FC2": 0.4}}
    )
    # average ranks: MHA 1.5, LN1 1.5 (MHA's mean higher), FC1 = FC2 = 3.5 (FC1 given first)
    assert figures.rank_order(best, ["FC1", "FC2", "LN1", "MHA"]) == ["MHA", "LN1", "FC1", "FC2"]


def test_accuracy_figure_sorts_by_rank_uses_the_palette_and_has_error_bars_on_the_average():
    best = _best({"x": {"LN1": 0.60, "MHA": 0.80, "FC1": 0.75}, "y": {"LN1": 0.50, "MHA": 0.70, "FC1": 0.72}}, std=0.03)
    fig = figures.accuracy_figure(best, ["LN1", "MHA", "FC1"], scale=100)
    per_dataset, average = fig.axes
    order = ["MHA", "FC1", "LN1"]  # average ranks 1.5, 1.5 (MHA's mean higher), 3
    assert [t.get_text() for t in average.get_xticklabels()] == order
    assert [h.get_label() for h in per_dataset.containers] == order
    col = figures.palette(order)
    for i, (c, container) in enumerate(zip(order, average.containers)):
        line, _, (bars,) = container
        assert to_rgba(line.get_color()) == col[c]
        assert line.get_xdata()[0] == i
        # the average's error: sqrt(0.03² + 0.03²) / 2 datasets, in points
        ((lo, hi),) = [seg[:, 1] for seg in bars.get_segments()]
        assert hi - lo == pytest.approx(2 * 100 * math.sqrt(2 * 0.03**2) / 2)
    assert average.get_xticklabels()[0].get_text() == "MHA"


def test_average_spread_is_nan_with_one_seed():
    best = _best({"x": {"MHA": 0.8}, "y": {"MHA": 0.6}}, std=np.nan)
    spread = figures.average_spread(best, ["MHA"])
    assert spread.loc["MHA", "mean"] == pytest.approx(0.7) and np.isnan(spread.loc["MHA", "std"])


def test_cd_diagram_is_refused_with_one_dataset(tmp_path):
    ranks = pd.Series({"MHA": 1.0, "LN1": 2.0})
    with pytest.raises(AnalysisError, match="needs average ranks over 2 or more datasets; got 1"):
        figures.cd_diagram(ranks, 0.9, [], tmp_path / "cd", n_datasets=1)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "ranks,cd",
    [
        ({"MHA": 1.2, "LN1": 1.8, "FC1": 3.0}, 2.34),  # CD past k
        ({c: 1.0 + i for i, c in enumerate(CONDITIONS)}, 4.5),
    ],
)
def test_cd_bar_lies_inside_the_rank_axis(ranks, cd):
    fig = figures.cd_figure(pd.Series(ranks), cd, [], n_datasets=4)
    (ax,) = fig.axes
    axis = next(line for line in ax.lines if line.get_gid() == "rank_axis").get_xdata()
    bar = next(line for line in ax.lines if line.get_gid() == "cd_bar").get_xdata()
    assert min(axis) <= min(bar) and max(bar) <= max(axis)
    assert max(bar) - min(bar) == pytest.approx(cd)
    lo, hi = ax.get_xlim()
    assert lo < min(axis) and max(axis) < hi


def _labels(axis) -> list[str]:
    axis.figure.canvas.draw()
    ticks = axis.get_majorticklabels() + axis.get_minorticklabels()
    return [t.get_text() for t in ticks if t.get_text()]


@pytest.mark.parametrize("lo,hi,plain", [(0.2, 5.0, True), (1e3, 1e7, False), (1e-6, 1e-2, False)])
def test_log_axes_label_every_tick_in_one_style(lo, hi, plain):
    fig = figures._figure(4, 3)
    ax = fig.add_subplot()
    ax.plot([1, 2], [lo, hi])
    figures._log_y(ax)
    ax.set_ylim(lo, hi)
    labels = _labels(ax.yaxis)
    assert ax.get_yscale() == "log" and len(labels) >= 2
    assert all(("10^" in t) != plain for t in labels), labels
    if plain:
        assert {"0.5", "1", "2"} <= set(labels)


def _pooled(datasets=("d1", "d2"), layers=3) -> pd.DataFrame:
    rows = [
        dict(
            model="vit_base_patch16_224.orig_in21k",
            dataset=d,
            mode=m,
            layer=layer,
            component=c,
            mean=v * (1 + 0.1 * layer),
            std=0.1,
            n=10,
            ci_low=v * 0.9,
            ci_high=v * 1.2,
        )
        for d in datasets
        for m in ("shared", "in_situ")
        for layer in range(layers)
        for c, v in (("MHA", 2.0), ("LN1", 0.5))
    ]
    return pd.DataFrame(rows)


def test_plasticity_figure_has_log_component_bars_with_intervals_beside_per_layer_curves():
    pooled = _pooled()
    fig = figures.plasticity_figure(pooled, ["LN1", "MHA"])
    axes = np.array(fig.axes).reshape(2, 3)  # shared, in situ × (bars, d1, d2)
    assert all(ax.get_yscale() == "log" for ax in axes.ravel())
    bars = axes[0, 0]
    col = figures.palette(["LN1", "MHA"])
    assert [to_rgba(p.get_facecolor())[:3] for p in bars.patches] == [col[c][:3] for c in ("LN1", "MHA")]
    # bar = mean over layers and datasets; its interval averages the per-layer bounds
    assert [p.get_height() for p in bars.patches] == pytest.approx([0.5 * 1.1, 2.0 * 1.1])
    (segments,) = [c.get_segments() for c in bars.collections if len(c.get_segments()) == 2]
    assert [tuple(s[:, 1]) for s in segments] == [pytest.approx((0.45, 0.6)), pytest.approx((1.8, 2.4))]
    assert [ax.get_title() for ax in axes[:, 1]] == ["d1 (shared input)", "d1 (in situ input)"]
    curve = next(line for line in axes[0, 2].lines if line.get_label() == "MHA")
    assert list(curve.get_xdata()) == [0, 1, 2] and to_rgba(curve.get_color()) == col["MHA"]


def test_plasticity_figure_keeps_dots_in_model_names(tmp_path):
    files = figures.plasticity_layers(_pooled(), ["MHA", "LN1"], tmp_path / "vit_base.orig_d")
    assert [f.name for f in files] == ["vit_base.orig_d.png", "vit_base.orig_d.pdf"]
    assert all(f.stat().st_size > 1000 for f in files)
    assert figures.plasticity_layers(_pooled().iloc[:0], ["MHA"], tmp_path / "none") == []


def test_a_multi_dataset_report_computes_friedman_and_draws_the_cd_diagram(tmp_path):
    runs = fake_runs(n_datasets=4, lrs=(0.01, 0.03), seeds=(0, 1), diverge=0.0)
    report = analyse(tmp_path, runs=runs)
    omnibus = pd.read_csv(tmp_path / "omnibus.csv").set_index("test")
    assert omnibus.loc["friedman", "p"] < 0.05  # the synthetic conditions differ
    k, n = len(CONDITIONS), 4
    assert omnibus.loc["nemenyi_cd", "statistic"] == pytest.approx(significance.nemenyi_cd(k, n))
    assert "Friedman test over 7 conditions and 4 datasets: chi2 =" in report.text
    assert (tmp_path / "figures" / "cd_diagram.png").stat().st_size > 1000


def test_intervals_figure_puts_the_best_mean_on_top_in_palette_colours():
    agg = pd.DataFrame(
        [
            dict(condition=c, statistic=s, estimate=m, low=m - 0.02, high=m + 0.02)
            for c, m in (("LN1", 0.6), ("MHA", 0.8), ("FC1", 0.7))
            for s in ("mean", "iqm")
        ]
    )
    fig = figures.intervals_figure(agg, ["LN1", "MHA", "FC1"])
    first = fig.axes[0]
    top_down = sorted(first.get_yticklabels(), key=lambda t: -t.get_position()[1])
    assert [t.get_text() for t in top_down] == ["MHA", "FC1", "LN1"]
    col = figures.palette(["LN1", "MHA", "FC1"])
    assert [tuple(c.get_colors()[0][:3]) for c in first.collections] == [col[c][:3] for c in ("MHA", "FC1", "LN1")]


def test_outputs_draws_and_keeps_the_files_only_when_drawing_is_on():
    drawn = []

    def fig_fn(base, suffix=".png"):
        drawn.append(base)
        return [base + suffix]

    on, off = figures.Outputs(), figures.Outputs(draw=False)
    on.add(fig_fn, "a", suffix=".pdf")
    off.add(fig_fn, "b")
    on += ["table.csv"]
    assert on == ["a.pdf", "table.csv"] and off == [] and drawn == ["a"]


def test_rank_order_ties_means_equal_in_decimal():
    # LN1's means equal MHA's in decimal (0.1 + 0.2 is 0.30000000000000004): a tie, in the order given
    best = _best({"a": {"LN1": 0.1 + 0.2, "MHA": 0.3, "FC1": 0.2}, "b": {"LN1": 0.8, "MHA": 0.8, "FC1": 0.4}})
    assert figures.rank_order(best, ["MHA", "LN1", "FC1"]) == ["MHA", "LN1", "FC1"]
