"""Cost of a plasticity probe pass against a plain forward over the same images.

    python benchmarks/bench_probe.py                       # vit_small_patch16_224, 32 pairs, CPU
    python benchmarks/bench_probe.py --pairs 64 --batch-size 16 --repeats 7 --threads 2

The target: over N pairs, a probe pass in either mode costs at most
1.3x a plain forward pass of the same model over the same 2N images. Each timed unit walks the
same N pairs in batches of B: the plain forward runs ``model(cat([x, y]))`` (2B images a call,
exactly the tensors the probe sees), the probes run ``plasticity.probe`` in one mode. Random init
at 224x224 (timing only: weights do not change the cost). The three are interleaved within
each repetition so machine noise hits them alike; the figures are medians over repetitions, of
wall time and of process CPU time (steadier than wall time on a machine shared with other jobs,
and the same thing at one thread).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="vit_small_patch16_224")
    ap.add_argument("--pairs", type=int, default=32, help="pairs N per timed unit (default 32)")
    ap.add_argument("--batch-size", type=int, default=16, help="pairs per batch B (default 16)")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved repetitions (default 5)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: a shared box)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.pairs < 1 or args.batch_size < 1 or args.repeats < 1:
        print("error: --pairs, --batch-size and --repeats must be >= 1", file=sys.stderr)
        return 2

    import timm

    from raystudy.measure import plasticity

    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(args.seed)
    model = timm.create_model(args.model, pretrained=False, num_classes=1000).eval()
    size = model.patch_embed.img_size
    batches = []
    for start in range(0, args.pairs, args.batch_size):
        b = min(args.batch_size, args.pairs - start)
        batches.append((torch.randn(b, 3, *size, generator=gen), torch.randn(b, 3, *size, generator=gen)))

    def forward():
        with torch.no_grad():
            for x, y in batches:
                model(torch.cat([x, y]))

    def shared():
        plasticity.probe(model, batches, mode="shared")

    def in_situ():
        plasticity.probe(model, batches, mode="in_situ")

    units = {"forward": forward, "shared": shared, "in_situ": in_situ}
    for fn in units.values():  # warm-up: allocator, kernels, first-call costs
        fn()
    wall: dict[str, list[float]] = {k: [] for k in units}
    cpu: dict[str, list[float]] = {k: [] for k in units}
    for _ in range(args.repeats):
        for name, fn in units.items():
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall[name].append(time.perf_counter() - w0)
            cpu[name].append(time.process_time() - c0)

    images = 2 * args.pairs
    mw = {k: statistics.median(v) for k, v in wall.items()}
    mc = {k: statistics.median(v) for k, v in cpu.items()}
    print(
        f"{args.model} random init, {size[0]}x{size[1]}, CPU, {args.threads} thread(s), torch "
        f"{torch.__version__}; N = {args.pairs} pairs ({images} images) in batches of "
        f"{args.batch_size} pairs; medians of {args.repeats} interleaved repetitions"
    )
    print(
        f"{'unit':<10}{'wall s':>9}{'(min-max)':>16}{'images/s':>10}{'x forward':>11}"
        f"{'cpu s':>9}{'images/cpu-s':>14}{'x forward':>11}"
    )
    for k in units:
        print(
            f"{k:<10}{mw[k]:>9.3f}{f'({min(wall[k]):.2f}-{max(wall[k]):.2f})':>16}"
            f"{images / mw[k]:>10.2f}{mw[k] / mw['forward']:>11.3f}"
            f"{mc[k]:>9.3f}{images / mc[k]:>14.2f}{mc[k] / mc['forward']:>11.3f}"
        )
    c0 = time.process_time()
    for blk in model.blocks:  # the probe's fixed cost per call, included in the rows above
        plasticity.linear_bound(blk.mlp.fc1), plasticity.linear_bound(blk.mlp.fc2)
        plasticity.mha_bound(blk.attn, model.patch_embed.num_patches + model.num_prefix_tokens, 1.0)
    print(
        f"of which bounds from the weights (once per probe call, whatever N): "
        f"{time.process_time() - c0:.3f} cpu s per mode"
    )
    for label, m in (("wall", mw), ("cpu", mc)):
        worst = max(m["shared"], m["in_situ"]) / m["forward"]
        print(
            f"probe / forward ({label} time): shared {m['shared'] / m['forward']:.3f}, in_situ "
            f"{m['in_situ'] / m['forward']:.3f} (target <= 1.3: {'met' if worst <= 1.3 else 'NOT met'})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
