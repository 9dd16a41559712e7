"""GPT-2: components over Hugging Face's names, plasticity probes checked against a hand
computation, token files, and a finetuning condition through the engine (tiny, random init)."""

import functools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from raystudy.commands import components as components_command
from raystudy.data.sources.tokens import TOKEN_LEN, rule_tokens
from raystudy.data.splits import build_splits
from raystudy.errors import ConfigError
from raystudy.measure import plasticity
from raystudy.models import components as C
from raystudy.models import gpt2, registry
from raystudy.train import engine
from raystudy.train.config import FinetuneConfig, validate
from raystudy.train.plan import resolve


def tiny(seed=0, num_classes=4):
    """gpt2_tiny in float64, eval mode, every parameter random (HF zero-inits biases)."""
    torch.manual_seed(seed)
    model = registry.create_model("gpt2_tiny", num_classes).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.3 * torch.randn_like(p))
            elif ".ln_" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            else:  # embeddings large enough that LayerNorm's eps does not dominate
                p.mul_(10.0 if name.endswith(("wte.weight", "wpe.weight")) else 1.0)
    return model


def tokens(n, length, seed):
    return torch.randint(0, 256, (n, length), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- components


def test_gpt2_sizes_partition_into_exactly_one_component_each():
    with torch.device("meta"):  # the real 124M sizes without allocating them
        model = registry.create_model("gpt2", 100, pretrained=False)
    groups = C.partition(model)
    names = [n for ns in groups.values() for n in ns]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())
    counts = C.component_counts(model)
    # per block: c_attn 768x2304 + 2304, c_proj 768x768 + 768 (= ViT-B's qkv + proj)
    assert counts["MHA"] == 12 * (768 * 2304 + 2304 + 768 * 768 + 768) == 28_348_416
    assert counts["FC1"] == 12 * (768 * 3072 + 3072)
    assert counts["FC2"] == 12 * (3072 * 768 + 768)
    assert counts["LN1"] == counts["LN2"] == 12 * 2 * 768
    assert counts["EMBED"] == 50257 * 768 + 1024 * 768
    assert counts["HEAD"] == 2 * 768 + 768 * 100 + 100
    assert sum(counts.values()) - counts["HEAD"] + 2 * 768 == 124_439_808  # GPT-2 small's body
    assert groups["HEAD"] == ["transformer.ln_f.weight", "transformer.ln_f.bias", "head.weight", "head.bias"]
    assert set(groups["MHA"]) >= {"transformer.h.11.attn.c_attn.weight", "transformer.h.0.attn.c_proj.bias"}
    assert "transformer.h.3.mlp.c_proj.weight" in groups["FC2"]


def test_a_bare_gpt2_model_partitions_too():
    with torch.device("meta"):
        body = registry.create_model("gpt2_tiny", 2).transformer
    groups = C.partition(body)
    assert groups["EMBED"] == ["wte.weight", "wpe.weight"] and groups["HEAD"] == ["ln_f.weight", "ln_f.bias"]


def test_components_cli_prints_gpt2_counts(capsys):
    assert components_command.main(["--model", "gpt2_tiny", "--conditions", "MHA,full,lora"]) == 0
    out = capsys.readouterr().out
    model = registry.create_model("gpt2_tiny", 100)
    total = sum(p.numel() for p in model.parameters())
    assert f"gpt2_tiny: {total:,} parameters" in out
    mha = sum(p.numel() for n, p in model.named_parameters() if ".attn." in n)
    assert f"{'MHA':<14}{mha:>14,}" in out
    # LoRA on GPT-2's Conv1D attention: rank 8 over c_attn (32 -> 96) and c_proj (32 -> 32)
    head = sum(p.numel() for n, p in model.named_parameters() if n.startswith(("head.", "transformer.ln_f")))
    assert f"{'lora':<14}{2 * 8 * (32 + 96 + 32 + 32) + head:>14,}" in out


def test_lora_on_gpt2_trains_only_adapters_and_starts_as_the_identity():
    model = tiny()
    x = tokens(3, 10, 1)
    before = model(x)
    C.apply_condition(model, "lora")
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or n.startswith(("head.", "transformer.ln_f")) for n in trainable)
    assert any("attn.c_attn.lora_A" in n for n in trainable)
    assert torch.allclose(model(x), before)  # B starts at zero


# ---------------------------------------------------------------- plasticity


def ref_layer_norm(ln, x):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + ln.eps) * ln.weight + ln.bias


def ref_conv1d(conv, x):
    return x @ conv.weight + conv.bias  # Conv1D: weight is (in, out)


