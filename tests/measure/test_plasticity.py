import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from timm.layers import Attention

from analysis.stats import pooling
from raystudy.measure import plasticity
from tests import helpers

PROPERTY = settings(max_examples=40, deadline=None)


def pair_ratios(fx, fy, x, y):
    """The definition, per sample: ||f(x) - f(y)||_F / ||x - y||_F (NaN where x = y)."""
    return plasticity.ratios(plasticity.pair_norms(fx, fy), plasticity.pair_norms(x, y))


COMPS = ("LN1", "MHA", "LN2", "FC1", "FC2")


def tiny_vit(seed=0, **kw):
    """A float64 tiny ViT whose every parameter is random (timm zero-inits some biases)."""
    torch.manual_seed(seed)
    model = helpers.tiny_vit(**kw).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or name in ("cls_token", "reg_token", "pos_embed") or ".ls" in name:
                p.copy_(0.3 * torch.randn_like(p))
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
    return model


def images(n, seed, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 16, 16, generator=g, dtype=torch.float64) + shift


def batches(x, y, size):
    return [(x[i : i + size], y[i : i + size]) for i in range(0, len(x), size)]


def by_key(rows):
    return {(r["mode"], r["layer"], r["component"]): r for r in rows}


def shown(rows):
    """The probe's rows as the analysis shows them: with the 95% t interval of each mean."""
    return pooling.t_interval(pd.DataFrame(rows)).to_dict("records")


# ---------------------------------------------------------------- independent references
# Written from the maths, without timm's modules (only their parameters), to check the probe.


def ref_layer_norm(ln, x):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + ln.eps) * ln.weight + ln.bias


def ref_linear(lin, x):
    return x @ lin.weight.T + lin.bias


def ref_attention(attn, x):
    b, n, d = x.shape
    h, dh = attn.num_heads, attn.head_dim
    qkv = ref_linear(attn.qkv, x)
    q, k, v = (qkv[..., i * h * dh : (i + 1) * h * dh].reshape(b, n, h, dh).transpose(1, 2) for i in range(3))
    a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dh), dim=-1)
    z = (a @ v).transpose(1, 2).reshape(b, n, h * dh)
    return ref_linear(attn.proj, z)


@torch.no_grad()
def ref_embed(vit, img):
    conv = vit.patch_embed.proj
    p = F.conv2d(img, conv.weight, conv.bias, stride=conv.stride).flatten(2).transpose(1, 2)
    prefix = [vit.cls_token.expand(len(img), -1, -1)]
    if vit.reg_token is not None:
        prefix.append(vit.reg_token.expand(len(img), -1, -1))
    if vit.no_embed_class:
        return torch.cat(prefix + [p + vit.pos_embed], dim=1)
    return torch.cat(prefix + [p], dim=1) + vit.pos_embed


def ref_block(blk, x):
    """One block by hand; returns the new residual stream and each component's (input, output)."""
    ls1 = blk.ls1.gamma if hasattr(blk.ls1, "gamma") else 1.0
    ls2 = blk.ls2.gamma if hasattr(blk.ls2, "gamma") else 1.0
    seen = {}
    h = ref_layer_norm(blk.norm1, x)
    seen["LN1"] = (x, h)
    a = ref_attention(blk.attn, h)
    seen["MHA"] = (h, a)
    x = x + ls1 * a
    h2 = ref_layer_norm(blk.norm2, x)
    seen["LN2"] = (x, h2)
    f1 = ref_linear(blk.mlp.fc1, h2)
    seen["FC1"] = (h2, f1)
    g = F.gelu(f1)
    f2 = ref_linear(blk.mlp.fc2, g)
    seen["FC2"] = (g, f2)
    return x + ls2 * f2, seen


def ref_ratios(fx, fy, x, y):
    return ((fx - fy).flatten(1).norm(dim=1) / (x - y).flatten(1).norm(dim=1)).numpy()


@torch.no_grad()
def ref_shared(vit, x, y):
    """The paper's reference: every component on E(x), E(y); FC2 on E zero-padded."""
    ex, ey = ref_embed(vit, x), ref_embed(vit, y)
    out = {}
    for i, blk in enumerate(vit.blocks):
        hidden = blk.mlp.fc1.out_features
        pad = lambda e: torch.cat([e, e.new_zeros(*e.shape[:-1], hidden - e.shape[-1])], -1)  # noqa: E731
        fns = {
            "LN1": lambda e: ref_layer_norm(blk.norm1, e),
            "MHA": lambda e: ref_attention(blk.attn, e),
            "LN2": lambda e: ref_layer_norm(blk.norm2, e),
            "FC1": lambda e: ref_linear(blk.mlp.fc1, e),
            "FC2": lambda e: ref_linear(blk.mlp.fc2, pad(e)),
        }
        for c, f in fns.items():
            out[("shared", i, c)] = ref_ratios(f(ex), f(ey), ex, ey)
    return out


