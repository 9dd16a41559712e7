#!/usr/bin/env bash
# What `ray up` runs on each node besides Ray itself (cluster.yaml, cluster.local.yaml):
#
#   bash cluster/node.sh env RAY_PORT MLFLOW_PORT [HEAD_IP]   # every node: ~/raystudy.env, sourced by ~/.bashrc
#   bash cluster/node.sh mlflow PORT STORE ARTIFACTS_DESTINATION   # head: (re)start MLflow
#   bash cluster/node.sh stop-mlflow                           # head: stop it
#   bash cluster/node.sh postgres [PORT]                       # head: (re)start its PostgreSQL (mlflow does)
#   bash cluster/node.sh stop-postgres                         # head: stop it
#
# STORE: sqlite (one file, $state/mlflow.db), postgres (a PostgreSQL server on this head, its data
# in $state/postgres, port $RAYSTUDY_PG_PORT or 5433, 127.0.0.1 only) or a database URI
# (sqlite:///PATH, postgresql://USER@HOST:PORT/DB: a managed one; its secret in $state/pgpass, never in the URI).
#
# ~/raystudy.env exports RAY_ADDRESS and MLFLOW_TRACKING_URI (the head's cluster address), so on any
# node `python -m raystudy.grid ...` finds the cluster and the tracking server by itself; it also
# sources $state/mlflow-credentials (MLFLOW_TRACKING_USERNAME/PASSWORD, made on the head at its first
# start, copied to the workers by Ray's cluster_synced_files), which the server requires (MLflow's
# basic-auth app): the secret stays in that file (mode 600), out of the repository and the cluster file.
# MLflow binds the head's cluster address only -- the one Ray gives the workers, private on a
# cloud -- never 0.0.0.0, and accepts only Host headers naming that address or localhost (the SSH
# tunnel): the UI is reached from a laptop through SSH, never from the internet.
set -euo pipefail
shopt -s inherit_errexit   # a failure inside $(...) stops the script too

state=${RAYSTUDY_STATE:-$HOME/raystudy-state}   # pid files, logs, credentials (and the stores on the head)

node_ip() {  # the address Ray uses for this node (RAY_HEAD_IP on the workers)
    python -c 'import ray.util; print(ray.util.get_node_ip_address())'
}

random_secret() {
    python -c 'import secrets; print(secrets.token_urlsafe(24))'
}

credentials() {  # $state/mlflow-credentials, made once; the basic-auth app's config from it, each start
    mkdir -p "$state"
    if [ ! -s "$state/mlflow-credentials" ]; then
        (umask 077 && printf 'export MLFLOW_TRACKING_USERNAME=raystudy\nexport MLFLOW_TRACKING_PASSWORD=%s\n' \
            "$(random_secret)" > "$state/mlflow-credentials")
    fi
    [ -s "$state/mlflow-server-key" ] || (umask 077 && random_secret > "$state/mlflow-server-key")
    # shellcheck disable=SC1091
    . "$state/mlflow-credentials"
    (umask 077 && cat > "$state/mlflow-auth.ini" <<EOF
[mlflow]
default_permission = READ
database_uri = sqlite:///$state/mlflow-auth.db
admin_username = $MLFLOW_TRACKING_USERNAME
admin_password = $MLFLOW_TRACKING_PASSWORD
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
EOF
    )
}

