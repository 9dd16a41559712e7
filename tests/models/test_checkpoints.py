"""A user's own model: local checkpoints read and mapped by timm, timm models saved for the hub
(``local-dir:``, ``hf-hub:``), and the preflight that builds the model before any trial.

Random-init timm ViTs saved to disk stand in for real checkpoints (no network here)."""

import pytest
import timm
import torch
from timm.models import save_for_hf

from raystudy.errors import ConfigError
from raystudy.models import checkpoints, preflight, registry, sources

TINY = "vit_tiny_patch16_224"


@pytest.fixture(scope="module")
def tiny_64():
    """A random-init tiny ViT at image size 64 (its position embedding differs from the 224 default)."""
    torch.manual_seed(0)
    return timm.create_model(TINY, pretrained=False, num_classes=10, img_size=64)


def test_a_checkpoint_at_another_image_size_is_resampled_as_timm_does(tmp_path, tiny_64):
    path = tmp_path / "w64.pth"
    torch.save({"model": tiny_64.state_dict()}, path)  # wrapped, as training scripts save it
    preflight.check(TINY, path)
    m = registry.create_model(TINY, 3, weights=path)
    assert m.pos_embed.shape == (1, 197, 192) and m.head.out_features == 3
    assert torch.equal(m.blocks[2].attn.qkv.weight, tiny_64.blocks[2].attn.qkv.weight)
    assert torch.equal(m.cls_token, tiny_64.cls_token)


def test_a_ddp_prefixed_safetensors_checkpoint_loads(tmp_path, tiny_64):
    from safetensors.torch import save_file

    path = tmp_path / "w.safetensors"
    save_file({f"module.{k}": v.contiguous() for k, v in tiny_64.state_dict().items()}, path)
    m = registry.create_model(TINY, 4, weights=path, img_size=64)
    assert torch.equal(m.pos_embed, tiny_64.pos_embed)


def test_a_checkpoint_that_does_not_fit_names_its_keys(tmp_path, tiny_64):
    sd = tiny_64.state_dict()
    sd["blocks.0.extra"] = torch.zeros(3)
    del sd["blocks.1.norm1.weight"]
    path = tmp_path / "bad.pt"
    torch.save(sd, path)
    with pytest.raises(ConfigError, match=r"missing 1: blocks\.1\.norm1\.weight; unexpected 1: blocks\.0\.extra"):
        preflight.check(TINY, path)
    with pytest.raises(registry.WeightsUnavailable, match="does not fit"):
        registry.create_model(TINY, 3, weights=path)
    wider = tmp_path / "small.pt"
    torch.save(timm.create_model("vit_small_patch16_224", pretrained=False).state_dict(), wider)
    with pytest.raises(ConfigError, match=r"misshapen \d+: cls_token \(1, 1, 384\) vs \(1, 1, 192\)"):
        preflight.check(TINY, wider)


def test_a_transformers_vit_checkpoint_is_named_as_not_mapped(tmp_path, tiny_64):
    path = tmp_path / "hf_vit.pt"
    torch.save({"vit.embeddings.cls_token": torch.zeros(1, 1, 192)}, path)
    with pytest.raises(ConfigError, match="a transformers ViT checkpoint .* is not mapped: save the model with timm"):
        preflight.check(TINY, path)


def test_the_head_is_never_loaded(tiny_64):
    state = checkpoints.mapped(tiny_64.state_dict(), tiny_64)
    assert not any(k.startswith("head.") for k in state)
    assert checkpoints.misfit(tiny_64, state) is None


def test_a_timm_model_saved_for_the_hub_loads_from_its_folder(tmp_path, tiny_64):
    folder = tmp_path / "my_vit"
    save_for_hf(tiny_64, folder, safe_serialization=True)
    name = f"local-dir:{folder}"
    assert registry.check_model(name) == name
    assert registry.input_config(name) == dict(img_size=64, in_chans=3, mean=(0.5,) * 3, std=(0.5,) * 3)
    assert sources.short(name) == "my_vit"
    assert registry.cached_weights(name) == str(folder / "model.safetensors")  # prefetch: nothing to download
    preflight.check(name)
    m = registry.create_model(name, 5)
    assert m.head.out_features == 5 and m.pos_embed.shape == tiny_64.pos_embed.shape
    assert torch.equal(m.blocks[0].mlp.fc1.weight, tiny_64.blocks[0].mlp.fc1.weight)
    assert not torch.equal(
        registry.create_model(name, 5, pretrained=False).blocks[0].mlp.fc1.weight, m.blocks[0].mlp.fc1.weight
    )


def test_a_folder_that_is_not_a_timm_model_is_refused_with_what_to_do(tmp_path):
    with pytest.raises(ConfigError, match="no config.json"):
        registry.check_model(f"local-dir:{tmp_path}")
    (tmp_path / "config.json").write_text('{"model_type": "vit", "hidden_size": 768}')  # transformers' ViT
    with pytest.raises(ConfigError, match="names no timm architecture; a transformers ViT checkpoint"):
        registry.check_model(f"local-dir:{tmp_path}")
    (tmp_path / "config.json").write_text('{"architecture": "resnet18"}')
    with pytest.raises(ConfigError, match="not a timm VisionTransformer"):
        registry.check_model(f"local-dir:{tmp_path}")


def test_a_hub_name_offline_and_uncached_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "hub_reachable", lambda *a, **k: False)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ConfigError, match="'hf-hub:someone/their_vit': its config.json is not in the Hugging Face"):
        registry.check_model("hf-hub:someone/their_vit")
    assert registry.hf_hub_id("hf-hub:someone/their_vit") == "someone/their_vit"


def test_a_model_with_parameters_no_component_holds_fails_before_any_trial():
    # timm's SigLIP ViT pools with attention (attn_pool): a real architecture the study cannot partition
    with pytest.raises(ConfigError, match=r"13 parameter\(s\) belong to no component: attn_pool\.latent"):
        preflight.check("vit_base_patch16_siglip_224")


def test_the_preflight_builds_nothing_real():
    m = preflight.meta_model("vit_base_patch16_224")
    assert all(p.device.type == "meta" for p in m.parameters())
    preflight.check("vit_demo")
    preflight.check("gpt2_tiny")