@torch.no_grad()
def ref_in_situ(vit, x, y):
    """Each component on what really enters it, from a hand-written forward of x and of y."""
    sx, sy = ref_embed(vit, x), ref_embed(vit, y)
    out = {}
    for i, blk in enumerate(vit.blocks):
        sx, seen_x = ref_block(blk, sx)
        sy, seen_y = ref_block(blk, sy)
        for c in COMPS:
            (ix, ox), (iy, oy) = seen_x[c], seen_y[c]
            out[("in_situ", i, c)] = ref_ratios(ox, oy, ix, iy)
    return out, ref_layer_norm(vit.norm, sx)


def summary(values):
    n = len(values)
    mean, std = float(np.mean(values)), float(np.std(values, ddof=1))
    half = stats.t.ppf(0.975, n - 1) * std / math.sqrt(n)
    return dict(mean=mean, std=std, n=n, ci_low=mean - half, ci_high=mean + half)


def assert_rows_match(rows, ref):
    got = by_key(shown(rows))
    assert set(ref) <= set(got)
    for key, values in ref.items():
        want = summary(values)
        for k, v in want.items():
            assert got[key][k] == pytest.approx(v, rel=1e-9, abs=1e-12), (key, k)


# ---------------------------------------------------------------- exact properties


@PROPERTY
@given(
    c=st.floats(-50, 50, allow_nan=False),
    b=st.integers(1, 5),
    n=st.integers(1, 6),
    d=st.integers(1, 9),
    seed=st.integers(0, 2**31 - 1),
)
def test_scaling_by_c_gives_plasticity_abs_c(c, b, n, d, seed):
    g = torch.Generator().manual_seed(seed)
    x, y = (
        torch.randn(b, n, d, generator=g, dtype=torch.float64),
        torch.randn(b, n, d, generator=g, dtype=torch.float64),
    )
    r = pair_ratios(c * x, c * y, x, y)
    assert r.shape == (b,)
    assert torch.allclose(r, torch.full_like(r, abs(c)), rtol=1e-12, atol=1e-12)


def test_identical_pairs_have_no_ratio_and_are_not_counted():
    x = torch.randn(3, 4, 5)
    y = x.clone()
    y[1] += 1.0
    r = pair_ratios(2 * x, 2 * y, x, y)
    assert torch.isnan(r[0]) and torch.isnan(r[2]) and r[1].item() == pytest.approx(2.0)
    s = plasticity.RunningStats()
    s.update(r)
    assert s.result()["n"] == 1 and s.result()["mean"] == pytest.approx(2.0)


