"""Screenshots of a finished grid in the MLflow UI, for docs/mlflow_ui.md.

    python -m raystudy.grid --conditions LN1,MHA,FC2,full,linear_probe --set steps=100 --set probe_pairs=64
    python -m raystudy report --experiment raystudy-demo-vit_demo --no-curves
    python scripts/mlflow_screenshots.py --tracking-uri sqlite:///mlflow.db --out docs/img

Starts a real ``mlflow server`` over the store (its own port) and drives headless Chromium
(``chromium`` on PATH, or ``--chromium``; through playwright, ``pip install playwright``) against
it: the runs table as the grid's printed URL opens it, the best trial's page (its plasticity
metrics) and the grid's parent run (its description: the ranking and the report). Writes PNGs to
``--out``. Bad input exits with status 2 and one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout
from raystudy.tracking import views

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def fail(msg: str) -> int:
    print(f"mlflow_screenshots: {msg}", file=sys.stderr)
    return 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rest(base: str, path: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(
        f"{base}/api/2.0/mlflow/{path}",
        method="POST" if body is not None else "GET",
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def start_server(uri: str, port: int) -> subprocess.Popen:
    """``mlflow server`` over ``uri``, healthy (one worker, no job runner: a fast start)."""
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            uri,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return proc
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited with status {proc.returncode}") from None
            time.sleep(0.5)
    stop(proc)
    raise RuntimeError("mlflow server did not become healthy in 120 s")


def stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def shoot(chromium: str, base: str, shots: list[tuple], out: Path) -> None:
    """Each (file, URL, window size, action) rendered by headless Chromium into ``out/file``,
    after ``action(page)`` (waits, clicks) has run; the assistant panel is closed first."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p, tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        ctx = p.chromium.launch_persistent_context(
            profile, executable_path=chromium, headless=True, args=[f for f in FLAGS if f != "--headless"]
        )
        ctx.add_init_script(
            "localStorage.setItem('mlflow.assistant.panelOpen_v1', 'false');"
            "localStorage.setItem('mlflow.assistant.fab.autoOpenedOnFirstLoad_v1', 'true');"
        )
        page = ctx.new_page()
        for name, url, (width, height), action in shots:
            page.set_viewport_size({"width": width, "height": height})
            page.goto(url)
            action(page)
            page.wait_for_timeout(1500)  # the last data and layout settle
            page.screenshot(path=str(out / name))
            small(out / name)
            print(f"{out / name}  <- {url.replace(base, '')}")
        ctx.close()


def small(png: Path, colors: int = 64) -> None:
    """A palette PNG: UI screenshots have few colours, and the repository keeps them."""
    from PIL import Image

    with Image.open(png) as im:
        im.convert("RGB").quantize(colors).save(png, optimize=True)


def wait_text(text: str):
    return lambda page: page.get_by_text(text, exact=True).first.wait_for(timeout=60_000)


def trial_action(page) -> None:
    """The trial's page, its metrics searched down to the plasticity summaries."""
    wait_text("Description")(page)
    page.get_by_placeholder("Search metrics").fill("plasticity/")
    page.get_by_text("plasticity/shared/MHA", exact=True).first.wait_for(timeout=60_000)


def parent_action(page) -> None:
    """The parent run's page with its whole description (ranking and report) shown."""
    page.get_by_text("Show more").first.click(timeout=60_000)


def pages(base: str, experiment: str) -> list[tuple]:
    """(file name, URL, window size, action) of each screenshot: the runs table as the grid's
    printed URL opens it, the best trial, the parent run."""
    exp = rest(base, f"experiments/get-by-name?experiment_name={experiment}")["experiment"]["experiment_id"]
    runs = rest(base, "runs/search", {"experiment_ids": [exp], "max_results": 1000})["runs"]

    def tag(r, key):
        return next((t["value"] for t in r["data"].get("tags", []) if t["key"] == key), None)

    def metric(r, key):
        return next((m["value"] for m in r["data"].get("metrics", []) if m["key"] == key), float("-inf"))

    parents = [r for r in runs if tag(r, "raystudy.role") == "grid"]
    trials = [r for r in runs if tag(r, "raystudy.role") == "trial"]
    if not parents or not trials:
        raise LookupError(f"experiment {experiment!r} has no grid parent run or no trial runs; run a grid first")
    best = max(trials, key=lambda r: metric(r, "test_acc"))
    return [
        ("runs.png", views.runs_url(base, exp), (1400, 760), wait_text("test_acc")),
        ("trial.png", f"{base}/#/experiments/{exp}/runs/{best['info']['run_id']}", (1100, 1300), trial_action),
        ("parent.png", f"{base}/#/experiments/{exp}/runs/{parents[-1]['info']['run_id']}", (1100, 2400), parent_action),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python scripts/mlflow_screenshots.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--tracking-uri", default="sqlite:///mlflow.db", help="store of a finished grid (sqlite:///mlflow.db)"
    )
    ap.add_argument("--experiment", default="raystudy-demo-vit_demo", help="experiment name (raystudy-demo-vit_demo)")
    ap.add_argument("--out", default="docs/img", help="folder for the PNGs (docs/img)")
    ap.add_argument("--chromium", default=shutil.which("chromium") or "chromium", help="Chromium binary")
    args = ap.parse_args(argv)
    if not args.tracking_uri.startswith("sqlite:///"):
        return fail(f"--tracking-uri {args.tracking_uri!r}: expected sqlite:///PATH (a grid's local store)")
    db = Path(args.tracking_uri[len("sqlite:///") :])
    if not db.is_file():
        return fail(f"--tracking-uri {args.tracking_uri}: {db} does not exist; run a grid first")
    if not shutil.which(args.chromium):
        return fail(f"--chromium {args.chromium!r} is not an executable; install Chromium (apt-get install chromium)")
    try:
        import playwright  # noqa: F401
    except ImportError:
        return fail("needs playwright (pip install playwright; it drives the Chromium given by --chromium)")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        return fail(f"--out {out} is a file, expected a folder")
    out.mkdir(parents=True, exist_ok=True)

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = start_server(f"sqlite:///{db.resolve()}", port)
    try:
        try:
            shots = pages(base, args.experiment)
        except LookupError as e:
            return fail(str(e))
        except urllib.error.HTTPError as e:
            return fail(f"--experiment {args.experiment!r}: not in {args.tracking_uri} ({e.code})")
        shoot(args.chromium, base, shots, out)
    finally:
        stop(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
