#!/usr/bin/env bash
# A raystudy study as a SLURM batch job, over as many jobs as it takes (docs/cluster.md#slurm):
#
#   raystudy slurm --shared DIR [SLURM FLAGS] -- grid --space demo ...   # checks, then sbatch this script
#   sbatch [FLAGS] cluster/slurm/job.sh grid --space demo ...             # the same by hand (fill-ins below)
#
# The job, on its first node: MLflow's tracking server (basic-auth, cluster/node.sh), its store on
# node-local disk restored from the newest snapshot in the shared folder and snapshotted to it, Ray
# on every node of the allocation (its CPUs and GPUs, a token required), then `python -m raystudy
# ARGS` with RAY_ADDRESS and MLFLOW_TRACKING_URI set, so the grid joins the job's Ray and server.
# Ports and the node-local folder come from the job id: two jobs on one node never meet.
# USR1 (sent before the time limit: --signal=B:USR1@SECONDS) stops the grid as a Ctrl-C does and,
# trials remaining, requeues the job, which resumes with the same command. TERM (scancel, or SLURM's
# own requeue: scontrol requeue, a preemption) reaches every process of the job, Ray's and MLflow's
# too: the grid is stopped at once, the job closes the runs it left RUNNING and snapshots the store;
# SLURM requeues it, or (scancel) the same command resumes it later.
# The log reads as the grid's console does: the stop said once, with its cause and what comes next.
#
# ---- fill in (or give them to `raystudy slurm` as flags; sbatch's own flags override these) ----
#SBATCH --job-name=raystudy
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --time=24:00:00
#SBATCH --signal=B:USR1@600
#SBATCH --requeue
#SBATCH --open-mode=append
# #SBATCH --partition=gpu
# #SBATCH --gpus-per-node=4
# #SBATCH --cpus-per-task=32
# #SBATCH --output=/shared/raystudy/logs/%x-%j.out
# Environment (exported at submission; sbatch passes it on):
#   RAYSTUDY_SHARED=DIR        a folder every node mounts: checkpoints, snapshots, artifacts, secrets, logs
#   RAYSTUDY_SRC=DIR           this checkout (raystudy slurm sets it; sbatch runs a copy of this script)
#   RAYSTUDY_SLURM_STORE=...   sqlite (default), postgres, postgresql://USER@HOST:PORT/DB (secret in
#                              DIR/secrets/pgpass), or http(s)://... a tracking server of your own
#   RAYSTUDY_LOCAL=/tmp        node-local disk for the job's folder (short: Ray's socket paths)
# ------------------------------------------------------------------------------------------------
set -euo pipefail
shopt -s inherit_errexit   # a failure inside $(...) stops the script too

shared=${RAYSTUDY_SHARED:?RAYSTUDY_SHARED: the shared folder (raystudy slurm --shared DIR sets it)}
src=${RAYSTUDY_SRC:?RAYSTUDY_SRC: the raystudy checkout (raystudy slurm sets it)}
store=${RAYSTUDY_SLURM_STORE:-sqlite}
job=${SLURM_JOB_ID:?SLURM_JOB_ID: run this script with sbatch}
node_sh=$src/cluster/node.sh
[ "$#" -gt 0 ] || set -- grid
say() { echo "[raystudy-slurm $(date -u +%FT%TZ)] $*"; }

# One folder per job on node-local disk, short: Ray's sockets live under it (a path of at most 107 bytes).
tmp=${RAYSTUDY_LOCAL:-/tmp}/rs$job
if [ "${#tmp}" -gt 40 ]; then
    echo "error: $tmp: Ray's socket paths under it would pass 107 bytes; set RAYSTUDY_LOCAL to a short node-local folder" >&2
    exit 2
fi
# A requeued job keeps its id: what its earlier run left on this node goes, so the store comes from the snapshot.
rm -rf "$tmp"
(umask 077 && mkdir -p "$tmp")
# Ports from the job id: GCS, MLflow, Ray client, dashboard, its agent, node and object managers,
# metrics, agent gRPC, runtime env agent, then the workers'.
base=$((20000 + (job % 300) * 100))
ray_port=$base mlflow_port=$((base + 1))
state=$tmp/state
mkdir -p "$shared/secrets" "$shared/ray" "$shared/mlflow-backups" "$shared/mlflow-artifacts"
chmod 700 "$shared/secrets"

# Ray requires a token: made once per shared folder (mode 600), read by every node and the driver.
if [ ! -s "$shared/secrets/ray-token" ]; then
    (umask 077 && python3 -c 'import secrets; print(secrets.token_hex(32))' > "$shared/secrets/ray-token")
fi
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$shared/secrets/ray-token
# Tune warns of each result that took it over 0.5 s to process ("may be a performance bottleneck"):
# on a busy node, with the tracking server a network hop away, that is a line every few results.
export TUNE_WARN_THRESHOLD_S=${TUNE_WARN_THRESHOLD_S:-30}