class Scale(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c

    def forward(self, x, **kwargs):  # timm passes attn_mask/is_causal to attn
        return self.c * x


@pytest.mark.parametrize("c", [-2.5, 0.5, 3.0])
def test_probe_of_a_scaling_component_is_abs_c_in_both_modes(c):
    vit = tiny_vit()
    for blk in vit.blocks:
        blk.norm1, blk.attn = Scale(c), Scale(-2 * c)
    rows = by_key(plasticity.probe(vit, batches(images(12, 1), images(12, 2, 0.5), 5), mode="both"))
    for mode in plasticity.MODES:
        for layer in range(2):
            ln1, mha = rows[(mode, layer, "LN1")], rows[(mode, layer, "MHA")]
            assert ln1["mean"] == pytest.approx(abs(c), rel=1e-12)
            assert ln1["std"] == pytest.approx(0.0, abs=1e-12)
            assert mha["mean"] == pytest.approx(2 * abs(c), rel=1e-12)
            assert ln1["n"] == 12
            # no theory for a foreign module: the bound says so instead of inventing one
            assert math.isnan(ln1["bound"]) and math.isnan(mha["bound"])


@PROPERTY
@given(
    fan_in=st.integers(1, 12),
    fan_out=st.integers(1, 12),
    n=st.integers(1, 5),
    b=st.integers(1, 4),
    scale=st.floats(1e-3, 1e3),
    seed=st.integers(0, 2**31 - 1),
    aligned=st.booleans(),
)
def test_linear_plasticity_lies_between_extreme_singular_values(fan_in, fan_out, n, b, scale, seed, aligned):
    g = torch.Generator().manual_seed(seed)
    lin = nn.Linear(fan_in, fan_out, dtype=torch.float64)
    with torch.no_grad():
        lin.weight.copy_(scale * torch.randn(fan_out, fan_in, generator=g, dtype=torch.float64))
        lin.bias.copy_(torch.randn(fan_out, generator=g, dtype=torch.float64))
    x = torch.randn(b, n, fan_in, generator=g, dtype=torch.float64)
    y = x + torch.randn(b, n, fan_in, generator=g, dtype=torch.float64)
    if aligned:  # the worst case: every difference along the top right singular vector
        top = torch.linalg.svd(lin.weight).Vh[0]
        y = x + torch.randn(b, n, 1, generator=g, dtype=torch.float64) * top
    with torch.no_grad():
        r = pair_ratios(lin(x), lin(y), x, y)
    sv = torch.linalg.svdvals(lin.weight)
    bound = plasticity.linear_bound(lin)
    assert bound == pytest.approx(torch.linalg.matrix_norm(lin.weight, ord=2).item(), rel=1e-10)
    assert (r <= bound * (1 + 1e-9)).all()
    if aligned:
        assert torch.allclose(r, torch.full_like(r, bound), rtol=1e-8)
    if fan_out >= fan_in:
        assert (r >= sv[-1] * (1 - 1e-9)).all()


@PROPERTY
@given(
    d=st.integers(2, 16),
    n=st.integers(1, 5),
    b=st.integers(1, 4),
    scale=st.floats(1e-4, 1e2),
    offset=st.floats(-10, 10),
    eps=st.sampled_from([1e-6, 1e-5, 0.1]),
    kind=st.sampled_from(["random", "opposite", "close", "rescaled"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_layernorm_plasticity_never_exceeds_its_bound(d, n, b, scale, offset, eps, kind, seed):
    g = torch.Generator().manual_seed(seed)
    ln = nn.LayerNorm(d, eps=eps, dtype=torch.float64)
    with torch.no_grad():
        ln.weight.copy_(torch.randn(d, generator=g, dtype=torch.float64))
        ln.bias.copy_(torch.randn(d, generator=g, dtype=torch.float64))
    x = scale * torch.randn(b, n, d, generator=g, dtype=torch.float64) + offset
    y = {
        "random": lambda: scale * torch.randn(b, n, d, generator=g, dtype=torch.float64) + offset,
        "opposite": lambda: 2 * offset - x,  # the segment between them crosses a zero-variance token
        "close": lambda: x + 1e-3 * scale * torch.randn(b, n, d, generator=g, dtype=torch.float64),
        "rescaled": lambda: 3.0 * (x - offset) + offset,
    }[kind]()
    with torch.no_grad():
        r = pair_ratios(ln(x), ln(y), x, y)
    bound = plasticity.layernorm_bound(ln, torch.cat([x, y]))
    sigma = torch.sqrt(torch.cat([x, y]).var(-1, unbiased=False) + eps).min().item()
    assert bound == pytest.approx(ln.weight.abs().max().item() / sigma, rel=1e-9)
    ok = r[~torch.isnan(r)]
    assert (ok <= bound * (1 + 1e-9)).all(), (ok.max().item(), bound)


def test_mha_bound_slices_heads_from_nn_linear_layout():
    torch.manual_seed(0)
    attn = Attention(12, num_heads=3, qkv_bias=True).double().eval()
    n, r = 7, 1.7
    dim, h, dh = 12, 3, 4
    wq_all, wk_all, wv_all = attn.qkv.weight[:dim], attn.qkv.weight[dim : 2 * dim], attn.qkv.weight[2 * dim :]
    want = 0.0
    for i in range(h):
        s = slice(i * dh, (i + 1) * dh)
        # maths convention (tokens are rows, x W): W^h is (dim, d_h), W_O^h is (d_h, dim)
        wq, wk, wv = wq_all[s].T, wk_all[s].T, wv_all[s].T
        wo = attn.proj.weight[:, s].T
        a = torch.linalg.matrix_norm(wq @ wk.T / math.sqrt(dh), ord=2).item()
        want += (
            torch.linalg.matrix_norm(wo, ord=2).item()
            * torch.linalg.matrix_norm(wv, ord=2).item()
            * math.sqrt(3 * n + (12 * n + 3) * r**4 * a**2)
        )
    assert plasticity.mha_bound(attn, n, r) == pytest.approx(want, rel=1e-10)


@PROPERTY
@given(n=st.integers(1, 6), b=st.integers(1, 4), scale=st.floats(0.1, 5.0), seed=st.integers(0, 2**31 - 1))
def test_mha_plasticity_never_exceeds_its_bound(n, b, scale, seed):
    torch.manual_seed(seed)
    attn = Attention(8, num_heads=2, qkv_bias=False).double().eval()
    g = torch.Generator().manual_seed(seed)
    x = scale * torch.randn(b, n, 8, generator=g, dtype=torch.float64)
    y = scale * torch.randn(b, n, 8, generator=g, dtype=torch.float64)
    with torch.no_grad():
        r = pair_ratios(attn(x), attn(y), x, y)
    xy = torch.cat([x, y])
    rms = xy.norm(dim=-1).square().mean().sqrt().item()
    assert (r <= plasticity.mha_bound(attn, n, rms)).all()


def test_spectral_norm_of_lora_adapted_linear_includes_the_adapter():
    from raystudy.models import components

    vit = tiny_vit().float()
    components.add_lora(vit, rank=2, alpha=4)
    qkv = vit.blocks[0].attn.qkv
    with torch.no_grad():
        qkv.lora_B["default"].weight.normal_()
    merged = qkv.base_layer.weight + qkv.get_delta_weight("default")
    assert torch.allclose(plasticity.effective_weight(qkv), merged)
    assert not torch.allclose(plasticity.effective_weight(qkv), qkv.base_layer.weight)
    assert plasticity.mha_bound(vit.blocks[0].attn, 17, 1.0) > 0


# ---------------------------------------------------------------- statistics


def test_running_stats_match_numpy_over_chunks_with_nans():
    rng = np.random.default_rng(0)
    values = rng.gamma(2.0, 1.5, size=103)
    chunks = np.split(values, [1, 2, 40, 41, 41, 90])  # sizes 1, 1, 38, 1, 0, 49, 13
    s = plasticity.RunningStats()
    for ch in chunks:
        s.update(torch.tensor(np.concatenate([ch, [np.nan]])))
    s.update(torch.full((3,), float("nan")))
    got = shown([s.result()])[0]
    want = summary(values)
    for k in ("mean", "std", "ci_low", "ci_high"):
        assert got[k] == pytest.approx(want[k], rel=1e-12)
    assert got["n"] == 103


def test_running_stats_of_one_or_no_value():
    s = plasticity.RunningStats()
    assert s.result()["n"] == 0 and math.isnan(s.result()["mean"])
    s.update(torch.tensor([4.0]))
    r = s.result()
    assert r["mean"] == 4.0 and math.isnan(r["std"]) and math.isnan(shown([r])[0]["ci_low"])


# ---------------------------------------------------------------- the probe against references


@pytest.mark.parametrize(
    "kw", [{}, dict(init_values=1e-5, reg_tokens=2, no_embed_class=True), dict(init_values=1e-5, reg_tokens=2)]
)
def test_probe_equals_independent_computation_in_both_modes(kw):
    vit = tiny_vit(**kw)
    x, y = images(10, 1), images(10, 2, shift=0.7)
    ref, features = ref_in_situ(vit, x, y)
    with torch.no_grad():  # the hand-written forward is the model's own forward
        assert torch.allclose(features, vit.forward_features(x), rtol=1e-10, atol=1e-10)
    ref.update(ref_shared(vit, x, y))
    rows = plasticity.probe(vit, batches(x, y, 4), mode="both")
    assert len(rows) == 2 * 2 * 5
    assert_rows_match(rows, ref)


def test_bounds_hold_for_every_layer_and_mode_and_depend_on_the_mode():
    vit = tiny_vit(init_values=1e-5, reg_tokens=2)
    x, y = images(16, 3), images(16, 4, shift=-0.5)
    rows = plasticity.probe(vit, batches(x, y, 8), mode="both")
    for r in rows:
        assert r["mean"] <= r["bound"], r
    k = by_key(rows)
    # shared: MHA sees E(x) of n = 16 patches + cls + 2 reg tokens, whose RMS norm sets r
    e = ref_embed(vit, torch.cat([x, y]))
    rms = e.norm(dim=-1).square().mean().sqrt().item()
    assert k[("shared", 1, "MHA")]["bound"] == pytest.approx(
        plasticity.mha_bound(vit.blocks[1].attn, 19, rms), rel=1e-9
    )
    assert k[("shared", 0, "LN2")]["bound"] == pytest.approx(
        plasticity.layernorm_bound(vit.blocks[0].norm2, e), rel=1e-9
    )
    assert k[("in_situ", 0, "LN1")]["bound"] == k[("shared", 0, "LN1")]["bound"]  # both see E
    assert k[("in_situ", 1, "LN1")]["bound"] != k[("shared", 1, "LN1")]["bound"]
    assert k[("in_situ", 0, "FC2")]["bound"] == k[("shared", 0, "FC2")]["bound"]  # weights only


def test_streaming_in_batches_equals_one_big_batch():
    vit = tiny_vit()
    x, y = images(13, 5), images(13, 6, shift=0.3)
    one = by_key(shown(plasticity.probe(vit, [(x, y)], mode="both")))
    streamed = by_key(shown(plasticity.probe(vit, batches(x, y, 3), mode="both")))  # 3, 3, 3, 3, 1
    assert one.keys() == streamed.keys()
    for key in one:
        for k in ("mean", "std", "n", "ci_low", "ci_high", "bound"):
            assert streamed[key][k] == pytest.approx(one[key][k], rel=1e-10), (key, k)


def test_modes_together_equal_modes_apart_and_components_subset():
    vit = tiny_vit()
    pairs = batches(images(8, 1), images(8, 2), 4)
    both = by_key(plasticity.probe(vit, pairs, mode="both"))
    apart = by_key(plasticity.probe(vit, pairs, mode="shared") + plasticity.probe(vit, pairs, mode="in_situ"))
    assert both == apart
    sub = plasticity.probe(vit, pairs, mode="in_situ", components="fc1, MHA")
    assert [(r["layer"], r["component"]) for r in sub] == [(0, "MHA"), (0, "FC1"), (1, "MHA"), (1, "FC1")]
    assert sub[1] == both[("in_situ", 0, "FC1")]


def test_each_mode_is_one_pass_over_2b_images_and_leaves_no_trace():
    vit = tiny_vit().train()
    calls = []
    vit.patch_embed.register_forward_hook(lambda m, a, o: calls.append(("embed", a[0].shape[0])))
    vit.blocks[1].mlp.fc1.register_forward_hook(lambda m, a, o: calls.append(("fc1", a[0].shape[0])))
    plasticity.probe(vit, batches(images(10, 1), images(10, 2), 5), mode="both")
    # per batch: shared embeds once and runs each component once; in_situ is one forward
    assert calls == [("embed", 10), ("fc1", 10)] * 4
    assert vit.training  # the training flag is restored
    hooks = [m for m in vit.modules() if m._forward_hooks and m not in (vit.patch_embed, vit.blocks[1].mlp.fc1)]
    assert not hooks


# ---------------------------------------------------------------- bad input


def test_bad_input_is_refused_with_a_clear_error():
    vit = tiny_vit()
    pairs = batches(images(4, 1), images(4, 2), 4)
    with pytest.raises(plasticity.ProbeError, match="unknown mode 'exact'.*shared, in_situ"):
        plasticity.probe(vit, pairs, mode="exact")
    with pytest.raises(plasticity.ProbeError, match="unknown component 'LN3'.*LN1, MHA, LN2, FC1, FC2"):
        plasticity.probe(vit, pairs, components=("LN1", "LN3"))
    with pytest.raises(plasticity.ProbeError, match="timm VisionTransformer, got Linear"):
        plasticity.probe(nn.Linear(3, 3), pairs)
    with pytest.raises(plasticity.ProbeError, match="no pairs"):
        plasticity.probe(vit, [])
    with pytest.raises(plasticity.ProbeError, match="differ in shape"):
        plasticity.probe(vit, [(images(4, 1), images(3, 2))])
    assert issubclass(plasticity.ProbeError, ValueError)


class Images(torch.utils.data.Dataset):
    def __init__(self, n, shape, offset=0.0):
        self.x = torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1).expand(n, *shape) + offset

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], i


def test_pairs_from_datasets_streams_seeded_batches():
    src, tgt = Images(7, (1, 4, 4)), Images(5, (1, 4, 4), offset=100.0)
    got = list(plasticity.pairs_from_datasets(src, tgt, n_pairs=12, batch_size=5, seed=3))
    assert [len(x) for x, _ in got] == [5, 5, 2] and all(x.shape == y.shape for x, y in got)
    xs = torch.cat([x for x, _ in got])[:, 0, 0, 0].long().tolist()
    ys = (torch.cat([y for _, y in got])[:, 0, 0, 0] - 100).long().tolist()
    assert sorted(xs[:7]) == list(range(7)) and sorted(ys[:5]) == list(range(5))  # no repeat too early
    again = list(plasticity.pairs_from_datasets(src, tgt, n_pairs=12, batch_size=5, seed=3))
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, again))
    other = torch.cat([x for x, _ in plasticity.pairs_from_datasets(src, tgt, 12, 5, seed=4)])
    assert not torch.equal(other, torch.cat([x for x, _ in got]))


