"""The finetuning loop: one plain function for every study condition.

``train(plan)`` reads top to bottom: build model and data, freeze by condition, then for each
step set the lr, (sometimes) evaluate, forward/backward, measure per-component gradient norms,
clip, step, report. The best-validation weights are evaluated on test at the end. It holds no
global state, so Ray runs it unchanged in a Tune trial or in each DDP worker of a TorchTrainer.

Speed, where it comes from: bf16 autocast and fused optimizers on GPU, timm's fused attention
(scaled_dot_product_attention), optional ``torch.compile``, frozen parameters with
``requires_grad=False`` (autograd skips their weight gradients, and linear probing keeps no
activations), batches cut and augmented on the device (``data_path: cache``), and no host-device
synchronisation in the hot loop except every ``log_every`` steps.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from raystudy.data import batches
from raystudy.errors import Preempted
from raystudy.measure import costs, plasticity
from raystudy.models import components, registry
from raystudy.train.config import FinetuneConfig
from raystudy.train.plan import OptimizerPlan, TrialPlan

Report = Callable[[dict[str, Any], "dict[str, Any] | None"], None]


# ---------------------------------------------------------------- pure helpers


def get_lr(step: int, base_lr: float, warmup_steps: int, total_steps: int) -> float:
    """Linear warmup to ``base_lr`` over ``warmup_steps``, then cosine decay to 0 at ``total_steps``."""
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * base_lr * (1.0 + math.cos(math.pi * min(1.0, progress)))


def resolve_device(name: str) -> torch.device:
    """The torch device for a config's ``device`` (``auto``: CUDA if available, else CPU)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) outside torch.distributed."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def build_optimizer(
    model: nn.Module, cfg: FinetuneConfig | OptimizerPlan, device: torch.device
) -> torch.optim.Optimizer:
    """An optimizer over the trainable parameters only: frozen ones get no state. ``cfg``: a
    config or a plan's ``optim``, read by the same key names.

    Fused (one kernel for all parameters) on GPU and CPU, where torch has it: one pass instead of
    one per tensor shortens the step on a CPU too (benchmarks/bench_step.py measures it).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    fused = device.type in ("cuda", "cpu")
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(
            params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, fused=fused or None
        )
    return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, fused=fused or None)


def trainable_groups(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """Trainable parameters by component, for per-component gradient norms."""
    named = dict(model.named_parameters())
    groups = {}
    for comp, names in components.partition(model).items():
        ps = [named[n] for n in names if named[n].requires_grad]
        if ps:
            groups[comp] = ps
    return groups


def grad_norms(groups: dict[str, list[nn.Parameter]]) -> dict[str, torch.Tensor]:
    """L2 norm of each component's gradient and of all of them ("total"), as device tensors.

    A fixed handful of kernels whatever the number of components: one foreach norm over every
    gradient, then a segmented sum of squares (the per-step cost of clip_grad_norm_, no more).
    """
    grads, counts = [], []
    for ps in groups.values():
        g = [p.grad for p in ps if p.grad is not None]
        grads += g
        counts.append(len(g))
    device = next(iter(groups.values()))[0].device
    if not grads:
        zero = torch.zeros((), device=device)
        return {**{c: zero for c in groups}, "total": zero}
    sq = torch.stack(torch._foreach_norm(grads)).float().square()
    per = torch.zeros(len(groups), device=device).index_add_(0, _owners(tuple(counts), device), sq)
    norms = torch.cat([per, per.sum(0, keepdim=True)]).sqrt()
    return dict(zip([*groups, "total"], norms.unbind()))


@functools.lru_cache(maxsize=64)
def _owners(counts: tuple[int, ...], device: torch.device) -> torch.Tensor:
    # Made once and kept: a host-to-device copy in every step would wait for the GPU.
    return torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts)).to(device)


def clip_(groups: dict[str, list[nn.Parameter]], total: torch.Tensor, max_norm: float) -> None:
    """Scale all gradients so their total norm is at most ``max_norm`` (no host sync)."""
    if max_norm <= 0:
        return
    grads = [p.grad for ps in groups.values() for p in ps if p.grad is not None]
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    torch._foreach_mul_(grads, coef)


def autocast(device: torch.device, enabled: bool = True):
    """bf16 autocast on GPU; plain fp32 elsewhere, or when not ``enabled`` (an fp32 reference)."""
    if device.type == "cuda" and enabled:
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train_step(
    model: nn.Module,
    micro_batches: list[tuple[torch.Tensor, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    groups: dict[str, list[nn.Parameter]],
    clip: float,
    device: torch.device,
    amp: bool = True,
) -> dict[str, torch.Tensor]:
    """One optimizer step over ``micro_batches`` (gradient accumulation); returns measurements.

    Under DDP only the last micro-batch all-reduces: the others accumulate locally (``no_sync``).
    ``amp=False`` runs the step in fp32 on a GPU too: the reference bf16 is checked against.
    """
    optimizer.zero_grad(set_to_none=True)
    loss_sum = torch.zeros((), device=device)
    last = len(micro_batches) - 1
    for i, (x, y) in enumerate(micro_batches):
        local = model.no_sync() if i < last and hasattr(model, "no_sync") else contextlib.nullcontext()
        with local:
            with autocast(device, amp):
                loss = F.cross_entropy(model(x), y) / len(micro_batches)
            loss.backward()
        loss_sum += loss.detach()
    norms = grad_norms(groups)
    clip_(groups, norms["total"], clip)
    optimizer.step()
    return {"loss": loss_sum, **{f"grad_norm/{k}": v for k, v in norms.items()}}


@torch.no_grad()
def evaluate(
    model: nn.Module, loader, device: torch.device, amp: bool = True, batch_mean: bool = False
) -> dict[str, float]:
    """Accuracy and mean loss over ``loader`` (summed over DDP ranks when distributed).

    Every image counts once, unless ``batch_mean``: then both are the mean over batches of each
    batch's accuracy and loss, as the paper's code counts them (a last small batch weighs as much
    as a full one).
    """
    was_training = model.training
    model.eval()
    # correct, loss sum, images, sum of batch accuracies, sum of batch mean losses, batches
    stats = torch.zeros(6, device=device, dtype=torch.float64)
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast(device, amp):
            logits = model(x)
        correct = (logits.argmax(-1) == y).sum()
        loss = F.cross_entropy(logits.float(), y, reduction="sum")
        stats[0] += correct
        stats[1] += loss
        stats[2] += len(y)
        stats[3] += correct / len(y)
        stats[4] += loss / len(y)
        stats[5] += 1
    if world()[1] > 1:
        dist.all_reduce(stats)
    model.train(was_training)
    correct, loss, n, batch_acc, batch_loss, batches = stats.tolist()
    if batch_mean:
        return {"acc": batch_acc / max(batches, 1), "loss": batch_loss / max(batches, 1)}
    return {"acc": correct / max(n, 1), "loss": loss / max(n, 1)}


def _labels(loader) -> Iterable[torch.Tensor]:
    """The label batches of an eval loader, cut as its batches are; the cache path's straight
    from its pool, without transforming an image."""
    if isinstance(loader, batches.DeviceEval):
        idx, labels = loader.view.indices, loader.view.pool.labels
        for k in range(0, len(idx), loader.batch_size):
            yield labels[idx[k : k + loader.batch_size]]
    else:
        for _, y in loader:
            yield torch.as_tensor(y)


def class0_accuracy(loader, device: torch.device, batch_mean: bool = False) -> float:
    """The accuracy of predicting class 0 for every image of ``loader``, counted as ``evaluate``
    counts it (summed over DDP ranks), from the labels alone: no forward pass.

    What the paper's code tests for a run whose weights turned NaN before its first evaluation:
    nothing stops it, the argmax of NaN logits is class 0, and that first evaluation, the best
    it will see, is the checkpoint it tests.
    """
    # images predicted right, images, sum of batch accuracies, batches
    stats = torch.zeros(4, device=device, dtype=torch.float64)
    for y in _labels(loader):
        hits = (y == 0).sum().item()
        stats += torch.tensor([hits, len(y), hits / len(y), 1], device=device, dtype=torch.float64)
    if world()[1] > 1:
        dist.all_reduce(stats)
    correct, n, batch_acc, batches_seen = stats.tolist()
    return batch_acc / max(batches_seen, 1) if batch_mean else correct / max(n, 1)


# The paper's test batches (its evaluation's batch_size): a batch mean is over these.
PAPER_TEST_BATCH = 512


def eval_split(ds, rank: int, size: int, block: int = 0):
    """One DDP rank's part of an eval split: every ``size``-th item (``block`` 0), or every
    ``size``-th run of ``block`` consecutive items. Batches of ``block`` cut from the latter are
    the very batches one process cuts from the whole split, so a mean over batches summed across
    the ranks is that process's mean."""
    if size == 1 or block <= 0:
        return batches.shard(ds, rank, size)
    keep = [i for s in range(rank * block, len(ds), size * block) for i in range(s, min(s + block, len(ds)))]
    if isinstance(ds, batches.CachedView):
        return ds.like(indices=ds.indices.cpu()[torch.as_tensor(keep, dtype=torch.int64)])
    return torch.utils.data.Subset(ds, keep)