def ref_attention(attn, x, causal=True):
    b, n, d = x.shape
    h = attn.num_heads
    dh = d // h
    q, k, v = (t.reshape(b, n, h, dh).transpose(1, 2) for t in ref_conv1d(attn.c_attn, x).split(d, -1))
    s = q @ k.transpose(-1, -2) / math.sqrt(dh)
    if causal:
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    z = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(b, n, d)
    return ref_conv1d(attn.c_proj, z)


def ref_ratio(f, a, b):
    return torch.linalg.vector_norm((f(a) - f(b)).flatten(1), dim=1) / torch.linalg.vector_norm(
        (a - b).flatten(1), dim=1
    )


@torch.no_grad()
def test_shared_mode_matches_a_hand_computation_with_causal_attention():
    model = tiny()
    x, y = tokens(6, 12, 1), tokens(6, 12, 2)
    rows = {(r["layer"], r["component"]): r for r in plasticity.probe(model, [(x[:4], y[:4]), (x[4:], y[4:])])}
    t = model.transformer
    pos = torch.arange(12)
    ex, ey = t.wte.weight[x] + t.wpe.weight[pos], t.wte.weight[y] + t.wpe.weight[pos]
    for i, block in enumerate(t.h):
        width = block.mlp.c_proj.weight.shape[0]
        refs = {
            "LN1": lambda e: ref_layer_norm(block.ln_1, e),
            "MHA": lambda e: ref_attention(block.attn, e),
            "LN2": lambda e: ref_layer_norm(block.ln_2, e),
            "FC1": lambda e: ref_conv1d(block.mlp.c_fc, e),
            "FC2": lambda e: ref_conv1d(block.mlp.c_proj, F.pad(e, (0, width - e.shape[-1]))),
        }
        for comp, f in refs.items():
            r = ref_ratio(f, ex, ey)
            assert rows[(i, comp)]["mean"] == pytest.approx(r.mean().item(), rel=1e-9), (i, comp)
            assert rows[(i, comp)]["std"] == pytest.approx(r.std().item(), rel=1e-7), (i, comp)
            assert rows[(i, comp)]["n"] == 6
        # the mask matters: attention over all tokens gives another number
        full = ref_ratio(lambda e: ref_attention(block.attn, e, causal=False), ex, ey).mean().item()
        assert abs(full - rows[(i, "MHA")]["mean"]) > 1e-6 * full
        # bounds: LayerNorm's and the linears' hold; causal attention gets none
        for comp in ("LN1", "LN2", "FC1", "FC2"):
            assert rows[(i, comp)]["mean"] <= rows[(i, comp)]["bound"] * (1 + 1e-9)
        assert math.isnan(rows[(i, "MHA")]["bound"])
        w = block.mlp.c_fc.weight  # Conv1D (in, out): its spectral norm is the transpose's
        assert rows[(i, "FC1")]["bound"] == pytest.approx(torch.linalg.matrix_norm(w.T, ord=2).item())


@torch.no_grad()
def test_in_situ_mode_measures_what_enters_each_component_in_the_forward():
    model = tiny()
    x, y = tokens(5, 9, 3), tokens(5, 9, 4)
    rows = {(r["layer"], r["component"]): r for r in plasticity.probe(model, [(x, y)], mode="in_situ")}
    t = model.transformer
    pos = torch.arange(9)
    hx, hy = t.wte.weight[x] + t.wpe.weight[pos], t.wte.weight[y] + t.wpe.weight[pos]
    for i, block in enumerate(t.h):

        def measured(comp, f, a, b):
            return rows[(i, comp)]["mean"] == pytest.approx(ref_ratio(f, a, b).mean().item(), rel=1e-9)

        ln1, ln2 = (lambda h: ref_layer_norm(block.ln_1, h)), (lambda h: ref_layer_norm(block.ln_2, h))
        attn = lambda a: ref_attention(block.attn, a)  # noqa: E731
        fc1, fc2 = (lambda a: ref_conv1d(block.mlp.c_fc, a)), (lambda a: ref_conv1d(block.mlp.c_proj, a))
        assert measured("LN1", ln1, hx, hy)
        ax, ay = ln1(hx), ln1(hy)
        assert measured("MHA", attn, ax, ay)
        hx, hy = hx + attn(ax), hy + attn(ay)
        assert measured("LN2", ln2, hx, hy)
        bx, by = ln2(hx), ln2(hy)
        assert measured("FC1", fc1, bx, by)
        gx, gy = F.gelu(fc1(bx), approximate="tanh"), F.gelu(fc1(by), approximate="tanh")  # gelu_new
        assert measured("FC2", fc2, gx, gy)
        hx, hy = hx + fc2(gx), hy + fc2(gy)


