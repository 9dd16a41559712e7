#!/usr/bin/env python3
"""Part set B of the GPU acceptance: compile per condition, trials packed on one GPU, and the
paper's own way of training side by side with raystudy's.

On the GPU machine (one GPU; at most 7 minutes: --budget-s 420 by default, --smoke's too), from the repository root:

    python benchmarks/gpu_acceptance.py --parts B --out $OUT/gpu_b

Anywhere, at tiny sizes, through every path of the three parts (tests/test_gpu_acceptance.py runs it):

    python benchmarks/gpu_acceptance.py --parts B --smoke --out /tmp/gpu_b_smoke

Each measured run is a trial of raystudy's own loop (``raystudy.train.engine.train``) in a process of
its own, on synthetic images written here as your own data (a class-folder tree); Ray, MLflow and
Optuna are blocked in every process, as on the GPU machine where they are absent.

  B1 compile_per_condition   full, MHA, FC1, FC2, LN1, LN2, LoRA and MHA+FC1 (the linear probe is
                             closed form: nothing to compile), each trained eagerly and under
                             torch.compile through >= 2 evaluations and a checkpoint: final losses
                             within 0.05 + 0.1 x eager's, no graph compiled after the first
                             evaluation (torch._dynamo's counters), the compile seconds of a
                             fresh process with an empty Inductor cache (cold) and of a second
                             process reusing it (TORCHINDUCTOR_CACHE_DIR shared: warm). The
                             verdicts also go to compile_verdicts.json, which `compile: auto`
                             reads once copied to search_spaces/measured/.
  B2 packing                 1, 2 and 4 trial processes at once on the one GPU, for full and LN1:
                             images/s in total, each process's seconds per step, peak memory
  B3 paper_configuration     the reference's training loop (fp32, torchvision's per-image PIL
                             transforms in a DataLoader in the main process, its unfused SGD, its
                             explicit-softmax attention, batch 512) against raystudy's step on the
                             same model and data shape: seconds per 100 steps and the ratio

Verdicts are judged only in a full run on a GPU; --smoke runs the same code paths on a CPU.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCKED = ("ray", "mlflow", "optuna")
COMPILE_CONDITIONS = ("full", "MHA", "FC1", "FC2", "LN1", "LN2", "lora", "MHA+FC1")
PACK_CONDITIONS = ("full", "LN1")
VERDICTS_NAME = "compile_verdicts.json"
VERDICTS_FORMAT = "raystudy-compile-verdicts/1"
TOL_ABS, TOL_REL = 0.05, 0.10  # the script's bf16-vs-fp32 rule, here compiled against eager
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


@dataclass(frozen=True)
class PlanB:
    """Sizes of part set B: the GPU run's, or the smoke run's tiny ones."""

    smoke: bool
    model: str  # the config's model: its input size and normalisation
    tiny: dict | None  # --smoke: a tiny VisionTransformer passed to the loop in its place
    backend: str  # torch.compile's backend
    compile_conditions: tuple[str, ...]
    compile_batch: int
    compile_steps: int
    compile_eval_every: int
    jobs: int  # compile processes at once (a compile is CPU work; the GPU idles meanwhile)
    pack_counts: tuple[int, ...]
    pack_conditions: tuple[str, ...]
    pack_batch: int
    pack_steps: int
    pack_log_every: int
    paper_batch: int
    paper_steps: int  # timed steps (after paper_warm), both loops
    paper_warm: int
    images: int  # images in the synthetic dataset (a fifth is its fixed test split)
    classes: int
    side: int  # CIFAR's 32 px, as the paper's main grid
    part_caps: dict


def make_plan(args) -> PlanB:
    """The GPU run's sizes, or with ``--smoke`` tiny ones through the same code."""
    if args.smoke:
        return PlanB(
            smoke=True,
            model="vit_base_patch16_224",
            tiny=dict(img_size=224, patch_size=32, embed_dim=32, depth=2, num_heads=2),
            backend=args.compile_backend or ("inductor" if args.device == "cuda" else "aot_eager"),
            compile_conditions=("full",),
            compile_batch=8,
            compile_steps=6,
            compile_eval_every=3,
            jobs=2,
            pack_counts=(1, 2),
            pack_conditions=("full",),
            pack_batch=8,
            pack_steps=6,
            pack_log_every=2,
            paper_batch=16,
            paper_steps=4,
            paper_warm=2,
            images=60,
            classes=4,
            side=32,
            part_caps={},
        )
    return PlanB(
        smoke=False,
        model="vit_base_patch16_224",
        tiny=None,
        backend=args.compile_backend or "inductor",
        compile_conditions=COMPILE_CONDITIONS,
        compile_batch=128,
        compile_steps=30,
        compile_eval_every=10,
        jobs=4,
        pack_counts=(1, 2, 4),
        pack_conditions=PACK_CONDITIONS,
        pack_batch=256,
        pack_steps=20,
        pack_log_every=5,
        paper_batch=512,
        paper_steps=12,
        paper_warm=4,
        images=1000,
        classes=10,
        side=32,
        part_caps={"B1_compile": 210, "B2_packing": 130, "B3_paper_configuration": 60},
    )


