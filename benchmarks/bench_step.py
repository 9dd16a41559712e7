"""Step time of raystudy's finetuning step: against a hand-written one, per study condition, fed by
its data paths, and (on a GPU) its model FLOPs utilisation and the paper grid's GPU-hours.

    python benchmarks/bench_step.py                    # demo + ViT-B/16 at 224, batch 8: minutes on a CPU
    python benchmarks/bench_step.py --skip-vitb        # the demo only, the quick one
    python benchmarks/bench_step.py --vitb-batch 512 --vitb-reps 5 --inner 5   # on a GPU (H100/H200)

(a) raystudy   engine.train_step (per-component gradient norms, clipping, fused optimizer) against
               a minimal hand-written PyTorch step (model(x) -> cross-entropy -> backward ->
               clip_grad_norm_ -> optimizer.step) on the same model, batch and optimizer.
(b) conditions the step under each of the paper's seven conditions, and its ratio to full finetuning.
(c) data       a full step fed by the real data path (the tensor cache, augmented on the device;
               torchvision's per-image DataLoader for reference) against the same step fed a batch
               already on the device.
(d) GPU        MFU of ViT-B full finetuning fed by the data path, against the measured bf16 matmul
               rate, and the projected GPU-hours of the paper's main grid (search_spaces/paper.yaml)
               from the measured step time of each condition. Without a GPU: the grid's analytic
               FLOPs and what they cost at a given MFU, labelled as a projection, not a measurement.
Random weights throughout (speed does not depend on them). Variants of one comparison run
interleaved, in alternating order, and medians are reported: the machine may be shared.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from raystudy.data import batches  # noqa: E402
from raystudy.data.source import ArrayImages, Pool  # noqa: E402
from raystudy.data.sources.cifar10c import CIFAR10C_CORRUPTIONS  # noqa: E402
from raystudy.data.splits import Splits, View, build_splits  # noqa: E402
from raystudy.data.transforms import transforms  # noqa: E402
from raystudy.models import components, registry  # noqa: E402
from raystudy.train import engine  # noqa: E402
from raystudy.train.config import FinetuneConfig  # noqa: E402

CONDITIONS = components.PAPER_CONDITIONS  # LN1, MHA, LN2, FC1, FC2, full, linear_probe
VITB = "vit_base_patch16_224"


# ---------------------------------------------------------------- timing


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Timing(dict):
    """Median seconds per call of each variant, and paired ratios between variants."""

    def __init__(self, times: dict[str, list[float]]):
        super().__init__({k: statistics.median(v) for k, v in times.items()})
        self.times = times

    def ratio(self, k: str, ref: str) -> float:
        """Median over reps of the ratio within each rep: the variants of one rep ran back to
        back, so a burst of load from other processes hits both and cancels."""
        return statistics.median(a / b for a, b in zip(self.times[k], self.times[ref]))


def interleaved(fns: dict, reps: int, device: torch.device, inner: int = 1, warm: int = 1) -> Timing:
    """Seconds per call of each function; within each rep every function runs once, in an order
    that rotates from rep to rep."""
    for f in fns.values():
        for _ in range(warm):
            f()
    sync(device)
    times: dict[str, list[float]] = {k: [] for k in fns}
    keys = list(fns)
    for r in range(reps):
        for k in keys[r % len(keys) :] + keys[: r % len(keys)]:
            sync(device)
            t0 = time.perf_counter()
            for _ in range(inner):
                fns[k]()
            sync(device)
            times[k].append((time.perf_counter() - t0) / inner)
    return Timing(times)


# ---------------------------------------------------------------- models and steps


def setup(model_name: str, condition: str, device: torch.device, seed: int = 0):
    """(model, optimizer, groups) as engine.train builds them, random init."""
    cfg = FinetuneConfig(
        model=model_name,
        pretrained=False,
        condition=condition,
        dataset="digits_c" if model_name == "vit_demo" else "cifar10",
    )
    torch.manual_seed(seed)
    model = registry.create_model(model_name, 10, pretrained=False)
    components.apply_condition(model, condition)
    model.to(device).train()
    return model, engine.build_optimizer(model, cfg, device), engine.trainable_groups(model)


def raystudy_step(model, opt, groups, device, batches):
    return lambda: engine.train_step(model, [batches()], opt, groups, 1.0, device)


def minimal_step(model, opt, device, batches):
    params = [p for p in model.parameters() if p.requires_grad]

    def step():
        x, y = batches()
        opt.zero_grad(set_to_none=True)
        with engine.autocast(device):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    return step


def fixed(batch):
    return lambda: batch


def nxt(stream):
    return lambda: next(stream)


# ---------------------------------------------------------------- FLOPs (analytic, timm ViT)


def step_flops(model: nn.Module, batch: int) -> tuple[float, float]:
    """(forward, training step) model FLOPs of a timm ViT for ``batch`` images.

    Matmuls only (2 per multiply-add): patch embedding, every block linear over all tokens, the
    two attention products, the head on one token. Backward: input gradients through every block
    at or above the lowest trainable parameter (attention: twice its forward products), plus a
    weight gradient (= its forward) for each trainable linear; frozen layers cost no weight
    gradient, which is the saving of the frozen conditions.
    """
    n_tok = model.patch_embed.num_patches + model.num_prefix_tokens
    patches = model.patch_embed.num_patches
    pe = 2 * patches * model.patch_embed.proj.weight.numel()
    head = 2 * model.head.weight.numel() if isinstance(model.head, nn.Linear) else 0
    fwd = pe + head
    per_block = []
    for blk in model.blocks:
        lin = sum(2 * n_tok * m.weight.numel() for m in blk.modules() if isinstance(m, nn.Linear))
        attn = 2 * 2 * n_tok * n_tok * blk.attn.qkv.weight.shape[1]
        wgrad = sum(
            2 * n_tok * m.weight.numel() for m in blk.modules() if isinstance(m, nn.Linear) and m.weight.requires_grad
        )
        trains = any(p.requires_grad for p in blk.parameters())
        per_block.append((lin, attn, wgrad, trains))
        fwd += lin + attn
    bwd = head if model.head.weight.requires_grad else 0
    embed_trains = any(
        p.requires_grad for n, p in model.named_parameters() if n.startswith(("patch_embed", "cls_token", "pos_embed"))
    )
    below = embed_trains  # something trainable at or below this block: gradients must reach it
    needs = []
    for _lin, _attn, _wgrad, trains in per_block:
        below = below or trains
        needs.append(below)
    for (lin, attn, wgrad, _), need in zip(per_block, needs):
        if need:
            bwd += lin + 2 * attn
        bwd += wgrad
    if embed_trains:
        bwd += pe
    return float(fwd * batch), float((fwd + bwd) * batch)


# ---------------------------------------------------------------- data


def demo_streams(batch: int, device: torch.device):
    """The demo's real data paths: its tensors on the device (cache), and the per-image DataLoader."""
    out = {}
    for path in ("cache", "torchvision"):
        splits = build_splits("digits_c", seed=0, img_size=16, mean=(0.5,), std=(0.5,), data_path=path)
        out[path] = batches.train_stream(batches.place(splits, device).train, batch, 0, device)
    return out