def test_probe_model_streams_token_datasets():
    model = registry.create_model("gpt2_tiny", 4)
    src = build_splits("tokens_random", seed=0, img_size=None, mean=(), std=())
    tgt = build_splits("tokens_rule", seed=0, img_size=None, mean=(), std=())
    df = plasticity.probe_model(model, src.test, tgt.test, n_pairs=10, batch_size=4, modes="shared")
    assert len(df) == 2 * 5 and (df["n"] == 10).all() and df["mean"].gt(0).all()


# ---------------------------------------------------------------- token data


def test_tokens_rule_is_a_learnable_rule_and_fits_every_gpt2():
    ids, labels = rule_tokens()
    assert ids.dtype == torch.int64 and ids.shape == (2000, TOKEN_LEN)
    assert 0 <= int(ids.min()) and int(ids.max()) < min(s["vocab_size"] for s in registry.GPT2_SIZES.values())
    counts = torch.stack([(ids % 4 == c).sum(1) for c in range(4)], 1)
    assert (counts.argmax(1).numpy() == labels).mean() > 0.95  # the planted class is the majority
    assert np.bincount(labels).min() > 400


@pytest.mark.parametrize(
    "make,msg",
    [
        (lambda p: np.save(p, np.zeros((3, 4), dtype=np.float32)), "2-D integer array"),
        (lambda p: np.save(p, np.zeros(4, dtype=np.int64)), "2-D integer array"),
        (lambda p: np.save(p, np.full((3, 4), 256)), "ids in [256, 256]"),
        (lambda p: np.save(p, np.zeros((3, 65), dtype=np.int64)), "sequences of 65 tokens"),
        (lambda p: open(p, "w").write("not numpy"), "cannot be read"),
    ],
)
def test_bad_token_files_say_what_is_wrong(tmp_path, make, msg):
    p = tmp_path / "x.npy"
    make(p)
    with pytest.raises(ConfigError, match=msg.replace("[", r"\[").replace("]", r"\]")):
        gpt2.load_tokens(p, vocab_size=256, max_len=64)


def test_token_files_load_from_npy_and_pt(tmp_path):
    ids = tokens(3, 5, 0)
    np.save(tmp_path / "a.npy", ids.numpy().astype(np.int32))
    torch.save(ids, tmp_path / "b.pt")
    for f in ("a.npy", "b.pt"):
        out = gpt2.load_tokens(tmp_path / f, 256, 64)
        assert out.dtype == torch.int64 and torch.equal(out, ids)


def test_probe_cli_on_a_supplied_token_file(tmp_path, capsys):
    from raystudy.commands import probe

    np.save(tmp_path / "x.npy", tokens(20, TOKEN_LEN, 5).numpy())
    rc = probe.main(
        [
            "--model",
            "gpt2_tiny",
            "--tokens",
            str(tmp_path / "x.npy"),  # y: tokens_rule
            "--pairs",
            "8",
            "--batch-size",
            "4",
            "--mode",
            "shared",
            "--device",
            "cpu",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert f"x: {tmp_path / 'x.npy'}, y: tokens_rule test" in out and "ranking (shared)" in out
    import pandas as pd

    df = pd.read_csv(tmp_path / "out" / "plasticity.csv")
    assert set(df["component"]) == set(plasticity.PROBE_COMPONENTS) and (df["n"] == 8).all()


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["--model", "gpt2_tiny", "--dataset", "digits_c"], "reads token ids"),
        (["--model", "vit_demo", "--tokens", "x.npy"], "--tokens is for GPT-2"),
        (["--model", "gpt2_tiny", "--dataset", "tokens_rule", "--tokens", "SHORT"], "equal sequence length"),
    ],
)
def test_probe_cli_refuses_tokens_that_do_not_fit(tmp_path, capsys, argv, msg):
    from raystudy.commands import probe

    np.save(tmp_path / "short.npy", tokens(4, 7, 0).numpy())
    argv = [str(tmp_path / "short.npy") if a == "SHORT" else a for a in argv]
    assert probe.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0]


# ---------------------------------------------------------------- finetuning