def helpers(run):
    """The acceptance script's module (records, notes, formatting), whichever name it runs under."""
    return sys.modules[type(run).__module__]


# ---------------------------------------------------------------- synthetic data, as your own images


def write_images(folder: Path, images: int, classes: int, side: int, seed: int = 0) -> Path:
    """A class-folder tree of ``images`` PNGs, ``side`` px: a smooth template per class seen through
    noise, so that a loss falls and two runs' losses can be compared. Written once per run."""
    import numpy as np
    from PIL import Image

    done = folder / ".complete"
    if done.exists():
        return folder
    rng = np.random.default_rng(seed)
    small = rng.normal(size=(classes, 4, 4, 3))
    templates = np.kron(small, np.ones((side // 4, side // 4, 1)))
    for i in range(images):
        c = i % classes
        x = 128 + 40 * templates[c] + rng.normal(scale=40, size=(side, side, 3))
        d = folder / f"c{c}"
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.clip(x, 0, 255).astype(np.uint8)).save(d / f"{i:05d}.png")
    done.write_text("")
    return folder


def trial_config(plan: PlanB, data: Path, **over) -> dict:
    """A trial's flat config on the synthetic images: random init, the paper's normalisation."""
    cfg = dict(
        model=plan.model,
        pretrained=False,
        dataset="synthetic",
        data=str(data),
        data_path="cache",
        normalization="imagenet",
        condition="full",
        optimizer="sgd",
        lr=0.01,
        momentum=0.9,
        warmup_steps=1,
        eval_batch_size=64,
        precision="bf16",
        seed=0,
        device="auto",
    )
    return {**cfg, **over}


# ---------------------------------------------------------------- child processes


def child_env(run, extra: dict | None = None) -> dict:
    """The environment of a measured process: this repository first, caches under --out."""
    tmp = run.out / "tmp_b"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "RAYSTUDY_CACHE": str(tmp / "raystudy_cache"),
        "HF_HUB_OFFLINE": "1",
    }
    if run.plan_b.smoke:
        env["OMP_NUM_THREADS"] = "1"
    return {**env, **(extra or {})}


def run_children(run, specs: list[dict], jobs: int, need_s: float) -> list[dict]:
    """Run each spec in a process of its own (``jobs`` at once) within the part's time; a spec
    that cannot start in time says so, one still running at the part's end is ended (by pid)."""
    tmp = Path(tempfile.mkdtemp(prefix="children", dir=run.out / "tmp_b"))
    results: list[dict] = [{} for _ in specs]
    waiting, running = list(range(len(specs))), {}
    while waiting or running:
        while waiting and len(running) < jobs:
            i = waiting.pop(0)
            if run.left() < need_s:
                results[i] = {
                    "skipped": f"out of time: {run.left():.0f} s left in the part, a run needs ~{need_s:.0f} s"
                }
                continue
            spec_file, out_file = tmp / f"{i}.spec.json", tmp / f"{i}.out.json"
            spec_file.write_text(json.dumps(specs[i]["spec"]))
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(spec_file), str(out_file)]
            log = open(tmp / f"{i}.log", "w")
            proc = subprocess.Popen(cmd, cwd=ROOT, env=specs[i]["env"], stdout=log, stderr=subprocess.STDOUT)
            running[i] = (proc, out_file, log, time.perf_counter())
        time.sleep(0.2)
        for i, (proc, out_file, log, t0) in list(running.items()):
            over = run.left() <= 0
            if proc.poll() is None and not over:
                continue
            if proc.poll() is None:
                proc.kill()  # our own child, by its pid
                proc.wait()
            log.close()
            del running[i]
            if out_file.exists():
                results[i] = json.loads(out_file.read_text())
            else:
                tail = (tmp / f"{i}.log").read_text().strip().splitlines()[-3:]
                why = "ended at the part's time limit" if over else f"exit {proc.returncode}"
                results[i] = {"error": f"{why}: {' | '.join(tail)[-400:]}"}
            results[i]["process_s"] = round(time.perf_counter() - t0, 2)
    return results


