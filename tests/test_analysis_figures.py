"""Figures: files written as PNG and PDF, stable colours, names with dots kept."""

import pandas as pd

from analysis import figures


def test_colors_are_stable_per_name_and_order():
    a = figures.colors(["LN1", "MHA", "FC1"])
    assert a == figures.colors(["LN1", "MHA", "FC1"]) and len(set(a.values())) == 3


def test_accuracy_and_cd_diagram_write_png_and_pdf(tmp_path):
    best = pd.DataFrame([dict(dataset=d, condition=c, test_mean=m, test_std=0.01)
                         for d in ("x", "y") for c, m in (("MHA", 0.8), ("LN1", 0.6))])
    files = figures.accuracy(best, ["MHA", "LN1"], tmp_path / "acc", scale=100)
    assert [f.name for f in files] == ["acc.png", "acc.pdf"] and all(f.stat().st_size > 1000 for f in files)
    files = figures.cd_diagram(pd.Series({"MHA": 1.0, "LN1": 2.0}), 0.9, [], tmp_path / "cd")
    assert [f.suffix for f in files] == [".png", ".pdf"]


def test_plasticity_figure_keeps_dots_in_model_names(tmp_path):
    rows = [dict(model="vit_base_patch16_224.orig_in21k", dataset="d", mode=m, layer=layer, component=c,
                 mean=v, std=0.1, n=10, ci_low=v * 0.9, ci_high=v * 1.1)
            for m in ("shared", "in_situ") for layer in range(3) for c, v in (("MHA", 2.0), ("LN1", 0.5))]
    files = figures.plasticity_layers(pd.DataFrame(rows), ["MHA", "LN1"], tmp_path / "vit_base.orig_d")
    assert [f.name for f in files] == ["vit_base.orig_d.png", "vit_base.orig_d.pdf"]
    assert figures.plasticity_layers(pd.DataFrame(rows).iloc[:0], ["MHA"], tmp_path / "none") == []