def eval_loaders(placed, cfg: FinetuneConfig, device: torch.device, rank: int = 0, size: int = 1):
    """(validation, test) batches of this rank. Validation in ``eval_batch_size`` batches; test in
    those too, or, counting accuracy as the paper does (``batch_mean``), in its batches of 512 in
    the split's order, whatever ``eval_batch_size`` is. Under ``batch_mean`` each DDP rank takes
    whole batches (``eval_split``): the batches, and so the mean over them, are one process's."""
    batch_mean = cfg.accuracy == "batch_mean"
    out = []
    for ds, bs in (
        (placed.val, cfg.eval_batch_size),
        (placed.test, PAPER_TEST_BATCH if batch_mean else cfg.eval_batch_size),
    ):
        part = eval_split(ds, rank, size, bs if batch_mean else 0)
        out.append(batches.eval_batches(part, bs, device, cfg.num_workers))
    return tuple(out)


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Copies of the trainable tensors: all a checkpoint needs, since the rest never changes."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


# ---------------------------------------------------------------- building


def build(plan: TrialPlan, model: nn.Module | None = None, augment_train: bool = True):
    """(model with the condition applied, splits, trainable counts per component) of a trial's
    plan (``plan.resolve``).

    Data comes first: a missing dataset fails before any weights are loaded. The head's init
    (and LoRA's) draws from the run's seed alone, whatever building the data drew before.
    """
    cfg = _planned(plan).cfg
    splits = plan.splits.build(augment_train)
    with seeded(cfg.seed):
        if model is None:
            # Pretrained or from cfg.weights; the name was checked when the plan was resolved.
            model = registry.create_model(
                cfg.model, splits.num_classes, pretrained=cfg.pretrained, weights=cfg.weights, full=plan.model
            )
        counts = components.apply_trainable(model, plan.trainable, lora_rank=cfg.lora_rank, lora_alpha=cfg.lora_alpha)
    return model, splits, counts


