"""The CUDA path: bf16 autocast and fused optimizers engaged, no host sync in the hot loop, frozen
weights bit-identical after steps, the single-process (DDP-free) loop end to end.

Marked ``gpu`` and skipped without CUDA. ``benchmarks/gpu_acceptance.py`` runs this file on the
GPU machine, where Ray, MLflow and Optuna are not installed: nothing here may import them.
"""

import numpy as np
import pytest
import torch
import torch.distributed as dist

from raystudy.data import batches
from raystudy.data.splits import Splits
from raystudy.models import components, registry
from raystudy.train import engine
from raystudy.train.config import FinetuneConfig
from raystudy.train.plan import resolve

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

MODEL = "vit_tiny_patch16_224"


def tiny(condition: str, optimizer: str = "sgd"):
    """A random-init ViT-Ti at 64x64 on the GPU with ``condition`` applied, its optimizer and groups."""
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = registry.create_model(MODEL, 10, pretrained=False, img_size=64)
    components.apply_condition(model, condition)
    model.to(dev).train()
    cfg = FinetuneConfig(model=MODEL, pretrained=False, dataset="cifar10", optimizer=optimizer, lr=0.01)
    return model, engine.build_optimizer(model, cfg, dev), engine.trainable_groups(model)


def device_stream(batch: int = 16, n: int = 64, size: int = 64):
    """Training batches cut and augmented on the GPU from a synthetic uint8 pool: the cache path."""
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    pool = batches.TensorPool(
        torch.randint(0, 256, (n, 3, 80, 80), dtype=torch.uint8, generator=g),
        torch.tensor([[120, 100]]).expand(n, 2).contiguous(),
        torch.randint(0, 10, (n,), generator=g),
    )
    view = batches.CachedView(pool, np.arange(n), train=True, size=size, mean=(0.5,) * 3, std=(0.5,) * 3)
    placed = batches.place(Splits(view, view, view, 10), dev)
    assert placed.train.pool.images.device.type == dev.type  # the pool moved to the GPU once
    return batches.train_stream(placed.train, batch, 0, dev)


@pytest.mark.parametrize("optimizer,kernel", [("sgd", "_fused_sgd"), ("adamw", "_fused_adamw")])
def test_bf16_autocast_and_fused_optimizer_engaged(optimizer, kernel):
    from torch.profiler import ProfilerActivity, profile

    dev = torch.device("cuda")
    model, opt, groups = tiny("full", optimizer)
    batches = device_stream()
    assert opt.defaults["fused"] is True
    seen = []
    hook = model.blocks[0].mlp.fc1.register_forward_hook(lambda m, a, out: seen.append(out.dtype))
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            out = engine.train_step(model, [next(batches)], opt, groups, 1.0, dev)
            torch.cuda.synchronize()
        assert seen == [torch.bfloat16]  # autocast ran the matmuls in bf16
        assert any(kernel in e.key for e in prof.key_averages()), "the fused optimizer kernel did not run"
        assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay fp32
        assert out["loss"].dtype == torch.float32 and torch.isfinite(out["loss"]).item()
        seen.clear()
        engine.train_step(model, [next(batches)], opt, groups, 1.0, dev, amp=False)
        assert seen == [torch.float32]  # the fp32 reference really is fp32
    finally:
        hook.remove()


def test_no_host_device_sync_in_the_hot_loop():
    dev = torch.device("cuda")
    model, opt, groups = tiny("MHA+FC1")
    batches = device_stream()
    engine.train_step(model, [next(batches)], opt, groups, 1.0, dev)  # warm: lru caches, allocator
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):  # two micro-batches a step: accumulation is in the hot loop too
            engine.train_step(model, [next(batches), next(batches)], opt, groups, 1.0, dev)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("condition", ["LN1", "FC2", "linear_probe", "lora"])
def test_frozen_weights_are_bit_identical_after_steps(condition):
    dev = torch.device("cuda")
    model, opt, groups = tiny(condition)
    batches = device_stream()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen
    for _ in range(3):
        engine.train_step(model, [next(batches)], opt, groups, 1.0, dev)
    after = dict(model.named_parameters())
    for n in frozen:
        assert torch.equal(before[n], after[n]), n
        assert after[n].grad is None, n
    assert any(not torch.equal(before[n], p) for n, p in after.items() if n not in frozen), "nothing trained"


@pytest.mark.parametrize("data_path", ["cache", "torchvision"])
def test_single_process_loop_runs_end_to_end_without_ddp(tmp_path, monkeypatch, data_path, image_folder):
    monkeypatch.setenv("RAYSTUDY_CACHE", str(tmp_path / "cache"))
    image_folder(tmp_path, n=12, max_side=300)
    cfg = FinetuneConfig(
        model=MODEL,
        pretrained=False,
        dataset="domainnet_sketch",
        data_root=str(tmp_path),
        data_path=data_path,
        device="cuda",
        condition="MHA",
        steps=4,
        warmup_steps=1,
        batch_size=8,
        eval_every=2,
        log_every=2,
        eval_batch_size=16,
    )
    logs = []
    res = engine.train(resolve(cfg), report=lambda m, s: logs.append(m))
    assert not (dist.is_available() and dist.is_initialized()) and engine.world() == (0, 1)
    assert res["status"] == "finished" and 0 <= res["test_acc"] <= 1
    losses = [m["loss"] for m in logs if "loss" in m]
    assert len(losses) == 2 and all(np.isfinite(losses))
