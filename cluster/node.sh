#!/usr/bin/env bash
# What `ray up` runs on each node besides Ray itself (cluster.yaml, cluster.local.yaml):
#
#   bash cluster/node.sh env RAY_PORT MLFLOW_PORT [HEAD_IP]   # every node: ~/raystudy.env, sourced by ~/.bashrc
#   bash cluster/node.sh mlflow PORT BACKEND_STORE_URI ARTIFACTS_DESTINATION   # head: (re)start MLflow
#   bash cluster/node.sh stop-mlflow                           # head: stop it
#
# ~/raystudy.env exports RAY_ADDRESS and MLFLOW_TRACKING_URI (the head's cluster address), so on any
# node `python -m raystudy.grid ...` finds the cluster and the tracking server by itself.
# MLflow binds the head's cluster address only -- the one Ray gives the workers, private on a
# cloud -- never 0.0.0.0, and accepts only Host headers naming that address or localhost (the SSH
# tunnel): the UI is reached from a laptop through SSH, never from the internet.
set -euo pipefail

state=${RAYSTUDY_STATE:-$HOME/raystudy-state}   # pid file, log (and by default the SQLite store)

node_ip() {  # the address Ray uses for this node (RAY_HEAD_IP on the workers)
    python -c 'import ray.util; print(ray.util.get_node_ip_address())'
}

case "${1:-}" in
env)
    ray_port=${2:?RAY_PORT}; mlflow_port=${3:?MLFLOW_PORT}; head=${4:-$(node_ip)}
    cat > ~/raystudy.env <<EOF
# written by cluster/node.sh at $(date -u +%FT%TZ): this cluster's head
export RAYSTUDY_HEAD_IP=$head
export RAY_ADDRESS=$head:$ray_port
export MLFLOW_TRACKING_URI=http://$head:$mlflow_port
EOF
    touch ~/.bashrc
    grep -qxF 'source ~/raystudy.env' ~/.bashrc || echo 'source ~/raystudy.env' >> ~/.bashrc
    cat ~/raystudy.env
    ;;
mlflow)
    port=${2:?PORT}; store=${3:?BACKEND_STORE_URI}; artifacts=${4:?ARTIFACTS_DESTINATION}
    ip=$(node_ip)
    mkdir -p "$state"
    bash "$0" stop-mlflow
    # One worker serialises writes to SQLite (no "database is locked" under many trials); without
    # the job runner it starts in ~5 s and leaves no children behind when stopped.
    # In a session of its own (it outlives this SSH command), whose id goes to the pid file.
    MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false setsid bash -c 'echo $$ > "$0"; exec "$@"' "$state/mlflow.pid" \
        python -m mlflow server --host "$ip" --port "$port" --workers 1 \
        --allowed-hosts "$ip,$ip:$port,localhost,localhost:$port,127.0.0.1,127.0.0.1:$port" \
        --backend-store-uri "$store" --artifacts-destination "$artifacts" \
        > "$state/mlflow.log" 2>&1 < /dev/null &
    sleep 0.5
    for _ in $(seq 120); do
        if python -c "import urllib.request as u; u.urlopen('http://$ip:$port/health', timeout=2)" 2>/dev/null; then
            echo "MLflow tracking server: http://$ip:$port (store $store, artifacts $artifacts)"
            echo "From a laptop: ssh -N -L $port:$ip:$port <user>@<head> then open http://localhost:$port"
            exit 0
        fi
        pid=$(cat "$state/mlflow.pid" 2>/dev/null || true)
        [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null && break
        sleep 1
    done
    echo "MLflow server did not become healthy; last lines of $state/mlflow.log:" >&2
    tail -n 20 "$state/mlflow.log" >&2
    exit 1
    ;;
stop-mlflow)
    pidfile=$state/mlflow.pid
    [ -f "$pidfile" ] || exit 0
    pid=$(cat "$pidfile")
    # only the server this script started (a stale pid file may name someone else's process by now)
    if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q "mlflow server"; then
        # its own process group (setsid): the server and its workers
        kill -TERM -- "-$pid" 2>/dev/null || true
        for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -KILL -- "-$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
    ;;
*)
    sed -n '2,12p' "$0" >&2
    exit 2
    ;;
esac