pg_bin() {  # PostgreSQL's server programs: on the PATH, else Debian's newest
    if command -v pg_ctl > /dev/null; then dirname "$(readlink -f "$(command -v pg_ctl)")"; return; fi
    local bin
    bin=$(ls -d /usr/lib/postgresql/*/bin 2> /dev/null | sort -V | tail -n 1 || true)
    if [ -z "$bin" ]; then
        echo "error: no PostgreSQL on this head (pg_ctl): apt-get install postgresql, or use STORE sqlite or a postgresql:// URI" >&2
        exit 2
    fi
    echo "$bin"
}

as_pg() {  # PostgreSQL refuses to run as root: then as Debian's postgres user
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# The head's PostgreSQL on 127.0.0.1:PORT (initialised once); its URI on stdout. Its port is not
# 5432: installing Debian's package may start the distribution's own server there.
pg_start() {
    local port=$1 bin data=$state/postgres new=
    bin=$(pg_bin)
    mkdir -p "$state"
    if [ ! -s "$data/PG_VERSION" ]; then
        local secret pwfile
        secret=$(random_secret)
        pwfile=$(mktemp)
        echo "$secret" > "$pwfile"
        mkdir -p "$data" && chmod 700 "$data"
        if [ "$(id -u)" = 0 ]; then
            chown postgres "$data" "$pwfile"
            if ! as_pg test -x "$data"; then
                echo "error: the postgres user cannot reach $data (a folder above it is closed to it)" >&2
                exit 2
            fi
        fi
        as_pg "$bin/initdb" -D "$data" -U mlflow --pwfile="$pwfile" --auth=scram-sha-256 -E UTF8 > "$state/postgres-init.log"
        rm -f "$pwfile"
        # Only MLflow on this host connects: loopback only, the socket in the data folder.
        printf "listen_addresses = '127.0.0.1'\nport = %s\nunix_socket_directories = '%s'\n" "$port" "$data" \
            | as_pg tee -a "$data/postgresql.conf" > /dev/null
        (umask 077 && echo "127.0.0.1:$port:*:mlflow:$secret" >> "$state/pgpass")
        new=1
    fi
    touch "$state/postgres.log"
    if [ "$(id -u)" = 0 ]; then chown postgres "$state/postgres.log"; fi
    as_pg "$bin/pg_ctl" -D "$data" status > /dev/null 2>&1 \
        || as_pg "$bin/pg_ctl" -D "$data" -l "$state/postgres.log" -o "-p $port" -w -t 120 start > /dev/null
    if [ -n "$new" ]; then
        PGPASSFILE=$state/pgpass "$bin/createdb" -h 127.0.0.1 -p "$port" -U mlflow mlflow
    fi
    echo "postgresql+psycopg2://mlflow@127.0.0.1:$port/mlflow"
}

case "${1:-}" in
env)
    ray_port=${2:?RAY_PORT}; mlflow_port=${3:?MLFLOW_PORT}; head=${4:-$(node_ip)}
    cat > ~/raystudy.env <<EOF
# written by cluster/node.sh at $(date -u +%FT%TZ): this cluster's head
export RAYSTUDY_HEAD_IP=$head
export RAY_ADDRESS=$head:$ray_port
export MLFLOW_TRACKING_URI=http://$head:$mlflow_port
# the tracking server's credentials: MLFLOW_TRACKING_USERNAME, MLFLOW_TRACKING_PASSWORD
if [ -r $state/mlflow-credentials ]; then . $state/mlflow-credentials; fi
EOF
    touch ~/.bashrc
    grep -qxF 'source ~/raystudy.env' ~/.bashrc || echo 'source ~/raystudy.env' >> ~/.bashrc
    cat ~/raystudy.env
    ;;
postgres)
    pg_start "${2:-${RAYSTUDY_PG_PORT:-5433}}"
    ;;
stop-postgres)
    [ -s "$state/postgres/PG_VERSION" ] || exit 0
    as_pg "$(pg_bin)/pg_ctl" -D "$state/postgres" -m fast -w stop > /dev/null 2>&1 || true
    ;;
mlflow)
    port=${2:?PORT}; store=${3:?STORE}; artifacts=${4:?ARTIFACTS_DESTINATION}
    case "$store" in
    sqlite) store=sqlite:///$state/mlflow.db ;;
    postgres) store=$(pg_start "${RAYSTUDY_PG_PORT:-5433}") ;;
    *://*:*@*)
        # not echoed: the line would put the secret in ray up's output and logs
        echo "error: STORE names a secret (USER:SECRET@HOST): put it in $state/pgpass (HOST:PORT:DB:USER:SECRET, mode 600)" >&2
        exit 2 ;;
    sqlite:///* | postgresql+*://*) ;;
    # psycopg2, the driver the project installs (SQLAlchemy's default for postgresql:// may be another)
    postgresql://*)
        if [ ! -s "$state/pgpass" ]; then
            echo "error: no secret for $store: put HOST:PORT:DB:USER:SECRET in $state/pgpass (mode 600) on the head" >&2
            exit 2
        fi
        store=postgresql+psycopg2://${store#postgresql://} ;;
    *)
        echo "error: STORE $store: use sqlite, postgres or a database URI (sqlite:///PATH, postgresql://USER@HOST:PORT/DB)" >&2
        exit 2 ;;
    esac
    ip=$(node_ip)
    mkdir -p "$state"
    credentials
    bash "$0" stop-mlflow
    # One worker serialises writes to SQLite (no "database is locked" under many trials); a
    # database server takes several. Without the job runner it starts in seconds and leaves no
    # children behind when stopped.
    case "$store" in sqlite:*) workers=1 ;; *) workers=4 ;; esac
    # libpq reads a database's secret from $state/pgpass (the head's own PostgreSQL writes its line there).
    if [ -f "$state/pgpass" ]; then export PGPASSFILE=$state/pgpass; fi
    # In a session of its own (it outlives this SSH command), whose id goes to the pid file.
    MLFLOW_AUTH_CONFIG_PATH=$state/mlflow-auth.ini MLFLOW_FLASK_SERVER_SECRET_KEY=$(cat "$state/mlflow-server-key") \
    MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false setsid bash -c 'echo $$ > "$0"; exec "$@"' "$state/mlflow.pid" \
        python -m mlflow server --app-name basic-auth --host "$ip" --port "$port" --workers "$workers" \
        --allowed-hosts "$ip,$ip:$port,localhost,localhost:$port,127.0.0.1,127.0.0.1:$port" \
        --backend-store-uri "$store" --artifacts-destination "$artifacts" \
        > "$state/mlflow.log" 2>&1 < /dev/null &
    sleep 0.5
    for _ in $(seq 120); do
        if python -c "import urllib.request as u; u.urlopen('http://$ip:$port/health', timeout=2)" 2>/dev/null; then
            echo "MLflow tracking server: http://$ip:$port (store $store, artifacts $artifacts)"
            echo "Its user and password: $state/mlflow-credentials on the head (docs/cluster.md)"
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
    sed -n '2,13p' "$0" >&2
    exit 2
    ;;
esac