def test_sequential_pairs_are_the_first_n_images_of_each_split_in_order():
    src, tgt = Images(9, (1, 4, 4)), Images(6, (1, 4, 4), offset=100.0)
    for seed in (0, 7):  # no seed enters a sequential pairing
        got = list(plasticity.pairs_from_datasets(src, tgt, n_pairs=5, batch_size=2, seed=seed, pairing="sequential"))
        xs = torch.cat([x for x, _ in got])[:, 0, 0, 0].long().tolist()
        ys = (torch.cat([y for _, y in got])[:, 0, 0, 0] - 100).long().tolist()
        assert xs == ys == [0, 1, 2, 3, 4]
    with pytest.raises(
        plasticity.ProbeError,
        match="whole batches of 7 images .* the target split holds 6; use a probe batch size of at most 6",
    ):
        plasticity.pairs_from_datasets(src, tgt, n_pairs=7, batch_size=7, pairing="sequential")
    with pytest.raises(plasticity.ProbeError, match="unknown pairing 'shuffled'"):
        plasticity.pairs_from_datasets(src, tgt, n_pairs=2, batch_size=2, pairing="shuffled")


def test_pairs_from_datasets_refuses_bad_input_before_loading():
    src = Images(4, (1, 4, 4))
    with pytest.raises(ValueError, match=r"image sizes differ: source \(1, 4, 4\) vs target \(3, 4, 4\)"):
        plasticity.pairs_from_datasets(src, Images(4, (3, 4, 4)), 8, 4)
    with pytest.raises(ValueError, match="pairs must be >= 1, got 0"):
        plasticity.pairs_from_datasets(src, src, 0, 4)


