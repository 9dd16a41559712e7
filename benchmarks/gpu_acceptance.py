#!/usr/bin/env python3
"""GPU acceptance of raystudy's CUDA path: one command, every figure in one JSON and one summary.

On the GPU machine (one H200; the run takes at most --budget-s, 440 s by default, within 8 minutes),
from the repository root:

    python benchmarks/gpu_acceptance.py --out $OUT/gpu

Anywhere, at tiny sizes, through every part's code path (CI runs it: tests/test_gpu_acceptance.py):

    python benchmarks/gpu_acceptance.py --smoke --out /tmp/gpu_smoke      # < 1 minute on 2 CPU cores

Part set B, `--parts B` (benchmarks/gpu_acceptance_b.py, its own docstring): compile per trained
condition with verdicts, trials packed on one GPU, the paper's own training loop against
raystudy's; at most 7 minutes on one GPU, `--parts B --smoke` on a CPU.

Needs: Python >= 3.11 with torch (a CUDA build), timm, torchvision, peft, numpy, pyyaml, pillow,
scipy, pandas and pytest, plus this repository (nothing installed from it: the script puts the
repository first on sys.path). Not Ray, MLflow or Optuna: the script blocks their import in its own
process and in its pytest run, as on the GPU machine where they are absent. No network: random-init
timm models (pretrained=False), synthetic images, HF_HUB_OFFLINE=1.

Writes to --out, rewritten after every part so that a run cut short still leaves its figures:
  gpu_acceptance.json  every part's status (ok, error, skipped, interrupted), seconds and figures,
                       an error's last traceback line or a skip's reason; targets and verdicts
  gpu_acceptance.md    the same as a summary
  step_times.json      measured seconds per step, per model and condition (raystudy.measure.costs format):
                       copied to search_spaces/measured/ (paper.yaml names it there),
                       `python -m raystudy.grid --dry-run` prices the grid from it
  gpu_tests.xml        pytest's report of part 1

Parts, in the order they run; each is guarded (an exception is recorded, the next part runs) and
checks the clock (a part or item the remaining budget cannot cover is skipped, saying why):
  1  gpu_tests       pytest -m gpu tests/test_gpu.py: bf16 autocast and fused optimizers engaged,
                     no host sync in the hot loop, frozen weights bit-identical, the DDP-free loop
  2  vitb_step       ViT-B/16 at 224, bf16, batch 256 (or the largest that fits), a ready device
                     batch, for full, MHA, FC1, FC2, LN1, LN2, linear_probe: images/s, FLOPs counted
                     by torch, achieved TFLOP/s, MFU against the bf16 matmul peak measured at start
  3  large_models    ViT-L/16 and ViT-H/14 at the paper's per-GPU batch (search_spaces/paper.yaml):
                     full finetuning's peak memory and step time, then the other conditions' steps
  4  data_path       JPEG-like images made here: the tensor cache + device augmentation vs
                     torchvision's per-image DataLoader on every host core; a ViT-B step fed by the
                     data path vs one fed a ready device batch
  5  probe           a plasticity probe pass (shared, in_situ) vs a plain forward over the same 2N
                     images (fp32, as the probe runs)
  6  finetune        a random-init ViT-S on a synthetic task, a few hundred steps per condition, in
                     bf16 and fp32: the loss falls, nothing is NaN, final losses agree
  7  step_times      parts 2, 3 and 4 as step_times.json, and the paper grid's GPU-hours per model
                     and condition, priced as `python -m raystudy.grid --dry-run` prices them
  2b vitb_compiled   part 2 under torch.compile, paired with eager; run last (a compile is the
                     slowest thing here, and a cut-off run still has part 7); each compiled
                     figure is added to step_times.json as it comes

Targets (benchmarks: ratios measured side by side in one run, not timed tests; judged only on a
GPU): ViT-B full finetuning >= 45% MFU; a frozen-component condition's step time <= its share of
the counted FLOPs + 0.10 of full's; data path >= 10x torchvision's per-image path and a data-fed
step <= 1.05x a ready-batch step; probe <= 1.3x a plain forward; the ViT-B paper grid (924 trials,
SGD) <= 200 H200-hours from measured step times.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime as dt
import functools
import gc
import importlib.util
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BLOCKED = ("ray", "mlflow", "optuna")  # absent on the GPU machine
NO_CUDA = "not measured: no CUDA"
CONDITIONS = ("full", "MHA", "FC1", "FC2", "LN1", "LN2", "linear_probe")
# Tolerance of the bf16 run's final loss against the fp32 run's (mean of the last 10% of steps).
TOL_ABS, TOL_REL = 0.05, 0.10
JSON_NAME, MD_NAME, STEP_TIMES_NAME = "gpu_acceptance.json", "gpu_acceptance.md", "step_times.json"


# ---------------------------------------------------------------- imports the GPU machine lacks


def block_imports(names: tuple[str, ...]) -> None:
    """Make ``names`` absent, as on the GPU machine: ``import`` raises ModuleNotFoundError and
    ``importlib.util.find_spec`` answers None. A finder that raised instead broke libraries that probe
    for optional packages (accelerate's find_spec('mlflow'), reached through peft's import)."""
    for name in names:
        if sys.modules.get(name) is None:
            sys.modules[name] = None


# The pytest run of part 1, with the same imports blocked (a separate process).
PYTEST_CHILD = """
import sys
for name in {blocked!r}:
    sys.modules[name] = None  # absent, as block_imports makes them
import pytest
sys.exit(pytest.main(sys.argv[1:]))
"""


# ---------------------------------------------------------------- what each mode measures


@dataclass(frozen=True)
class ModelSpec:
    """A model the parts build: a timm ViT by name, or (``--smoke``) a tiny stand-in by arguments."""

    key: str  # its name in step_times.json and the report
    timm_name: str | None = None
    kwargs: dict = field(default_factory=dict)
    img_size: int = 224

    def create(self, num_classes: int):
        if self.timm_name is not None:
            from raystudy.models import registry

            extra = {"img_size": self.img_size} if self.img_size != 224 else {}
            return registry.create_model(self.timm_name, num_classes, pretrained=False, **extra)
        from timm.models.vision_transformer import VisionTransformer

        return VisionTransformer(num_classes=num_classes, img_size=self.img_size, **self.kwargs)


@dataclass(frozen=True)
class Plan:
    """Sizes of every part: the GPU run's, or the smoke run's tiny ones."""

    smoke: bool
    vitb: ModelSpec
    vitb_batch: int
    large: tuple[tuple[str, ModelSpec], ...]  # (paper.yaml models key, spec)
    batch_divisor: int  # paper per-GPU batches are divided by this
    vits: ModelSpec
    ft_steps: int
    ft_batch: int
    probe_pairs: int
    probe_batch: int
    n_jpeg: int
    loader_batch: int  # the per-image DataLoader's batch (granularity only)
    reps: int
    inner: int
    compile_conditions: tuple[str, ...]
    compile_backend: str
    compile_estimate_s: float  # time a first compile is expected to take
    part_caps: dict[str, float]


def make_plan(args) -> Plan:
    """The GPU run's sizes, or with ``--smoke`` tiny stand-ins that go through the same code."""
    tiny = dict(patch_size=32, depth=2, num_heads=2)
    if args.smoke:
        return Plan(
            smoke=True,
            vitb=ModelSpec("smoke-vit_base", kwargs={**tiny, "embed_dim": 64}),
            vitb_batch=args.vitb_batch or 8,
            large=(
                ("vit_large", ModelSpec("smoke-vit_large", kwargs={**tiny, "embed_dim": 96})),
                ("vit_huge", ModelSpec("smoke-vit_huge", kwargs={**tiny, "embed_dim": 128})),
            ),
            batch_divisor=64,
            vits=ModelSpec(
                "smoke-vit_small", kwargs=dict(patch_size=8, embed_dim=64, depth=2, num_heads=2), img_size=32
            ),
            ft_steps=40,
            ft_batch=32,
            probe_pairs=8,
            probe_batch=4,
            n_jpeg=40,
            loader_batch=8,
            reps=2,
            inner=1,
            compile_conditions=("full",),
            compile_backend=args.compile_backend or ("inductor" if args.device == "cuda" else "aot_eager"),
            compile_estimate_s=20.0,
            part_caps={},
        )
    return Plan(
        smoke=False,
        vitb=ModelSpec("vit_base_patch16_224", "vit_base_patch16_224"),
        vitb_batch=args.vitb_batch or 256,
        large=(
            ("vit_large", ModelSpec("vit_large_patch16_224", "vit_large_patch16_224")),
            ("vit_huge", ModelSpec("vit_huge_patch14_224", "vit_huge_patch14_224")),
        ),
        batch_divisor=1,
        vits=ModelSpec("vit_small_patch16_224@112", "vit_small_patch16_224", img_size=112),
        ft_steps=300,
        ft_batch=128,
        probe_pairs=512,
        probe_batch=128,
        n_jpeg=1024,
        loader_batch=32,
        reps=7,
        inner=5,
        compile_conditions=CONDITIONS,
        compile_backend=args.compile_backend or "inductor",
        compile_estimate_s=90.0,
        part_caps={
            "1_gpu_tests": 100,
            "2_vitb_step": 60,
            "3_large_models": 60,
            "4_data_path": 70,
            "5_probe": 30,
            "6_finetune": 70,
            "7_step_times": 40,
        },
    )


