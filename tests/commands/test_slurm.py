"""The study as SLURM jobs (raystudy slurm, cluster/slurm/job.sh) on a real one-node SLURM
(slow: Debian's slurm-wlm and munge, started by cluster/slurm/local.sh as .ci/run does, real Ray,
MLflow servers and grids inside the jobs).

Every job runs this checkout (PYTHONPATH); what a job recorded is read back from the newest
snapshot in its shared folder, the store the next job would restore. A requeued job waits out
SLURM's fixed delay before it is eligible again; the tests make it eligible at once
(``scontrol update StartTime=now``), as an administrator may."""

import gzip
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from raystudy.train.rehearsal import experiment_name
from tests.helpers import REPO, driver_env, experiment_runs, hosts_module

LOCAL_SH = REPO / "cluster" / "slurm" / "local.sh"
SLURM_DIR = os.environ.get("RAYSTUDY_SLURM_DIR", "/tmp/raystudy-slurm")
EXPERIMENT = "raystudy-t-vit_demo"
REHEARSAL = experiment_name(EXPERIMENT)  # where a rehearsal of the grid records
# One xdist worker: the tests share the machine's one SLURM node, whose two CPUs their jobs fill.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]


def space(conditions, steps: int) -> dict:
    return {
        "study": "t",
        "base": {"model": "vit_demo", "steps": steps, "warmup_steps": 4, "eval_every": 20, "log_every": 10},
        "grid": {"condition": {"grid_search": conditions}, "lr": 0.1, "seed": 0},
        "datasets": {"digits_c": {}},
        "tune": {"max_failures": 1, "checkpoint_every_s": 1, "max_concurrent": 1},
    }


def have_slurm() -> bool:
    return shutil.which("sbatch") is not None and Path("/usr/sbin/slurmctld").exists() and os.getuid() == 0


