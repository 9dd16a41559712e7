"""Plasticity of ViT components: measured ratios, theoretical bounds, one streaming probe.

For a component f and pairs (x, y), x from the pretraining distribution and y from the
downstream test split:

    P(f) = E ||f(x) - f(y)||_F / ||x - y||_F        (Frobenius over tokens x features)

measured for LN1, MHA, LN2, FC1 and FC2 of every block of a timm VisionTransformer or of a
Hugging Face GPT-2 (``raystudy.models.gpt2``; x and y are then token-id sequences), in two modes:

- ``shared`` (the paper's): every component gets the embedding output E(x) (FC2 gets it
  zero-padded to its input width); the denominator is ||E(x) - E(y)||_F. GPT-2's E(x) is
  wte(x) + wpe(positions), and its attention runs causally, as in the model.
- ``in_situ``: each component gets the tensor that really enters it in the forward pass
  (forward hooks on one pass over ``cat([x, y])``); the denominator is the distance between
  those inputs.

Pairs stream in batches and every statistic is a running one, so memory does not grow with the
number of pairs. Rows come back per (mode, layer, component) with mean, std, n and the
theoretical bound; ``to_frame`` turns them into the tidy table. The interval of the mean is the
analysis's (``analysis.stats.pooling.t_interval``), from mean, std and n: a worker needs no scipy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from raystudy.models import architectures
from raystudy.models.architectures import PROBE_COMPONENTS
from raystudy.models.components import PAIRINGS

MODES = ("shared", "in_situ")
COLUMNS = ("model", "dataset", "mode", "layer", "component", "mean", "std", "n", "bound", "pairing")


class ProbeError(ValueError):
    """Bad probe input (mode, component, model, pairs): one line naming the value and the choices."""


# ---------------------------------------------------------------- names


def check_modes(mode: str | Sequence[str]) -> tuple[str, ...]:
    """Modes as a tuple in canonical order; ``"both"`` means every mode.

    >>> check_modes("both")
    ('shared', 'in_situ')
    """
    names = [mode] if isinstance(mode, str) else list(mode)
    out = []
    for m in names:
        if m == "both":
            out.extend(MODES)
        elif m in MODES:
            out.append(m)
        else:
            raise ProbeError(f"unknown mode {m!r}; valid: {', '.join(MODES)}, both")
    if not out:
        raise ProbeError(f"no mode given; valid: {', '.join(MODES)}, both")
    return tuple(m for m in MODES if m in out)


def check_components(names: str | Iterable[str]) -> tuple[str, ...]:
    """Component names (a comma-separated string or a sequence), upper-cased, in table order."""
    items = names.split(",") if isinstance(names, str) else list(names)
    out = set()
    for c in items:
        key = str(c).strip().upper()
        if key not in PROBE_COMPONENTS:
            raise ProbeError(f"unknown component {str(c).strip()!r}; valid: {', '.join(PROBE_COMPONENTS)}")
        out.add(key)
    if not out:
        raise ProbeError(f"no component given; valid: {', '.join(PROBE_COMPONENTS)}")
    return tuple(c for c in PROBE_COMPONENTS if c in out)


def unwrap_vit(model: nn.Module) -> nn.Module:
    """The model of a known family (``raystudy.models.architectures``: a timm VisionTransformer or
    raystudy's GPT-2 classifier) inside ``model``, DDP and torch.compile wrappers removed."""
    inner = model
    for _ in range(4):  # DDP(compile(model)) and the like
        wrapped = [getattr(inner, a, None) for a in ("module", "_orig_mod")]
        wrapped = [w for w in wrapped if isinstance(w, nn.Module)]
        if not wrapped:
            break
        inner = wrapped[0]
    if architectures.of_model(inner) is None:
        first, *others = architectures.ARCHITECTURES.values()
        raise ProbeError(
            f"the plasticity probe needs {first.title}, got {type(inner).__name__} (or "
            + ", ".join(a.title for a in others)
            + "); its components are "
            + "; ".join(
                f"{a.blocks}.*.{', '.join(a.module_paths.values())}" for a in architectures.ARCHITECTURES.values()
            )
        )
    return inner


def block_module(block: nn.Module, component: str, paths: dict[str, str]) -> nn.Module:
    """The module of ``component`` in a block, by the family's ``paths`` (``MHA`` -> ``block.attn``)."""
    mod = block
    for part in paths[component].split("."):
        mod = getattr(mod, part, None)
        if mod is None:
            raise ProbeError(
                f"block {type(block).__name__} has no {paths[component]} "
                f"(component {component}); the probe needs timm's standard ViT blocks "
                "or GPT-2's"
            )
    return mod


# ---------------------------------------------------------------- measurement


def pair_norms(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-sample Frobenius norm of ``a - b`` over every dimension but the first."""
    return torch.linalg.vector_norm((a - b).flatten(1), dim=1)


def ratios(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``num / den`` with NaN where ``den`` is 0: a pair with x = y has no ratio and is skipped."""
    return torch.where(den > 0, num / torch.where(den > 0, den, 1.0), float("nan"))


class RunningStats:
    """Count, mean and M2 of a stream of values, in float64 on the values' device.

    Batches merge with Chan et al.'s parallel update (Welford for blocks), written with masks
    instead of indexing so a GPU never waits for the host; NaNs are skipped.
    """

    def __init__(self, device: torch.device | str | None = None):
        dev = torch.device(device) if device is not None else torch.device("cpu")
        if dev.type == "mps":  # no float64 there
            dev = torch.device("cpu")
        self.device = dev
        self.count = torch.zeros((), dtype=torch.float64, device=dev)
        self.mean = torch.zeros((), dtype=torch.float64, device=dev)
        self.m2 = torch.zeros((), dtype=torch.float64, device=dev)

    def update(self, values: torch.Tensor) -> None:
        """Add a batch of values (any shape); NaNs are ignored."""
        v = values.detach().reshape(-1).to(self.device, torch.float64)
        ok = ~torch.isnan(v)
        nb = ok.sum().to(torch.float64)
        mean_b = torch.where(ok, v, 0.0).sum() / nb.clamp(min=1.0)
        m2_b = torch.where(ok, v - mean_b, 0.0).square().sum()
        n = self.count + nb
        delta = mean_b - self.mean
        self.mean = self.mean + delta * nb / n.clamp(min=1.0)
        self.m2 = self.m2 + m2_b + delta.square() * self.count * nb / n.clamp(min=1.0)
        self.count = n

    def result(self) -> dict[str, float]:
        """mean, std (ddof 1) and n (NaN where undefined): what an interval of the mean needs."""
        n = int(self.count.item())
        mean = self.mean.item() if n else float("nan")
        std = math.sqrt(max(self.m2.item(), 0.0) / (n - 1)) if n > 1 else float("nan")
        return {"mean": mean, "std": std, "n": n}


class Scratch:
    """Reused buffers for the probe's elementwise work.

    On a CPU every fresh activation-sized tensor comes as fresh pages from the OS (page faults,
    zeroing) that cost more than the subtraction written into it: measured on ViT-S, reusing a
    few buffers more than halves the time of the probe's subtractions. Harmless on a GPU.
    """

    def __init__(self, max_buffers: int = 8):
        self._bufs: dict[tuple, torch.Tensor] = {}
        self.max_buffers = max_buffers

    def like(self, t: torch.Tensor) -> torch.Tensor:
        """An uninitialised buffer of ``t``'s shape, dtype and device, reused across calls."""
        key = (tuple(t.shape), t.dtype, t.device)
        buf = self._bufs.get(key)
        if buf is None:
            if len(self._bufs) >= self.max_buffers:  # e.g. a last, smaller batch: start over
                self._bufs.clear()
            buf = self._bufs[key] = torch.empty(t.shape, dtype=t.dtype, device=t.device)
        return buf

    def diff_norms(self, t: torch.Tensor, b: int) -> torch.Tensor:
        """``pair_norms(t[:b], t[b:])`` without allocating the difference."""
        d = torch.sub(t[:b], t[b:], out=self.like(t[:b]))
        return torch.linalg.vector_norm(d.flatten(1), dim=1)


def token_sigma_min(t: torch.Tensor, eps: float = 0.0, scratch: Scratch | None = None) -> torch.Tensor:
    """Smallest per-token sqrt(var + eps) over the last dimension, as a 0-d tensor.

    Two passes (mean, then the norm of the centred token): as exact as ``var`` and several
    times faster than ``torch.var`` over the last dimension on a CPU.
    """
    t = t.detach()
    mu = t.mean(dim=-1, keepdim=True)
    centred = torch.sub(t, mu, out=scratch.like(t)) if scratch is not None else t - mu
    var = torch.linalg.vector_norm(centred, dim=-1).square() / t.shape[-1]
    return (var + eps).sqrt().min()


class InputStats:
    """What the bounds need of the data entering a component, as running device tensors.

    ``sigma_min``: smallest per-token sqrt(var + eps) (LayerNorm's own convention);
    ``r``: RMS token norm; ``n``: sequence length.
    """

    def __init__(self, device: torch.device | str | None = None, eps: float = 0.0):
        dev = RunningStats(device).device
        self.eps = eps
        self.sigma_min = torch.full((), float("inf"), dtype=torch.float64, device=dev)
        self.sq_sum = torch.zeros((), dtype=torch.float64, device=dev)
        self.tokens = 0
        self.n = 0

    def update_sigma(self, t: torch.Tensor, scratch: Scratch | None = None) -> None:
        """Fold the smallest per-token sqrt(var + eps) of ``t`` into ``sigma_min``."""
        sigma = token_sigma_min(t, self.eps, scratch)
        self.sigma_min = torch.minimum(self.sigma_min, sigma.to(self.sigma_min))

    def update_radius(self, t: torch.Tensor) -> None:
        """Add ``t``'s squared norm and token count to the RMS token norm; record its sequence length."""
        # the norm in the activation's own precision (at least fp32), the running sum in float64:
        # no float64 copy of a large activation
        t = t.detach()
        sq = torch.linalg.vector_norm(t.float() if t.element_size() < 4 else t).to(self.sq_sum).square()
        self.sq_sum = self.sq_sum + sq
        self.tokens += t[..., 0].numel()
        self.n = t.shape[-2]

    @property
    def r(self) -> float:
        """RMS token norm of everything seen (NaN before any update)."""
        return math.sqrt(self.sq_sum.item() / self.tokens) if self.tokens else float("nan")


# ---------------------------------------------------------------- bounds


def effective_weight(linear: nn.Module) -> torch.Tensor:
    """A linear layer's weight (out, in), with any unmerged active peft LoRA delta added."""
    base = getattr(linear, "base_layer", None)
    if base is None:
        return linear.weight
    w = base.weight
    if getattr(linear, "disable_adapters", False):
        return w
    merged = set(getattr(linear, "merged_adapters", []))
    for name in getattr(linear, "active_adapters", []):
        if name in getattr(linear, "lora_A", {}) and name not in merged:
            w = w + linear.get_delta_weight(name)
    return w


def _as64(w: torch.Tensor) -> torch.Tensor:
    w = w.detach()
    return w.cpu().double() if w.device.type == "mps" else w.double()


def spectral_norm(w: torch.Tensor) -> float:
    """Largest singular value of a matrix, in float64.

    Same value as ``torch.linalg.matrix_norm(w, ord=2)``, through the eigenvalues of the smaller
    Gram matrix: several times faster than an SVD of an (hidden x dim) weight, which matters
    for ViT-H's 64 MLP linears on a CPU; in float64 the top eigenvalue loses nothing.
    """
    w = _as64(w)
    gram = w.T @ w if w.shape[0] >= w.shape[1] else w @ w.T
    return math.sqrt(max(torch.linalg.eigvalsh(gram)[-1].item(), 0.0))


def linear_bound(linear: nn.Module) -> float:
    """P of a linear layer never exceeds ||W||_2 (the bias cancels in f(x) - f(y))."""
    return spectral_norm(effective_weight(linear))


def layernorm_bound(ln: nn.Module, inputs: torch.Tensor | float) -> float:
    """||γ||_∞ / σ_min for a LayerNorm; ``inputs`` are tensors (..., d) or σ_min itself.

    σ_min is the smallest per-token sqrt(var + eps) over the inputs (LayerNorm's own eps). The
    bound holds pair by pair: lifting a centred token u to (u, sqrt(d eps)) makes LayerNorm a
    radial projection, and ||u/|u| - v/|v||| <= |u - v| / sqrt(|u||v|). NaN for norms other
    than nn.LayerNorm (RMSNorm's σ is not a standard deviation).
    """
    if not isinstance(ln, nn.LayerNorm):
        return float("nan")
    if isinstance(inputs, torch.Tensor):
        stats = InputStats(inputs.device, eps=ln.eps)
        stats.update_sigma(inputs)
        sigma_min = stats.sigma_min.item()
    else:
        sigma_min = float(inputs)
    gamma = 1.0 if ln.weight is None else ln.weight.detach().abs().max().item()
    return gamma / sigma_min if sigma_min > 0 else float("inf")


def head_weights(attn: nn.Module) -> tuple[torch.Tensor, ...]:
    """(W_Q, W_K, W_V, W_O) of every head of a timm Attention, in float64, stacked over heads:
    (heads, d_h, dim) for W_Q, W_K, W_V (nn.Linear's (out, in) layout) and (heads, dim, d_h) for W_O.

    qkv.weight is (3 * heads * d_h, dim) laid out [q; k; v], so a head's W_Q, W_K, W_V are row
    slices (d_h, dim); its W_O is a column slice (dim, d_h) of proj.weight.
    """
    heads, dh = attn.num_heads, attn.head_dim
    q, k, v = _as64(effective_weight(attn.qkv)).reshape(3, heads, dh, -1).unbind(0)
    wo = _as64(effective_weight(attn.proj)).reshape(-1, heads, dh).transpose(0, 1)
    return q, k, v, wo


def mha_bound(attn: nn.Module, n: int, r: float) -> float:
    """Σ_h ||W_O^h||_2 ||W_V^h||_2 sqrt(3n + (12n+3) r⁴ ||W_Q^h W_K^hᵀ / √d_h||_2²).

    n: sequence length; r: RMS token norm of the data entering the attention. In the maths
    convention (tokens as rows, x W) the logits are x W_Q W_Kᵀ xᵀ; with nn.Linear's (out, in)
    weights that matrix is W_Qᵀ W_K (dim x dim). Biases are left out, as in the proposition.
    NaN for attentions the proposition does not cover (qk-norm, gating, fused variants, and
    GPT-2's causal attention).
    """
    plain = (
        hasattr(attn, "qkv")
        and hasattr(attn, "proj")
        and hasattr(attn, "num_heads")
        and isinstance(getattr(attn, "q_norm", nn.Identity()), nn.Identity)
        and isinstance(getattr(attn, "k_norm", nn.Identity()), nn.Identity)
        and isinstance(getattr(attn, "norm", nn.Identity()), nn.Identity)
        and getattr(attn, "gate", None) is None
    )
    if not plain or not math.isfinite(r):
        return float("nan")
    # Every head at once, as batched (heads x d_h x d_h) problems read back once: head by head, a GPU
    # pays a launch and a host sync for each of about five small factorisations per head.
    wq, wk, wv, wo = head_weights(attn)
    dh = wq.shape[1]
    # ||W_Qᵀ W_K||_2 through thin QRs of W_Qᵀ and W_Kᵀ: a (d_h x d_h) problem, not (dim x dim).
    ra = torch.linalg.qr(wq.mT, mode="r").R
    rb = torch.linalg.qr(wk.mT, mode="r").R
    a = torch.linalg.matrix_norm(ra @ rb.mT, ord=2) / math.sqrt(dh)
    norm_o = torch.linalg.eigvalsh(wo.mT @ wo)[:, -1].clamp(min=0).sqrt()  # wo^h: (dim, d_h)
    norm_v = torch.linalg.eigvalsh(wv @ wv.mT)[:, -1].clamp(min=0).sqrt()  # wv^h: (d_h, dim)
    terms = norm_o * norm_v * torch.sqrt(3 * n + (12 * n + 3) * r**4 * a.square())
    return math.fsum(terms.tolist())


# ---------------------------------------------------------------- the paper's bounds
# The reference's bounds figure (apps/plots/theory.py), for reproducing it: its LayerNorm bound
# is the signed max of γ with no 1/σ_min (:128-136), its heads slice W_Q, W_K, W_V by input
# columns (:201-206), and r is one radius for every dataset (:221, :249). raystudy's are the sound
# ones (``layernorm_bound``, ``head_weights``, r measured per probe); these are named apart.
BOUNDS = ("raystudy", "paper")
PAPER_RADIUS = 19.4  # the reference's r: CIFAR-10's mean per-image RMS token norm (theory.py:99-106)


def paper_layernorm_bound(ln: nn.Module) -> float:
    """The reference's LayerNorm 'bound': max γ, signed, not divided by σ_min."""
    return 1.0 if getattr(ln, "weight", None) is None else ln.weight.detach().max().item()


def paper_mha_bound(attn: nn.Module, n: int, r: float = PAPER_RADIUS) -> float:
    """The reference's MHA bound: ``mha_bound``'s formula with each head's Q, K, V sliced by the
    input columns of the (out, in) weights, W_O by its columns, and a fixed ``r``."""
    if not (hasattr(attn, "qkv") and hasattr(attn, "proj")):
        return float("nan")
    heads, dh = attn.num_heads, attn.head_dim
    # Each head's input columns, as (heads, dim, d_h) stacks: one batched computation and one
    # read-back for every head, as ``mha_bound`` (head by head, a GPU syncs for each).
    q, k, v = (w.reshape(w.shape[0], heads, dh).transpose(0, 1) for w in _as64(effective_weight(attn.qkv)).chunk(3))
    wo = _as64(effective_weight(attn.proj))
    wo = wo.reshape(wo.shape[0], heads, dh).transpose(0, 1)
    # ||Q_h K_hᵀ||_2 through thin QRs of Q_h and K_h: a (d_h x d_h) problem, not (dim x dim).
    rq, rk = torch.linalg.qr(q, mode="r").R, torch.linalg.qr(k, mode="r").R
    a = torch.linalg.matrix_norm(rq @ rk.mT, ord=2) / math.sqrt(dh)
    norm_o = torch.linalg.eigvalsh(wo.mT @ wo)[:, -1].clamp(min=0).sqrt()
    norm_v = torch.linalg.eigvalsh(v.mT @ v)[:, -1].clamp(min=0).sqrt()
    terms = norm_o * norm_v * torch.sqrt(3 * n + (12 * n + 3) * r**4 * a.square())
    return math.fsum(terms.tolist())


# ---------------------------------------------------------------- the probe


def embed(vit: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """E(x): the tokens that enter the first block of an unwrapped ViT or GPT-2, by its family's
    record (ViT: patches, prefix tokens, positions; GPT-2: token plus position embeddings)."""
    return architectures.of_model(vit).embed(vit, x)


def _width(mod: nn.Module) -> int | None:
    """Input width of a linear layer: nn.Linear's in_features, or Conv1D's nx."""
    return getattr(mod, "in_features", None) or getattr(mod, "nx", None)


def _tensor(out):
    """A component's output tensor: GPT-2's attention returns (output, weights)."""
    return out[0] if isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor) else out


class _Site:
    """Running measurements of one (mode, layer, component)."""

    def __init__(self, device: torch.device, eps: float = 0.0):
        self.stats = RunningStats(device)
        self.inputs = InputStats(device, eps)


class _Probe:
    """Accumulators for every (mode, layer, component), and the per-batch work of each mode."""

    def __init__(self, vit: nn.Module, modes: tuple[str, ...], comps: tuple[str, ...], device, bounds="raystudy"):
        self.vit, self.modes, self.comps, self.device, self.bounds = vit, modes, comps, device, bounds
        self.arch = architectures.of_model(vit)
        self.paths = self.arch.module_paths
        self.mods = [{c: block_module(b, c, self.paths) for c in comps} for b in vit.blocks]
        self.sites = {
            (m, i, c): _Site(device, getattr(mods[c], "eps", 0.0))
            for m in modes
            for i, mods in enumerate(self.mods)
            for c in comps
        }
        self.shared_inputs = InputStats(device)  # E(x), E(y): the data entering every component
        self.scratch = Scratch()
        self._last: tuple[torch.Tensor, torch.Tensor] | None = None

    # -- shared: every component of every block on E(x) and E(y), as one batch of 2B
    def shared(self, xy: torch.Tensor, b: int) -> None:
        """Every component of every block on E(x) and E(y) (the paper's mode), for one batch."""
        e = self.arch.embed(self.vit, xy)
        den = self.scratch.diff_norms(e, b)
        self.shared_inputs.update_radius(e)
        padded: dict[int, torch.Tensor] = {}  # E zero-padded to FC2's width, once per batch
        sigma: dict[float, torch.Tensor] = {}  # σ_min of E depends only on the LayerNorm's eps
        mask = self.arch.attention_mask(e.shape[1], e.dtype, e.device)  # once per batch
        for i, mods in enumerate(self.mods):
            for c, mod in mods.items():
                site = self.sites[("shared", i, c)]
                if c == "FC2":
                    width = _width(mod)
                    if width is None:
                        raise ProbeError(
                            f"block {i}'s {self.paths[c]} is a {type(mod).__name__}, not a "
                            "linear layer; shared mode pads E(x) to its input width"
                        )
                    if width not in padded:
                        padded[width] = F.pad(e, (0, width - e.shape[-1]))
                    out = mod(padded[width])
                elif c == "MHA":
                    out = self.arch.attend(mod, e, mask)
                else:
                    out = mod(e)
                site.stats.update(ratios(self.scratch.diff_norms(out, b), den))
                if c in ("LN1", "LN2"):
                    eps = site.inputs.eps
                    if eps not in sigma:
                        sigma[eps] = token_sigma_min(e, eps, self.scratch)
                    site.inputs.sigma_min = torch.minimum(site.inputs.sigma_min, sigma[eps].to(site.inputs.sigma_min))
                del out  # one component output alive at a time

    # -- in situ: one forward over cat([x, y]); hooks measure what really enters each component
    def in_situ(self, xy: torch.Tensor, b: int) -> None:
        """Every component on the tensor that really enters it in one forward over ``xy``, for one batch."""
        handles = [
            mod.register_forward_hook(self._hook(i, c, b))
            for i, mods in enumerate(self.mods)
            for c, mod in mods.items()
        ]
        try:
            self.vit.forward_features(xy)
        finally:
            for h in handles:
                h.remove()
            self._last = None

    def _norms(self, t: torch.Tensor, b: int) -> torch.Tensor:
        # LN1's output is the very tensor MHA receives (LN2's, FC1's): measure it once.
        if self._last is not None and self._last[0] is t:
            return self._last[1]
        n = self.scratch.diff_norms(t, b)
        self._last = (t, n)
        return n

    def _hook(self, i: int, c: str, b: int):
        site = self.sites[("in_situ", i, c)]

        def hook(module, args, out):
            out = _tensor(out)
            if not args or not isinstance(args[0], torch.Tensor) or not isinstance(out, torch.Tensor):
                raise ProbeError(
                    f"block {i}'s {self.paths[c]} does not map a tensor to a tensor; "
                    "in_situ mode needs timm's standard ViT blocks or GPT-2's"
                )
            inp = args[0]
            den = self._norms(inp, b)
            site.stats.update(ratios(self._norms(out, b), den))
            if c in ("LN1", "LN2"):
                site.inputs.update_sigma(inp, self.scratch)
            elif c == "MHA":
                site.inputs.update_radius(inp)

        return hook

    def rows(self) -> list[dict]:
        """One row per (mode, layer, component): the running statistics and the theoretical bound."""
        linear = {}
        out = []
        for (m, i, c), site in self.sites.items():
            mod = self.mods[i][c]
            if c in ("FC1", "FC2"):
                if (i, c) not in linear:
                    linear[(i, c)] = linear_bound(mod)
                bound = linear[(i, c)]
            elif c in ("LN1", "LN2"):
                paper = self.bounds == "paper"
                bound = paper_layernorm_bound(mod) if paper else layernorm_bound(mod, site.inputs.sigma_min.item())
            else:
                data = self.shared_inputs if m == "shared" else site.inputs
                bound = paper_mha_bound(mod, data.n) if self.bounds == "paper" else mha_bound(mod, data.n, data.r)
            out.append({"mode": m, "layer": i, "component": c, **site.stats.result(), "bound": bound})
        return out


def probe(
    model: nn.Module,
    pairs: Iterable[tuple[torch.Tensor, torch.Tensor]],
    mode: str | Sequence[str] = "shared",
    components: str | Sequence[str] = PROBE_COMPONENTS,
    bounds: str = "raystudy",
) -> list[dict]:
    """Plasticity of each (layer, component) of a timm ViT or GPT-2 over a stream of (x, y) batches
    (images, or token ids of equal length for GPT-2).

    ``mode`` is ``"shared"``, ``"in_situ"``, ``"both"`` or a sequence of modes; several modes
    share one pass over ``pairs`` (each batch is loaded once). Each mode costs about one forward
    over the 2B images of a batch. The model runs in eval mode, without autocast, in its own
    dtype (the engine keeps fp32 weights), on its own device; its training flag is restored.

    Returns one row per (mode, layer, component), layers numbered like ``blocks.{i}``: mean, std,
    n (pairs with x != y) and bound (the theoretical bound, computed from the weights and the
    data that entered the component; ``bounds="paper"``: the reference's, ``paper_*_bound``).
    """
    modes, comps = check_modes(mode), check_components(components)
    if bounds not in BOUNDS:
        raise ProbeError(f"unknown bounds {bounds!r}; valid: {', '.join(BOUNDS)}")
    vit = unwrap_vit(model)
    param = next(vit.parameters())
    device, dtype = param.device, param.dtype
    state = _Probe(vit, modes, comps, device, bounds)
    was_training = vit.training
    vit.eval()
    seen = 0
    try:
        with torch.no_grad(), torch.autocast(device.type, enabled=False):
            for x, y in pairs:
                if x.shape != y.shape:
                    raise ProbeError(f"x and y batches differ in shape: {tuple(x.shape)} vs {tuple(y.shape)}")
                b = x.shape[0]
                # images in the model's dtype; token ids stay integers
                xy = torch.cat([x, y]).to(device, dtype if x.is_floating_point() else torch.long, non_blocking=True)
                for m in modes:
                    getattr(state, m)(xy, b)
                seen += b
    finally:
        vit.train(was_training)
    if seen == 0:
        raise ProbeError("no pairs to probe: the pairs iterable was empty")
    return state.rows()


# ---------------------------------------------------------------- pairs


def _draw(rng: np.random.Generator, size: int, n: int) -> np.ndarray:
    """n indices of range(size): fresh permutations back to back (no repeat before all are used)."""
    reps = -(-n // size)
    return np.concatenate([rng.permutation(size) for _ in range(reps)])[:n]


def image_of(ds, i: int) -> torch.Tensor:
    """The image tensor of item ``i`` of a dataset of ``(image, label)`` items (or of images)."""
    item = ds[i]
    img = item[0] if isinstance(item, (tuple, list)) else item
    if not isinstance(img, torch.Tensor):
        raise ProbeError(
            f"dataset items must be image tensors (C, H, W), got {type(img).__name__}; "
            "build the datasets with their eval transform"
        )
    return img


def pairs_from_datasets(
    source_ds, target_ds, n_pairs: int, batch_size: int, seed: int = 0, num_workers: int = 0, pairing: str = "random"
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Stream ``n_pairs`` (x, y) pairs in batches: x from ``source_ds``, y from ``target_ds``.

    ``random``: indices are seeded permutations (with ``seed``), so the same call gives the same
    pairs. ``sequential``: each dataset read in its own order in whole batches, cycled when it runs
    out (``sequential_indices``), the paper's measurement (ImageNet val in class-folder order with
    the downstream test split); ``seed`` is unused. Shapes are checked here, before any batch is
    loaded: a ValueError (ProbeError) names both.
    """
    if pairing not in PAIRINGS:
        raise ProbeError(f"unknown pairing {pairing!r}; valid: {', '.join(PAIRINGS)}")
    if n_pairs < 1:
        raise ProbeError(f"number of pairs must be >= 1, got {n_pairs}")
    if batch_size < 1:
        raise ProbeError(f"batch size must be >= 1, got {batch_size}")
    if len(source_ds) == 0 or len(target_ds) == 0:
        raise ProbeError("source and target datasets must not be empty")
    sx, sy = tuple(image_of(source_ds, 0).shape), tuple(image_of(target_ds, 0).shape)
    if sx != sy:
        raise ProbeError(
            f"image sizes differ: source {sx} vs target {sy}; both must be built at the model's input size"
        )
    if pairing == "sequential":
        ix = sequential_indices(len(source_ds), n_pairs, batch_size, "source")
        iy = sequential_indices(len(target_ds), n_pairs, batch_size, "target")
    else:
        rng = np.random.default_rng(seed)
        ix, iy = _draw(rng, len(source_ds), n_pairs), _draw(rng, len(target_ds), n_pairs)
    return _stream(source_ds, target_ds, ix, iy, batch_size, num_workers)


def sequential_indices(n_images: int, n_pairs: int, batch_size: int, which: str = "split") -> np.ndarray:
    """Image indices of ``n_pairs`` sequential pairs from a split of ``n_images``, as the paper reads them.

    The reference code's loaders are unshuffled, drop the last partial batch and start again when
    they run out (``make_iterable`` cycles them), so pair k is image
    ``(k // batch_size mod full_batches) * batch_size + k mod batch_size``: a split smaller than
    the pair count is read again from its start, and its last partial batch is never read.
    """
    full = n_images // batch_size
    if full == 0:
        raise ProbeError(
            f"sequential pairing reads whole batches of {batch_size} images (the last partial "
            f"batch is dropped, as the paper's loaders do), but the {which} split holds "
            f"{n_images}; use a probe batch size of at most {n_images}"
        )
    k = np.arange(n_pairs)
    return (k // batch_size) % full * batch_size + k % batch_size


def _stream(source_ds, target_ds, ix, iy, batch_size, num_workers):
    from torch.utils.data import DataLoader

    def loader(ds, idx):
        return DataLoader(ds, batch_size=batch_size, sampler=idx.tolist(), num_workers=num_workers)

    for bx, by in zip(loader(source_ds, ix), loader(target_ds, iy)):
        x = bx[0] if isinstance(bx, (tuple, list)) else bx
        y = by[0] if isinstance(by, (tuple, list)) else by
        yield x, y


# ---------------------------------------------------------------- the tidy table


def to_frame(rows: Iterable[dict], **constants) -> pd.DataFrame:  # noqa: F821
    """The tidy table: one row per (model, dataset, mode, layer, component).

    ``constants`` fill columns the rows lack (``model="vit_base", dataset="cifar100"``) or add
    new ones (``stage="after_finetune"``); the columns of ``COLUMNS`` come first.
    """
    import pandas as pd

    df = pd.DataFrame([{**constants, **r} for r in rows])
    for col in COLUMNS:
        if col not in df:
            df[col] = constants.get(col, "" if col in ("model", "dataset", "pairing") else np.nan)
    extra = [c for c in df.columns if c not in COLUMNS]
    df = df[list(COLUMNS) + extra]
    return df.astype({"layer": int, "n": int})


def probe_model(
    model: nn.Module,
    source_ds,
    target_ds,
    *,
    n_pairs: int,
    batch_size: int,
    modes: str | Sequence[str] = MODES,
    seed: int = 0,
    model_name: str = "",
    dataset_name: str = "",
    components: str | Sequence[str] = PROBE_COMPONENTS,
    num_workers: int = 0,
    tags: dict | None = None,
    pairing: str = "random",
    bounds: str = "raystudy",
) -> pd.DataFrame:  # noqa: F821
    """Probe an already built model (any device) on (x, y) pairs; returns the tidy table.

    x from ``source_ds`` (pretraining-like), y from ``target_ds`` (downstream test split), both
    datasets of image tensors at the model's input size. All modes share one pass over the pairs.
    ``tags`` adds constant columns (``{"stage": "after_finetune", "run_id": ...}``).
    """
    pairs = pairs_from_datasets(
        source_ds, target_ds, n_pairs, batch_size, seed, num_workers=num_workers, pairing=pairing
    )
    rows = probe(model, pairs, mode=modes, components=components, bounds=bounds)
    return to_frame(rows, model=model_name, dataset=dataset_name, pairing=pairing, **(tags or {}))
