"""paper.yaml against the reference code's settings (github.com/ambroiseodt/vit-plasticity, commit
268c240), written here from that code, each with the file and line it comes from, so that an edit
of the space that drifts from the paper fails here rather than silently in a user's numbers."""

import pytest

from raystudy.spaces import grids, schema

REPO = "github.com/ambroiseodt/vit-plasticity@268c240"

# (config key, the reference's value, where the reference sets it): the same for every dataset
COMMON = [
    ("optimizer", "sgd", "apps/vit/configs/cifar10.yaml:23"),
    ("momentum", 0.9, "apps/vit/configs/cifar10.yaml:25"),
    ("weight_decay", 0.0, "src/vitef/optim.py:48"),
    ("batch_size", 512, "apps/vit/configs/cifar10.yaml:13"),
    ("clip_grad", 1.0, "apps/vit/configs/cifar10.yaml:20"),
    ("warmup_steps", 2000, "src/vitef/optim.py:113"),
    ("normalization", "imagenet", "src/vitef/data/images/utils.py:337"),
    ("probe_pairing", "sequential", "apps/vit/analysis.py:197-206 (unshuffled loaders, cycled)"),
    ("probe_batch_size", 64, "apps/vit/scripts/analysis.sh:11"),
    ("linear_probe_data", "augmented", "apps/vit/linear_probing.py:279 (build_train_val_loader: train transform)"),
]
SEEDS = ([0, 42, 3407], "apps/vit/scripts/finetuning.sh:27-30")
LRS = ([1e-3, 3e-3, 1e-2, 3e-2], "apps/vit/scripts/finetuning.sh:32-36")
LRS_DOMAINNET = ([3e-3, 1e-2, 3e-2, 6e-2], "apps/vit/scripts/finetuning.sh:311-315")
# dataset -> (steps, evaluation period, where)
PER_DATASET = {
    "cifar10": (10_000, 500, "apps/vit/configs/cifar10.yaml:17,31"),
    "cifar100": (10_000, 500, "apps/vit/configs/cifar100.yaml:17,31"),
    **{
        f"cifar10c_{c}": (10_000, 350, "apps/vit/configs/cifar10_c.yaml:17,31")
        for c in ("contrast", "gaussian_noise", "motion_blur", "snow", "speckle_noise")
    },
    "domainnet_clipart": (20_000, 500, "apps/vit/configs/domainnet.yaml:17,31"),
    "domainnet_sketch": (20_000, 500, "apps/vit/configs/domainnet.yaml:17,31"),
    "flowers102": (5_000, 250, "apps/vit/configs/flowers102.yaml:17,31"),
    "pets": (4_000, 200, "apps/vit/configs/pet.yaml:17,31"),
}
# the AdamW ablation: lr = the SGD grid / 100 (apps/vit/scripts/ablation/adam.sh:49), betas and
# weight decay from src/vitef/optim.py:48-49
ADAMW = {"lr_scale": 0.01, "betas": (0.9, 0.999), "weight_decay": 0.0}
# ViT-L and ViT-H probe in batches of 32 (apps/vit/scripts/analysis.sh:52,95)
PROBE_BATCH_LARGE = 32


@pytest.fixture(scope="module")
def main_grid():
    return grids.expand(grids.load_grid("paper"), "vit_base")


@pytest.mark.parametrize("key,value,where", COMMON, ids=[c[0] for c in COMMON])
def test_every_trial_has_the_references_setting(main_grid, key, value, where):
    assert {t.config[key] for t in main_grid} == {value}, f"{key} differs from {REPO} {where}"


def test_seeds_lrs_steps_and_evaluation_cadence_are_the_references(main_grid):
    assert sorted({t.config["seed"] for t in main_grid}) == SEEDS[0], SEEDS[1]
    for name, (steps, every, where) in PER_DATASET.items():
        trials = [t for t in main_grid if t.config["dataset"] == name]
        assert trials, f"{name} missing from the paper's grid"
        assert {t.config["steps"] for t in trials} == {steps}, f"{name} steps: {REPO} {where}"
        assert {t.config["eval_every"] for t in trials} == {every}, f"{name} eval_every: {REPO} {where}"
        lrs, lr_where = LRS_DOMAINNET if name.startswith("domainnet") else LRS
        tuned = [t for t in trials if t.config["condition"] != "linear_probe"]
        assert sorted({t.config["lr"] for t in tuned}) == lrs, f"{name} lrs: {REPO} {lr_where}"
    assert set(PER_DATASET) == {t.config["dataset"] for t in main_grid}


def test_the_adamw_ablation_and_the_larger_models_are_the_references():
    space = grids.load_grid("paper")
    adamw = grids.expand(space, "vit_base", datasets=["cifar100"], optimizers=["adamw"])
    sgd = grids.expand(space, "vit_base", datasets=["cifar100"], optimizers=["sgd"])
    assert sorted({t.config["lr"] for t in adamw if t.config["condition"] != "linear_probe"}) == pytest.approx(
        [lr * ADAMW["lr_scale"] for lr in LRS[0]]
    )
    assert {tuple(t.config["betas"]) for t in adamw} == {ADAMW["betas"]}
    assert {t.config["weight_decay"] for t in adamw} == {ADAMW["weight_decay"]}
    assert len(adamw) == len(sgd)
    for model in ("vit_large", "vit_huge"):
        trials = grids.expand(space, model, datasets=["domainnet_clipart"])
        assert {t.config["probe_batch_size"] for t in trials} == {PROBE_BATCH_LARGE}
        # the effective batch stays the reference's 512 (apps/vit/scripts/ablation/model_size.sh:27-29,66-68)
        assert {t.config["batch_size"] for t in trials} == {512}