# ---------------------------------------------------------------- the run: clock, records, guards


class Interrupted(Exception):
    """SIGTERM arrived: record what there is and stop."""


def _on_sigterm(signum, frame):
    raise Interrupted("SIGTERM")


def jsonable(v: Any) -> Any:
    """Plain JSON values: tensors and numpy scalars as numbers, non-finite floats spelled out."""
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if hasattr(v, "item") and callable(v.item) and getattr(v, "ndim", 0) == 0:
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


@dataclass
class Part:
    """One part of the run: ``run(run, results)`` fills ``results`` as it measures."""

    key: str
    title: str
    run: Callable[[Run, dict], None]
    min_s: float  # a part starts only with this much budget left


class Run:
    """The clock, the record of every part, and the files rewritten after each part."""

    def __init__(self, args, plan: Plan, device, parts: list[Part], t0: float):
        self.args, self.plan, self.device, self.parts = args, plan, device, parts
        self.out = Path(args.out)
        self.t0 = t0
        self.deadline = self.t0 + args.budget_s
        self.part_deadline = self.deadline
        self.store: dict[str, Any] = {}  # measurements later parts use (part 7)
        self.doc: dict[str, Any] = {
            "script": "benchmarks/gpu_acceptance.py",
            "command": " ".join(["python", "benchmarks/gpu_acceptance.py", *sys.argv[1:]]),
            "mode": "smoke" if plan.smoke else "full",
            "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "budget_s": args.budget_s,
            "elapsed_s": 0.0,
            "finished": False,
            "environment": {},
            "parts": {p.key: {"title": p.title, "status": "pending"} for p in parts},
            "targets": [],
        }

    # -- the clock
    def left(self) -> float:
        """Seconds left for the running part (its share of the budget)."""
        return self.part_deadline - time.perf_counter()

    def elapsed(self) -> float:
        """Seconds since the script started."""
        return time.perf_counter() - self.t0

    # -- records
    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def mfu(self, flop_per_s: float) -> float | str:
        """``flop_per_s`` over the bf16 matmul peak measured at start, or why there is none."""
        peak = self.store.get("matmul_peak")
        return flop_per_s / peak if peak else str(self.doc["environment"].get("bf16_matmul_tflops", NO_CUDA))

    def target(self, name: str, value: Any, goal: str, met: bool | None, note: str = "") -> None:
        """Record a target's measured value and verdict: judged only in a full run on a GPU."""
        rec = {"name": name, "value": jsonable(value), "goal": goal, "met": met}
        if not self.cuda or self.plan.smoke:
            rec.update(
                met=None, not_judged="a GPU target; this is " + ("a --smoke run" if self.plan.smoke else "no GPU")
            )
        elif met is None:
            rec["not_judged"] = "not measured"
        if note:
            rec["note"] = note
        self.doc["targets"].append(rec)

    def save(self) -> None:
        """Rewrite the JSON and the Markdown with everything recorded so far."""
        self.doc["elapsed_s"] = round(self.elapsed(), 2)
        self.doc["updated"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        self.doc["environment"]["forbidden_modules_loaded"] = sorted(
            {m.split(".")[0] for m, mod in sys.modules.items() if mod is not None and m.split(".")[0] in BLOCKED}
        )
        write_atomic(self.out / JSON_NAME, json.dumps(jsonable(self.doc), indent=1) + "\n")
        write_atomic(self.out / MD_NAME, markdown(self.doc))

    # -- the guard around each part
    def run_part(self, part: Part, selected: bool, remaining_min: float) -> None:
        """Run ``part`` guarded, within its share of the budget; ``remaining_min``: what later parts need."""
        rec = self.doc["parts"][part.key]
        if not selected:
            rec.update(status="skipped", reason="not selected (--parts)")
            return
        left = self.deadline - time.perf_counter()
        if left < part.min_s:
            rec.update(
                status="skipped",
                reason=f"out of time: {left:.0f} s of the budget left, the part needs ~{part.min_s:.0f} s to start",
            )
            self.save()
            return
        cap = self.plan.part_caps.get(part.key, math.inf)
        # Leave the parts still to come the least they need to start.
        share = max(part.min_s, min(cap, left - remaining_min))
        self.part_deadline = time.perf_counter() + share
        results: dict[str, Any] = {}
        rec.update(status="running", budget_s=round(share, 1), results=results)
        self.save()
        t = time.perf_counter()
        try:
            part.run(self, results)
            rec["status"] = "ok"
        except Interrupted:
            rec.update(status="interrupted", reason="SIGTERM during the part")
            raise
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt):
                rec.update(status="interrupted", reason="KeyboardInterrupt during the part")
                raise
            tb = traceback.extract_tb(e.__traceback__)
            where = f"{Path(tb[-1].filename).name}:{tb[-1].lineno} in {tb[-1].name}" if tb else ""
            last = traceback.format_exception_only(type(e), e)[-1].strip().splitlines()[0]
            rec.update(status="error", error=last, where=where)
        finally:
            rec["seconds"] = round(time.perf_counter() - t, 2)
            if "_notes" in results:
                rec["notes"] = results.pop("_notes")
            if "_skip" in results and rec["status"] == "ok":  # the part found it had nothing to do
                rec.update(status="skipped", reason=results.pop("_skip"))
            self.part_deadline = self.deadline
            free_memory(self.device)
            self.save()


def free_memory(device) -> None:
    """On a GPU: collect tensors held only by reference cycles and hand cached blocks back, so
    the next measurement starts clean. Nothing on a CPU: no device cache to hand back, and a full
    collection there would only add time."""
    import torch

    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


def fmt(v: Any, unit: str = "", digits: int = 3) -> str:
    """A number with ``digits`` significant digits and ``unit``; anything else as it is."""
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, (int, float)):
        return f"{v:,.{digits}g}{unit}"
    return str(v)


def cell(v: Any) -> str:
    return str(v).replace("|", "\\|")  # a pipe would end the table cell


