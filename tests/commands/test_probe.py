import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats

from raystudy.commands import probe
from raystudy.data.splits import build_splits
from raystudy.measure import plasticity
from raystudy.measure import probe as measured
from tests.helpers import class_folders


def test_demo_probe_both_modes_prints_ranking_and_writes_files(demo_weights, tmp_path, capsys):
    out = tmp_path / "demo"
    rc = probe.main(["--pairs", "96", "--batch-size", "40", "--out", str(out)])
    stdout = capsys.readouterr().out
    assert rc == 0, stdout
    for mode in ("shared", "in_situ"):
        line = next(ln for ln in stdout.splitlines() if ln.startswith(f"ranking ({mode}): "))
        ranked = [part.split()[0] for part in line.split(": ", 1)[1].split(" > ")]
        assert sorted(ranked) == sorted(plasticity.PROBE_COMPONENTS)
    assert "about large pretrained ViTs" in stdout  # the demo says what its ranking is not
    assert "warning" not in stdout
    files = {p.name for p in out.iterdir()}
    assert files == {"plasticity.csv", "plasticity.parquet", "plasticity.png", "plasticity.pdf"}

    df = pd.read_parquet(out / "plasticity.parquet")
    cols = list(plasticity.COLUMNS)  # with the interval of each mean after n, as the report shows it
    assert list(df.columns) == cols[: cols.index("n") + 1] + ["ci_low", "ci_high"] + cols[cols.index("n") + 1 :]
    assert len(df) == 2 * 4 * 5 and (df["n"] == 96).all()  # modes x blocks x components
    assert set(df["model"]) == {"vit_demo"} and set(df["dataset"]) == {"digits_c"}
    assert (df["mean"] <= df["bound"]).all()
    assert (df["ci_low"] < df["mean"]).all() and (df["mean"] < df["ci_high"]).all()
    half = stats.t.ppf(0.975, df["n"] - 1) * df["std"] / np.sqrt(df["n"])  # from n, mean and std alone
    assert np.allclose(df["ci_low"], df["mean"] - half, rtol=1e-12, atol=0)
    assert np.allclose(df["ci_high"], df["mean"] + half, rtol=1e-12, atol=0)
    assert pd.read_csv(out / "plasticity.csv").shape == df.shape
    # the ranking printed is the aggregate's
    agg = measured.aggregate(df)
    first = agg[(agg["mode"] == "shared") & (agg["rank"] == 1)]["component"].item()
    assert f"ranking (shared): {first} " in stdout


def test_probe_model_library_entry_on_a_built_model(demo_weights):
    from raystudy.models import registry

    model = registry.create_model("vit_demo", 10, weights=demo_weights)
    kw = dict(seed=0, img_size=16, mean=(0.5,), std=(0.5,))
    src, tgt = build_splits("digits", **kw), build_splits("digits_c", **kw)
    df = plasticity.probe_model(
        model,
        src.test,
        tgt.test,
        n_pairs=20,
        batch_size=8,
        modes="in_situ",
        seed=1,
        model_name="vit_demo",
        dataset_name="digits_c",
        components=("MHA", "FC2"),
        tags={"stage": "before_finetune"},
    )
    assert list(df.columns) == list(plasticity.COLUMNS) + ["stage"]
    assert set(df["mode"]) == {"in_situ"} and set(df["component"]) == {"MHA", "FC2"}
    assert (df["n"] == 20).all() and (df["stage"] == "before_finetune").all()
    again = plasticity.probe_model(
        model, src.test, tgt.test, n_pairs=20, batch_size=5, modes="in_situ", seed=1, components=("MHA", "FC2")
    )
    assert np.allclose(again["mean"], df["mean"], rtol=1e-5)  # same seed, same pairs


def _fake_imagenet(root):
    from PIL import Image

    d = root / "imagenet" / "val" / "n0001"
    d.mkdir(parents=True)
    for i in range(3):
        Image.fromarray(np.full((20, 20, 3), 40 * i, dtype=np.uint8)).save(d / f"{i}.png")
    return root


@pytest.mark.parametrize(
    "args,names",
    [
        (["--mode", "exact"], ["'exact'", "shared, in_situ, both"]),
        (["--components", "LN1,LN3"], ["'LN3'", "LN1, MHA, LN2, FC1, FC2"]),
        (["--pairs", "0"], ["--pairs", "0"]),
        (["--pairs", "many"], ["--pairs", "'many'"]),
        (["--model", "resnet50"], ["'resnet50'", "VisionTransformer"]),
        (["--model", "vit_nope"], ["'vit_nope'", "vit_base"]),
        (["--dataset", "mnist"], ["'mnist'", "digits_c"]),
        (["--source", "imagenet"], ["'imagenet'", "imagenet_val"]),
        (["--weights", "/nonexistent/w.pt"], ["/nonexistent/w.pt"]),
        (["--model", "vit_small_patch16_224", "--source", "digits"], ["'digits'", "(3, 224, 224)"]),
    ],
)
def test_bad_input_exits_2_with_one_line(args, names, capsys):
    rc = probe.main(args + ["--pairs", "8"] if "--pairs" not in args else args)
    err = capsys.readouterr()
    assert rc == 2
    lines = err.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err.err
    for name in names:
        assert name in lines[0]
    assert err.out == ""  # refused before any work is announced