# ---------------------------------------------------------------- the paper's three experiments, as scoped
# The AdamW ablation ran on CIFAR-100, CIFAR-10-C motion_blur, DomainNet clipart and sketch
# (apps/vit/scripts/ablation/adam.sh:25,60-61,97-98,133-134); the model-size ablation on DomainNet
# clipart (apps/vit/scripts/ablation/model_size.sh:21-22).
ADAMW_DATASETS = ["cifar100", "cifar10c_motion_blur", "domainnet_clipart", "domainnet_sketch"]
MODEL_SIZE_DATASETS = ["domainnet_clipart"]


def _dry(capsys, tmp_path, *argv):
    from raystudy.commands import grid

    code = grid.main([*argv, "--dry-run", "--tracking-uri", f"sqlite:///{tmp_path}/none.db"])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_larger_model_plans_the_papers_model_size_experiment_by_default(capsys, tmp_path):
    for model in ("vit_large", "vit_huge"):
        code, out, _ = _dry(capsys, tmp_path, "--model", model)
        assert code == 0
        assert f"grid paper for {model}: 75 trials" in out and "  datasets: domainnet_clipart\n" in out
        assert "every dataset: add --datasets all (825 trials" in out
        code, out, _ = _dry(capsys, tmp_path, "--model", model, "--datasets", "all")
        assert code == 0 and f"grid paper for {model}: 825 trials" in out and "--datasets all" not in out


def test_the_adamw_ablation_runs_on_its_four_datasets_only(capsys, tmp_path):
    space = grids.load_grid("paper")
    scope = {"adamw": grids.experiment_datasets(space, "vit_base", "adamw")}
    assert scope["adamw"] == ADAMW_DATASETS
    trials = grids.expand(space, "vit_base", optimizers=["sgd", "adamw"], scope=scope)
    adamw = [t for t in trials if t.config["optimizer"] == "adamw"]
    assert sorted({t.config["dataset"] for t in adamw}) == sorted(ADAMW_DATASETS)
    assert len(adamw) == 4 * 25 * 3 and len(trials) == 825 + 300
    code, out, _ = _dry(capsys, tmp_path, "--model", "vit_base", "--optimizers", "sgd,adamw")
    assert code == 0 and "grid paper for vit_base: 1,125 trials" in out
    assert "adamw on 4 of them (cifar100, cifar10c_motion_blur, domainnet_clipart, domainnet_sketch)" in out


def test_the_whole_papers_dry_run_prices_each_experiment_and_the_total(capsys, tmp_path):
    code, out, _ = _dry(capsys, tmp_path, "--space", "paper", "--experiments", "all")
    assert code == 0
    rows = [line.split() for line in out.splitlines()[1:5]]
    assert [(r[0], r[1], r[2], r[3], r[5]) for r in rows] == [
        ("main", "vit_base", "sgd", "11", "825"),
        ("adamw", "vit_base", "adamw", "4", "300"),
        ("model_size", "vit_large", "sgd", "1", "75"),
        ("model_size", "vit_huge", "sgd", "1", "75"),
    ]
    hours = [float(r[7].replace(",", "")) for r in rows]
    total = out.splitlines()[5]
    assert total.startswith("  total: 1,275 trials, ") and f"{sum(hours):,.0f} GPU-hours" in total
    code, _, err = _dry(capsys, tmp_path, "--space", "paper", "--experiments", "all", "--model", "vit_base")
    assert code == 2 and "--model" in err


def test_an_experiment_naming_what_the_space_lacks_is_refused(tmp_path):
    import yaml

    raw = yaml.safe_load((schema.SPACES_DIR / "paper.yaml").read_text())
    raw["experiments"]["adamw"]["datasets"] = ["cifar100", "imagenet21k"]
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(raw))
    with pytest.raises(Exception, match="experiments.adamw.datasets: imagenet21k not in the file's 'datasets'"):
        grids.load_grid(str(f))


def test_the_small_batches_the_paper_used_are_in_the_space():
    # speckle noise: batch_size=128, val_batch_size=128, grad_acc_steps=4
    # (apps/vit/scripts/finetuning.sh:267-269); ViT-L val batches 128, ViT-H 64
    # (apps/vit/scripts/ablation/model_size.sh:28,67)
    space = grids.load_grid("paper")
    speckle = grids.expand(space, "vit_base", datasets=["cifar10c_speckle_noise"])
    assert {(t.config["batch_size"] // t.config["grad_accum"], t.config["grad_accum"]) for t in speckle} == {(128, 4)}
    assert {t.config["eval_batch_size"] for t in speckle} == {128}
    for model, val in (("vit_large", 128), ("vit_huge", 64)):
        trials = grids.expand(space, model, datasets=["domainnet_clipart"])
        assert {t.config["eval_batch_size"] for t in trials} == {val}, f"{model}: {REPO}"


def test_clipart_is_the_cleaned_release_by_its_image_count():
    # the reference downloads clipart from groundtruth/ (src/vitef/data/images/domainnet.py:98-100)
    from raystudy.data.registry import DATASETS
    from raystudy.data.sources.domainnet import DOMAINNET_CLEANED_CLIPART

    trials = grids.expand(grids.load_grid("paper"), "vit_base", datasets=["domainnet_clipart", "domainnet_sketch"])
    by = {
        d: {t.config["expect_images"] for t in trials if t.config["dataset"] == d}
        for d in ("domainnet_clipart", "domainnet_sketch")
    }
    assert by == {"domainnet_clipart": {DOMAINNET_CLEANED_CLIPART}, "domainnet_sketch": {0}}
    assert "groundtruth/clipart.zip" in DATASETS["domainnet_clipart"].where
