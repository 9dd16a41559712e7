"""The head's tracking server behind MLflow's basic-auth app: what each request costs with and
without MLflow's cache of verified credentials, side by side in one run.

    python benchmarks/bench_auth.py                  # 200 requests each way
    python benchmarks/bench_auth.py --requests 20    # the test's toy size

Each variant is ``cluster/node.sh mlflow PORT sqlite ARTIFACTS`` in a state folder of its own (its
credentials, its auth database), with ``RAYSTUDY_AUTH_CACHE_S`` 0 (every request's password
checked: a scrypt hash) or 600 (node.sh's default); the same ``--requests`` authenticated calls
(``experiments/search``, one at a time, as a driver's writes are) against each, then a wrong
password, which both must refuse. Printed: the milliseconds a request (median and mean), the
server's CPU milliseconds a request (its processes' CPU time, steadier than wall time on a busy
machine) and the ratios of the cached server's to the uncached one's.
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NODE_SH = ROOT / "cluster" / "node.sh"
SEARCH = "/api/2.0/mlflow/experiments/search?max_results=1"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _status(uri: str, login: str) -> int:
    req = urllib.request.Request(uri + SEARCH)
    req.add_header("Authorization", "Basic " + base64.b64encode(login.encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _cpu(pid: int) -> float:
    """CPU seconds of the server's processes (its session: the server and its workers)."""
    import psutil

    root = psutil.Process(pid)
    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        try:
            c = p.cpu_times()
            total += c.user + c.system
        except psutil.Error:
            pass
    return total


def one_variant(cache_s: int, requests: int, root: Path) -> dict:
    """A server with ``RAYSTUDY_AUTH_CACHE_S=cache_s``: each request's seconds, and what a wrong password got."""
    state = root / f"state{cache_s}"
    env = {**os.environ, "RAYSTUDY_STATE": str(state), "HOME": str(root), "RAYSTUDY_AUTH_CACHE_S": str(cache_s)}
    run = lambda *a: subprocess.run(["bash", str(NODE_SH), *a], env=env, capture_output=True, text=True, timeout=300)  # noqa: E731
    p = run("mlflow", str(_free_port()), "sqlite", str(root / f"art{cache_s}"))
    if p.returncode != 0:
        sys.exit(f"bench_auth: node.sh mlflow failed: {p.stdout[-1000:]}{p.stderr[-1000:]}")
    try:
        uri = re.search(r"MLflow tracking server: (http://\S+)", p.stdout).group(1)
        creds = dict(
            line[len("export ") :].split("=", 1)
            for line in (state / "mlflow-credentials").read_text().splitlines()
            if line.startswith("export ")
        )
        login = f"{creds['MLFLOW_TRACKING_USERNAME']}:{creds['MLFLOW_TRACKING_PASSWORD']}"
        server = int((state / "mlflow.pid").read_text())
        times, cpu0 = [], _cpu(server)
        for _ in range(requests):
            t = time.perf_counter()
            if _status(uri, login) != 200:
                sys.exit(f"bench_auth: the server refused its own credentials (cache {cache_s} s)")
            times.append(time.perf_counter() - t)
        return {"times": times, "cpu": (_cpu(server) - cpu0) / requests, "wrong": _status(uri, login + "x")}
    finally:
        run("stop-mlflow")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=200, help="authenticated requests per variant (default 200)")
    args = ap.parse_args(argv)
    if args.requests < 2:
        ap.exit(2, "bench_auth: --requests: use 2 or more\n")
    with tempfile.TemporaryDirectory(prefix="rsauth") as tmp:
        rows = {cache: one_variant(cache, args.requests, Path(tmp)) for cache in (0, 600)}
    print(f"# python benchmarks/bench_auth.py --requests {args.requests}  ({date.today()}, {os.cpu_count()} CPUs)")
    print(
        "| credential cache | ms a request (median) | ms a request (mean) | server CPU ms a request "
        "| a wrong password |"
    )
    print("|---|---:|---:|---:|---|")
    for cache, r in rows.items():
        med, mean = statistics.median(r["times"]) * 1000, statistics.mean(r["times"]) * 1000
        print(f"| {cache} s | {med:.1f} | {mean:.1f} | {r['cpu'] * 1000:.1f} | {r['wrong']} |")
    ratio = statistics.mean(rows[600]["times"]) / statistics.mean(rows[0]["times"])
    print(
        f"cached / uncached, mean ms a request: {ratio:.3f}; "
        f"server CPU a request: {rows[600]['cpu'] / rows[0]['cpu']:.3f}"
    )
    return 0 if all(r["wrong"] == 401 for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
