"""benchmarks/nemesis.py: its seeded schedule, its coverage table and its input, by hand; and a toy
run in the slow tier (a rehearsal grid under five faults, two of them on events, then the checker)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import nemesis  # noqa: E402


def test_a_seed_draws_the_same_faults_for_its_store_and_another_seed_others():
    one = nemesis.schedule(7, "postgresql", 7, 60.0, (5.0, 30.0), disk=True)
    assert one == nemesis.schedule(7, "postgresql", 7, 60.0, (5.0, 30.0), disk=True)
    assert one != nemesis.schedule(8, "postgresql", 7, 60.0, (5.0, 30.0), disk=True)
    assert len(one) == 7
    for f in one:
        assert f.trigger == "time" and 2 <= f.at <= 60 or f.trigger in nemesis.EVENTS and 0 <= f.at <= 3
        held = f.kind.startswith("pause") or f.kind in ("kill_server", "fill_disk", "restart_postgres")
        assert (5 <= f.hold <= 30) if held else f.hold == 0, f


def test_a_sqlite_run_draws_no_server_fault_and_no_disk_fault_without_a_disk():
    for seed in range(40):
        drawn = nemesis.schedule(seed, "sqlite", 9, 60.0, (5.0, 30.0), disk=False)
        kinds = {f.kind for f in drawn}
        assert not kinds & {"pause_server", "kill_server", "pause_postgres", "restart_postgres", "fill_disk"}
        assert all(n <= 2 for n in (sum(f.kind == k for f in drawn) for k in kinds))  # each kind at most twice
        assert "snapshot" not in {f.trigger for f in drawn}  # only a head's store is snapshotted
    every = {f.kind for seed in range(40) for f in nemesis.schedule(seed, "postgresql", 7, 60.0, (5, 30), True)}
    assert every == set(nemesis.FAULTS) - {"cut_host"}  # a cut needs two hosts


def test_two_hosts_draw_the_cut_too_held_up_to_three_times_longer():
    drawn = [f for seed in range(40) for f in nemesis.schedule(seed, "sqlite", 7, 60.0, (5, 20), False, hosts=True)]
    assert {f.kind for f in drawn} == {k for k, stores in nemesis.FAULTS.items() if "sqlite" in stores} - {"fill_disk"}
    cuts = [f.hold for f in drawn if f.kind == "cut_host"]
    assert cuts and all(5 <= h <= 60 for h in cuts) and max(cuts) > 20, cuts


def test_coverage_counts_the_faults_that_hit_by_phase():
    runs = [
        {"faults": [{"kind": "kill_driver", "phase": "trials", "hit": True}, {"kind": "kill_gcs", "hit": False}]},
        {
            "faults": [
                {"kind": "kill_driver", "phase": "trials", "hit": True},
                {"kind": "fill_disk", "phase": "closing", "hit": True},
            ]
        },
    ]
    assert nemesis.coverage(runs) == {("kill_driver", "trials"): 2, ("fill_disk", "closing"): 1}


def test_seeds_are_numbers_and_ranges():
    assert nemesis.parse_seeds("1-3,7") == [1, 2, 3, 7]
    assert nemesis.parse_seeds("5") == [5]


@pytest.mark.parametrize(
    "args, says",
    [
        (["--workloads", "grid,train"], "--workloads 'grid,train': use grid, search or grid,search"),
        (["--stores", "mysql"], "--stores 'mysql': use sqlite, postgresql or sqlite,postgresql"),
        (["--seeds", "1-x"], "--seeds '1-x': use numbers and ranges"),
        (["--hold-min", "9", "--hold-max", "3"], "0 < --hold-min <= --hold-max"),
    ],
)
def test_bad_input_is_refused_in_one_line(args, says):
    p = subprocess.run([sys.executable, "benchmarks/nemesis.py", *args], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 2 and p.stdout == "" and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert p.stderr.startswith("nemesis: ") and says in p.stderr, p.stderr


@pytest.mark.slow
def test_a_toy_run_under_overlapping_faults_finds_no_anomaly():
    # seed 23 on SQLite: the driver killed, then, on its restore, the disk filled and the driver
    # paused together, a worker killed as a Tune run begins, another at a time
    p = subprocess.run(
        [
            sys.executable,
            "benchmarks/nemesis.py",
            "--toy",
            "--seeds",
            "23",
            "--workloads",
            "grid",
            "--stores",
            "sqlite",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "0 anomalies in 0 of 1 runs" in out, out[-4000:]
    fired = [line for line in out.splitlines() if line.startswith("  +")]
    assert len(fired) == 5, out[-4000:]
    assert sum(line.endswith(": hit") for line in fired) >= 3, out[-4000:]
    assert "kill_driver" in out and "| fault |" in out