def cifar_like_streams(batch: int, device: torch.device, workers: int, cache: Path, n: int = 2048):
    """CIFAR-like uint8 32x32 images: the tensor cache path and torchvision's per-image path, to 224."""
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, n)
    pool = Pool(ArrayImages(imgs, labels), labels)
    ic = registry.input_config(VITB)
    tp = batches.tensor_cache("bench_cifar_like", "train", pool, 32, cache, cache=cache, log=None)
    view = batches.CachedView(tp, np.arange(n), train=True, size=224, mean=ic["mean"], std=ic["std"])
    cached = batches.train_stream(batches.place(Splits(view, view, view, 10), device).train, batch, 0, device)
    train_tf, _ = transforms(224, ic["mean"], ic["std"])
    per_image = batches.train_stream(View(pool.items, np.arange(n), train_tf), batch, 0, device, num_workers=workers)
    return {"cache": cached, "torchvision": per_image}


# ---------------------------------------------------------------- GPU


def matmul_rate(device: torch.device, n: int = 8192, iters: int = 50) -> float:
    """Measured dense bf16 matmul FLOP/s (the denominator of MFU)."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        a @ b
    sync(device)
    return 2 * n**3 * iters / (time.perf_counter() - t0)


# Approximate split sizes (images) for the eval cost of each run: val every eval_every steps,
# test once at the end. From the datasets' official sizes and raystudy's splits.
EVAL_IMAGES = {  # name: (val, test)
    "cifar10": (10_000, 10_000),
    "cifar100": (10_000, 10_000),
    **{f"cifar10c_{c}": (1_600, 2_000) for c in CIFAR10C_CORRUPTIONS},
    "domainnet_clipart": (7_813, 9_767),
    "domainnet_sketch": (11_262, 14_077),
    "flowers102": (1_020, 6_149),
    "pets": (736, 3_669),
}


def paper_grid():
    """(conditions, [(dataset, steps, runs per condition)], batch, eval_every) of the paper's grid."""
    import yaml

    space = yaml.safe_load((ROOT / "search_spaces" / "paper.yaml").read_text())
    grid = space["grid"]
    conds = grid["condition"]["grid_search"]
    seeds = len(grid["seed"]["grid_search"])
    rows = []
    for name, over in space["datasets"].items():
        lrs = len((over.get("lr") or grid["lr"])["grid_search"])
        rows.append((name, over["steps"], lrs * seeds))
    return conds, rows, space["base"]["batch_size"], space["base"]["eval_every"]