def test_missing_dataset_mismatched_sources_and_unfit_weights_exit_2(tmp_path, capsys, demo_weights):
    empty = tmp_path / "empty"
    empty.mkdir()
    rc = probe.main(["--source", "imagenet_val", "--data-root", str(empty), "--pairs", "4"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "imagenet_val" in err[0] and str(empty) in err[0]

    # RGB ImageNet images at the demo's size do not pair with its grey digits
    root = _fake_imagenet(tmp_path / "data")
    rc = probe.main(["--source", "imagenet_val", "--data-root", str(root), "--pairs", "4"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "(3, 16, 16)" in err[0] and "(1, 16, 16)" in err[0]

    bad = tmp_path / "bad.pt"
    torch.save({"something": torch.zeros(3)}, bad)
    rc = probe.main(["--weights", str(bad), "--pairs", "4"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and str(bad) in err[0] and "does not fit" in err[0]


def test_cli_in_a_subprocess_refuses_an_unknown_mode():
    res = subprocess.run(
        [sys.executable, "-m", "raystudy", "probe", "--mode", "exact"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == ["error: unknown mode 'exact'; valid: shared, in_situ, both"]


def test_table_aggregate_ranking_and_files(tmp_path):
    rows = []
    for mode, per_layer in {
        "shared": {"LN1": (1, 3), "MHA": (4, 6), "FC1": (2, 2)},
        "in_situ": {"LN1": (9, 9), "MHA": (1, 1), "FC1": (5, 3)},
    }.items():
        for c, means in per_layer.items():
            for layer, m in enumerate(means):
                rows.append(dict(mode=mode, layer=layer, component=c, mean=float(m), std=0.5, n=10, bound=10.0))
    df = plasticity.to_frame(rows, model="vit_base_patch16_224.orig_in21k", dataset="cifar100")
    assert list(df.columns) == list(plasticity.COLUMNS)
    agg = measured.aggregate(df)
    shared = agg[agg["mode"] == "shared"].set_index("component")
    assert shared.loc["MHA", "plasticity"] == 5.0 and shared.loc["LN1", "plasticity"] == 2.0
    assert list(agg["mode"].unique()) == ["shared", "in_situ"]

    def ranking(mode):
        return agg[agg["mode"] == mode].sort_values("rank", kind="stable")["component"].tolist()

    assert ranking("shared") == ["MHA", "LN1", "FC1"]  # LN1 2.0 ties FC1 2.0: table order
    assert ranking("in_situ") == ["LN1", "FC1", "MHA"]
    assert shared.loc["FC1", "rank"] == shared.loc["LN1", "rank"] == 2
    assert measured.aggregate(probe.with_interval(df)).equals(agg)  # the interval is no key of the table

    files = measured.save_table(df, tmp_path / "t")
    import pandas as pd

    back = pd.read_parquet(files[1])
    assert back.equals(df) and pd.read_csv(files[0]).shape == df.shape
    figs = probe.save_figure(df, tmp_path / "vit_base_patch16_224.orig_in21k_cifar100")
    assert [f.name for f in figs] == [
        "vit_base_patch16_224.orig_in21k_cifar100.png",
        "vit_base_patch16_224.orig_in21k_cifar100.pdf",
    ]
    assert all(f.stat().st_size > 1000 for f in figs)
    assert plasticity.to_frame(rows[:1], model="m", dataset="d", stage="after")["stage"].tolist() == ["after"]


def test_the_probe_normalises_images_as_the_grid_does():
    from raystudy.commands import probe
    from raystudy.models import registry

    plan = probe.check_args(probe.build_parser().parse_args(["--model", "vit_demo"]))
    assert (tuple(plan["ic"]["mean"]), tuple(plan["ic"]["std"])) == registry.normalization("vit_demo", "checkpoint")
    rgb = "vit_tiny_patch16_224"  # any RGB timm ViT: its checkpoint's mean/std, or ImageNet's on request
    for kind in ("checkpoint", "imagenet"):
        args = probe.build_parser().parse_args(["--model", rgb, "--normalization", kind])
        plan = probe.check_args(args)
        assert (tuple(plan["ic"]["mean"]), tuple(plan["ic"]["std"])) == registry.normalization(rgb, kind)
    assert registry.normalization(rgb, "imagenet") == (registry.IMAGENET_MEAN, registry.IMAGENET_STD)
    r = subprocess.run(
        [sys.executable, "-m", "raystudy", "probe", "--model", "vit_demo", "--normalization", "imagenet"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "normalization 'imagenet' is for RGB models" in r.stderr


def test_probe_on_your_own_images_checks_them_first_and_probes_their_test_split(demo_weights, tmp_path, capsys):
    from PIL import Image

    root = class_folders(tmp_path / "photos", n=10, size=20)
    Image.new("CMYK", (20, 20), (0, 50, 100, 0)).save(root / "dog" / "cmyk.jpg")
    (root / "eel" / "cut.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated")
    argv = ["--dataset", "mine", "--data", str(root), "--pairs", "8", "--batch-size", "4", "--out", str(tmp_path / "o")]
    assert probe.main(argv) == 2  # the full check comes first: the truncated file, named
    err = capsys.readouterr().err
    assert "cut.jpg' is not an image" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()

    (root / "eel" / "cut.jpg").unlink()
    assert probe.main(argv) == 0
    stdout = capsys.readouterr().out
    assert "vit_demo on mine (x: digits test, y: mine test)" in stdout
    df = pd.read_parquet(tmp_path / "o" / "plasticity.parquet")
    assert set(df["dataset"]) == {"mine"} and (df["n"] == 8).all()
    assert stdout.count("image(s) not RGB (CMYK 1); converted") == 1  # the mode converted, said once