@pytest.fixture()
def fast_config(fast_config):
    """conftest's fast trial on GPT-2's tiny model (random init) and token ids: 4 steps on the CPU."""
    return functools.partial(
        fast_config,
        model="gpt2_tiny",
        pretrained=True,  # FinetuneConfig's default: gpt2_tiny has no weights to load either way
        dataset="tokens_rule",
        steps=4,
        warmup_steps=1,
        batch_size=16,
        eval_every=2,
        log_every=2,
        eval_batch_size=128,
        device="cpu",
        lr=0.1,
    )


def test_a_token_model_and_an_image_dataset_are_refused_before_any_work(fast_config):
    with pytest.raises(ConfigError, match="reads token ids, dataset 'digits_c' does not"):
        validate(fast_config(dataset="digits_c"))
    with pytest.raises(ConfigError, match="reads images, dataset 'tokens_rule' does not"):
        validate(FinetuneConfig(model="vit_demo", dataset="tokens_rule"))
    with pytest.raises(ConfigError, match="reads token ids: use normalization: checkpoint"):
        validate(fast_config(normalization="imagenet"))


def test_mha_condition_trains_only_gpt2_attention_and_the_head(fast_config):
    cfg = fast_config(condition="MHA", probe_pairs=8)
    torch.manual_seed(0)
    model = registry.create_model("gpt2_tiny", 4)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    res = engine.train(resolve(cfg), model=model)
    assert res["status"] == "finished" and 0.0 <= res["test_acc"] <= 1.0
    groups = C.partition(model)
    assert res["trainable_params/MHA"] == sum(before[n].numel() for n in groups["MHA"])
    for comp, names in groups.items():
        for n in names:
            same = torch.equal(before[n], dict(model.named_parameters())[n])
            assert same == (comp not in ("MHA", "HEAD")), (comp, n)
    assert any(not torch.equal(before[n], dict(model.named_parameters())[n]) for n in groups["MHA"])
    # plasticity before and after, from tokens_random (x) and tokens_rule's test split (y)
    comps = {(r["mode"], r["component"]) for r in res["plasticity_after"]}
    assert ("shared", "MHA") in comps and len(res["plasticity_before"]) == len(res["plasticity_after"])


def test_finetune_cli_runs_a_gpt2_condition(tmp_path, capsys, monkeypatch):
    from raystudy.commands import finetune

    monkeypatch.chdir(tmp_path)  # its run goes to the default store, ./mlflow.db: the test's own
    rc = finetune.main(
        [
            "--model",
            "gpt2_tiny",
            "--dataset",
            "tokens_rule",
            "--condition",
            "FC1",
            "--steps",
            "3",
            "--warmup-steps",
            "1",
            "--batch-size",
            "8",
            "--eval-every",
            "3",
            "--device",
            "cpu",
            "--quiet",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "condition FC1" in out and "FC1 8,448" in out and "test acc" in out


# ---------------------------------------------------------------- weights


def test_prefetch_knows_gpt2s_hub_repo_and_that_gpt2_tiny_has_no_weights(tmp_path, monkeypatch, capsys):
    from raystudy.commands import prefetch

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # an empty cache; main() sets both
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(registry, "hub_reachable", lambda *a, **k: pytest.fail("--check touched the network"))
    rc = prefetch.main(["--model", "gpt2_tiny,gpt2", "--check", "--hf-cache", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "local   gpt2_tiny: random init" in out
    assert "missing gpt2 (gpt2): not in the Hugging Face cache" in out


def test_gpt2_without_cache_or_network_names_the_command_that_gets_it(monkeypatch):
    if registry.cached_weights("gpt2") is not None:
        pytest.skip("gpt2's weights are cached on this machine")
    monkeypatch.setattr(registry, "hub_reachable", lambda *a, **k: False)
    with pytest.raises(registry.WeightsUnavailable, match="prefetch --model gpt2"):
        registry.create_model("gpt2", 2)


def test_a_weights_file_loads_into_the_body_and_the_head_stays_fresh(tmp_path):
    src = tiny(seed=1).float()
    torch.save(src.transformer.state_dict(), tmp_path / "body.pt")  # a bare GPT2Model's names
    model = registry.create_model("gpt2_tiny", 7, weights=tmp_path / "body.pt")
    for n, p in src.transformer.state_dict().items():
        assert torch.equal(model.transformer.state_dict()[n], p), n
    assert model.head.out_features == 7


def test_the_papers_linear_probe_runs_on_gpt2_features(fast_config):
    res = engine.train(resolve(fast_config(condition="linear_probe")))
    assert res["status"] == "finished" and res["steps_done"] == 0
    assert res["trainable_params/HEAD"] == 4 * 32 + 4  # 4 classes over width-32 pooled features
    assert 0.0 <= res["test_acc"] <= 1.0