def start_together(run, specs: list[dict], timeout: float) -> list[dict]:
    """Start all specs at once, each building its model, and let them train only when every one is
    ready (a file each writes, then one file for all): their steps overlap from the first."""
    go = run.out / "tmp_b" / f"go_{time.monotonic_ns()}"
    ready = [go.with_name(go.name + f".ready{i}") for i in range(len(specs))]
    for s, r in zip(specs, ready):
        s["spec"].update(go=str(go), ready=str(r), wait_s=timeout)

    import threading

    def release():
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout and not all(r.exists() for r in ready):
            time.sleep(0.05)
        go.write_text("")

    threading.Thread(target=release, daemon=True).start()
    return run_children(run, specs, jobs=len(specs), need_s=5.0)


# ---------------------------------------------------------------- what a child process runs


class Recorder:
    """The loop's ``report``: times and losses at log points (each one a host sync), graphs
    compiled so far at each evaluation, and each evaluation's checkpoint saved as a trial saves it."""

    def __init__(self, folder: Path):
        self.folder, self.logs, self.evals, self.checkpoints = folder, [], [], 0

    def __call__(self, metrics: dict, state: dict | None) -> None:
        import torch

        now = time.perf_counter()
        if state is None and "loss" in metrics:
            self.logs.append({"step": metrics["step"], "t": now, "loss": metrics["loss"]})
        if state is not None:
            self.evals.append({"step": metrics["step"], "graphs": graphs_compiled()})
            torch.save(state, self.folder / "state.pt")
            self.checkpoints += 1

    def seconds_per_step(self) -> float | None:
        """Mean seconds per step between the first log point and the last (no evaluation between)."""
        if len(self.logs) < 2:
            return None
        a, b = self.logs[0], self.logs[-1]
        return (b["t"] - a["t"]) / (b["step"] - a["step"])


def graphs_compiled() -> int:
    """Graphs torch._dynamo has compiled in this process (a recompilation adds one)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def compile_seconds() -> float:
    """Seconds this process spent compiling: Dynamo's frames and the lazily compiled backward."""
    from torch._dynamo.utils import compilation_time_metrics as m

    return sum(m.get("_compile.compile_inner", [])) + sum(m.get("backward._backward_impl", []))


def child_model(spec: dict, num_classes: int):
    """The model a child trains: a tiny stand-in (``--smoke``), else None (the loop builds it)."""
    if not spec.get("tiny"):
        return None
    import torch
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    return VisionTransformer(num_classes=num_classes, **spec["tiny"])


def child_trial(spec: dict, cfg_over: dict) -> dict:
    """One trial of raystudy's loop as a Tune worker runs it; what it measured."""
    import torch
    import torch._dynamo

    from raystudy.train import engine
    from raystudy.train.config import from_dict
    from raystudy.train.plan import resolve

    torch._dynamo.reset()
    from torch._dynamo.utils import compilation_time_metrics, counters

    counters.clear()
    compilation_time_metrics.clear()
    plan = resolve(from_dict({**spec["config"], **cfg_over}))
    device = engine.resolve_device(plan.cfg.device)
    model = None
    if spec.get("tiny") or spec.get("go"):  # packed: built before the start, as the others
        from raystudy.models import registry

        classes = plan.splits.build().num_classes
        model = child_model(spec, classes) or registry.create_model(plan.cfg.model, classes, pretrained=False)
    if spec.get("go"):  # packed: start training with the others
        Path(spec["ready"]).write_text("")
        t0 = time.perf_counter()
        while not Path(spec["go"]).exists() and time.perf_counter() - t0 < spec["wait_s"]:
            time.sleep(0.01)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with tempfile.TemporaryDirectory(prefix="trial") as folder:  # a ViT-B checkpoint: hundreds of MB
        rec = Recorder(Path(folder))
        t0 = time.perf_counter()
        results = engine.train(plan, report=rec, model=model)
        wall = time.perf_counter() - t0
    first_eval = rec.evals[0]["graphs"] if rec.evals else None
    return {
        "condition": plan.cfg.condition,
        "compile": bool(plan.cfg.compile),
        "status": results["status"],
        "final_loss": results.get("final_loss"),
        "losses": [x["loss"] for x in rec.logs],
        "wall_s": wall,
        "seconds_per_step": rec.seconds_per_step(),
        "evaluations": len(rec.evals),
        "checkpoints": rec.checkpoints,
        "graphs_at_first_evaluation": first_eval,
        "graphs_at_last_evaluation": rec.evals[-1]["graphs"] if rec.evals else None,
        "graphs_at_end": graphs_compiled(),
        "compile_s": compile_seconds(),
        "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        "batch": plan.cfg.batch_size,
    }