# ---------------------------------------------------------------- timm's ViT family


@pytest.mark.parametrize(
    "name,kw",
    [
        ("vit_small_patch14_reg4_dinov2", dict(img_size=28, depth=2)),  # DINOv2: layer scale, registers
        ("deit3_small_patch16_224", dict(img_size=32, depth=2)),  # layer scale, no_embed_class
        ("vit_base_patch16_clip_224", dict(img_size=32, depth=1)),  # norm_pre, quick-gelu-free CLIP
        pytest.param(
            "vit_giant_patch14_dinov2",
            dict(img_size=28, depth=1),  # SwiGLU MLP, width 1536
            marks=pytest.mark.slow,
        ),
    ],
)
def test_probe_runs_on_timm_vits_and_stays_under_the_bounds(name, kw):
    import timm

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=0, **kw)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 3, kw["img_size"], kw["img_size"], generator=g)
    rows = plasticity.probe(model, batches(x[:3], x[3:], 2), mode="both")
    assert len(rows) == 2 * kw["depth"] * 5
    for r in rows:
        assert r["n"] == 3 and math.isfinite(r["mean"]) and math.isfinite(r["bound"]), r
        assert r["mean"] <= r["bound"], r


def test_the_interval_shown_is_the_t_interval_of_n_mean_and_std():
    # the probe's table, as the report, the figures and the probe command line show it; the
    # interval computed here from each row's n, mean and std alone
    rows = plasticity.probe(tiny_vit(), batches(images(9, 1), images(9, 2, shift=0.7), 4), mode="both")
    table = plasticity.to_frame(
        rows + [dict(rows[0], layer=7, n=1, std=math.nan), dict(rows[0], layer=8, n=0)], model="m", dataset="d"
    )
    got = pooling.t_interval(table)
    cols = list(plasticity.COLUMNS)
    assert list(got.columns) == cols[: cols.index("n") + 1] + ["ci_low", "ci_high"] + cols[cols.index("n") + 1 :]
    for r in got.itertuples():
        if r.n < 2:
            assert math.isnan(r.ci_low) and math.isnan(r.ci_high)
            continue
        half = stats.t.ppf(0.975, r.n - 1) * r.std / math.sqrt(r.n)
        assert (r.ci_low, r.ci_high) == pytest.approx((r.mean - half, r.mean + half), rel=1e-12), r
    big = pd.DataFrame({"n": [12800, 10**6], "mean": [2.0, 2.0], "std": [1.0, 1.0]})
    want = [2.0 + stats.t.ppf(0.975, n - 1) / math.sqrt(n) for n in (12800, 10**6)]
    assert pooling.t_interval(big)["ci_high"].tolist() == pytest.approx(want, rel=1e-12)
    ninety = 2.0 + stats.t.ppf(0.95, 12799) / math.sqrt(12800)
    assert pooling.t_interval(big, level=0.9)["ci_high"][0] == pytest.approx(ninety, rel=1e-12)