def markdown(doc: dict) -> str:
    """The JSON's figures as a Markdown summary."""
    env = doc["environment"]
    lines = [
        f"# GPU acceptance ({doc['mode']})",
        "",
        f"`{doc['command']}` — started {doc['started']}, {doc['elapsed_s']:.0f} s of a "
        f"{doc['budget_s']:.0f} s budget{'' if doc['finished'] else ' (not finished)'}",
        "",
        f"Device: {env.get('device_name', '?')} | torch {env.get('torch', '?')} | CUDA "
        f"{env.get('cuda', '-')} | timm {env.get('timm', '?')} | {env.get('host_cores', '?')} host "
        f"cores | bf16 matmul peak: {fmt(env.get('bf16_matmul_tflops'), ' TFLOP/s')}",
        "",
        "| part | status | seconds | note |",
        "|---|---|---:|---|",
    ]
    for key, p in doc["parts"].items():
        note = p.get("error") or p.get("reason") or "; ".join(p.get("notes", [])[:1])
        lines.append(f"| {key} {p['title']} | {p['status']} | {fmt(p.get('seconds'))} | {cell(note)} |")
    lines += ["", "## Targets", "", "| target | value | goal | met |", "|---|---|---|---|"]
    for t in doc["targets"]:
        met = {True: "yes", False: "**NO**", None: f"not judged ({t.get('not_judged', '')})"}[t["met"]]
        lines.append(
            f"| {cell(t['name'])} | {cell(fmt(t['value']))} | {cell(t['goal'])} | {cell(met)}"
            + (f"; {cell(t['note'])}" if t.get("note") else "")
            + " |"
        )
    for key, p in doc["parts"].items():
        if p.get("notes"):
            lines += ["", f"## {key} {p['title']}", "", *[f"- {n}" for n in p["notes"]]]
    if doc["mode"] == "full" and "B1_compile" in doc["parts"]:
        lines += [
            "",
            "Compile verdicts: `compile_verdicts.json` next to this file. `cp compile_verdicts.json "
            "search_spaces/measured/` and `compile: auto` turns compile on, on a GPU, where they hold.",
        ]
    elif doc["mode"] == "full":
        lines += [
            "",
            f"Measured step times: `{STEP_TIMES_NAME}` next to this file. `mkdir -p "
            f"search_spaces/measured && cp {STEP_TIMES_NAME} search_spaces/measured/` and "
            "`python -m raystudy.grid --model vit_base --dry-run` prices the grid from it.",
        ]
    return "\n".join(lines) + "\n"


def note(results: dict, line: str) -> None:
    """A line for the Markdown summary, kept with the part's record."""
    results.setdefault("_notes", []).append(line)


# ---------------------------------------------------------------- shared pieces


def bench():
    """The benchmark modules whose helpers this script reuses (timing, FLOPs, synthetic images)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_data
    import bench_step

    return bench_step, bench_data


def build(spec: ModelSpec, device, num_classes: int = 100):
    """``spec`` random-init on ``device``: initialised there directly (a ViT-H on the host is slow)."""
    import torch

    torch.manual_seed(0)
    try:
        with torch.device(device):
            model = spec.create(num_classes)
    except (RuntimeError, TypeError, NotImplementedError):  # an init that cannot run under a device context
        model = spec.create(num_classes)
    return model.to(device).train()


def prepare(model, condition: str, device):
    """``model`` with ``condition`` applied, its optimizer and groups, as engine.train builds them."""
    from raystudy.models import components
    from raystudy.train import engine
    from raystudy.train.config import FinetuneConfig

    components.apply_condition(model, condition)
    for p in model.parameters():
        p.grad = None
    cfg = FinetuneConfig(optimizer="sgd", lr=1e-3, momentum=0.9)
    return model, engine.build_optimizer(model, cfg, device), engine.trainable_groups(model)


def ready_batch(batch: int, size: int, device, num_classes: int = 100):
    """A random (images, labels) batch already on ``device``: a step with no data path in it."""
    import torch

    g = torch.Generator(device=device).manual_seed(0)
    return (
        torch.randn(batch, 3, size, size, generator=g, device=device),
        torch.randint(0, num_classes, (batch,), generator=g, device=device),
    )


def counted_flops(fn) -> float:
    """FLOPs of one call of ``fn`` as torch counts them (matmuls, attention; forward and backward)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return float(counter.get_total_flops())


def is_oom(e: BaseException) -> bool:
    """Whether ``e`` is the device running out of memory."""
    import torch

    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e)


def peak_gib(device) -> float | str:
    """Peak GPU memory allocated since the last reset_peak, in GiB (or why it is not measured)."""
    import torch

    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else NO_CUDA


