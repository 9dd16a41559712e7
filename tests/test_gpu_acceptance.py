"""benchmarks/gpu_acceptance.py: its --smoke run goes through every part and records every figure
or the reason it has none; it never needs Ray, MLflow or Optuna; bad flags exit 2 in one line."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from raystudy.measure import costs

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_acceptance.py"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def script_module():
    spec = importlib.util.spec_from_file_location("gpu_acceptance", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while being defined
    spec.loader.exec_module(mod)  # nothing happens at import: definitions only
    return mod


G = script_module()


def smoke(out: Path, *flags: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--out", str(out), *flags],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_smoke_run_goes_through_every_part_and_records_everything(tmp_path):
    t0 = time.perf_counter()
    proc = smoke(tmp_path)
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads((tmp_path / G.JSON_NAME).read_text())
    assert doc["mode"] == "smoke" and doc["finished"] is True
    assert list(doc["parts"]) == [p.key for p in G.PARTS]
    for key, part in doc["parts"].items():
        # every part ran its code path at tiny sizes, or says why not
        assert part["status"] in ("ok", "skipped"), (key, part)
        if part["status"] == "skipped":
            assert part["reason"], key
        else:
            assert part["results"] and part["notes"] and part["seconds"] >= 0, key
    assert all(p["status"] == "ok" for p in doc["parts"].values()), {
        k: p.get("reason") for k, p in doc["parts"].items()
    }

    env = doc["environment"]
    assert env["blocked_imports"] == ["ray", "mlflow", "optuna"]
    assert env["forbidden_modules_loaded"] == []

    parts = {k: p["results"] for k, p in doc["parts"].items()}
    tests = parts["1_gpu_tests"]
    # every GPU test was collected with ray/mlflow/optuna blocked, none failed (on a CPU: all skipped)
    assert len(tests["tests"]) >= 9 and tests["failed"] == 0 and tests["returncode"] == 0, tests
    vitb = parts["2_vitb_step"]["conditions"]
    assert set(vitb) == set(G.CONDITIONS)
    for r in vitb.values():
        assert r["seconds_per_step"] > 0 and r["counted_gflop_per_step"] > 0
    assert vitb["linear_probe"]["flop_share"] < vitb["LN1"]["flop_share"] < 1 == vitb["full"]["flop_share"]
    compiled = parts["2b_vitb_compiled"]["conditions"]
    assert compiled["full"]["seconds_per_step"] > 0 and "skipped" in compiled["MHA"]
    for model in ("vit_large", "vit_huge"):
        assert set(parts["3_large_models"][model]["seconds_per_step"]) == set(G.CONDITIONS)
    data = parts["4_data_path"]
    assert data["cache_images_per_s"] > 0 and data["per_image_images_per_s"] > 0 and data["fed_step"]["ratio"] > 0
    assert set(parts["5_probe"]["ratio"]) == {"shared", "in_situ"}
    ft = parts["6_finetune"]["conditions"]
    assert set(ft) == set(G.CONDITIONS)
    for c, r in ft.items():
        assert r["amp"]["finite"] and r["fp32"]["finite"], c
        assert r["amp"]["falls"], (c, r)  # the synthetic task is learnt within the smoke's 40 steps
    if not torch.cuda.is_available():
        # CUDA-only figures are said not to be measured, never made up
        assert env["bf16_matmul_tflops"] == G.NO_CUDA
        assert vitb["full"]["mfu"] == G.NO_CUDA and compiled["full"]["mfu"] == G.NO_CUDA
        assert parts["3_large_models"]["vit_huge"]["peak_memory_gib"] == G.NO_CUDA
        # autocast is a no-op on a CPU: the two runs are the same computation
        assert all(r["abs_diff"] == 0 for r in ft.values())
    assert all(t["met"] is None and t["not_judged"] for t in doc["targets"])  # smoke: nothing judged

    st = costs.load_step_times(tmp_path / G.STEP_TIMES_NAME)
    assert set(st.models["smoke-vit_base"].seconds) == set(G.CONDITIONS)
    assert "full" in st.models["smoke-vit_base"].compiled
    grid = parts["7_step_times"]["paper_grid"]
    assert grid["trials"] == 825 and grid["smoke_check"]["priced_from_measurements"] == 825
    assert "FLOP estimate" in grid["vit_base"]["dry_run"]  # no vit_base measured here: the fallback, said so

    md = (tmp_path / G.MD_NAME).read_text()
    assert all(key in md for key in doc["parts"]) and "## Targets" in md
    assert (tmp_path / "gpu_tests.xml").exists()
    print(f"smoke run: {wall:.1f} s wall")


def test_a_budget_too_small_skips_every_part_with_its_reason(tmp_path):
    proc = smoke(tmp_path, "--budget-s", "0.001")
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((tmp_path / G.JSON_NAME).read_text())
    for key, part in doc["parts"].items():
        assert part["status"] == "skipped" and part["reason"].startswith("out of time"), (key, part)
    assert (tmp_path / G.MD_NAME).exists()


def test_sigterm_mid_part_records_it_and_stops(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--smoke", "--out", str(tmp_path), "--parts", "6,7"],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 300
        while time.time() < deadline:  # wait until the finetunes are under way
            try:
                doc = json.loads((tmp_path / G.JSON_NAME).read_text())
                if doc["parts"]["6_finetune"]["status"] == "running":
                    break
            except (FileNotFoundError, json.JSONDecodeError, KeyError):
                pass
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    doc = json.loads((tmp_path / G.JSON_NAME).read_text())
    parts = doc["parts"]
    assert parts["6_finetune"]["status"] == "interrupted" and doc["finished"] is False
    assert parts["7_step_times"] == {**parts["7_step_times"], "status": "skipped", "reason": "the run was interrupted"}
    assert parts["1_gpu_tests"]["reason"] == "not selected (--parts)"


BLOCKED_PROCESS = """
import importlib.util, sys
sys.path.insert(0, {root!r})
import benchmarks.gpu_acceptance as G
G.block_imports(G.BLOCKED)
for name in ("ray", "mlflow", "optuna"):
    assert importlib.util.find_spec(name) is None, name  # absent, not an error: libraries probe this way
    try:
        __import__(name + ".tune" if name == "ray" else name)
    except ModuleNotFoundError:
        pass
    else:
        raise AssertionError(name + " imported")