def child_paper(spec: dict) -> dict:
    """The reference's training loop on the synthetic images (``baseline``), then raystudy's runs,
    in one process (a process start saved): the reference's one thread, then the process's own."""
    import torch

    threads = torch.get_num_threads()
    ref = baseline(spec["reference"], torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    torch.set_num_threads(threads)
    ours = spec["raystudy"]
    return {"reference": ref, "runs": [child_trial(ours, over) for over in ours["runs"]]}


def child_main(spec_file: str, out_file: str) -> None:
    """A measured process: block what the GPU machine lacks, run the spec, write its results."""
    for name in BLOCKED:
        sys.modules.setdefault(name, None)
    sys.path.insert(0, str(ROOT))
    spec = json.loads(Path(spec_file).read_text())
    import torch

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    if spec.get("backend") and spec["backend"] != "inductor":
        # --smoke on a CPU: the loop's torch.compile with a backend that needs no C++ toolchain
        import functools

        torch.compile = functools.partial(torch.compile, backend=spec["backend"])
    if spec["kind"] == "paper":
        out = child_paper(spec)
    else:
        out = {"runs": [child_trial(spec, over) for over in spec["runs"]]}
    Path(out_file).write_text(json.dumps(out))


# ---------------------------------------------------------------- B1: compile per condition


def compile_verdict(eager: dict, compiled: dict) -> dict:
    """Whether compile holds for a condition: both runs finished with finite losses within the
    tolerance, >= 2 evaluations and a checkpoint, and no graph compiled after the first evaluation."""
    e, c = eager.get("final_loss"), compiled.get("final_loss")
    finite = all(isinstance(x, (int, float)) and math.isfinite(x) for x in (e, c))
    diff = abs(c - e) if finite else None
    recompiles = None
    if compiled.get("graphs_at_first_evaluation") is not None:
        recompiles = compiled["graphs_at_end"] - compiled["graphs_at_first_evaluation"]
    checks = {
        "finished": eager.get("status") == "finished" and compiled.get("status") == "finished",
        "losses_within_tolerance": finite and diff <= TOL_ABS + TOL_REL * e,
        "two_evaluations_and_a_checkpoint": compiled.get("evaluations", 0) >= 2 and compiled.get("checkpoints", 0) >= 1,
        "no_recompile_after_first_evaluation": recompiles == 0,
    }
    return {
        "abs_diff": diff,
        "recompiles_after_first_evaluation": recompiles,
        "checks": checks,
        "holds": all(checks.values()),
    }


def part_compile(run, r: dict) -> None:
    """B1: each condition eager then compiled in a fresh process with an empty Inductor cache, then
    compiled again in a second process reusing that cache; verdicts and compile seconds."""
    G, plan = helpers(run), run.plan_b
    data = write_images(run.out / "tmp_b" / "images", plan.images, plan.classes, plan.side)
    base = trial_config(
        plan,
        data,
        batch_size=plan.compile_batch,
        steps=plan.compile_steps,
        eval_every=plan.compile_eval_every,
        log_every=plan.compile_eval_every,
        eval_last=True,
    )
    r.update(
        model=plan.model if not plan.smoke else f"tiny stand-in with {plan.model}'s inputs",
        backend=plan.backend,
        batch=plan.compile_batch,
        steps=plan.compile_steps,
        eval_every=plan.compile_eval_every,
        tolerance=f"|compiled - eager final loss| <= {TOL_ABS} + {TOL_REL} x eager",
        processes_at_once=plan.jobs,
        compile_s="Dynamo's and the backward's compile seconds in the trial's process; cold: an empty "
        f"Inductor cache, warm: a second process reusing it; {plan.jobs} processes compile at once",
        untested="ViT-H's 4-worker DDP under compile: it needs 4 GPUs",
        conditions={},
    )
    conds = [c for c in COMPILE_CONDITIONS if c in plan.compile_conditions]
    for c in COMPILE_CONDITIONS:
        if c not in conds:
            r["conditions"][c] = {"skipped": "--smoke compiles one condition (every path is the same)"}

    def spec(c: str, runs: list[dict]) -> dict:
        cache = run.out / "tmp_b" / "inductor" / c.replace("+", "_")
        env = {"TORCHINDUCTOR_CACHE_DIR": str(cache), "TRITON_CACHE_DIR": str(cache / "triton")}
        body = {"kind": "trial", "config": {**base, "condition": c}, "runs": runs, "tiny": plan.tiny}
        body.update(backend=plan.backend, threads=1 if plan.smoke else None)
        return {"spec": body, "env": child_env(run, env)}

    cold = run_children(
        run, [spec(c, [{"compile": False}, {"compile": True}]) for c in conds], plan.jobs, 20 if plan.smoke else 60
    )
    warm = run_children(run, [spec(c, [{"compile": True}]) for c in conds], plan.jobs, 10 if plan.smoke else 30)
    verdicts = {}
    for c, a, b in zip(conds, cold, warm):
        if "runs" not in a:
            r["conditions"][c] = a
            continue
        eager, compiled = a["runs"]
        rec = {"eager": eager, "compiled": compiled, **compile_verdict(eager, compiled)}
        rec["compile_s_cold"] = compiled["compile_s"]
        rec["compile_s_warm"] = b["runs"][0]["compile_s"] if "runs" in b else b
        rec["wall_s_cold_minus_eager"] = compiled["wall_s"] - eager["wall_s"]
        r["conditions"][c] = rec
        verdicts[c] = rec
        G.note(
            r,
            f"{c}: {'holds' if rec['holds'] else 'FAILS ' + str([k for k, v in rec['checks'].items() if not v])}; "
            f"loss eager {eager['final_loss']:.4f}, compiled {compiled['final_loss']:.4f}; "
            f"compile {rec['compile_s_cold']:.1f} s cold, {G.fmt(rec['compile_s_warm'])} s warm",
        )
    write_verdicts(run, verdicts)
    run.target(
        "compile: verdict per trained condition",
        f"{sum(v['holds'] for v in verdicts.values())}/{len(verdicts)} hold",
        f"every condition of {', '.join(conds)}",
        bool(verdicts) and len(verdicts) == len(conds) and all(v["holds"] for v in verdicts.values()),
    )


def write_verdicts(run, verdicts: dict) -> None:
    """compile_verdicts.json: per condition whether compile holds and its compile seconds; what
    ``compile: auto`` reads from search_spaces/measured/ (a smoke run's is marked so, never read)."""
    env = run.doc["environment"]
    doc = {
        "format": VERDICTS_FORMAT,
        "gpu": env.get("device_name", "?"),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": run.doc["command"],
        "torch": env.get("torch"),
        "model": run.plan_b.model,
        **({"smoke": True} if run.plan_b.smoke or not run.cuda else {}),
        "conditions": {
            c: {
                "holds": v["holds"],
                "compile_s_cold": v["compile_s_cold"],
                **({"compile_s_warm": v["compile_s_warm"]} if isinstance(v["compile_s_warm"], float) else {}),
            }
            for c, v in verdicts.items()
        },
    }
    helpers(run).write_atomic(run.out / VERDICTS_NAME, json.dumps(doc, indent=1) + "\n")


# ---------------------------------------------------------------- B2: trials packed on one GPU


def part_packing(run, r: dict) -> None:
    """B2: 1, 2 and 4 trial processes at once per condition: total images/s, each process's step, peak memory."""
    G, plan = helpers(run), run.plan_b
    data = write_images(run.out / "tmp_b" / "images", plan.images, plan.classes, plan.side)
    base = trial_config(
        plan,
        data,
        batch_size=plan.pack_batch,
        steps=plan.pack_steps,
        log_every=plan.pack_log_every,
        eval_every=plan.pack_steps,
    )
    r.update(
        model=plan.model if not plan.smoke else f"tiny stand-in with {plan.model}'s inputs",
        batch_per_process=plan.pack_batch,
        steps=plan.pack_steps,
        seconds_per_step=f"from the log at step {plan.pack_log_every} to the last, the processes started together",
        conditions={},
    )
    for c in plan.pack_conditions:
        rec = r["conditions"][c] = {}
        for k in plan.pack_counts:
            body = {"kind": "trial", "config": {**base, "condition": c}, "runs": [{}], "tiny": plan.tiny}
            body.update(backend=plan.backend, threads=1 if plan.smoke else None)
            out = start_together(run, [{"spec": dict(body), "env": child_env(run)} for _ in range(k)], 120.0)
            runs = [o["runs"][0] for o in out if "runs" in o]
            if len(runs) < k:
                rec[str(k)] = {"error": [o.get("error") or o.get("skipped") for o in out if "runs" not in o]}
                continue
            steps = [x["seconds_per_step"] for x in runs]
            rec[str(k)] = {
                "processes": k,
                "seconds_per_step": steps,
                "images_per_s_total": sum(plan.pack_batch / s for s in steps),
                "peak_memory_gib": [x["peak_memory_gib"] if run.cuda else G.NO_CUDA for x in runs],
            }
        one = rec.get("1", {}).get("images_per_s_total")
        for k in plan.pack_counts:
            x = rec.get(str(k), {})
            if one and "images_per_s_total" in x:
                x["gain_over_one"] = x["images_per_s_total"] / one
                G.note(
                    r,
                    f"{c}, {k} at once: {x['images_per_s_total']:,.0f} img/s in total (x{x['gain_over_one']:.2f} "
                    f"of one), steps {', '.join(f'{s * 1e3:.0f}' for s in x['seconds_per_step'])} ms",
                )
    gains = [
        x["gain_over_one"] for c in r["conditions"].values() for k, x in c.items() if k != "1" and "gain_over_one" in x
    ]
    run.target(
        "packing: total images/s of 2 or 4 trials at once / 1 trial (best)",
        max(gains) if gains else "not measured",
        ">= 1.10 to adopt gpus_per_trial below 1",
        max(gains) >= 1.10 if gains else None,
    )


# ---------------------------------------------------------------- B3: the paper's configuration


def baseline(spec: dict, device) -> dict:
    """The reference's loop (its apps/vit/train.py and vitef's data and optimizer code): fp32, the
    model's attention with its softmax materialised (its flash=False), torchvision's per-image PIL
    transforms through a DataLoader in the main process (no workers, one thread), plain SGD
    (torch's default implementation, not fused), clip_grad_norm_ over every parameter, a cosine
    schedule; its batch, in micro-batches only where it accumulated (or where memory runs out)."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    import torchvision.transforms.functional as TF
    from torch.utils.data import DataLoader, Dataset
    from torchvision import transforms as T

    torch.set_num_threads(1)  # the reference sets OMP_NUM_THREADS=1 (the caller puts its own back)
    rng = np.random.default_rng(0)
    n, side, size = spec["images"], spec["side"], spec["img_size"]
    arrays = rng.integers(0, 256, size=(n, side, side, 3), dtype=np.uint8)
    labels = rng.integers(0, spec["classes"], size=n).tolist()
    tf = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(*IMAGENET)])

    class Images(Dataset):
        def __len__(self):
            return n

        def __getitem__(self, i):
            return tf(TF.to_pil_image(arrays[i])), labels[i]

    model = child_model(spec, spec["classes"])
    if model is None:
        from raystudy.models import registry

        model = registry.create_model(spec["model"], spec["classes"], pretrained=False)
    for m in model.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = False
    model.to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=0.0)
    total = spec["warm"] + spec["steps"]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(1.0, s / total))))
    accum = spec["accum"]
    while True:
        try:
            secs = baseline_loop(model, opt, sched, Images(), spec, accum, device, DataLoader, F)
            break
        except torch.OutOfMemoryError:
            if spec["batch"] // accum <= 1:
                raise
            opt.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            accum *= 2
    return {
        "seconds_per_step": secs,
        "grad_accum": accum,
        "micro_batch": spec["batch"] // accum,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
    }


def baseline_loop(model, opt, sched, ds, spec, accum, device, DataLoader, F) -> float:
    """Mean seconds per optimizer step of the reference's loop over ``spec['steps']`` after ``spec['warm']``."""
    import torch

    micro = spec["batch"] // accum
    loader = DataLoader(ds, batch_size=micro, shuffle=True, drop_last=True)  # num_workers=0, as the reference

    def batches():
        while True:
            yield from loader

    it = batches()
    t0 = None
    for step in range(spec["warm"] + spec["steps"]):
        if step == spec["warm"]:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
        for _ in range(accum):
            x, y = next(it)
            if device.type != "cpu":
                x, y = x.pin_memory(), y.pin_memory()
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = F.cross_entropy(model(x), y) / accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) / spec["steps"]