def reset_peak(device) -> None:
    """Start a peak-memory measurement."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def paper_models() -> dict[str, dict]:
    """Per-GPU batch and accumulation of each model of search_spaces/paper.yaml (read as data)."""
    import yaml

    space = yaml.safe_load((ROOT / "search_spaces" / "paper.yaml").read_text())
    batch = int(space["base"]["batch_size"])
    out = {}
    for name, m in space["models"].items():
        workers = int(m.get("workers", 1))
        accum = int((m.get("config") or {}).get("grad_accum", space["base"].get("grad_accum", 1)))
        out[name] = {
            "batch": batch,
            "workers": workers,
            "gpus_per_trial": int(m.get("gpu", 1)) * workers,
            "per_gpu": batch // workers,
            "grad_accum": accum,
        }
    return out


# ---------------------------------------------------------------- part 1: the GPU-marked tests


def part_gpu_tests(run: Run, r: dict) -> None:
    """Part 1: tests/test_gpu.py in a pytest process of its own, ray/mlflow/optuna blocked there too."""
    import xml.etree.ElementTree as ET

    if importlib.util.find_spec("pytest") is None:
        r["_skip"] = "pytest is not installed"
        return
    xml = run.out / "gpu_tests.xml"
    cmd = [
        sys.executable,
        "-c",
        PYTEST_CHILD.format(blocked=BLOCKED),
        "-q",
        "-m",
        "gpu",
        "-p",
        "no:cacheprovider",
        f"--junitxml={xml}",
        str(ROOT / "tests" / "test_gpu.py"),
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    r["command"] = "python -m pytest -q -m gpu tests/test_gpu.py (ray, mlflow, optuna blocked)"
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=max(5.0, run.left()))
    except subprocess.TimeoutExpired:
        r["timed_out_after_s"] = round(run.left(), 1)
        raise RuntimeError("pytest did not finish within the part's share of the budget") from None
    r["returncode"] = proc.returncode
    r["output_tail"] = (proc.stdout + proc.stderr).strip().splitlines()[-6:]
    if not xml.exists():
        raise RuntimeError(f"pytest wrote no report (exit {proc.returncode}): {r['output_tail'][-1:]}")
    cases = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = case.get("name")
        outcome, msg = "passed", ""
        for kind in ("failure", "error", "skipped"):
            el = case.find(kind)
            if el is not None:
                outcome = "failed" if kind != "skipped" else "skipped"
                msg = (el.get("message") or "").strip().splitlines()[0][:200] if el.get("message") else ""
                break
        cases[name] = outcome + (f": {msg}" if msg else "")
    r["tests"] = cases
    counts = {k: sum(v.split(":")[0] == k for v in cases.values()) for k in ("passed", "failed", "skipped")}
    r.update(counts)
    note(
        r,
        f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped "
        f"(pytest exit {proc.returncode})",
    )
    for name, outcome in cases.items():
        if outcome.startswith("failed"):
            note(r, f"FAILED {name}: {outcome[8:]}")
    ran = counts["passed"] + counts["failed"]
    run.target(
        "GPU-marked tests pass",
        f"{counts['passed']}/{ran} passed" if ran else "none ran",
        "all pass",
        counts["failed"] == 0 and ran > 0 and proc.returncode == 0,
        "" if ran else "every test skipped: no CUDA",
    )


# ---------------------------------------------------------------- part 2: ViT-B step per condition


def fit_batch(step_at: Callable[[int], None], batch: int, device, r: dict) -> int:
    """The largest batch from ``batch`` down (halving) whose full step fits in memory."""
    while True:
        try:
            step_at(batch)
            return batch
        except Exception as e:
            if not is_oom(e) or batch <= 1:
                raise
            r.setdefault("oom_at_batch", []).append(batch)
            free_memory(device)
            batch //= 2


def part_vitb(run: Run, r: dict) -> None:
    """Part 2: ViT-B steps per condition, interleaved: time, images/s, counted FLOPs, MFU."""
    bench_step, _ = bench()
    plan, dev = run.plan, run.device
    base = build(plan.vitb, dev)
    size = plan.vitb.img_size

    def full_step_at(b):
        m, opt, groups = prepare(copy.deepcopy(base), "full", dev)
        x, y = ready_batch(b, size, dev)
        bench_step.raystudy_step(m, opt, groups, dev, bench_step.fixed((x, y)))()
        bench_step.sync(dev)

    batch = fit_batch(full_step_at, plan.vitb_batch, dev, r)
    staged = ready_batch(batch, size, dev)
    r.update(
        model=plan.vitb.key,
        image_size=size,
        batch=batch,
        requested_batch=plan.vitb_batch,
        precision="bf16 autocast" if run.cuda else "fp32 (CPU)",
        data="a ready device batch",
        reps=plan.reps,
        steps_per_rep=plan.inner,
    )
    built = {c: prepare(copy.deepcopy(base), c, dev) for c in CONDITIONS}
    base = None  # the copies are what is timed
    steps = {c: bench_step.raystudy_step(*built[c], dev, bench_step.fixed(staged)) for c in CONDITIONS}
    flops = {c: counted_flops(steps[c]) for c in CONDITIONS}
    analytic = {c: bench_step.step_flops(built[c][0], batch)[1] for c in CONDITIONS}
    t = bench_step.interleaved(steps, plan.reps, dev, plan.inner)
    peak = run.store.get("matmul_peak")
    per = {}
    for c in CONDITIONS:
        tflops = flops[c] / t[c] / 1e12
        per[c] = {
            "seconds_per_step": t[c],
            "images_per_s": batch / t[c],
            "counted_gflop_per_step": flops[c] / 1e9,
            "analytic_gflop_per_step": analytic[c] / 1e9,
            # far from 1: an attention kernel torch's counter does not know (MFU then low)
            "counted_over_analytic": flops[c] / analytic[c],
            "achieved_tflops": tflops,
            "mfu": run.mfu(tflops * 1e12),
            "time_ratio_to_full": t.ratio(c, "full"),
            "flop_share": flops[c] / flops["full"],
        }
    r["conditions"] = per
    run.store["vitb"] = {"batch": batch, "seconds": {c: t[c] for c in CONDITIONS}}
    run.store["vitb_flops"] = flops
    for c in CONDITIONS:
        p = per[c]
        note(
            r,
            f"{c}: {p['seconds_per_step'] * 1e3:.1f} ms, {p['images_per_s']:,.0f} img/s, "
            f"{fmt(p['achieved_tflops'])} TFLOP/s, MFU {fmt(p['mfu'])}, x{p['time_ratio_to_full']:.3f} "
            f"of full's time (FLOP share {p['flop_share']:.3f})",
        )
    run.target(
        f"ViT-B full finetuning MFU (bf16, batch {batch})",
        per["full"]["mfu"],
        ">= 0.45",
        per["full"]["mfu"] >= 0.45 if peak else None,
    )
    for c in CONDITIONS[1:]:
        p = per[c]
        run.target(
            f"ViT-B {c} step time / full",
            p["time_ratio_to_full"],
            f"<= FLOP share + 0.10 = {p['flop_share'] + 0.10:.3f}",
            p["time_ratio_to_full"] <= p["flop_share"] + 0.10,
        )


# ---------------------------------------------------------------- part 2b: the same, compiled


def part_vitb_compiled(run: Run, r: dict) -> None:
    """Part 2b: each condition under torch.compile, paired with eager, while the budget allows."""
    import torch

    bench_step, _ = bench()
    plan, dev = run.plan, run.device
    batch = run.store.get("vitb", {}).get("batch", plan.vitb_batch)
    staged = ready_batch(batch, plan.vitb.img_size, dev)
    base = build(plan.vitb, dev)
    r.update(model=plan.vitb.key, batch=batch, backend=plan.compile_backend, conditions={})
    expected, observed, compiled = plan.compile_estimate_s, [], {}
    for c in CONDITIONS:
        if c not in plan.compile_conditions:
            r["conditions"][c] = {"skipped": "--smoke compiles one condition (the code path is the same)"}
            continue
        if run.left() < expected * 1.2:
            r["conditions"][c] = {"skipped": f"out of time: {run.left():.0f} s left, a compile takes ~{expected:.0f} s"}
            continue
        torch._dynamo.reset()
        model, opt, groups = prepare(copy.deepcopy(base), c, dev)
        cm = torch.compile(model, backend=plan.compile_backend)
        t0 = time.perf_counter()
        for _ in range(2):  # the first step compiles forward and backward
            bench_step.raystudy_step(cm, opt, groups, dev, bench_step.fixed(staged))()
        bench_step.sync(dev)
        compile_s = time.perf_counter() - t0
        observed.append(compile_s)
        expected = max(observed)  # recompiles for another condition: about as long as the slowest so far
        t = bench_step.interleaved(
            {
                "eager": bench_step.raystudy_step(model, opt, groups, dev, bench_step.fixed(staged)),
                "compiled": bench_step.raystudy_step(cm, opt, groups, dev, bench_step.fixed(staged)),
            },
            plan.reps,
            dev,
            plan.inner,
        )
        flops = run.store.get("vitb_flops", {}).get(c) if run.store.get("vitb", {}).get("batch") == batch else None
        flops = flops or counted_flops(bench_step.raystudy_step(model, opt, groups, dev, bench_step.fixed(staged)))
        rec = {
            "compile_s": compile_s,
            "seconds_per_step": t["compiled"],
            "eager_seconds_per_step": t["eager"],
            "speedup": 1 / t.ratio("compiled", "eager"),
            "images_per_s": batch / t["compiled"],
            "achieved_tflops": flops / t["compiled"] / 1e12,
            "mfu": run.mfu(flops / t["compiled"]),
        }
        r["conditions"][c] = rec
        compiled[c] = t["compiled"]
        note(
            r,
            f"{c}: compiled {rec['seconds_per_step'] * 1e3:.1f} ms, "
            f"eager {rec['eager_seconds_per_step'] * 1e3:.1f} ms, "
            f"speed-up x{rec['speedup']:.2f}, MFU {fmt(rec['mfu'])}, compile {compile_s:.0f} s",
        )
        del cm, model, opt, groups
        free_memory(dev)
        run.store["vitb_compiled"] = compiled
        if (run.out / STEP_TIMES_NAME).exists():  # part 7 wrote it: add the compiled figures as they come
            write_step_times(run)
        run.save()  # a compile is long: keep what is measured
    if "full" in compiled:
        m = r["conditions"]["full"]["mfu"]
        run.target(
            "ViT-B full finetuning MFU, torch.compile",
            m,
            ">= 0.45 (either way)",
            m >= 0.45 if isinstance(m, float) else None,
        )


# ---------------------------------------------------------------- part 3: ViT-L, ViT-H


def part_large(run: Run, r: dict) -> None:
    """Part 3: ViT-L and ViT-H at the paper's per-GPU batch: peak memory, step time per condition."""
    import torch

    from raystudy.train import engine

    bench_step, _ = bench()
    plan, dev = run.plan, run.device
    paper = paper_models()
    total = torch.cuda.get_device_properties(dev).total_memory / 2**30 if run.cuda else None
    r["gpu_memory_gib"] = total if total else NO_CUDA
    run.store["large"] = {}
    for key, spec in plan.large:
        if run.left() < 10:
            r[key] = {"skipped": f"out of time: {run.left():.0f} s left in the part"}
            continue
        pm = paper[key]
        per_gpu = max(1, pm["per_gpu"] // plan.batch_divisor)
        accum = pm["grad_accum"]
        rec = r[key] = {
            "model": spec.key,
            "paper_batch": pm["batch"],
            "paper_workers": pm["workers"],
            "paper_gpus_per_trial": pm["gpus_per_trial"],
            "per_gpu_batch": per_gpu,
            "grad_accum": accum,
        }
        model = build(spec, dev)
        # The paper's micro-batch first; on OOM, twice the accumulation at half the micro-batch.
        while True:
            micro = per_gpu // accum
            opt = groups = batch = None
            try:
                model, opt, groups = prepare(model, "full", dev)
                batch = [ready_batch(micro, spec.img_size, dev)] * accum
                reset_peak(dev)
                t0 = time.perf_counter()
                engine.train_step(model, batch, opt, groups, 1.0, dev)
                bench_step.sync(dev)
                rec["first_step_s"] = time.perf_counter() - t0
                rec["peak_memory_gib"] = peak_gib(dev)
                break
            except Exception as e:
                if not is_oom(e) or micro <= 1:
                    raise
                rec.setdefault("oom", []).append(f"micro-batch {micro} x {accum}")
                opt = groups = batch = None
                free_memory(dev)
                accum *= 2
        rec.update(micro_batch=micro, fits_at_paper_batch=not rec.get("oom"), effective_grad_accum=accum)
        if total:
            rec["memory_share"] = rec["peak_memory_gib"] / total
        flops = bench_step.step_flops(model, per_gpu)[1]
        secs = {}
        for c in CONDITIONS:
            if run.left() < (6 if c == "full" else 3):
                secs[c] = f"skipped: out of time ({run.left():.0f} s left in the part)"
                continue
            if c != "full":
                del opt, groups
                free_memory(dev)
                model, opt, groups = prepare(model, c, dev)
                reset_peak(dev)
            one = functools.partial(engine.train_step, model, batch, opt, groups, 1.0, dev)
            t = bench_step.interleaved({c: one}, reps=3 if not plan.smoke else 1, device=dev, inner=1)
            secs[c] = t[c]
            if c != "full":
                rec.setdefault("peak_memory_gib_by_condition", {})[c] = peak_gib(dev)
        rec["seconds_per_step"] = secs
        s_full = secs.get("full")
        if isinstance(s_full, float):
            rec["analytic_tflop_per_step"] = flops / 1e12
            rec["achieved_tflops_full"] = flops / s_full / 1e12
            rec["mfu_full"] = run.mfu(flops / s_full)
        measured = {c: s for c, s in secs.items() if isinstance(s, float)}
        run.store["large"][spec.key] = {"batch_per_gpu": per_gpu, "seconds": measured}
        memory = (
            f"peak memory {fmt(rec['peak_memory_gib'], ' GiB')} of {fmt(total, ' GiB')}"
            if total
            else f"peak memory {NO_CUDA}"
        )
        note(
            r,
            f"{key} ({spec.key}): {per_gpu} images per GPU as {accum} x {micro}, {memory}; "
            f"full step {fmt(s_full, ' s')}; paper.yaml: {pm['gpus_per_trial']} GPU(s) per trial",
        )
        note(r, f"{key} seconds per step: " + ", ".join(f"{c} {fmt(s)}" for c, s in secs.items()))
        run.target(
            f"{key} full finetuning fits at the paper's per-GPU batch ({per_gpu})",
            rec["peak_memory_gib"],
            f"<= 0.95 of {fmt(total, ' GiB') if total else 'the GPU'}",
            rec["fits_at_paper_batch"] and total is not None and rec["peak_memory_gib"] <= 0.95 * total,
        )
        del model, opt, groups, batch
        free_memory(dev)
        run.save()


# ---------------------------------------------------------------- part 4: the data path


def per_image_rate(pool, size: int, batch: int, workers: int, epochs: int) -> tuple[float, float]:
    """(images/s over whole epochs of torchvision's per-image path with ``workers`` processes,
    images/s of one process alone). Persistent workers, warmed by a first epoch: an epoch's time
    is then the steady pipeline with every worker busy from its start, no process start-up."""
    import numpy as np
    from torch.utils.data import DataLoader

    from raystudy.data.splits import View
    from raystudy.data.transforms import transforms

    train_tf, _ = transforms(size, (0.5,) * 3, (0.5,) * 3)
    ds = View(pool.items, np.arange(len(pool.labels)), train_tf)
    for i in range(min(8, len(ds))):  # warm: imports, first decodes
        ds[i]
    t0 = time.perf_counter()
    n1 = min(len(ds), 4 * batch)
    for i in range(n1):
        ds[i]
    single = n1 / (time.perf_counter() - t0)
    if workers == 0:
        return single, single
    # A worker that hangs (not dies) would stall the run: a batch taking a minute is an error.
    loader = DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, persistent_workers=True, timeout=60)
    for _ in loader:  # epoch 0: worker start-up, not timed
        pass
    rates = []
    for _ in range(epochs):
        t0, n = time.perf_counter(), 0
        for _, y in loader:
            n += len(y)
        rates.append(n / (time.perf_counter() - t0))
    del loader
    return statistics.median(rates), single