def project_hours(sec_per_step: dict[str, float], eval_img_s: float) -> tuple[dict[str, float], int]:
    """GPU-hours of the paper's main grid per condition from seconds per step at the grid's batch."""
    conds, rows, _, eval_every = paper_grid()
    hours, runs = {}, 0
    for c in conds:
        s = 0.0
        for name, steps, n in rows:
            val, test = EVAL_IMAGES[name]
            s += n * (steps * sec_per_step[c] + (steps // eval_every * val + test) / eval_img_s)
            runs += n
        hours[c] = s / 3600
    return hours, runs


# ---------------------------------------------------------------- report


def machine(device: torch.device) -> str:
    from timm.layers import use_fused_attn

    cores = len(os.sched_getaffinity(0))
    dev = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    load = "/".join(f"{v:.1f}" for v in os.getloadavg())
    return (
        f"machine: {platform.node()} | {cores} host cores | {platform.machine()} | torch "
        f"{torch.__version__} ({torch.get_num_threads()} threads) | device {device} ({dev}) | "
        f"timm fused attention: {use_fused_attn()} | autocast: "
        f"{'bf16' if device.type == 'cuda' else 'none (fp32)'} | load average {load}"
    )


def ratio_line(label: str, t: Timing, k: str, ref: str, target: float | None = None) -> str:
    r = t.ratio(k, ref)
    verdict = "" if target is None else f"  [target <= {target:.2f}: {'met' if r <= target else 'NOT met'}]"
    return f"  {label:<44} {t[k] * 1e3:10.1f} ms   {r:6.3f}x{verdict}"


def bench_model(
    name: str, batch: int, reps: int, inner: int, device: torch.device, workers: int, cache: Path, gpu: dict | None
) -> dict:
    label = "demo (vit_demo, 16x16 digits)" if name == "vit_demo" else f"ViT-B/16 at 224 ({VITB}, random init)"
    print(f"\n=== {label}, batch {batch}, {reps} reps x {inner} steps, medians ===")
    built = {c: setup(name, c, device) for c in CONDITIONS}
    if name == "vit_demo":
        streams = demo_streams(batch, device)
    else:
        streams = cifar_like_streams(batch, device, workers, cache)
    staged = next(streams["cache"])
    model, opt, groups = built["full"]

    # (a) raystudy's step against the minimal one: the same model, optimizer and batch
    t = interleaved(
        {
            "raystudy": raystudy_step(model, opt, groups, device, fixed(staged)),
            "minimal": minimal_step(model, opt, device, fixed(staged)),
        },
        reps,
        device,
        inner,
    )
    print("(a) raystudy's train_step vs a minimal hand-written step (full finetuning, same batch)")
    print(ratio_line("minimal: forward, CE, backward, clip, step", t, "minimal", "minimal"))
    print(ratio_line("raystudy engine.train_step", t, "raystudy", "minimal", 1.05))

    # (b) every condition, pre-staged batch
    tc = interleaved({c: raystudy_step(*built[c], device, fixed(staged)) for c in CONDITIONS}, reps, device, inner)
    print(f"(b) per condition (ratio to full; analytic FLOPs ratio in brackets; {batch / tc['full']:,.3g} img/s full)")
    flops = {c: step_flops(built[c][0], batch)[1] for c in CONDITIONS}
    for c in CONDITIONS:
        line = ratio_line(c, tc, c, "full", 0.75 if c == "LN1" else None)
        print(f"{line}   [{flops[c] / flops['full']:.2f}]")

    # (c) the step fed by the data paths against a pre-staged batch
    td = interleaved(
        {
            "staged": raystudy_step(model, opt, groups, device, fixed(staged)),
            "cache": raystudy_step(model, opt, groups, device, nxt(streams["cache"])),
            "torchvision": raystudy_step(model, opt, groups, device, nxt(streams["torchvision"])),
        },
        reps,
        device,
        inner,
    )
    w = f"{workers} workers" if name != "vit_demo" else "0 workers"
    print("(c) full step fed by the data path vs fed a batch already on the device")
    print(ratio_line("pre-staged batch on the device", td, "staged", "staged"))
    print(ratio_line("data_path cache (device-side augmentation)", td, "cache", "staged", 1.05))
    print(ratio_line(f"data_path torchvision (per image, {w})", td, "torchvision", "staged"))
    # The data path's own cost, measured alone: what it adds to a step when nothing overlaps it.
    alone = interleaved({"cache": nxt(streams["cache"])}, max(reps, 20), device)["cache"]
    print(
        f"  data path alone: {alone * 1e3:.2f} ms per batch ({batch / alone:,.0f} img/s), "
        f"{alone / td['staged']:.1%} of a pre-staged step"
    )

    out = {"tc": tc, "td": td, "flops": flops, "batch": batch}
    if gpu is not None:
        fwd, _ = step_flops(model, batch)
        mfu = flops["full"] / td["cache"] / gpu["rate"]
        print(
            f"(d) MFU, full finetuning fed by the cache path: {mfu:.1%} of the measured bf16 matmul "
            f"rate ({flops['full'] / td['cache'] / 1e12:.0f} of {gpu['rate'] / 1e12:.0f} TFLOP/s)"
            + ("  [target >= 40%: " + ("met" if mfu >= 0.4 else "NOT met") + "]" if name != "vit_demo" else "")
        )
        for c in CONDITIONS:
            print(f"      {c:<14} {flops[c] / tc[c] / gpu['rate']:6.1%}   {batch / tc[c]:9,.0f} img/s")
        out["fwd"] = fwd
        if name != "vit_demo":
            torch.cuda.set_sync_debug_mode("error")
            try:
                for _ in range(3):
                    raystudy_step(model, opt, groups, device, nxt(streams["cache"]))()
                print("      host-device synchronisations in 3 hot-loop steps (cache path): none")
            except RuntimeError as e:
                print(f"      host-device synchronisation in the hot loop: {str(e).splitlines()[0]}")
            finally:
                torch.cuda.set_sync_debug_mode("default")
            with torch.no_grad(), engine.autocast(device):
                model.eval()
                x = staged[0]
                te = interleaved({"eval": lambda: model(x)}, reps, device, inner)["eval"]
                model.train()
            out["eval_img_s"] = batch / te
    del built, streams
    return out


def projection(vitb: dict | None, gpu: dict | None) -> None:
    conds, rows, grid_batch, _ = paper_grid()
    steps = sum(s * n for _, s, n in rows) * len(conds)
    runs = sum(n for *_, n in rows) * len(conds)
    print(f"\n=== (d) the paper's main grid: {runs} runs, {steps / 1e6:.2f} M steps of batch {grid_batch} ===")
    if gpu is not None and vitb is not None:
        scale = grid_batch / vitb["batch"]
        feed = vitb["td"].ratio("cache", "staged")  # what the data path adds, measured in (c)
        sec = {c: vitb["tc"][c] * feed * scale for c in conds}
        hours, _ = project_hours(sec, vitb["eval_img_s"])
        note = "" if scale == 1 else f"; step times scaled linearly from batch {vitb['batch']}"
        print(
            f"projected from this GPU's measured step times (x{feed:.3f} for the data path{note}), "
            "eval passes included:"
        )
        for c in conds:
            print(f"  {c:<14} {sec[c]:7.3f} s/step   {hours[c]:8.1f} GPU-hours")
        total = sum(hours.values())
        print(f"  {'total':<14} {'':>15} {total:8.1f} GPU-hours  [goal <= 200: {'met' if total <= 200 else 'NOT met'}]")
        return
    model = registry.create_model(VITB, 10, pretrained=False)
    per = {}
    for c in conds:
        components.apply_condition(model, c)
        per[c] = step_flops(model, grid_batch)[1]
    total = sum(per.values()) * sum(s * n for _, s, n in rows)
    print("no GPU here, nothing measured: an analytic projection (model FLOPs of the training steps,")
    print(f"ViT-B/16 at 224, batch {grid_batch}; eval passes add ~1-3%):")
    print("  step FLOPs relative to full: " + ", ".join(f"{c} {per[c] / per['full']:.2f}" for c in conds))
    print(f"  grid total {total:.3g} FLOP ({total / (per['full'] * steps):.2f} of all-full finetuning)")
    for mfu in (0.4, 0.5, 0.6):
        print(
            f"  at {mfu:.0%} MFU of 989 TFLOP/s (H100/H200 dense bf16 spec): "
            f"{total / (mfu * 989e12) / 3600:5.0f} GPU-hours"
        )
    print("  run this script on a GPU for the measured figure")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", help="auto, cpu or cuda")
    ap.add_argument("--demo-batch", type=int, default=64)
    ap.add_argument("--demo-reps", type=int, default=61)
    ap.add_argument("--vitb-batch", type=int, default=8)
    ap.add_argument("--vitb-reps", type=int, default=5)
    ap.add_argument("--inner", type=int, default=1, help="steps per timed call (GPU: >1 keeps the queue full)")
    ap.add_argument("--skip-vitb", action="store_true")
    ap.add_argument(
        "--workers",
        type=int,
        default=None,
        help="DataLoader workers of the per-image path for ViT-B (default: all host cores on a GPU, 0 on CPU)",
    )
    args = ap.parse_args(argv)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    workers = (
        args.workers if args.workers is not None else (len(os.sched_getaffinity(0)) if device.type == "cuda" else 0)
    )
    print(machine(device))
    import tempfile

    cache = Path(tempfile.mkdtemp(prefix="bench_step"))
    gpu = {"rate": matmul_rate(device)} if device.type == "cuda" else None
    if gpu:
        print(f"measured bf16 matmul rate (8192^3): {gpu['rate'] / 1e12:.0f} TFLOP/s")
    bench_model("vit_demo", args.demo_batch, args.demo_reps, args.inner, device, 0, cache, gpu)
    vitb = None
    if not args.skip_vitb:
        vitb = bench_model(VITB, args.vitb_batch, args.vitb_reps, args.inner, device, workers, cache, gpu)
    projection(vitb, gpu)
    import shutil

    shutil.rmtree(cache, ignore_errors=True)
    print(f"load average at the end: {'/'.join(f'{v:.1f}' for v in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
