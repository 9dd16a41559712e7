import pytest
import timm
import torch

from raystudy.commands import components as components_command
from raystudy.models import components as C
from tests.helpers import tiny_vit


@pytest.fixture(scope="module")
def vit_base():
    return timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=100)


def test_vit_base_partition_counts_match_the_study(vit_base):
    counts = C.component_counts(vit_base)
    assert counts["MHA"] == 28_348_416
    assert counts["FC1"] == 28_348_416
    assert counts["FC2"] == 28_320_768
    assert counts["LN1"] == 18_432
    assert counts["LN2"] == 18_432
    # every parameter is counted exactly once
    assert sum(counts.values()) == sum(p.numel() for p in vit_base.parameters())


def test_every_parameter_in_exactly_one_component(vit_base):
    groups = C.partition(vit_base)
    names = [n for ns in groups.values() for n in ns]
    assert sorted(names) == sorted(n for n, _ in vit_base.named_parameters())
    assert groups["HEAD"] == ["norm.weight", "norm.bias", "head.weight", "head.bias"]
    assert set(groups["EMBED"]) == {"cls_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias"}


@pytest.mark.parametrize(
    "names,culprit",
    [
        (["blocks.0.norm1.weight", "blocks.0.attn.gate"], "blocks.0.attn.gate"),  # a name timm never had
        (["blocks.0.mlp.fc1.weight", "blocks.0.mlp.fc1_g.weight"], "fc1_g"),  # SwiGLU: not a study MLP
    ],
)
def test_partition_fails_loudly_on_unknown_parameters(names, culprit):
    with pytest.raises(C.PartitionError, match=culprit):
        C.partition(names)


def test_layer_scale_and_register_tokens_have_a_component():
    """LayerScale trains with the component whose output it scales; registers are embedding."""
    model = tiny_vit(init_values=1e-5, reg_tokens=2)
    groups = C.partition(model)
    names = [n for ns in groups.values() for n in ns]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())
    assert "blocks.0.ls1.gamma" in groups["MHA"] and "blocks.0.ls2.gamma" in groups["FC2"]
    assert "reg_token" in groups["EMBED"]
    C.apply_condition(model, "MHA")
    trains = {n for n, p in model.named_parameters() if p.requires_grad}
    assert "blocks.1.ls1.gamma" in trains and "blocks.1.ls2.gamma" not in trains


def test_components_cli_counts_a_dinov2_style_vit_with_registers(capsys):
    assert components_command.main(["--model", "vit_small_patch14_reg4_dinov2", "--conditions", "MHA,FC2,full"]) == 0
    out = capsys.readouterr().out
    per = {line.split()[0]: int(line.split()[1].replace(",", "")) for line in out.splitlines()[2:9]}
    assert per["MHA"] == 12 * (384 * 1152 + 1152 + 384 * 384 + 384 + 384)  # qkv, proj, ls1
    assert per["FC2"] == 12 * (1536 * 384 + 384 + 384)  # fc2, ls2


def test_ambiguous_parameter_is_refused(monkeypatch):
    # a pattern table whose entries overlap must be caught, not resolved silently
    import re

    monkeypatch.setitem(C._COMPILED, "EXTRA", [re.compile(r"head\.weight")])
    with pytest.raises(C.PartitionError, match="several"):
        C.partition(["head.weight"])


@pytest.mark.parametrize(
    "cond,expected",
    [
        ("MHA", {"MHA"}),
        ("mha+fc1", {"MHA", "FC1"}),
        ("FC1+MHA", {"MHA", "FC1"}),
        ("full", set(C.STUDY_COMPONENTS)),
        ("linear_probe", set()),
        ("lora", {"LORA"}),
        ("EMBED", {"EMBED"}),
    ],
)
def test_parse_condition(cond, expected):
    assert C.parse_condition(cond) == expected


def test_canonical_condition_orders_by_table():
    assert C.canonical_condition("fc1+mha") == "MHA+FC1"
    assert C.canonical_condition("FULL") == "full"


@pytest.mark.parametrize("bad", ["FC3", "MHA+", "", "MHA+MHA", "head"])
def test_bad_condition_names_the_value_and_the_choices(bad):
    with pytest.raises(C.ConditionError) as e:
        C.parse_condition(bad)
    msg = str(e.value)
    assert "\n" not in msg
    assert "valid" in msg or "twice" in msg


@pytest.mark.parametrize("cond", ["LN1", "MHA", "LN2", "FC1", "FC2", "EMBED", "full", "linear_probe", "MHA+FC1"])
def test_apply_condition_sets_exactly_the_trainable_set(cond):
    model = tiny_vit()
    counts = C.apply_condition(model, cond)
    groups = C.partition(model)
    params = dict(model.named_parameters())
    want = C.trainable_components(cond)
    for comp, names in groups.items():
        for n in names:
            assert params[n].requires_grad == (comp in want), n
    assert sum(counts.values()) == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert set(counts) == {c for c in want if groups[c]}


def test_lora_trains_only_adapters_head_and_final_norm():
    model = tiny_vit()
    counts = C.apply_condition(model, "lora")
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable, "nothing trains"
    for n in trainable:
        assert "lora_" in n or n.split(".")[0] in ("head", "norm"), n
    # rank 8 adapters on qkv (32 -> 96) and proj (32 -> 32) of each of the 2 blocks
    assert counts["LORA"] == 2 * (8 * 32 + 96 * 8 + 8 * 32 + 32 * 8)
    # peft kept timm's names, so the partition still covers everything
    assert any(n.endswith("attn.qkv.base_layer.weight") for n, _ in model.named_parameters())
    assert not any("patch_embed" in n and "lora" in n for n, _ in model.named_parameters())


def test_lora_starts_as_the_identity():
    torch.manual_seed(0)
    model = tiny_vit().eval()
    x = torch.randn(2, 1, 16, 16)
    before = model(x)
    C.apply_condition(model, "lora")
    assert torch.allclose(model(x), before, atol=1e-6)


def test_condition_counts_report_each_condition(vit_base):
    counts = C.condition_counts(vit_base, ["MHA", "linear_probe", "full"])
    head = C.component_counts(vit_base)["HEAD"]
    assert counts["linear_probe"] == head
    assert counts["MHA"] == 28_348_416 + head
    assert counts["full"] == sum(p.numel() for p in vit_base.parameters())


def test_components_cli_prints_table(capsys):
    assert components_command.main(["--model", "vit_demo", "--conditions", "MHA,lora"]) == 0
    out = capsys.readouterr().out
    assert "MHA" in out and "lora" in out and "HEAD" in out


def test_components_cli_bad_condition_exits_2(capsys):
    assert components_command.main(["--model", "vit_demo", "--conditions", "XYZ"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "XYZ" in err[0]


def test_only_the_closed_form_has_no_lr():
    assert not C.has_lr("linear_probe")
    assert C.has_lr("MHA") and C.has_lr("MHA+FC1") and C.has_lr("full")
    assert C.has_lr("../../evil")  # a run record's tag, not a condition: not the closed form