def part_data(run: Run, r: dict) -> None:
    """Part 4: images/s of both data paths on JPEG-like images; a data-fed step vs a ready batch."""
    bench_step, bench_data = bench()
    plan, dev = run.plan, run.device
    workers = run.args.workers if run.args.workers is not None else len(os.sched_getaffinity(0))
    batch = run.store.get("vitb", {}).get("batch", plan.vitb_batch)
    tmp = Path(tempfile.mkdtemp(prefix="gpu_acceptance_data", dir=run.out))
    try:
        t0 = time.perf_counter()
        pool = bench_data.jpeg_like(plan.n_jpeg, tmp / "jpeg")
        r["made_jpegs_s"] = time.perf_counter() - t0
        stream, build_s, nbytes = bench_data.cache_stream(pool, 256, batch, dev, tmp / "cache", "jpeg")
        size = 224
        r.update(
            images=plan.n_jpeg,
            image_sides="300-500 px JPEG",
            output=f"{size}x{size}",
            batch=batch,
            cache_build_s=build_s,
            cache_mib=nbytes / 2**20,
            per_image_workers=workers,
            per_image_loader_batch=plan.loader_batch,
        )
        bench_data.window(stream, 1, dev)  # warm: first page faults, kernels
        # The stream is endless (a new shuffle each epoch): windows may cross epochs.
        cache_rates = [bench_data.window(stream, 4 if plan.smoke else 12, dev) for _ in range(max(3, plan.reps))]
        cache = statistics.median(cache_rates)
        per_img = single = None
        if run.left() < 15:
            r["per_image"] = f"skipped: out of time ({run.left():.0f} s left in the part)"
        else:
            try:
                per_img, single = per_image_rate(pool, size, plan.loader_batch, workers, epochs=2)
            except Exception as e:  # noqa: BLE001 - e.g. a small /dev/shm for the workers; the fed step still runs
                r["per_image"] = "error: " + traceback.format_exception_only(type(e), e)[-1].strip()
        r["cache_images_per_s"] = cache
        if per_img is not None:
            ideal = single * max(workers, 1)
            r.update(
                per_image_images_per_s=per_img,
                per_image_one_process_images_per_s=single,
                per_image_ideal_images_per_s=ideal,
                ratio=cache / per_img,
                ratio_to_ideal=cache / ideal,
            )
            note(
                r,
                f"cache + device augmentation {cache:,.0f} img/s; torchvision per image {per_img:,.0f} img/s "
                f"with {workers} workers (one process {single:,.0f} img/s, x{workers} = {ideal:,.0f}): "
                f"x{cache / per_img:.1f} (x{cache / ideal:.1f} against the ideal)",
            )
            run.target(
                "data path / torchvision per-image path",
                cache / max(per_img, ideal),
                ">= 10",
                cache / max(per_img, ideal) >= 10,
                "against the better of measured and ideal",
            )
        # A full ViT-B step fed by the data path vs fed a ready batch.
        if run.left() < 10:
            r["fed_step"] = f"skipped: out of time ({run.left():.0f} s left in the part)"
            return
        if plan.vitb.img_size != size:
            raise RuntimeError(f"the data path makes {size}px images; {plan.vitb.key} takes {plan.vitb.img_size}")
        model, opt, groups = prepare(build(plan.vitb, dev), "full", dev)
        staged = next(stream)
        t = bench_step.interleaved(
            {
                "ready": bench_step.raystudy_step(model, opt, groups, dev, bench_step.fixed(staged)),
                "data_path": bench_step.raystudy_step(model, opt, groups, dev, bench_step.nxt(stream)),
            },
            plan.reps,
            dev,
            plan.inner,
        )
        feed = t.ratio("data_path", "ready")
        r["fed_step"] = {
            "ready_seconds_per_step": t["ready"],
            "data_path_seconds_per_step": t["data_path"],
            "ratio": feed,
        }
        run.store["feed_factor"] = feed
        note(
            r,
            f"ViT-B full step: ready batch {t['ready'] * 1e3:.1f} ms, fed by the data path "
            f"{t['data_path'] * 1e3:.1f} ms: x{feed:.3f}",
        )
        run.target("data-fed step / ready-batch step", feed, "<= 1.05", feed <= 1.05)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------- part 5: probe vs forward