ip=$(python3 -c 'import ray.util; print(ray.util.get_node_ip_address())')
ray_pid= mlflow_up= grid= stop_by=
ray_pids() {  # this job's Ray processes on this node: those under its own folder, and `ray start`
    local p
    for p in /proc/[0-9]*; do
        if { tr '\0' ' ' < "$p/cmdline"; } 2> /dev/null | grep -qF -- "$tmp/ray"; then echo "${p#/proc/}"; fi
    done
}
stop_ray() {  # never `ray stop`: it stops every Ray of this user on the node, other jobs' too
    local pids
    pids=$(ray_pids)
    [ -n "$pids" ] || return 0
    # shellcheck disable=SC2086
    kill -TERM $pids 2> /dev/null || true
    for _ in $(seq 10); do [ -n "$(ray_pids)" ] || return 0; sleep 0.5; done
    pids=$(ray_pids)
    # shellcheck disable=SC2086
    if [ -n "$pids" ]; then kill -KILL $pids 2> /dev/null || true; fi
}
term_cause() {  # why SLURM sent TERM: its requeue counts one restart more than this run's, scancel none
    local n
    n=$(scontrol -o show job "$job" 2> /dev/null | grep -o 'Restarts=[0-9]*' | cut -d= -f2) || true
    if [ -n "$n" ] && [ "$n" -gt "${SLURM_RESTART_COUNT:-0}" ]; then echo "requeue"; else echo "scancel"; fi
}
cleanup() {
    trap - EXIT
    if [ -n "$grid" ] && kill -0 "$grid" 2> /dev/null; then kill -KILL "$grid" 2> /dev/null || true; fi
    if [ -n "$ray_pid" ]; then stop_ray; fi
    if [ -n "$mlflow_up" ]; then RAYSTUDY_STATE=$state bash "$node_sh" stop-mlflow || true; fi
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'say "stopped while starting: $(term_cause)"; exit 143' TERM   # what it started so far is stopped
trap 'stop_by="time limit"' USR1   # the limit's notice while the job starts: no grid, a requeue

case "$store" in
http://* | https://*)
    export MLFLOW_TRACKING_URI=$store
    say "tracking server: $store (yours)"
    ;;
*)
    mkdir -p "$state"
    # The server's credentials outlive the job: the shared folder's copy, made by the first job.
    if [ -s "$shared/secrets/mlflow-credentials" ]; then cp -p "$shared/secrets/mlflow-credentials" "$state/"; fi
    if [ -s "$shared/secrets/pgpass" ]; then cp -p "$shared/secrets/pgpass" "$state/"; fi
    mlflow_up=1
    # the log names the credentials' copy that persists (the job's folder goes when it ends), and the login node
    RAYSTUDY_STATE=$state RAYSTUDY_CREDENTIALS_AT=$shared/secrets/mlflow-credentials RAYSTUDY_LOGIN_AT="<login node>" \
        bash "$node_sh" mlflow "$mlflow_port" "$store" "$shared/mlflow-artifacts" "$shared/mlflow-backups"
    [ -s "$shared/secrets/mlflow-credentials" ] || cp -p "$state/mlflow-credentials" "$shared/secrets/"
    # shellcheck disable=SC1091
    . "$state/mlflow-credentials"
    export MLFLOW_TRACKING_USERNAME MLFLOW_TRACKING_PASSWORD
    export MLFLOW_TRACKING_URI=http://$ip:$mlflow_port
    export RAYSTUDY_SNAPSHOT_CMD="RAYSTUDY_STATE=$state bash $node_sh snapshot"
    # the server's own database: the grid reads what is done there in one query, not by the server's search
    RAYSTUDY_TRACKING_STORE=$(cat "$state/mlflow-store")
    export RAYSTUDY_TRACKING_STORE
    if [ -f "$state/pgpass" ]; then export PGPASSFILE=$state/pgpass; fi
    ;;
esac

cpus=${SLURM_CPUS_ON_NODE:-$(nproc)}
gpus=0
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then gpus=$(tr ',' '\n' <<< "$CUDA_VISIBLE_DEVICES" | grep -c .); fi
ray_args=(--num-cpus="$cpus" --num-gpus="$gpus" --temp-dir="$tmp/ray" --disable-usage-stats
    --object-manager-port=$((base + 6)) --node-manager-port=$((base + 5)) --metrics-export-port=$((base + 7))
    --dashboard-agent-listen-port=$((base + 4)) --dashboard-agent-grpc-port=$((base + 8))
    --runtime-env-agent-port=$((base + 9)) --min-worker-port=$((base + 10)) --max-worker-port=$((base + 99)))