@contextlib.contextmanager
def seeded(seed: int, device: torch.device | None = None):
    """The global RNG (CPU, and ``device``'s if a GPU) seeded for a block, then put back as it was."""
    cuda = (
        [device.index if device.index is not None else torch.cuda.current_device()]
        if device is not None and device.type == "cuda"
        else []
    )
    with torch.random.fork_rng(devices=cuda):
        torch.default_generator.manual_seed(seed)
        if cuda:
            torch.cuda.manual_seed(seed)
        yield


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    """The global RNG states (CPU, and ``device``'s if a GPU), for a checkpoint."""
    out = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        out["cuda"] = torch.cuda.get_rng_state(device)
    return out


def set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    """Put back the global RNG states ``rng_state`` took."""
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def probe_plasticity(plan: TrialPlan, model: nn.Module, splits) -> list[dict]:
    """Plasticity of every (mode, layer, component) on ``cfg.probe_pairs`` pairs, as rows.

    x from the model's pretraining distribution (``plan.source``), y from the run's
    test split; pairs are seeded by the run's seed, so before and after finetuning see the
    same pairs. The rows are what tracking logs as plasticity_*.csv.
    """
    cfg = plan.cfg
    source = plan.source.build()
    df = plasticity.probe_model(
        model,
        source.test,
        splits.test,
        n_pairs=cfg.probe_pairs,
        batch_size=cfg.probe_batch_size or cfg.eval_batch_size,
        seed=cfg.seed,
        model_name=cfg.model,
        dataset_name=cfg.dataset,
        num_workers=cfg.num_workers,
        pairing=cfg.probe_pairing,
        bounds=cfg.probe_bounds,
    )
    return df.to_dict("records")


