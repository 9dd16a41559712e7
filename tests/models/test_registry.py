import pytest
import timm
import torch

from raystudy.models import registry
from raystudy.train.config import ConfigError


def test_aliases_map_to_the_papers_in21k_checkpoints():
    assert registry.resolve_name("vit_base") == "vit_base_patch16_224.orig_in21k"
    assert registry.resolve_name("vit_huge") == "vit_huge_patch14_224.orig_in21k"
    assert registry.resolve_name("vit_small_patch16_224") == "vit_small_patch16_224"


def test_every_alias_is_a_timm_vit_with_the_inputs_timm_gives_it():
    # check_model and input_config take the aliases from ALIAS_INPUTS without importing timm:
    # this is where they are checked against it
    assert set(registry.ALIAS_INPUTS) == set(registry.ALIASES.values())
    for alias, full in registry.ALIASES.items():
        assert registry.check_timm_vit(alias) == full == registry.check_model(alias)
        cfg = timm.models.get_pretrained_cfg(full)
        assert registry.input_config(alias) == dict(
            img_size=cfg.input_size[-1], in_chans=cfg.input_size[0], mean=tuple(cfg.mean), std=tuple(cfg.std)
        ), full


def test_unknown_and_non_vit_models_are_refused():
    with pytest.raises(ConfigError, match="unknown model 'vit_bse'"):
        registry.check_model("vit_bse")
    with pytest.raises(ConfigError, match="not a timm VisionTransformer"):
        registry.check_model("resnet18")


def test_fresh_head_for_the_datasets_classes():
    m = registry.create_model("vit_demo", 37, pretrained=False)
    assert m.head.out_features == 37


def test_local_weights_file_loads_the_backbone_not_the_head(tmp_path):
    torch.manual_seed(0)
    src = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10)
    path = tmp_path / "w.pth"
    torch.save(src.state_dict(), path)
    m = registry.create_model("vit_tiny_patch16_224", 5, weights=path)
    assert m.head.out_features == 5
    assert torch.equal(m.blocks[3].attn.qkv.weight, src.blocks[3].attn.qkv.weight)
    assert torch.equal(m.pos_embed, src.pos_embed)


def test_demo_weights_file_round_trip(tmp_path):
    src = registry.create_model("vit_demo", 10, pretrained=False)
    path = tmp_path / "demo.pt"
    torch.save(src.state_dict(), path)
    m = registry.create_model("vit_demo", 3, weights=path)
    assert torch.equal(m.blocks[0].mlp.fc1.weight, src.blocks[0].mlp.fc1.weight)
    with pytest.raises(registry.WeightsUnavailable, match="does not fit"):
        bad = tmp_path / "bad.pt"
        torch.save({"blocks.0.nonsense": torch.zeros(1)}, bad)
        registry.create_model("vit_demo", 3, weights=bad)


def test_offline_without_cache_says_how_to_prefetch(monkeypatch, tmp_path):
    # An empty hub cache and an unreachable hub: one clear error, fast, no download stack trace.
    monkeypatch.setattr(registry, "hub_reachable", lambda *a, **k: False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(registry.WeightsUnavailable) as e:
        registry.create_model("vit_base", 10)
    msg = str(e.value)
    assert "python -m raystudy prefetch --models vit_base" in msg and "--weights" in msg


def test_hub_reachable_is_false_for_an_unresolvable_host():
    assert registry.hub_reachable("nonexistent.invalid", timeout=1.0) is False


def test_cached_weights_are_found_without_network(tmp_path, monkeypatch):
    # Lay out a hub cache entry the way huggingface_hub does and check it is picked up.
    repo = "timm/vit_tiny_patch16_224.augreg_in21k"
    snap = tmp_path / ("models--" + repo.replace("/", "--")) / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (tmp_path / ("models--" + repo.replace("/", "--")) / "refs").mkdir()
    (tmp_path / ("models--" + repo.replace("/", "--")) / "refs" / "main").write_text("abc")
    src = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0)
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, snap / "model.safetensors")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(registry, "hub_reachable", lambda *a, **k: pytest.fail("network used"))
    path = registry.cached_weights("vit_tiny_patch16_224.augreg_in21k")
    assert path is not None and path.endswith("model.safetensors")
    m = registry.create_model("vit_tiny_patch16_224.augreg_in21k", 7)
    assert torch.equal(m.blocks[0].norm1.weight, src.blocks[0].norm1.weight)


def test_input_config_without_building():
    assert registry.input_config("vit_demo") == dict(img_size=16, in_chans=1, mean=(0.5,), std=(0.5,))
    ic = registry.input_config("vit_base")
    assert ic["img_size"] == 224 and ic["mean"] == (0.5, 0.5, 0.5)


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("vit_base", "timm"),
        ("vit_small_patch16_224", "timm"),
        ("vit_demo", "local"),
        ("gpt2_tiny", "gpt2"),
        ("local-dir:/nowhere", "saved timm"),
        ("hf-hub:org/name", "saved timm"),
    ],
)
def test_every_model_name_belongs_to_one_family(name, family):
    full = registry.resolve_name(name)
    owners = [f.name for f in registry.FAMILIES if f.owns(full)]
    assert owners[0] == family == registry.family(full).name  # first match wins; timm takes the rest
    assert registry.architecture(name) is registry.family(full).architecture


def test_a_new_family_is_one_record(monkeypatch):
    # What docs/development.md's recipe says: a family is a record in registry.FAMILIES (plus its
    # architecture's record when its parameter names are new); every question about a model of
    # it is answered by the record, with no branch on the family elsewhere.
    built = []

    def create(name, full, num_classes, pretrained, weights, img_size):
        built.append((full, num_classes, pretrained))
        return torch.nn.Linear(4, num_classes)

    toy = registry.Family(
        name="toy",
        owns=lambda full: full.startswith("toy_"),
        check=lambda name, full: None,
        create=create,
        input_config=lambda full: dict(img_size=8, in_chans=3, mean=(0.1,) * 3, std=(0.2,) * 3),
        hub_id=lambda full: "org/" + full,
        architecture=registry.architectures.VIT,
        registered=lambda full: True,
        source=lambda full: "digits",
        note=lambda full: "a toy",
    )
    monkeypatch.setattr(registry, "FAMILIES", (toy, *registry.FAMILIES))
    assert registry.check_model("toy_1") == "toy_1" and registry.registered("toy_1")
    assert registry.create_model("toy_1", 5, pretrained=False).out_features == 5
    assert built == [("toy_1", 5, False)]
    assert registry.input_config("toy_1")["img_size"] == 8
    assert registry.normalization("toy_1") == ((0.1,) * 3, (0.2,) * 3)
    assert (registry.hf_hub_id("toy_1"), registry.source_dataset("toy_1"), registry.note("toy_1")) == (
        "org/toy_1",
        "digits",
        "a toy",
    )
    assert registry.family("vit_demo").name == "local"  # the others unchanged