def part_probe(run: Run, r: dict) -> None:
    """Part 5: probe passes (shared, in_situ) vs a plain forward over the same pairs, interleaved."""
    import torch

    from raystudy.measure import plasticity

    bench_step, _ = bench()
    plan, dev = run.plan, run.device
    model = build(plan.vitb, dev).eval()
    g = torch.Generator(device=dev).manual_seed(0)
    size = plan.vitb.img_size
    batches = []
    for start in range(0, plan.probe_pairs, plan.probe_batch):
        b = min(plan.probe_batch, plan.probe_pairs - start)
        batches.append(
            (
                torch.randn(b, 3, size, size, generator=g, device=dev),
                torch.randn(b, 3, size, size, generator=g, device=dev),
            )
        )

    def forward():
        with torch.no_grad():
            for x, y in batches:
                model(torch.cat([x, y]))

    tokens = model.patch_embed.num_patches + model.num_prefix_tokens

    def bounds():  # the probe's fixed cost, whatever the number of pairs: one mode's bounds
        for blk in model.blocks:
            plasticity.linear_bound(blk.mlp.fc1), plasticity.linear_bound(blk.mlp.fc2)
            plasticity.mha_bound(blk.attn, tokens, 1.0)

    units = {
        "forward": forward,
        "shared": lambda: plasticity.probe(model, batches, mode="shared"),
        "in_situ": lambda: plasticity.probe(model, batches, mode="in_situ"),
        "bounds": bounds,
    }
    t = bench_step.interleaved(units, max(3, plan.reps // 2), dev)
    images = 2 * plan.probe_pairs
    r.update(
        model=plan.vitb.key,
        pairs=plan.probe_pairs,
        pairs_per_batch=plan.probe_batch,
        precision="fp32 (the probe runs in the model's dtype, without autocast)",
        seconds={k: t[k] for k in units},
        images_per_s={k: images / t[k] for k in units},
        ratio={k: t.ratio(k, "forward") for k in ("shared", "in_situ")},
    )
    note(
        r,
        f"{images} images: forward {t['forward']:.3f} s, shared x{r['ratio']['shared']:.3f}, "
        f"in_situ x{r['ratio']['in_situ']:.3f}; of a probe, its bounds (once a probe, whatever "
        f"the pairs) {t['bounds']:.3f} s",
    )
    worst = max(r["ratio"].values())
    run.target("probe pass / plain forward (worse mode)", worst, "<= 1.3", worst <= 1.3)


# ---------------------------------------------------------------- part 6: short finetunes

# The synthetic task: 10 classes, each a smooth random template, seen through N(0, 1) pixel noise,
# with 20% of labels replaced by another class. The templates are easy to tell apart; the label
# noise keeps the best achievable loss at the Bayes floor below, so that bf16 and fp32 runs are
# compared where the loss still means something (not both at 0).
TASK_CLASSES, LABEL_NOISE = 10, 0.2
LOSS_FLOOR = -(
    (1 - LABEL_NOISE) * math.log(1 - LABEL_NOISE) + LABEL_NOISE * math.log(LABEL_NOISE / (TASK_CLASSES - 1))
)  # 0.94 nats


def synthetic_task(size: int, device, seed: int = 0):
    """The task's templates and its batches: ``draw(batch) -> (x, y)`` on ``device``, from ``seed``."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator(device=device).manual_seed(seed)
    t = torch.randn(TASK_CLASSES, 3, 8, 8, generator=g, device=device)
    t = F.interpolate(t, size=(size, size), mode="bilinear", align_corners=False)
    templates = t / t.flatten(1).std(1).view(-1, 1, 1, 1)

    def draw(batch: int):
        c = torch.randint(0, TASK_CLASSES, (batch,), generator=g, device=device)
        x = templates[c] + torch.randn(batch, 3, size, size, generator=g, device=device)
        other = (c + torch.randint(1, TASK_CLASSES, (batch,), generator=g, device=device)) % TASK_CLASSES
        flip = torch.rand(batch, generator=g, device=device) < LABEL_NOISE
        return x, torch.where(flip, other, c)

    return draw


def finetune(spec: ModelSpec, condition: str, steps: int, batch: int, device, amp: bool, lr: float = 0.1) -> dict:
    """``steps`` SGD steps of random-init ``spec`` on the synthetic task; losses read once at the end."""
    import torch

    from raystudy.train import engine

    model, opt, groups = prepare(build(spec, device, num_classes=TASK_CLASSES), condition, device)
    draw = synthetic_task(spec.img_size, device)
    losses = []
    t0 = time.perf_counter()
    for s in range(steps):
        for pg in opt.param_groups:
            pg["lr"] = engine.get_lr(s, lr, max(1, steps // 10), steps)
        losses.append(engine.train_step(model, [draw(batch)], opt, groups, 1.0, device, amp=amp)["loss"])
    curve = torch.stack(losses).float().cpu()  # the one host sync of the run
    secs = time.perf_counter() - t0
    # first: the untrained model (chance is ln 10 = 2.30); final: the mean of the last 10% of steps
    first, final = curve[: max(1, steps // 50)].mean().item(), curve[-max(1, steps // 10) :].mean().item()
    return {
        "first_loss": first,
        "final_loss": final,
        "finite": bool(torch.isfinite(curve).all()),
        "falls": final < 0.8 * first,
        "seconds": secs,
        "steps": steps,
    }


def part_finetune(run: Run, r: dict) -> None:
    """Part 6: short finetunes per condition, with and without autocast; the verdicts."""
    plan, dev = run.plan, run.device
    amp_name = "bf16" if run.cuda else "amp (no-op on CPU: the engine runs fp32 there)"
    r.update(
        model=plan.vits.key,
        steps=plan.ft_steps,
        batch=plan.ft_batch,
        optimizer="sgd lr 0.1, momentum 0.9",
        task=f"{TASK_CLASSES} smooth random templates + N(0,1) noise, {LABEL_NOISE:.0%} of labels wrong",
        loss_floor=LOSS_FLOOR,
        loss="first: mean of the first 2% of steps; final: of the last 10%",
        tolerance=f"|final bf16 - final fp32| <= {TOL_ABS} + {TOL_REL} x final fp32",
        amp=amp_name,
        conditions={},
    )
    last = 0.0
    for c in CONDITIONS:
        rec = r["conditions"][c] = {}
        for label, amp in (("amp", True), ("fp32", False)):
            # fp32 runs slower than bf16 on a GPU; a condition's runs cost about the last one's
            need = (last * (2.0 if label == "fp32" else 1.2)) if last else 2.0
            if run.left() < need:
                rec[label] = f"skipped: out of time ({run.left():.0f} s left in the part)"
                continue
            rec[label] = finetune(plan.vits, c, plan.ft_steps, plan.ft_batch, dev, amp)
            last = rec[label]["seconds"] if label == "amp" else last
        a, f = rec.get("amp"), rec.get("fp32")
        if isinstance(a, dict) and isinstance(f, dict):
            rec["abs_diff"] = abs(a["final_loss"] - f["final_loss"])
            rec["within_tolerance"] = rec["abs_diff"] <= TOL_ABS + TOL_REL * f["final_loss"]
        run.save()
        if isinstance(a, dict):
            note(
                r,
                f"{c:<12} loss {a['first_loss']:.3f} -> {a['final_loss']:.3f} ({amp_name.split()[0]}; "
                f"floor {LOSS_FLOOR:.3f})"
                + (f", fp32 {f['final_loss']:.3f}, |diff| {rec['abs_diff']:.3f}" if "abs_diff" in rec else ""),
            )
    done = [rec for rec in r["conditions"].values() if isinstance(rec.get("amp"), dict)]
    runs = [x for rec in r["conditions"].values() for x in (rec.get("amp"), rec.get("fp32")) if isinstance(x, dict)]
    compared = [rec for rec in done if "within_tolerance" in rec]
    run.target(
        "finetune: the loss falls (final < 0.8 x first)",
        f"{sum(x['falls'] for x in runs)}/{len(runs)} runs",
        "all",
        all(x["falls"] for x in runs) and bool(runs),
    )
    run.target(
        "finetune: no NaN or inf",
        f"{sum(x['finite'] for x in runs)}/{len(runs)} runs finite",
        "all",
        all(x["finite"] for x in runs) and bool(runs),
    )
    run.target(
        "finetune: bf16 final loss vs fp32",
        f"{sum(x['within_tolerance'] for x in compared)}/{len(compared)} conditions within tolerance",
        f"all, |diff| <= {TOL_ABS} + {TOL_REL} x fp32",
        all(x["within_tolerance"] for x in compared) and bool(compared),
    )


# ---------------------------------------------------------------- part 7: step times and GPU-hours


def write_step_times(run: Run) -> Path | None:
    """step_times.json from every step time measured so far; None if there is none yet."""
    from raystudy.measure import costs

    plan = run.plan
    models_doc = {}
    vitb = run.store.get("vitb")
    if vitb:
        m = {
            "batch_per_gpu": vitb["batch"],
            "seconds_per_step": vitb["seconds"],
            "notes": "a ready device batch; data_feed_factor: the data path's measured cost (part 4)",
        }
        if run.store.get("vitb_compiled"):
            m["compiled_seconds_per_step"] = run.store["vitb_compiled"]
        if run.store.get("feed_factor"):
            m["data_feed_factor"] = max(1.0, run.store["feed_factor"])  # never priced below a ready batch
        models_doc[plan.vitb.key] = m
    for key, v in run.store.get("large", {}).items():
        if v["seconds"]:
            models_doc[key] = {
                "batch_per_gpu": v["batch_per_gpu"],
                "seconds_per_step": v["seconds"],
                "notes": "a ready device batch, the paper's gradient accumulation",
            }
    if not models_doc:
        return None
    env = run.doc["environment"]
    doc = {
        "format": costs.FORMAT,
        "gpu": env.get("device_name", "?"),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": run.doc["command"],
        "precision": "bf16 autocast" if run.cuda else "fp32 (CPU)",
        "torch": env.get("torch"),
        **({"smoke": True} if plan.smoke else {}),
        "models": models_doc,
    }
    return costs.write_step_times(run.out / STEP_TIMES_NAME, doc)


def part_step_times(run: Run, r: dict) -> None:
    """Part 7: step_times.json from the measured steps, and the paper grid priced from it."""
    from raystudy.measure import costs
    from raystudy.spaces import grids, schema

    plan = run.plan
    path = write_step_times(run)
    if path is None:
        r["_skip"] = "no step time was measured in this run (parts 2 and 3 did not run)"
        return
    table = costs.load_step_times(path)
    r["file"] = str(path)
    r["measured_models"] = sorted(table.models)

    # The ViT-B paper grid, priced exactly as `python -m raystudy.grid --model vit_base --dry-run`.
    space = grids.load_grid("paper")
    trials = grids.expand(space, "vit_base")
    flops_est = grids.gpu_hours(dataclasses.replace(space, step_times=None), "vit_base", trials)
    est = grids.gpu_hours(dataclasses.replace(space, step_times=path), "vit_base", trials)
    r["paper_grid"] = {
        "trials": len(trials),
        "vit_base": {
            "dry_run": est.describe(),
            "hours": est.hours,
            "by_condition": est.by_condition,
            "flop_estimate_hours": flops_est.hours,
        },
    }
    note(r, f"vit_base, paper grid ({len(trials)} trials): {est.describe()} (FLOP estimate: {fmt(flops_est.hours)} h)")
    # ViT-L and ViT-H: the same trials with each model's workers, GPUs and measured key.
    rows = [(t.config["condition"], t.config["steps"], t.config["batch_size"], t.config["compile"]) for t in trials]
    paper = paper_models()
    for key, _ in plan.large:
        pm = paper[key]
        opts = schema.model_options(space.models, key)
        e = costs.estimate(
            key,
            [costs.TrialCost(c, s, b, pm["workers"], pm["gpus_per_trial"], comp) for c, s, b, comp in rows],
            step_times=table,
            fallback=opts["step_seconds"],
        )
        r["paper_grid"][key] = {"hours": e.hours, "by_condition": e.by_condition, "describe": e.describe()}
        note(r, f"{key}: {e.describe()}")
    if plan.smoke:
        # The tiny stand-ins' step times price the paper's trials: the measured path runs, the
        # hours mean nothing (vit_base above fell back to its FLOP estimate, as it should here).
        e = costs.estimate(
            plan.vitb.key, [costs.TrialCost(c, s, b, 1, 1, comp) for c, s, b, comp in rows], step_times=table
        )
        r["paper_grid"]["smoke_check"] = {
            "priced_from_measurements": e.measured,
            "of": len(rows),
            "note": "CPU stand-in's step times; a code-path check, not an estimate",
        }
        note(
            r,
            f"smoke: {e.measured} of {len(rows)} trials priced from the stand-in's measured step "
            "times (a code-path check, not an estimate)",
        )
    run.target(
        "ViT-B paper grid (924 trials, SGD), measured step times",
        est.hours if est.measured else "not measured",
        "<= 200 H200-hours",
        est.hours <= 200 if est.measured and est.hours else None,
        "" if est.measured else est.note,
    )


# ---------------------------------------------------------------- main

PARTS = [
    Part("1_gpu_tests", "GPU-marked tests", part_gpu_tests, 20),
    Part("2_vitb_step", "ViT-B/16 step, MFU per condition", part_vitb, 20),
    Part("3_large_models", "ViT-L/16, ViT-H/14 at the paper's per-GPU batch", part_large, 20),
    Part("4_data_path", "data path vs torchvision; data-fed step", part_data, 25),
    Part("5_probe", "plasticity probe vs plain forward", part_probe, 10),
    Part("6_finetune", "short finetunes: bf16 vs fp32", part_finetune, 20),
    Part("7_step_times", "measured step times and the grid's GPU-hours", part_step_times, 10),
    Part("2b_vitb_compiled", "ViT-B/16 step under torch.compile", part_vitb_compiled, 45),
]
SMOKE_MIN_S = 1.0  # --smoke: tiny parts; only the budget as a whole is checked


def part_b(key: str) -> Callable[[Run, dict], None]:
    """A part of set B (benchmarks/gpu_acceptance_b.py), imported when it runs."""

    def run_part(run: Run, r: dict) -> None:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import gpu_acceptance_b

        gpu_acceptance_b.PARTS[key](run, r)

    return run_part


# Part set B (--parts B): compile per condition, trials packed on one GPU, the paper's configuration.
PARTS_B = [
    Part("B1_compile", "compile per trained condition: verdicts, compile seconds", part_b("B1_compile"), 60),
    Part("B2_packing", "1, 2 and 4 trials at once on one GPU", part_b("B2_packing"), 30),
    Part(
        "B3_paper_configuration", "the reference's loop against raystudy's step", part_b("B3_paper_configuration"), 25
    ),
]


class Parser(argparse.ArgumentParser):
    """argparse, with bad input as one line and exit status 2."""

    def error(self, message):  # one line, exit 2
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def parse_args(argv):
    """Flags, checked: anything wrong ends the script with one line and status 2."""
    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for the JSON, the Markdown and step_times.json")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes through every part (CPU, CI)")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="seconds for the whole run (default 440; --smoke 240; --parts B 420)",
    )
    ap.add_argument(
        "--parts",
        help="comma-separated parts to run, by key or number (e.g. 1,2,2b,7); default all; "
        "B: part set B (benchmarks/gpu_acceptance_b.py)",
    )
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--threads", type=int, help="torch threads (default: 1 for --smoke, torch's otherwise)")
    ap.add_argument("--vitb-batch", type=int, help="ViT-B batch (default 256; --smoke 8)")
    ap.add_argument("--workers", type=int, help="per-image DataLoader workers (default: every host core)")
    ap.add_argument("--compile-backend", help="torch.compile backend (default inductor; --smoke on CPU: aot_eager)")
    args = ap.parse_args(argv)
    args.part_set = "B" if args.parts is not None and args.parts.strip().upper() == "B" else "A"
    if args.part_set == "B":
        args.parts = None  # every part of the set
    if args.budget_s is None:
        args.budget_s = 420.0 if args.part_set == "B" else (240.0 if args.smoke else 440.0)
    for flag, v in (("--budget-s", args.budget_s), ("--threads", args.threads), ("--vitb-batch", args.vitb_batch)):
        if v is not None and v <= 0:
            ap.error(f"{flag} must be > 0, got {v:g}")
    if args.workers is not None and args.workers < 0:
        ap.error(f"--workers must be >= 0, got {args.workers}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        ap.error(f"--out {args.out}: exists and is not a folder")
    known = {p.key: p.key for p in PARTS} | {p.key.split("_")[0]: p.key for p in PARTS}
    if args.parts is not None:
        names = [s.strip() for s in args.parts.split(",") if s.strip()]
        bad = [s for s in names if s not in known]
        if bad or not names:
            ap.error(
                f"--parts: {', '.join(bad) or 'empty list'} unknown; valid: "
                f"{', '.join(p.key.split('_')[0] for p in PARTS)} or the full keys, or B alone"
            )
        args.parts = {known[s] for s in names}
    import torch

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device")
    if args.device == "cpu" and not args.smoke:
        ap.error("the full run needs a CUDA GPU; on a CPU run --smoke")
    return args


def environment(run: Run) -> dict:
    """What the figures were measured on."""
    import timm
    import torch

    dev = run.device
    env = {
        "device": str(dev),
        "python": platform.python_version(),
        "host": platform.node(),
        "host_cores": len(os.sched_getaffinity(0)),
        "torch": torch.__version__,
        "timm": timm.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda if dev.type == "cuda" else None,
        "blocked_imports": list(BLOCKED),
    }
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        env.update(
            device_name=props.name,
            gpu_memory_gib=props.total_memory / 2**30,
            capability=f"{props.major}.{props.minor}",
            sdpa_enabled={
                name: bool(getattr(torch.backends.cuda, f"{name}_sdp_enabled", lambda: None)())
                for name in ("flash", "mem_efficient", "cudnn", "math")
            },
        )
    else:
        env.update(device_name=f"CPU ({platform.machine()})", gpu_memory_gib=NO_CUDA)
    try:
        from timm.layers import use_fused_attn

        env["timm_fused_attention"] = bool(use_fused_attn())
    except ImportError:
        pass
    return env


def main(argv: list[str] | None = None) -> int:
    """Run every selected part; 0 unless a part failed or the run was interrupted."""
    t0 = time.perf_counter()  # the budget counts start-up (imports) too
    args = parse_args(argv)
    # What the GPU machine lacks, lacked here too; no download can start.
    block_imports(BLOCKED)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(ROOT))
    import torch

    if args.threads or args.smoke:
        torch.set_num_threads(args.threads or 1)  # a shared CPU: more threads than free cores stall
    plan = make_plan(args)
    parts = PARTS_B if args.part_set == "B" else PARTS
    if plan.smoke:
        parts = [dataclasses.replace(p, min_s=SMOKE_MIN_S) for p in parts]
    Path(args.out).mkdir(parents=True, exist_ok=True)
    run = Run(args, plan, torch.device(args.device), parts, t0)
    if args.part_set == "B":
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import gpu_acceptance_b

        run.plan_b = gpu_acceptance_b.make_plan(args)
        plan = dataclasses.replace(plan, part_caps=run.plan_b.part_caps)
        run.plan = plan
        (run.out / "tmp_b").mkdir(exist_ok=True)
    signal.signal(signal.SIGTERM, _on_sigterm)
    status = 0
    try:
        try:
            run.doc["environment"] = environment(run)
        except Exception as e:  # noqa: BLE001 - recorded; the parts still run
            run.doc["environment"] = {
                "device": str(run.device),
                "error": traceback.format_exception_only(type(e), e)[-1].strip(),
            }
        if run.cuda and args.part_set == "A":
            try:  # the denominator of every MFU: the best of three dense bf16 8192^3 matmul runs
                bench_step, _ = bench()
                rate = max(bench_step.matmul_rate(run.device) for _ in range(3))
                run.store["matmul_peak"] = rate
                run.doc["environment"]["bf16_matmul_tflops"] = rate / 1e12
            except Exception as e:  # noqa: BLE001 - recorded; the MFUs then say not measured
                run.doc["environment"]["bf16_matmul_tflops"] = (
                    "not measured: " + traceback.format_exception_only(type(e), e)[-1].strip()
                )
        else:
            run.doc["environment"]["bf16_matmul_tflops"] = NO_CUDA if not run.cuda else "not measured: part set B"
        run.save()
        for i, p in enumerate(parts):
            rest = sum(q.min_s for q in parts[i + 1 :] if args.parts is None or q.key in args.parts)
            run.run_part(p, args.parts is None or p.key in args.parts, rest)
            rec = run.doc["parts"][p.key]
            print(
                f"[{run.elapsed():6.1f} s] {p.key}: {rec['status']}"
                + (f" ({rec.get('error') or rec.get('reason')})" if rec.get("error") or rec.get("reason") else ""),
                flush=True,
            )
            run.save()
    except (Interrupted, KeyboardInterrupt):
        for rec in run.doc["parts"].values():
            if rec["status"] == "pending":
                rec.update(status="skipped", reason="the run was interrupted")
        status = 1
    if args.part_set == "B":
        gpu_acceptance_b.clean(run)
    run.doc["finished"] = status == 0
    run.save()
    errors = [k for k, p in run.doc["parts"].items() if p["status"] in ("error", "interrupted")]
    print(
        f"wrote {run.out / JSON_NAME} and {run.out / MD_NAME} in {run.elapsed():.1f} s"
        + (f"; errors in {', '.join(errors)}" if errors else "")
    )
    return 1 if errors or status else 0


if __name__ == "__main__":
    sys.exit(main())
