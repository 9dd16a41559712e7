"""measure.summary: a component's plasticity over the model, the mean over its layers, worked by hand."""

import math

import pandas as pd

from analysis.stats import pooling
from raystudy.measure import summary
from raystudy.tracking import record

ROWS = [  # two layers of MHA and LN1 in shared mode, one of MHA in situ; LN1's layer 0 unmeasured
    {"dataset": "d", "mode": "shared", "layer": 0, "component": "MHA", "mean": 2.0},
    {"dataset": "d", "mode": "shared", "layer": 1, "component": "MHA", "mean": 4.0},
    {"dataset": "d", "mode": "in_situ", "layer": 0, "component": "MHA", "mean": 5.0},
    {"dataset": "d", "mode": "shared", "layer": 0, "component": "LN1", "mean": float("nan")},
    {"dataset": "d", "mode": "shared", "layer": 1, "component": "LN1", "mean": 1.5},
    {"dataset": "d", "mode": "shared", "layer": 0, "component": "FC1", "mean": float("nan")},
]


def test_the_mean_over_layers_by_hand():
    means = summary.layer_means(ROWS)
    # (2 + 4) / 2 = 3; 5 alone; LN1's NaN left out: 1.5; FC1 has no number: NaN, its group kept
    assert list(means.index) == [("shared", "MHA"), ("in_situ", "MHA"), ("shared", "LN1"), ("shared", "FC1")]
    assert means.name == "plasticity" and list(means.index.names) == ["mode", "component"]
    assert list(means.iloc[:3]) == [3.0, 5.0, 1.5] and math.isnan(means.iloc[3])
    # over modes too: (2 + 4 + 5) / 3; a DataFrame or rows alike, a value read back as text a number
    by_component = summary.layer_means(pd.DataFrame(ROWS).astype({"mean": str}), ["component"])
    assert by_component["MHA"] == 11 / 3 and by_component["LN1"] == 1.5
    assert summary.layer_means([]).empty and summary.layer_means([], ["component"]).empty


def test_every_reader_of_the_table_takes_that_mean():
    assert record.plasticity_metrics(ROWS, "p") == {"p/shared/MHA": 3.0, "p/in_situ/MHA": 5.0, "p/shared/LN1": 1.5}
    table = pooling.component_plasticity(pd.DataFrame(ROWS), "shared")
    assert list(table.columns) == ["FC1", "LN1", "MHA"] and list(table.index) == ["d"]  # sorted
    assert table.loc["d", "MHA"] == 3.0 and table.loc["d", "LN1"] == 1.5 and math.isnan(table.loc["d", "FC1"])