export RAY_ADDRESS=$ip:$ray_port
# The head is up once the cluster lists its node: `ray status` answers as soon as the GCS does ("No
# cluster status"). `ray start` gives the raylet 30 s to join, which it does once its agents are up
# (tens of seconds of imports on a busy node), then ends all it started: it is started again.
head_up() {
    ray start --head --block --node-ip-address="$ip" --port="$ray_port" --ray-client-server-port=$((base + 2)) \
        --include-dashboard="${RAYSTUDY_RAY_DASHBOARD:-true}" --dashboard-host=127.0.0.1 --dashboard-port=$((base + 3)) \
        "${ray_args[@]}" > "$tmp/ray-head.log" 2>&1 &
    ray_pid=$!
    disown "$ray_pid"   # stopped by stop_ray, by pid: bash would log its KILL ("line N: PID Killed ray start ...")
    local status
    for _ in $(seq 180); do
        if ! kill -0 "$ray_pid" 2> /dev/null; then return 1; fi
        status=$(timeout 30 ray status --address "$RAY_ADDRESS" 2> /dev/null || true)
        if [[ "$status" == *" node_"* ]]; then return 0; fi
        sleep 1
    done
    return 1
}
for try in 1 2 3; do
    if head_up; then break; fi
    say "Ray's head did not start (try $try of 3): $(grep -v '^[[:space:]]*$' "$tmp/ray-head.log" | tail -n 1 || true)"
    stop_ray
    if [ "$try" = 3 ]; then
        echo "error: Ray's head did not start; last lines of its log:" >&2
        tail -n 20 "$tmp/ray-head.log" >&2
        exit 1
    fi
done
nodes=${SLURM_JOB_NUM_NODES:-1}
if [ "$nodes" -gt 1 ]; then
    # one Ray node per other host of the allocation, joined to the head (started first)
    srun --overlap --nodes=$((nodes - 1)) --ntasks=$((nodes - 1)) --exclude="${SLURMD_NODENAME:-$(hostname -s)}" \
        bash -c 'g=0; [ -n "${CUDA_VISIBLE_DEVICES:-}" ] && g=$(tr "," "\n" <<< "$CUDA_VISIBLE_DEVICES" | grep -c .);
        exec ray start --block --address="$0" --num-gpus="$g" --num-cpus="${SLURM_CPUS_ON_NODE:-$(nproc)}" "${@:1}"' \
        "$RAY_ADDRESS" "${ray_args[@]:2}" > "$tmp/ray-workers.log" 2>&1 &
    disown $!
fi
say "job $job (run ${SLURM_RESTART_COUNT:-0}) on $(hostname -s): Ray $RAY_ADDRESS ($nodes nodes, $cpus CPUs and $gpus GPUs on this one), MLflow $MLFLOW_TRACKING_URI"

args=("$@")
if [[ " ${args[*]} " != *" --storage"* ]]; then args+=(--storage "$shared/ray"); fi
# Job control: the grid in a process group of its own, and SIGINT reaches it (a non-interactive
# shell would start it with SIGINT ignored). TERM ignored (the grid keeps it so once Ray is up,
# raystudy.driver.local_ray; Ray's handler would print a stack and abort it): scancel's is the trap's.
# The waits' stderr dropped: bash would log the grid's KILL there ("line N: PID Killed ...").
rc=130
if [ -z "$stop_by" ]; then
    set -m
    (trap '' TERM && exec python3 -m raystudy "${args[@]}") &
    grid=$!
    set +m
    trap 'stop_by=${stop_by:-time limit}; kill -INT "$grid" 2> /dev/null || true' USR1
    trap 'stop_by=$(term_cause); kill -KILL "$grid" 2> /dev/null || true' TERM
    rc=0
    wait "$grid" 2> /dev/null || rc=$?
    while kill -0 "$grid" 2> /dev/null; do
        rc=0
        wait "$grid" 2> /dev/null || rc=$?
    done
    grid=
fi
# the grid's exit said where no stop says it: stopped before the time limit it exits 130, and
# scancel's or SLURM's requeue kills it
if [ -z "$stop_by" ] || { [ "$stop_by" = "time limit" ] && [ "$rc" != 130 ]; }; then say "raystudy ${args[0]} exited $rc"; fi
if [ -n "$mlflow_up" ] && { [[ "$stop_by" =~ ^(scancel|requeue)$ ]] || ! [[ "$rc" =~ ^(0|1|2|130)$ ]]; }; then
    # scancel's TERM reached every process (the grid's Ray aborts it, MLflow's server stops): the
    # runs it left RUNNING are closed in the store itself and a snapshot taken, before SLURM's KILL.
    python3 -c 'import sys; from raystudy.driver import slurm_batch; slurm_batch.close_running(sys.argv[1])' "$(cat "$state/mlflow-store")" \
        || say "could not close the runs left RUNNING: the next job's grid does"
    RAYSTUDY_STATE=$state bash "$node_sh" snapshot || true
fi
cleanup
case "$stop_by" in
"time limit")
    if [ "$rc" = 130 ]; then
        say "stopped: time limit near (SLURM's notice, --stop-before); trials remain: requeueing job $job, which resumes the study"
        scontrol requeue "$job"
        exit 0
    fi
    say "stopped: time limit near (SLURM's notice), as the grid ended: nothing to resume" ;;
scancel) say "stopped: scancel; the same raystudy slurm command resumes the study" ;;
requeue) say "stopped: requeued by SLURM (scontrol requeue, or a preemption); job $job runs again and resumes the study" ;;
esac
exit "$rc"