def test_the_probe_runs_without_scipy(monkeypatch):
    # scipy.stats costs every trial worker ~2 s of CPU to import; the probe measures n, mean and
    # std and leaves the interval to the analysis. Any scipy import during the probe fails here.
    import importlib.abc
    import sys

    class NoScipy(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] == "scipy":
                raise ImportError(f"{name} imported during the probe")

    for m in [m for m in sys.modules if m.split(".")[0] == "scipy"]:
        monkeypatch.delitem(sys.modules, m)
    monkeypatch.setattr(sys, "meta_path", [NoScipy(), *sys.meta_path])
    rows = plasticity.probe(tiny_vit(), batches(images(10, 1), images(10, 2, shift=0.7), 4), mode="both")
    assert len(rows) == 2 * 2 * 5 and all(r["n"] == 10 and r["std"] > 0 for r in rows)
    monkeypatch.undo()
    assert all(r["ci_low"] < r["mean"] < r["ci_high"] for r in shown(rows))


def _reference_pairs(n_source, n_target, batch_size, n_steps):
    """The reference's probe loop written out: two unshuffled drop_last loaders, cycled, one batch
    of each per step (apps/vit/analysis.py with vitef's make_iterable and build_loader)."""
    from itertools import repeat

    from torch.utils.data import DataLoader

    def cycled(n):
        loader = DataLoader(list(range(n)), batch_size=batch_size, shuffle=False, drop_last=True)
        for epoch in repeat(loader):
            yield from epoch

    it1, it2 = cycled(n_source), cycled(n_target)
    xs, ys = [], []
    for _ in range(n_steps):
        xs += next(it1).tolist()
        ys += next(it2).tolist()
    return xs, ys