def test_local_sh_prints_an_export_and_its_stop_leaves_no_daemon_of_its_own():
    """``local.sh start DIR`` prints one line a shell can eval (before: ``SLURM_CONF=...``, which
    left squeue failing on a DNS lookup), and ``stop DIR`` stops every daemon it started, munged
    included (before: munged ran on). A SLURM of its own, on other ports than the tests' one."""
    if not have_slurm():
        pytest.skip("no SLURM here (as root: apt-get install slurm-wlm munge)")
    folder = Path(tempfile.mkdtemp(prefix="rs-local-", dir="/tmp"))
    folder.chmod(0o755)  # munged's socket is under it: open to all, as /tmp/raystudy-slurm is
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    env.update(RAYSTUDY_SLURMCTLD_PORT="6937", RAYSTUDY_SLURMD_PORT="6938")
    pidfiles = [
        folder / "munge" / "munged.pid",
        folder / "slurmctld.pid",
        folder / f"slurmd-{socket.gethostname().split('.')[0]}.pid",
    ]
    try:
        p = subprocess.run(["bash", str(LOCAL_SH), "start", str(folder)], env=env, capture_output=True, text=True)
        assert p.returncode == 0, p.stdout + p.stderr
        assert p.stdout.splitlines() == [f"export SLURM_CONF={folder}/slurm.conf"], p.stdout
        q = subprocess.run(
            ["bash", "-c", 'eval "$1" && squeue -h && sinfo -h -o %T', "-", p.stdout],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert q.returncode == 0 and q.stdout.split() == ["idle"], q.stdout + q.stderr
        pids = [int(f.read_text()) for f in pidfiles]
        assert all(Path(f"/proc/{pid}").exists() for pid in pids)
        p = subprocess.run(["bash", str(LOCAL_SH), "stop", str(folder)], env=env, capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        left = [pid for pid in pids if Path(f"/proc/{pid}").exists()]
        assert not left, [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in left]
    finally:
        subprocess.run(["bash", str(LOCAL_SH), "stop", str(folder)], env=env, capture_output=True, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def slurm():
    """The environment that reaches the machine's one-node SLURM, started if it is not running."""
    if not have_slurm():
        pytest.skip("no SLURM here (as root: apt-get install slurm-wlm munge; .ci/run installs it)")
    p = subprocess.run(["bash", str(LOCAL_SH), "start", SLURM_DIR], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    conf = re.fullmatch(r"export SLURM_CONF=(\S+)\n", p.stdout).group(1)
    return driver_env(SLURM_CONF=conf, PYTHONPATH=str(REPO), RAYSTUDY_RAY_DASHBOARD="false")


@pytest.fixture()
def study(tmp_path, slurm, demo_weights):
    """A folder with a space and a shared folder; its jobs are cancelled if the test leaves any."""
    (tmp_path / "shared").mkdir()
    jobs: list[str] = []
    yield tmp_path, jobs
    for job in jobs:
        if job_state(slurm, job)[0] not in DONE:
            subprocess.run(["scancel", job], env=slurm, timeout=30)


DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"}


def submit(
    env, folder: Path, jobs: list, conditions, steps: int, *flags: str, cpus: int = 1, rehearse: int | None = None
) -> str:
    """``raystudy slurm`` from ``folder``: the job's id. ``rehearse``: the grid's trials are a
    rehearsal's, each lasting that many seconds on any machine (a test that stops a job mid-grid
    needs a grid that is still running then, which real training on a fast machine is not)."""
    (folder / "space.yaml").write_text(yaml.safe_dump(space(conditions, steps)))
    cmd = [sys.executable, "-m", "raystudy", "slurm", "--shared", str(folder / "shared"), "--cpus-per-node", str(cpus)]
    cmd += [*flags, "--", "grid", "--space", str(folder / "space.yaml"), "--quiet"]
    cmd += ["--rehearse", str(rehearse)] if rehearse else []
    p = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    job = re.search(r"submitted job (\d+)", p.stdout).group(1)
    jobs.append(job)
    return job


def job_state(env, job: str) -> tuple[str, int, str]:
    """(state, restarts, reason) of ``job`` as the controller says."""
    p = subprocess.run(["scontrol", "-o", "show", "job", job], env=env, capture_output=True, text=True, timeout=30)
    fields = dict(f.split("=", 1) for f in p.stdout.split() if "=" in f)
    return fields.get("JobState", "UNKNOWN"), int(fields.get("Restarts", 0)), fields.get("Reason", "")


def wait_job(env, job: str, timeout: float = 420, then_minutes: int | None = None) -> tuple[str, int]:
    """Until ``job`` ends: (state, restarts); a requeued one is made eligible within seconds, and
    given ``then_minutes`` as its time limit (its next run then finishes the grid)."""
    end = time.monotonic() + timeout
    pushed = 0  # the restart last made eligible: once each, or its start would keep moving away
    while time.monotonic() < end:
        state, restarts, reason = job_state(env, job)
        if state in DONE:
            return state, restarts
        if state == "PENDING" and restarts > pushed and reason == "BeginTime":
            pushed = restarts
            more = [f"TimeLimit={then_minutes}"] if then_minutes else []
            # not at once: slurmd refuses a relaunch within moments of the requeue's kill ("Job N
            # already killed, do not launch batch job") and the job ends FAILED, seen in CI
            subprocess.run(["scontrol", "update", f"jobid={job}", *more, "StartTime=now+5"], env=env, timeout=30)
        time.sleep(2)
    raise AssertionError(f"job {job} still {job_state(env, job)} after {timeout} s:\n{log(Path(), job)}")


def log(folder: Path, job: str) -> str:
    found = list((folder / "shared" / "logs").glob(f"*-{job}.out")) if folder.name else []
    return found[0].read_text() if found else ""


def wait_log(folder: Path, job: str, pattern: str, timeout: float = 240) -> re.Match:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        m = re.search(pattern, log(folder, job))
        if m:
            return m
        time.sleep(1)
    raise AssertionError(f"no {pattern!r} in job {job}'s log:\n{log(folder, job)[-3000:]}")


def recorded(folder: Path, experiment: str = EXPERIMENT):
    """The newest snapshot in the shared folder, as an MLflow store: (client, its runs, its trials)."""
    from mlflow import MlflowClient

    newest = sorted((folder / "shared" / "mlflow-backups").glob("mlflow-*.sqlite.gz"))[-1]
    db = folder / "restored.db"
    db.write_bytes(gzip.decompress(newest.read_bytes()))
    cl = MlflowClient(tracking_uri=f"sqlite:///{db}")
    runs = experiment_runs(cl, experiment)
    return cl, runs, [r for r in runs if r.data.tags.get("raystudy.role") == "trial"]


def assert_once_finished(folder: Path, n: int, experiment: str = EXPERIMENT) -> None:
    """Every trial once, finished, no metric step logged twice, no run RUNNING."""
    cl, runs, trials = recorded(folder, experiment)
    keys = [r.data.tags["raystudy.key"] for r in trials]
    assert len(keys) == n and len(set(keys)) == n, keys
    assert {r.data.tags.get("raystudy.status") for r in trials} == {"finished"}
    assert {r.info.status for r in trials} == {"FINISHED"}
    assert not [r for r in runs if r.info.status == "RUNNING"]
    for r in trials:
        for key in ("loss", "val_acc"):
            steps = [m.step for m in cl.get_metric_history(r.info.run_id, key)]
            assert steps and len(steps) == len(set(steps)), (key, steps)


# What a job's log showed besides the grid's console: bash's word on the Ray head it killed at the
# end ("slurm_script: line 88: N Killed ray start ..."), and on scancel the grid aborted by Ray's
# SIGTERM handler (its stack, "Aborted", exit 134), Tune's warning of each slow result.
NOISE = ("slurm_script: line", "Killed", "Aborted", "SIGTERM received", "exited 134", "performance bottleneck")


def assert_reads_clean(text: str, stops: list[str]) -> None:
    """The log as the grid's console, plus the job's lines: no noise, and each stop said once, in
    order, with its cause (``stops``: each stop line's start)."""
    noise = [line for line in text.splitlines() if any(n in line for n in NOISE)]
    assert not noise, noise
    said = [line.split("] ", 1)[1] for line in text.splitlines() if "] stopped" in line]
    assert len(said) == len(stops) and all(s.startswith(w) for s, w in zip(said, stops)), said


def answers(url: str, auth: tuple[str, str] | None) -> int:
    """The HTTP status of a tracking server's experiment search, with ``auth`` or none."""
    import base64

    req = urllib.request.Request(f"{url}/api/2.0/mlflow/experiments/search?max_results=1")
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def credentials(folder: Path) -> tuple[str, str]:
    text = (folder / "shared" / "secrets" / "mlflow-credentials").read_text()
    return tuple(re.search(rf"{k}=(\S+)", text).group(1) for k in ("USERNAME", "PASSWORD"))


_JOIN = "import ray; ray.init(address={!r}, log_to_driver=False); print('JOINED', flush=True)"


def ray_joins(tries: dict) -> dict:
    """What a driver joining each address says in its first seconds, with that token file or none:
    {name: (address, token)} -> {name: output}; all at once."""
    procs = {}
    for name, (address, token) in tries.items():
        env = driver_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token)) if token else driver_env()
        procs[name] = subprocess.Popen(
            [sys.executable, "-c", _JOIN.format(address)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    said = {}
    for name, proc in procs.items():
        try:
            said[name] = proc.communicate(timeout=25)[0]
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            said[name] = proc.communicate()[0]
    return said


def test_two_studies_at_once_complete_and_neither_answers_the_other(study, slurm, tmp_path):
    """Two demo grids submitted at once share the node: ports and folders from their job ids, each
    its own credentials and Ray token; each completes, every trial once, FINISHED. Two 30-second
    rehearsal trials each: the jobs are still up while their servers and Rays are asked, on any
    machine (real training could end a job first)."""
    a, b = tmp_path / "a", tmp_path / "b"
    for f in (a, b):
        (f / "shared").mkdir(parents=True)
    _, jobs = study
    ja = submit(slurm, a, jobs, ["MHA", "LN2"], 200, rehearse=30)
    jb = submit(slurm, b, jobs, ["FC1", "LN1"], 200, rehearse=30)
    where = {}
    for f, j in ((a, ja), (b, jb)):
        m = wait_log(f, j, r"Ray (\S+) \(.*MLflow (http://\S+)")
        where[f] = m.groups()
    assert where[a][0] != where[b][0] and where[a][1] != where[b][1]
    # the grid joined the job's Ray, not a local one of its own
    wait_log(a, ja, r"Connected to Ray cluster")
    assert "Started a local Ray instance" not in log(a, ja)
    tries = {}
    for me, other in ((a, b), (b, a)):
        url = where[me][1]
        assert answers(url, None) == 401
        assert answers(url, credentials(other)) == 401
        assert answers(url, credentials(me)) == 200
        tries[(me.name, "none")] = (where[me][0], None)
        tries[(me.name, "other")] = (where[me][0], other / "shared" / "secrets" / "ray-token")
    tries[("a", "own")] = (where[a][0], a / "shared" / "secrets" / "ray-token")
    said = ray_joins(tries)
    assert "JOINED" in said.pop(("a", "own"))
    for name, text in said.items():
        assert "JOINED" not in text and re.search(r"Unauthenticated|InvalidAuthToken", text), (name, text[-2000:])
    for f in (a, b):
        assert (f / "shared" / "secrets" / "mlflow-credentials").stat().st_mode & 0o077 == 0
        assert (f / "shared" / "secrets" / "ray-token").stat().st_mode & 0o077 == 0
    for f, j in ((a, ja), (b, jb)):
        assert wait_job(slurm, j) == ("COMPLETED", 0), log(f, j)[-3000:]
        text = log(f, j)
        assert credentials(f)[1] not in text
        assert "done in" in text and "2 finished, 0 diverged, 0 failed" in text
        # the credentials' path that outlives the job (before: /tmp/rsJOBID/state/..., removed at its end)
        assert f"Its user and password: {f / 'shared' / 'secrets' / 'mlflow-credentials'} " in text, text[:2000]
        assert_reads_clean(text, [])
        assert_once_finished(f, 2, REHEARSAL)
        assert not Path(f"/tmp/rs{j}").exists()


def test_time_limit_mid_grid_stops_requeues_and_the_next_job_completes(study, slurm):
    """A job whose time limit falls mid-grid: SLURM's signal before the limit stops the grid as a
    Ctrl-C does, the job requeues itself, and its next run restores the store from the snapshot and
    finishes the grid: every trial once, no step twice, nothing RUNNING. The requeued job is given
    a longer limit, so that its next run is the last (each run pays the job's start). The grid is
    three 40-second rehearsal trials one at a time, so the notice, 60 s into the job, always falls
    while trials remain: real training finished all three first on a fast machine (CI, 26 s)."""
    folder, jobs = study
    job = submit(
        slurm, folder, jobs, ["MHA", "LN2", "FC1"], 300, "--time", "2", "--stop-before", "60", cpus=2, rehearse=40
    )
    state, restarts = wait_job(slurm, job, timeout=600, then_minutes=10)
    text = log(folder, job)
    assert (state, restarts) == ("COMPLETED", 1), text[-4000:]
    assert "stopped: time limit" in text and "requeueing job" in text
    assert_reads_clean(
        text, [f"stopped: time limit near (SLURM's notice, --stop-before); trials remain: requeueing job {job}"]
    )
    first, rest = text.split("requeueing job", 1)
    # a first run stopped before its grid recorded anything leaves an empty store, which is never
    # snapshotted (its snapshot would be what the next run restores): the next run starts it anew
    if "snapshot of MLflow's store:" in first:
        assert "restored MLflow's store from the snapshot" in rest, text[-4000:]
    else:
        assert "MLflow's store is new and empty" in rest, text[-4000:]
    assert "DUE TO TIME LIMIT" not in text  # stopped before the limit, never killed by it
    assert_once_finished(folder, 3, REHEARSAL)


def _process(needle: str, word: str) -> int | None:
    """A process whose command line holds both ``needle`` and ``word``."""
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if needle in cmd and word in cmd:
                return int(d.name)
    return None


def test_a_job_whose_ray_head_gives_up_starting_starts_it_again_and_completes(study, slurm):
    """``ray start`` gives the head's raylet 30 s to join the cluster, which it does once its agents
    are up (tens of seconds of imports on a busy node), then ends all it started. The job took the
    GCS's first answer (``ray status``: "No cluster status") for the head, and its grid failed to
    connect (CI, twice: a requeued job's next run). Held here: the dashboard agent of the job's first
    head stopped until ``ray start`` gives up; the job starts its head again and completes."""
    folder, jobs = study
    job = submit(slurm, folder, jobs, ["MHA"], 20)
    end, agent = time.monotonic() + 180, None
    while agent is None:
        assert time.monotonic() < end and job_state(slurm, job)[0] not in DONE, log(folder, job)[-3000:]
        agent = _process(f"/tmp/rs{job}/ray", "dashboard/agent.py")
        time.sleep(0.01)
    os.kill(agent, signal.SIGSTOP)
    try:
        end = time.monotonic() + 120
        while Path(f"/proc/{agent}").exists() and time.monotonic() < end:  # ended by ray start's giving up
            time.sleep(0.5)
    finally:
        if Path(f"/proc/{agent}").exists():
            os.kill(agent, signal.SIGCONT)
    state, _ = wait_job(slurm, job, timeout=600)
    text = log(folder, job)
    assert state == "COMPLETED", text[-4000:]
    assert "Ray's head did not start (try 1 of 3)" in text, text[-4000:]
    assert_once_finished(folder, 1)


def wait_rerun(env, folder: Path, job: str, timeout: float = 300) -> None:
    """Until the requeued ``job``'s next run trains again (its log's second "running" line); made
    eligible within seconds, as ``wait_job`` does."""
    end = time.monotonic() + timeout
    pushed = False
    while time.monotonic() < end:
        state, restarts, reason = job_state(env, job)
        assert state not in DONE, log(folder, job)[-3000:]
        if state == "PENDING" and restarts and reason == "BeginTime" and not pushed:
            pushed = True
            subprocess.run(["scontrol", "update", f"jobid={job}", "StartTime=now+5"], env=env, timeout=30)
        if len(re.findall(r"running \d+ of \d+ trials", log(folder, job))) >= 2:
            return
        time.sleep(1)
    raise AssertionError(f"job {job} not running again after {timeout} s:\n{log(folder, job)[-3000:]}")


def test_a_requeue_by_slurm_then_a_scancel_mid_grid_each_stop_cleanly_and_resubmitting_completes_it(study, slurm):
    """``scontrol requeue`` mid-grid (an administrator's, or a preemption's): on SLURM's TERM the job
    stops the grid, the log says a requeue (before: "stopped: scancel"), and SLURM runs it again.
    Then ``scancel`` mid-grid in that run: the grid stops as on a Ctrl-C (no requeue; before: aborted
    by Ray's SIGTERM handler, its stack, exit 134), nothing left RUNNING. The same submission again
    finishes the study from where it was: every trial once, finished. (Both stops in one job: a
    job's start is much of what such a test costs.) Two 40-second rehearsal trials one at a time:
    each stop, 8 s after its run's grid starts, falls mid-grid on any machine."""
    folder, jobs = study
    job = submit(slurm, folder, jobs, ["MHA", "LN2"], 200, cpus=2, rehearse=40)
    wait_log(folder, job, r"running 2 of 2 trials")
    time.sleep(8)
    subprocess.run(["scontrol", "requeue", job], env=slurm, timeout=30, check=True)
    wait_rerun(slurm, folder, job)  # its 24-hour limit kept: no notice
    time.sleep(8)
    subprocess.run(["scancel", job], env=slurm, timeout=30, check=True)
    state, restarts = wait_job(slurm, job)
    text = log(folder, job)
    assert (state, restarts) == ("CANCELLED", 1), text[-4000:]
    assert "requeueing job" not in text and "exited" not in text, text[-4000:]
    assert_reads_clean(
        text,
        [
            f"stopped: requeued by SLURM (scontrol requeue, or a preemption); job {job} runs again",
            "stopped: scancel; the same raystudy slurm command resumes the study",
        ],
    )
    _, runs, _ = recorded(folder, REHEARSAL)
    assert not [r for r in runs if r.info.status == "RUNNING"]
    again = submit(slurm, folder, jobs, ["MHA", "LN2"], 200, cpus=2, rehearse=40)
    assert wait_job(slurm, again) == ("COMPLETED", 0), log(folder, again)[-3000:]
    assert "restored MLflow's store from the snapshot" in log(folder, again)
    assert_once_finished(folder, 2, REHEARSAL)


@pytest.mark.parametrize(
    "flags,needle",
    [
        (["--gpus-per-node", "1"], "--gpus-per-node 1: the nodes of partition debug have no GPUs"),
        (["--partition", "nope", "--gpus-per-node", "1"], "--partition nope: no such partition"),
        # before: sbatch took it, and it waited for ever (PartitionConfig, PartitionNodeLimit)
        (["--nodes", "3"], "--nodes 3: partition debug has 1 node (sinfo: "),
        (["--partition", "debug", "--nodes", "2"], "--nodes 2: partition debug has 1 node"),
        (["--partition", "nope", "--nodes", "2"], "--partition nope: no such partition"),
    ],
)
def test_more_gpus_or_nodes_than_sinfo_says_is_refused_before_submitting(slurm, tmp_path, flags, needle):
    (tmp_path / "shared").mkdir()
    before = queued(slurm)
    cmd = [sys.executable, "-m", "raystudy", "slurm", "--shared", str(tmp_path / "shared"), *flags, "--", "grid"]
    p = subprocess.run(cmd, cwd=tmp_path, env=slurm, capture_output=True, text=True, timeout=60)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and needle in lines[0], p.stderr
    assert queued(slurm) == before
    assert not (tmp_path / "shared" / "logs").exists()


def queued(env) -> str:
    return subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True).stdout


def test_a_two_node_job_on_two_hosts_trains_each_trial_across_both(tmp_path, demo_weights):
    """Two namespaced hosts (cluster/hosts.py): slurmctld and a slurmd on h1, a slurmd on h2, one CPU
    each, SLURM's nodes named n1 and n2; ``raystudy slurm --nodes 2``: the job's Ray head on h1, a Ray
    node on h2 by ``srun``, and its trial trains with 2 DDP workers, one on each host
    (before: ``srun --exclude=$(hostname -s)``, "Invalid node name specified", and no Ray on h2)."""
    if not have_slurm():
        pytest.skip("no SLURM here (as root: apt-get install slurm-wlm munge)")
    hosts_py = hosts_module()
    if hosts_py.missing_tools():
        pytest.skip(f"no {hosts_py.missing_tools()}")
    folder = Path(tempfile.mkdtemp(prefix="rs-slurm2-", dir="/tmp"))
    folder.chmod(0o755)  # munged's socket is under it: open to all
    hosts = hosts_py.Hosts(2, tmp_path / "hosts", keep=[REPO, Path(sys.prefix), folder])
    env = driver_env(
        PYTHONPATH=str(REPO),
        RAYSTUDY_RAY_DASHBOARD="false",
        RAYSTUDY_SLURM_NODES="n1:h1=10.77.0.1 n2:h2=10.77.0.2",  # node names that are not host names
        RAYSTUDY_SLURM_CPUS="1",
        SLURM_CONF=str(folder / "slurm.conf"),
    )
    try:
        hosts.up()
        for k in (1, 2):
            hosts.as_node(k)  # a default route (Ray's own address) and cgroups (slurmd)
        p = hosts.run(1, ["bash", str(LOCAL_SH), "start", str(folder)], env=env, capture_output=True, text=True)
        assert p.returncode == 0, p.stdout + p.stderr
        p = hosts.run(2, ["bash", str(LOCAL_SH), "node", str(folder)], env=env, capture_output=True, text=True)
        assert p.returncode == 0, p.stdout + p.stderr
        end = time.monotonic() + 60
        while time.monotonic() < end:
            idle = hosts.sh(1, "sinfo -h -N -o '%N %T'", env=env).stdout.split("\n")
            if sorted(line.strip() for line in idle if line.strip()) == ["n1 idle", "n2 idle"]:
                break
            time.sleep(1)
        else:
            raise AssertionError(f"nodes not idle: {idle}")
        study = hosts.shared / "study"
        (study / "shared").mkdir(parents=True)
        spec = {**space(["MHA"], 60), "models": {"vit_demo": {"workers": 2, "cpu": 1}}}
        (study / "space.yaml").write_text(yaml.safe_dump(spec))
        cmd = [sys.executable, "-m", "raystudy", "slurm", "--shared", str(study / "shared"), "--nodes", "2"]
        cmd += ["--cpus-per-node", "1", "--wait", "--", "grid", "--space", str(study / "space.yaml"), "--quiet"]
        p = hosts.run(1, cmd, cwd=study, env=env, capture_output=True, text=True, timeout=600)
        text = log(study, re.search(r"submitted job (\d+)", p.stdout).group(1)) if "submitted job" in p.stdout else ""
        assert p.returncode == 0, p.stdout + p.stderr + text[-4000:]
        assert "(2 nodes, 1 CPUs" in text and "1 finished, 0 diverged, 0 failed" in text, text[-4000:]
        assert "(2 DDP workers)" in text, text[-4000:]
        assert_reads_clean(text, [])
        assert_once_finished(study, 1)
        _, _, trials = recorded(study)
        for r in trials:  # ip:pid of each DDP worker, in rank order
            where = sorted(w.split(":")[0] for w in r.data.tags["raystudy.worker"].split(","))
            assert where == ["10.77.0.1", "10.77.0.2"], where
    finally:
        subprocess.run(["bash", str(LOCAL_SH), "stop", str(folder)], capture_output=True, timeout=120)
        hosts.down()
        shutil.rmtree(folder, ignore_errors=True)