def part_paper(run, r: dict) -> None:
    """B3: seconds per 100 steps of the reference's loop and of raystudy's (its default data path,
    and the tensor cache), the same model, batch and CIFAR-shaped images; the ratios."""
    G, plan = helpers(run), run.plan_b
    data = write_images(run.out / "tmp_b" / "images", plan.images, plan.classes, plan.side)
    steps = plan.paper_warm + plan.paper_steps
    base = trial_config(
        plan,
        data,
        batch_size=plan.paper_batch,
        steps=steps,
        log_every=plan.paper_warm,
        eval_every=steps,
        warmup_steps=1,
    )
    paper = G.paper_models()["vit_base"]
    ref = {
        "model": plan.model,
        "tiny": plan.tiny,
        "img_size": 224,
        "images": plan.images,
        "classes": plan.classes,
        "side": plan.side,
        "batch": plan.paper_batch,
        "accum": paper["grad_accum"],
        "steps": plan.paper_steps,
        "warm": plan.paper_warm,
    }
    ours = {"config": base, "tiny": plan.tiny, "runs": [{"data_path": "auto"}, {"data_path": "cache"}]}
    r.update(
        model=plan.model if not plan.smoke else f"tiny stand-in with {plan.model}'s inputs",
        batch=plan.paper_batch,
        images=f"{plan.side} px (CIFAR's shape), resized to 224",
        timed_steps=plan.paper_steps,
        reference="ambroiseodt/vit-plasticity apps/vit/train.py, src/vitef (data, optim), models/vit.py flash=False",
    )
    spec = {"kind": "paper", "reference": ref, "raystudy": ours, "backend": plan.backend}
    spec["threads"] = 1 if plan.smoke else None
    (b,) = run_children(run, [{"spec": spec, "env": child_env(run)}], jobs=1, need_s=15 if plan.smoke else 30)
    if "runs" not in b:
        raise RuntimeError(f"the loops did not run: {b.get('error') or b.get('skipped')}")
    a = r["reference_loop"] = {**b["reference"], "process_s": b["process_s"]}
    default, cache = b["runs"]
    r["raystudy_default"] = {**default, "data_path": "auto (torchvision's per-image path for image datasets)"}
    r["raystudy_cache"] = {**cache, "data_path": "cache"}
    per100 = {
        k: 100 * v
        for k, v in (
            ("reference", a["seconds_per_step"]),
            ("default", default["seconds_per_step"]),
            ("cache", cache["seconds_per_step"]),
        )
    }
    r["seconds_per_100_steps"] = per100
    r["speedup"] = {"default": per100["reference"] / per100["default"], "cache": per100["reference"] / per100["cache"]}
    G.note(
        r,
        f"seconds per 100 steps at batch {plan.paper_batch}: reference {per100['reference']:.1f}, raystudy default "
        f"{per100['default']:.1f} (x{r['speedup']['default']:.2f}), with data_path cache {per100['cache']:.1f} "
        f"(x{r['speedup']['cache']:.2f})",
    )
    run.target(
        "paper's configuration: reference loop / raystudy's default step (seconds per 100 steps)",
        r["speedup"]["default"],
        "> 1: the speed-up a reader of the paper gets by switching",
        r["speedup"]["default"] >= 1.0,
    )


def clean(run) -> None:
    """Remove what the run wrote only to measure (images, tensor and Inductor caches): hundreds of
    MB under --out; the processes' specs, results and logs stay."""
    import shutil

    for name in ("images", "raystudy_cache", "inductor"):
        shutil.rmtree(run.out / "tmp_b" / name, ignore_errors=True)


PARTS = {"B1_compile": part_compile, "B2_packing": part_packing, "B3_paper_configuration": part_paper}


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child_main(sys.argv[2], sys.argv[3])
    else:
        print("run it through benchmarks/gpu_acceptance.py --parts B", file=sys.stderr)
        sys.exit(2)