@pytest.mark.parametrize("n_source,n_target,batch_size,n_steps", [(9, 6, 2, 11), (50, 13, 4, 7), (64, 64, 8, 3)])
def test_sequential_pairs_cycle_as_the_papers_loaders(n_source, n_target, batch_size, n_steps):
    src, tgt = Images(n_source, (1, 4, 4)), Images(n_target, (1, 4, 4), offset=100.0)
    got = list(
        plasticity.pairs_from_datasets(
            src, tgt, n_pairs=n_steps * batch_size, batch_size=batch_size, pairing="sequential"
        )
    )
    xs = torch.cat([x for x, _ in got])[:, 0, 0, 0].long().tolist()
    ys = (torch.cat([y for _, y in got])[:, 0, 0, 0] - 100).long().tolist()
    assert (xs, ys) == _reference_pairs(n_source, n_target, batch_size, n_steps)
    assert all(len(x) == batch_size for x, _ in got)


def test_the_papers_12800_sequential_pairs_run_on_a_split_smaller_than_the_pair_count():
    # The paper's ViT-B probe: 200 batches of 64 sequential pairs; the demo's test split holds 359
    # images (5 whole batches), so it is read 40 times over, as the reference's cycled loader reads it.
    from raystudy.data.splits import build_splits

    kw = dict(seed=0, img_size=16, mean=(0.5,), std=(0.5,), data_path="cache")
    source, target = build_splits("digits", **kw).test, build_splits("digits_c", **kw).test
    assert len(target) < 12_800
    model = tiny_vit().float()
    df = plasticity.probe_model(
        model, source, target, n_pairs=12_800, batch_size=64, modes="shared", pairing="sequential"
    )
    assert set(df["n"]) == {12_800} and df["mean"].notna().all()
    assert set(df["pairing"]) == {"sequential"}