import peft  # imports accelerate, which probes find_spec('mlflow') (failed on the GPU machine)
import raystudy.measure.costs, torch
print("ok")
"""


def test_blocked_packages_look_absent_and_what_probes_for_them_still_imports():
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKED_PROCESS.format(root=str(ROOT))], env=ENV, capture_output=True, text=True
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--smoke"], "the following arguments are required: --out"),
        (["--out", "x", "--smoke", "--budget-s", "-1"], "--budget-s must be > 0"),
        (["--out", "x", "--smoke", "--parts", "1,9"], "--parts: 9 unknown"),
        (["--out", "x", "--smoke", "--workers", "-2"], "--workers must be >= 0"),
        (["--out", "x", "--smoke", "--device", "tpu"], "invalid choice: 'tpu'"),
    ],
)
def test_bad_flags_exit_2_in_one_line(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        G.parse_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_out_must_be_a_folder_and_the_full_run_needs_a_gpu(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(SystemExit):
        G.parse_args(["--out", str(f), "--smoke"])
    assert "exists and is not a folder" in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit) as e:
            G.parse_args(["--out", str(tmp_path)])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and "needs a CUDA GPU; on a CPU run --smoke" in err[0]


def test_paper_models_read_the_per_gpu_batch_from_the_space():
    pm = G.paper_models()
    assert pm["vit_base"] == {"batch": 512, "workers": 1, "gpus_per_trial": 1, "per_gpu": 512, "grad_accum": 1}
    assert pm["vit_large"]["per_gpu"] == 512 and pm["vit_large"]["grad_accum"] == 2
    assert pm["vit_huge"]["per_gpu"] == 128 and pm["vit_huge"]["gpus_per_trial"] == 4


@pytest.mark.slow
def test_part_set_b_smoke_goes_through_compile_packing_and_the_papers_loop(tmp_path):
    proc = smoke(tmp_path, "--parts", "B")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads((tmp_path / G.JSON_NAME).read_text())
    assert list(doc["parts"]) == [p.key for p in G.PARTS_B] and doc["finished"] is True
    assert all(p["status"] == "ok" for p in doc["parts"].values()), {
        k: p.get("error") or p.get("reason") for k, p in doc["parts"].items()
    }
    assert doc["environment"]["forbidden_modules_loaded"] == []
    parts = {k: p["results"] for k, p in doc["parts"].items()}

    b1 = parts["B1_compile"]["conditions"]
    assert set(b1) == {"full", "MHA", "FC1", "FC2", "LN1", "LN2", "lora", "MHA+FC1"}
    full = b1["full"]  # the one the smoke compiles; the others say why not
    assert all("skipped" in v for c, v in b1.items() if c != "full")
    assert full["eager"]["evaluations"] >= 2 and full["compiled"]["checkpoints"] >= 1
    assert full["compiled"]["graphs_at_first_evaluation"] > 0 == full["eager"]["graphs_at_end"]
    assert full["recompiles_after_first_evaluation"] == 0 and full["holds"] is True, full["checks"]
    assert full["compile_s_cold"] > 0 and full["compile_s_warm"] > 0
    verdicts = json.loads((tmp_path / "compile_verdicts.json").read_text())
    assert verdicts["smoke"] is True and verdicts["conditions"]["full"]["holds"] is True
    assert costs.load_compile_verdicts(tmp_path / "compile_verdicts.json") is None  # a smoke's: never read

    b2 = parts["B2_packing"]["conditions"]["full"]
    assert b2["1"]["processes"] == 1 and len(b2["2"]["seconds_per_step"]) == 2
    assert b2["2"]["images_per_s_total"] > 0 and b2["2"]["gain_over_one"] > 0

    b3 = parts["B3_paper_configuration"]
    assert set(b3["seconds_per_100_steps"]) == {"reference", "default", "cache"}
    assert all(v > 0 for v in b3["seconds_per_100_steps"].values()) and set(b3["speedup"]) == {"default", "cache"}
    assert b3["reference_loop"]["grad_accum"] == 1  # ViT-B: the reference's batch in one pass
    names = [t["name"] for t in doc["targets"]]
    assert any(n.startswith("compile") for n in names) and any(n.startswith("packing") for n in names)
    assert all(t["met"] is None for t in doc["targets"])  # smoke: nothing judged
    assert not (tmp_path / "tmp_b" / "images").exists() and not (tmp_path / "tmp_b" / "inductor").exists()


def test_part_set_b_is_selected_alone():
    args = G.parse_args(["--out", "x", "--smoke", "--parts", "B"])
    assert args.part_set == "B" and args.parts is None and args.budget_s == 420
    assert G.parse_args(["--out", "x", "--smoke", "--parts", "1,2"]).part_set == "A"
