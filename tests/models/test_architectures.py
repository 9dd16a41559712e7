"""The registry of model families: every record fits a small random-init model of its family.

Per record: its patterns put every parameter in exactly one component (LoRA adapters included),
its module paths resolve in every block, its embedding is what enters the first block, its
attention call reproduces the attention of the model's own forward, and a model name and a
built model look up the same record.
"""

import re

import pytest
import torch

from raystudy.measure import plasticity
from raystudy.models import architectures, components, registry
from tests.helpers import tiny_vit


def gpt2_tiny(attention: str = "sdpa"):
    model = registry.create_model("gpt2_tiny", 10, pretrained=False)
    model.transformer.config._attn_implementation = attention  # eager: causal only by the mask
    return model


# (record, builder, input): the ViT variants the patterns name (LayerScale, registers, average
# pooling's fc_norm, CLIP's pre-norm) each get a case.
MODELS = {
    "vit": (architectures.VIT, tiny_vit, lambda: torch.randn(3, 1, 16, 16)),
    "vit_layerscale_registers": (
        architectures.VIT,
        lambda: tiny_vit(init_values=1e-5, reg_tokens=2),
        lambda: torch.randn(3, 1, 16, 16),
    ),
    "vit_avg_pool_no_cls": (
        architectures.VIT,
        lambda: tiny_vit(class_token=False, global_pool="avg"),
        lambda: torch.randn(3, 1, 16, 16),
    ),
    "vit_pre_norm": (architectures.VIT, lambda: tiny_vit(pre_norm=True), lambda: torch.randn(3, 1, 16, 16)),
    "gpt2": (architectures.GPT2, gpt2_tiny, lambda: torch.randint(0, 256, (3, 12))),
    "gpt2_eager": (architectures.GPT2, lambda: gpt2_tiny("eager"), lambda: torch.randint(0, 256, (3, 12))),
}


@pytest.fixture(params=list(MODELS))
def case(request):
    arch, build, inputs = MODELS[request.param]
    torch.manual_seed(0)
    return arch, build().eval(), inputs()


def owners(arch: architectures.Architecture, name: str) -> list[str]:
    return [c for c, pats in arch.patterns.items() if any(re.fullmatch(p, name) for p in pats)]


def test_every_family_of_the_registry_is_tested():
    assert {arch.name for arch, _, _ in MODELS.values()} == set(architectures.ARCHITECTURES)


def test_records_list_the_components_in_one_order():
    order = list(components.COMPONENTS)
    for arch in architectures.ARCHITECTURES.values():
        assert list(arch.patterns) == order, arch.name
        assert set(arch.module_paths) == set(architectures.PROBE_COMPONENTS), arch.name
    assert architectures.PROBE_COMPONENTS == ("LN1", "MHA", "LN2", "FC1", "FC2")


@pytest.mark.parametrize("lora", [False, True])
def test_patterns_put_every_parameter_in_exactly_one_component(case, lora):
    arch, model, _ = case
    if lora:
        components.add_lora(model, rank=2, alpha=4)
    names = [n for n, _ in model.named_parameters()]
    assert names
    wrong = {n: owners(arch, n) for n in names if len(owners(arch, n)) != 1}
    assert not wrong, wrong
    assert any(owners(arch, n) == ["LORA"] for n in names) == lora


def test_module_paths_resolve_in_every_block(case):
    arch, model, _ = case
    assert model.get_submodule(arch.blocks) is model.blocks
    for block in model.blocks:
        for comp, path in arch.module_paths.items():
            mod = block.get_submodule(path)
            assert isinstance(mod, torch.nn.Module)
            assert plasticity.block_module(block, comp, arch.module_paths) is mod


def test_the_model_and_its_name_find_the_record(case):
    arch, model, _ = case
    assert architectures.of_model(model) is arch
    assert architectures.of_model(torch.nn.Linear(2, 2)) is None


@pytest.mark.parametrize(
    "name,arch",
    [
        ("vit_demo", architectures.VIT),
        ("vit_base", architectures.VIT),
        ("gpt2_tiny", architectures.GPT2),
        ("gpt2", architectures.GPT2),
    ],
)
def test_a_model_name_finds_its_record(name, arch):
    assert registry.architecture(name) is arch
    assert registry.takes_tokens(name) == arch.tokens == (arch.inputs == "token ids")


def test_a_built_model_and_its_name_agree():
    for name in ("vit_demo", "gpt2_tiny"):
        assert architectures.of_model(registry.create_model(name, 4, pretrained=False)) is registry.architecture(name)


@torch.no_grad()
def test_embed_is_what_enters_the_first_block(case):
    arch, model, x = case
    seen = []
    handle = model.blocks[0].register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    try:
        model.forward_features(x)
    finally:
        handle.remove()
    torch.testing.assert_close(arch.embed(model, x), seen[0])


@torch.no_grad()
def test_attend_is_the_attention_of_the_forward(case):
    arch, model, x = case
    attn = model.blocks[0].get_submodule(arch.module_paths["MHA"])
    seen = []

    def hook(module, args, out):
        seen.append((args[0], out[0] if isinstance(out, tuple) else out))

    handle = attn.register_forward_hook(hook)
    try:
        model.forward_features(x)
    finally:
        handle.remove()
    inp, want = seen[0]
    mask = arch.attention_mask(inp.shape[1], inp.dtype, inp.device)
    assert (mask is not None) == (arch is architectures.GPT2)  # GPT-2's attention is causal
    torch.testing.assert_close(arch.attend(attn, inp, mask), want)