def _reference_bounds(vit, n: int, r: float = 19.4) -> dict[tuple[int, str], float]:
    """apps/plots/theory.py of the reference, written out on timm's names: LayerNorms :126-136
    (torch.max of γ), linears :156-168 (max singular value), MHA :190-212 (qkv chunked in 3, each
    head's q, k, v and W_O sliced [:, i*d_h:(i+1)*d_h], QK by sqrt(len(q_h[0])), r fixed, :221)."""
    out = {}
    for i, block in enumerate(vit.blocks):
        out[(i, "LN1")] = torch.max(block.norm1.weight.data).item()
        out[(i, "LN2")] = torch.max(block.norm2.weight.data).item()
        out[(i, "FC1")] = torch.max(torch.linalg.svdvals(block.mlp.fc1.weight.data)).item()
        out[(i, "FC2")] = torch.max(torch.linalg.svdvals(block.mlp.fc2.weight.data)).item()
        heads, d = block.attn.num_heads, block.attn.head_dim
        A = block.attn.proj.weight.data
        O_h = [torch.linalg.svdvals(A[:, h * d : (h + 1) * d]).max().item() for h in range(heads)]
        q, k, v = block.attn.qkv.weight.data.chunk(3, dim=0)
        V_h, QK_h = [], []
        for h in range(heads):
            q_h, k_h, v_h = (m[:, h * d : (h + 1) * d] for m in (q, k, v))
            qk_h = q_h @ k_h.transpose(-1, -2) / math.sqrt(len(q_h[0]))
            V_h.append(torch.linalg.svdvals(v_h).max().item())
            QK_h.append(torch.linalg.svdvals(qk_h).max().item())
        out[(i, "MHA")] = sum(
            O_h[h] * V_h[h] * np.sqrt(3 * n + (12 * n + 3) * r**4 * QK_h[h] ** 2) for h in range(heads)
        )
    return out


def test_paper_bounds_are_the_references_formulas_on_a_random_init_vit():
    vit = tiny_vit()
    with torch.no_grad():  # a γ with negative entries: the reference's max is signed
        vit.blocks[0].norm1.weight.mul_(-1)
    x, y = images(8, 3), images(8, 4, shift=-0.5)
    paper = by_key(plasticity.probe(vit, batches(x, y, 4), mode="both", bounds="paper"))
    ours = by_key(plasticity.probe(vit, batches(x, y, 4), mode="both"))
    n = vit.patch_embed.num_patches + vit.num_prefix_tokens
    ref = _reference_bounds(vit, n)
    for (mode, i, c), row in paper.items():
        assert row["bound"] == pytest.approx(ref[(i, c)], rel=1e-6, abs=1e-6), (mode, i, c)
        assert row["mean"] == ours[(mode, i, c)]["mean"]  # the measurement is the same either way
    assert paper[("shared", 0, "MHA")]["bound"] != pytest.approx(ours[("shared", 0, "MHA")]["bound"], rel=1e-3)
    assert paper[("shared", 0, "LN1")]["bound"] != pytest.approx(ours[("shared", 0, "LN1")]["bound"], rel=1e-3)
    with pytest.raises(plasticity.ProbeError, match="unknown bounds"):
        plasticity.probe(vit, batches(x, y, 4), bounds="reference")


def _paper_mha_bound_head_by_head(attn, n: int, r: float) -> float:
    """The reference's MHA bound head by head in float64, as it was computed before it was batched."""
    q, k, v = attn.qkv.weight.detach().double().chunk(3, dim=0)
    wo = attn.proj.weight.detach().double()
    dh = attn.head_dim
    total = 0.0
    for h in range(attn.num_heads):
        s = slice(h * dh, (h + 1) * dh)
        a = torch.linalg.matrix_norm(q[:, s] @ k[:, s].T / math.sqrt(dh), ord=2).item()
        norm_o = torch.linalg.matrix_norm(wo[:, s], ord=2).item()
        norm_v = torch.linalg.matrix_norm(v[:, s], ord=2).item()
        total += norm_o * norm_v * math.sqrt(3 * n + (12 * n + 3) * r**4 * a**2)
    return total


@pytest.mark.parametrize("dim,heads,n,r", [(12, 3, 7, 1.7), (64, 4, 17, 19.4), (48, 1, 5, 0.3)])
def test_paper_mha_bound_batched_over_heads_equals_head_by_head(dim, heads, n, r):
    torch.manual_seed(dim + heads)
    attn = Attention(dim, num_heads=heads, qkv_bias=True).eval()
    with torch.no_grad():  # heads (input columns here) of unequal scales: a mix-up would show
        attn.qkv.weight.mul_(torch.linspace(0.5, 2.0, dim))
        attn.proj.weight.mul_(torch.linspace(2.0, 0.5, dim))
    want = _paper_mha_bound_head_by_head(attn, n, r)
    assert plasticity.paper_mha_bound(attn, n, r) == pytest.approx(want, rel=1e-6, abs=1e-6)
    assert plasticity.paper_mha_bound(attn, n) == pytest.approx(
        _paper_mha_bound_head_by_head(attn, n, plasticity.PAPER_RADIUS), rel=1e-6
    )