# ---------------------------------------------------------------- the loop


def train(
    plan: TrialPlan,
    *,
    report: Report | None = None,
    resume: dict | None = None,
    model: nn.Module | None = None,
    stop: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """Finetune the condition of the model on the dataset of ``plan`` (``plan.resolve``: the
    config validated and resolved once, by the caller); returns the results.

    ``report(metrics, state)`` is called every ``log_every`` steps with step measurements (loss,
    ``scheduled_lr``: the lr of that step, ``grad_norm/<component>``) and
    after each evaluation with validation metrics and ``state``, a checkpoint that ``resume``
    takes back to continue from that step. ``model`` overrides the built one (pretraining).
    ``stop()`` true after a step (a preemption notice): the step is checkpointed at once
    (``report`` gets ``preempted``) and ``Preempted`` is raised, for a retry to resume from it.

    Every random draw of the run comes from its seed: the head's init, the batch order and
    augmentation (their own generators) and dropout (the global RNG, seeded here and put back
    afterwards, so the caller's draws and the run's do not touch). Results then depend on the
    seed, not on what ran before in the process; bit-exactness also needs the same device and,
    on CPU, the same thread count (torch's reductions split work by thread).
    """
    if _planned(plan).closed_form:
        return linear_probe(plan)
    device = resolve_device(plan.cfg.device)
    with seeded(plan.cfg.seed, device):
        return _train(plan, device, report, resume, model, stop)


def _planned(plan: TrialPlan) -> TrialPlan:
    """``plan`` itself; a TypeError for anything else (a raw config is resolved by the caller)."""
    if not isinstance(plan, TrialPlan):
        raise TypeError(f"the engine takes a TrialPlan (plan.resolve(cfg)), got {type(plan).__name__}")
    return plan


def use_compile(cfg: FinetuneConfig, device: torch.device, workers: int = 1) -> bool:
    """Whether the loop runs under torch.compile: ``compile: true`` or ``false`` as said; ``auto``
    on a GPU, in one process, for a condition whose verdict in the measured compile verdicts
    (``raystudy.measure.costs.COMPILE_VERDICTS``) holds; off on a CPU."""
    verdicts = costs.load_compile_verdicts() if cfg.compile == "auto" and device.type == "cuda" else None
    return costs.compile_on(cfg.compile, cfg.condition, device.type, verdicts, workers)


def evaluates(done: int, cfg: FinetuneConfig) -> bool:
    """Whether validation runs after step ``done``: every ``eval_every`` steps, and at the last
    step unless ``eval_last`` is off (the paper's code evaluates only on the period; with a period
    over the run's steps it evaluates at the end, and so does this)."""
    last = done == cfg.steps and (cfg.eval_last or cfg.eval_every > cfg.steps)
    return done % cfg.eval_every == 0 or last


def _train(
    plan: TrialPlan,
    device: torch.device,
    report: Report | None,
    resume: dict | None,
    model: nn.Module | None,
    stop: Callable[[], bool] | None,
) -> dict[str, Any]:
    t0 = time.perf_counter()
    cfg = plan.cfg
    rank, size = world()
    if device.type == "cuda" and size > 1:
        device = torch.device("cuda", torch.cuda.current_device())

    # -- model, data, condition
    model, splits, counts = build(plan, model)
    model.to(device).train()
    net = model
    if size > 1:
        net = nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    if use_compile(cfg, device, size):
        net = torch.compile(net)
    groups = trainable_groups(model)
    optimizer = build_optimizer(model, plan.optim, device)
    micro = cfg.batch_size // cfg.grad_accum // size
    # Cache path: the tensor pools move to the device once; batches are cut and augmented there.
    placed = batches.place(splits, device)
    val_loader, test_loader = eval_loaders(placed, cfg, device, rank, size)
    report = report or (lambda metrics, state: None)

    # -- resume
    start, best = 0, {"val_acc": -1.0, "step": -1, "weights": trainable_state(model)}
    if resume is not None:
        model.load_state_dict(resume["model"], strict=False)
        optimizer.load_state_dict(resume["optimizer"])
        start, best = resume["step"], resume["best"]
    # Plasticity of the pretrained model. Every DDP rank probes (the same pairs): a rank that
    # waited instead could time out at its first all-reduce during a long probe.
    probe_before = None
    if cfg.probe_pairs:
        probe_before = resume.get("probe_before") if resume else probe_plasticity(plan, model, splits)
    # A resumed run continues the batch stream and the RNG (dropout) where its checkpoint was.
    # Under DDP the checkpoint is rank 0's alone: each rank then draws a fresh stream from the step.
    exact = resume is not None and size == 1 and "stream" in resume
    seed = cfg.seed * 1_000_003 + rank + (start * 7919 if resume is not None and not exact else 0)
    stream = batches.train_stream(
        placed.train,
        micro,
        seed=seed,
        device=device,
        num_workers=cfg.num_workers,
        state=resume["stream"] if exact else None,
    )
    if exact:
        set_rng_state(resume["rng"], device)
    else:
        torch.default_generator.manual_seed(cfg.seed * 1_000_003 + 7919 + rank)
        if device.type == "cuda":
            torch.cuda.manual_seed(cfg.seed * 1_000_003 + 7919 + rank)

    def checkpoint(done: int) -> dict[str, Any]:
        return {
            "step": done,
            "model": trainable_state(model),
            "optimizer": optimizer.state_dict(),
            "best": best,
            "probe_before": probe_before,
            "stream": stream.state_dict(),
            "rng": rng_state(device),
        }

    status, last = "finished", {}
    amp, batch_mean = cfg.precision == "bf16", cfg.accuracy == "batch_mean"
    for step in range(start, cfg.steps):
        lr = get_lr(step, cfg.lr, cfg.warmup_steps, cfg.steps)
        for g in optimizer.param_groups:
            g["lr"] = lr

        out = train_step(
            net, [next(stream) for _ in range(cfg.grad_accum)], optimizer, groups, cfg.clip_grad, device, amp=amp
        )

        done = step + 1
        if done % cfg.log_every == 0 or done == cfg.steps:
            # The only host sync of the hot loop: every log_every steps.
            last = {"step": done, "scheduled_lr": lr, **{k: v.item() for k, v in out.items()}}
            if not math.isfinite(last["loss"]):
                status = "diverged"
                report({**last, "diverged": 1.0}, None)
                break
            report(last, None)
        if evaluates(done, cfg):
            val = evaluate(net, val_loader, device, amp, batch_mean)
            if val["acc"] > best["val_acc"]:
                best = {"val_acc": val["acc"], "step": done, "weights": trainable_state(model)}
            report(
                {"step": done, "val_acc": val["acc"], "val_loss": val["loss"], "best_val_acc": best["val_acc"]},
                checkpoint(done),
            )
        if stop is not None and done < cfg.steps and stop():
            report({"step": done, "preempted": 1.0}, checkpoint(done))
            raise Preempted(f"preempted after step {done}, checkpointed there")

    # -- test the best-validation weights
    results: dict[str, Any] = {
        "status": status,
        "steps_done": last.get("step", start),
        "trainable_params": sum(counts.values()),
        **{f"trainable_params/{k}": v for k, v in counts.items()},
    }
    # A diverged run stopped early; its best checkpoint before that is tested too, as the paper's
    # code (which never checks) tests it, and kept apart by its status.
    if status == "finished" or best["step"] > 0:
        model.load_state_dict(best["weights"], strict=False)
        test = evaluate(net, test_loader, device, amp, batch_mean)
        results.update(
            best_val_acc=best["val_acc"],
            best_step=best["step"],
            test_acc=test["acc"],
            test_loss=test["loss"],
            final_loss=last.get("loss", float("nan")),
        )
        if cfg.probe_pairs and status == "finished":  # the best-validation weights, finetuned
            results["plasticity_after"] = probe_plasticity(plan, model, splits)
    elif status == "diverged":  # before its first evaluation: what the paper's code tests then
        results.update(
            class0_val_acc=class0_accuracy(val_loader, device, batch_mean),
            class0_test_acc=class0_accuracy(test_loader, device, batch_mean),
        )
    if probe_before is not None:
        results["plasticity_before"] = probe_before
    results["wall_s"] = time.perf_counter() - t0
    return results


# ---------------------------------------------------------------- the paper's linear probe


@torch.no_grad()
def pooled_features(model: nn.Module, loader, device: torch.device) -> tuple[np.ndarray, np.ndarray]:
    """(features, labels) in one streaming pass: the last block's output tokens, before the final
    norm, mean-pooled over tokens, in fp32 (the paper's linear-probe features)."""
    model.eval()
    out: list[torch.Tensor] = []
    hook = model.blocks[-1].register_forward_hook(lambda m, i, o: out.append(o.float().mean(1).cpu()))
    labels = []
    try:
        for x, y in loader:
            model.forward_features(x.to(device, non_blocking=True))
            labels.append(y.cpu() if torch.is_tensor(y) else torch.as_tensor(y))
    finally:
        hook.remove()
    return torch.cat(out).numpy(), torch.cat(labels).numpy()


def linear_probe(plan: TrialPlan) -> dict[str, Any]:
    """The paper's linear probe: a multinomial logistic regression (scikit-learn, max_iter 5000)
    on frozen features (``pooled_features``, L2-normalised, then standardised on the training
    split), fitted once per dataset and seed; no lr, no steps. Training images get the eval
    transform (``linear_probe_data: clean``), or, as the paper's code fits it, the training
    augmentation in one pass of shuffled ``batch_size`` batches without the last partial one
    (``augmented``). Results have the keys ``train`` returns."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss
    from sklearn.preprocessing import StandardScaler

    t0 = time.perf_counter()
    cfg = plan.cfg
    device = resolve_device(cfg.device)
    augmented = cfg.linear_probe_data == "augmented"
    model, splits, _ = build(plan, augment_train=augmented)  # the head's init: seeded inside
    model.to(device)
    placed = batches.place(splits, device)
    feats = {
        name: pooled_features(
            model, batches.eval_batches(getattr(placed, name), cfg.eval_batch_size, device, cfg.num_workers), device
        )
        for name in ("train", "val", "test")
        if not (augmented and name == "train")
    }
    if augmented:
        stream = batches.train_stream(
            placed.train, cfg.batch_size, seed=cfg.seed, device=device, num_workers=cfg.num_workers
        )
        epoch = max(1, len(placed.train) // cfg.batch_size)
        feats["train"] = pooled_features(model, (next(stream) for _ in range(epoch)), device)

    def unit(x: np.ndarray) -> np.ndarray:
        return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)

    scaler = StandardScaler().fit(unit(feats["train"][0]))
    clf = LogisticRegression(max_iter=5000, random_state=cfg.seed)
    clf.fit(scaler.transform(unit(feats["train"][0])), feats["train"][1])

    def score(name: str) -> float:
        x, y = feats[name]
        return float(clf.score(scaler.transform(unit(x)), y))

    xt, yt = feats["test"]
    params = int(clf.coef_.size + clf.intercept_.size)
    return {
        "status": "finished",
        "steps_done": 0,
        "trainable_params": params,
        "trainable_params/HEAD": params,
        "best_val_acc": score("val"),
        "best_step": 0,
        "test_acc": score("test"),
        "test_loss": float(log_loss(yt, clf.predict_proba(scaler.transform(unit(xt))), labels=clf.classes_)),
        "wall_s": time.perf_counter() - t0,
    }
