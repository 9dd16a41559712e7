#!/usr/bin/env bash
# What `ray up` runs on each node besides Ray itself (cluster.yaml, cluster.local.yaml):
#
#   bash cluster/node.sh ip                                    # head: the address Ray and MLflow bind there
#   bash cluster/node.sh env RAY_PORT MLFLOW_PORT [HEAD_IP]   # every node: ~/raystudy.env, sourced by ~/.bashrc
#   bash cluster/node.sh mlflow PORT STORE ARTIFACTS_DESTINATION [BACKUPS]   # head: (re)start MLflow
#   bash cluster/node.sh stop-mlflow                           # head: stop it (and its snapshot loop)
#   bash cluster/node.sh snapshot                              # head: a snapshot of the store to BACKUPS now
#   bash cluster/node.sh restore [SNAPSHOT]                    # head: an empty store from a snapshot (the newest)
#   bash cluster/node.sh postgres [PORT]                       # head: (re)start its PostgreSQL (mlflow does)
#   bash cluster/node.sh stop-postgres                         # head: stop it
#
# STORE: sqlite (one file, $state/mlflow.db), postgres (a PostgreSQL server on this head, its data
# in $state/postgres, port $RAYSTUDY_PG_PORT or 5433, 127.0.0.1 only) or a database URI
# (sqlite:///PATH, postgresql://USER@HOST:PORT/DB: a managed one; its secret in $state/pgpass, never in the URI).
#
# BACKUPS: where snapshots of the store go (the bucket, s3://..., or a folder: another disk, NFS), one
# every $RAYSTUDY_BACKUP_MINUTES (30) minutes by a loop started with MLflow, the newest
# $RAYSTUDY_BACKUP_KEEP (24) kept; a head whose store is empty restores the newest before MLflow starts.
# SQLite's online backup API for sqlite (consistent while MLflow writes), pg_dump for PostgreSQL.
#
# ~/raystudy.env exports RAY_ADDRESS and MLFLOW_TRACKING_URI (the head's cluster address), so on any
# node `python -m raystudy.grid ...` finds the cluster and the tracking server by itself; it also
# sources $state/mlflow-credentials (MLFLOW_TRACKING_USERNAME/PASSWORD, made on the head at its first
# start, copied to the workers by Ray's cluster_synced_files), which the server requires (MLflow's
# basic-auth app): the secret stays in that file (mode 600), out of the repository and the cluster file.
# MLflow binds the head's cluster address only -- the one Ray gives the workers, private on a
# cloud -- never 0.0.0.0, and accepts only Host headers naming that address or localhost (the SSH
# tunnel): the UI is reached from a laptop through SSH, never from the internet.
# On the head (no HEAD_IP given) it also exports RAYSTUDY_SNAPSHOT_CMD, this script's `snapshot`: a grid
# driver runs it once when the grid ends, so the loss window is a grid's end or the interval, whichever is sooner;
# and RAYSTUDY_TRACKING_STORE, the server's database, where a driver on the head reads what is done.
set -euo pipefail
shopt -s inherit_errexit   # a failure inside $(...) stops the script too

state=${RAYSTUDY_STATE:-$HOME/raystudy-state}   # pid files, logs, credentials (and the stores on the head)

node_ip() {  # the address Ray uses for this node (RAY_HEAD_IP on the workers)
    # On a head that `ray up` made, the head_ip of the cluster file (its copy on the head): Ray's own
    # pick routes towards the internet, and a node with no default route (a private network) falls
    # back to its host name's address, 127.0.1.1 on Debian, where no worker reaches it.
    python - <<'PY'
import os
import yaml
import ray.util
try:
    with open(os.path.expanduser("~/ray_bootstrap_config.yaml")) as f:
        ip = (yaml.safe_load(f).get("provider") or {}).get("head_ip")
except OSError:
    ip = None
print(ip or ray.util.get_node_ip_address())
PY
}

random_secret() {
    python -c 'import secrets; print(secrets.token_urlsafe(24))'
}

# Each request's password check is a scrypt hash, costly by design (benchmarks/bench_auth.py); MLflow
# keeps a verified credential for this many seconds in each worker (keyed by an HMAC of it, never the
# secret itself), so a grid's thousands of requests pay it once a worker. 0 checks every request.
auth_cache_s=${RAYSTUDY_AUTH_CACHE_S:-600}

credentials() {  # $state/mlflow-credentials, made once; the basic-auth app's config from it, each start
    if ! [[ "$auth_cache_s" =~ ^[0-9]+$ ]]; then
        echo "error: RAYSTUDY_AUTH_CACHE_S=$auth_cache_s: use seconds a verified credential is kept, 0 or more" >&2
        exit 2
    fi
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
auth_cache_ttl_seconds = $auth_cache_s
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
    if as_pg "$bin/pg_ctl" -D "$data" status > /dev/null 2>&1; then
        # postmaster.pid's fourth line is the port it listens on: another one would be a URI to nothing
        local running
        running=$(sed -n 4p "$data/postmaster.pid" 2>/dev/null)
        if [ -n "$running" ] && [ "$running" != "$port" ]; then
            echo "error: the head's PostgreSQL already runs on port $running, not $port ($data): use port $running, or stop it first (cluster/node.sh stop-postgres) to start it on $port" >&2
            exit 2
        fi
    else
        as_pg "$bin/pg_ctl" -D "$data" -l "$state/postgres.log" -o "-p $port" -w -t 120 start > /dev/null
        # started on another port than before: libpq finds the secret by host and port
        if ! grep -q "^127.0.0.1:$port:" "$state/pgpass" 2>/dev/null; then
            local secret
            secret=$(sed -n 's/^127\.0\.0\.1:[0-9]*:\*:mlflow://p' "$state/pgpass" | head -n 1)
            (umask 077 && echo "127.0.0.1:$port:*:mlflow:$secret" >> "$state/pgpass")
        fi
    fi
    if [ -n "$new" ]; then
        PGPASSFILE=$state/pgpass "$bin/createdb" -h 127.0.0.1 -p "$port" -U mlflow mlflow
    fi
    echo "postgresql+psycopg2://mlflow@127.0.0.1:$port/mlflow"
}

# ---------------------------------------------------------------- snapshots of the store
# A snapshot is one file, mlflow-<UTC time>.sqlite.gz (SQLite) or mlflow-<UTC time>.pgdump (pg_dump's
# custom format); names sort by time. BACKUPS is an s3:// URI (aws s3) or a folder (a plain copy).

backup_minutes=${RAYSTUDY_BACKUP_MINUTES:-30}
backup_keep=${RAYSTUDY_BACKUP_KEEP:-24}

check_backup_settings() {
    if ! [[ "$backup_minutes" =~ ^[0-9]*\.?[0-9]+$ ]] || [[ "$backup_minutes" =~ ^[0.]+$ ]]; then
        echo "error: RAYSTUDY_BACKUP_MINUTES=$backup_minutes: use minutes between snapshots, a number above 0" >&2
        exit 2
    fi
    if ! [[ "$backup_keep" =~ ^[1-9][0-9]*$ ]]; then
        echo "error: RAYSTUDY_BACKUP_KEEP=$backup_keep: use how many snapshots to keep, 1 or more" >&2
        exit 2
    fi
}

pg_tool() {  # pg_dump, pg_restore, psql: Debian's newest (the server's version), else on the PATH
    local bin
    bin=$(ls -d /usr/lib/postgresql/*/bin 2> /dev/null | sort -V | tail -n 1 || true)
    if [ -n "$bin" ] && [ -x "$bin/$1" ]; then echo "$bin/$1"; return; fi
    if command -v "$1"; then return; fi
    echo "error: no $1 on this head: apt-get install postgresql-client (a version as new as the database's)" >&2
    exit 2
}

libpq_uri() {  # SQLAlchemy's postgresql+DRIVER://... as libpq takes it
    echo "postgresql://${1#*://}"
}

store_kind() {  # sqlite or pgdump: the snapshot format of a store URI
    case "$1" in sqlite:*) echo sqlite.gz ;; postgresql*) echo pgdump ;; *) return 1 ;; esac
}

put() {  # put FILE DEST/NAME: a snapshot whole or not at all
    case "$2" in
    s3://*) aws s3 cp --only-show-errors "$1" "$2" ;;
    *) mkdir -p "$(dirname "$2")" && cp "$1" "$2.part" && mv "$2.part" "$2" ;;
    esac
}

get() {  # get DEST/NAME FILE
    case "$1" in
    s3://*) aws s3 cp --only-show-errors "$1" "$2" ;;
    *) cp "$1" "$2" ;;
    esac
}

remove() {
    case "$1" in
    s3://*) aws s3 rm --only-show-errors "$1" ;;
    *) rm -f "$1" ;;
    esac
}

snapshots() {  # snapshots DEST KIND: their names, oldest first
    local dest=$1 kind=$2 listing rc=0
    case "$dest" in
    s3://*)
        # `aws s3 ls` exits 1 for a prefix with nothing under it; an unreadable bucket is an error
        listing=$(aws s3 ls "$dest/" 2>&1) || rc=$?
        if [ "$rc" -gt 1 ]; then
            echo "error: cannot list the snapshots in $dest: $(tail -n 1 <<< "$listing")" >&2
            exit 2
        fi
        [ "$rc" = 1 ] || awk '{print $4}' <<< "$listing"
        ;;
    *) if [ -d "$dest" ]; then ls -1 "$dest"; fi ;;
    esac | { grep -E "^mlflow-[0-9T.]+Z\.$kind\$" || true; } | sort
}

recorded() {  # recorded NAME: what `mlflow` wrote to $state/NAME (the store, the backups destination)
    if [ ! -s "$state/$1" ]; then
        echo "error: no $1 in $state: start MLflow with cluster/node.sh mlflow PORT STORE ARTIFACTS BACKUPS first" >&2
        exit 2
    fi
    cat "$state/$1"
}

store_is_empty() {  # no MLflow store there yet (no file, or a database without tables)
    local store=$1
    case "$store" in
    sqlite:///*) [ ! -s "${store#sqlite:///}" ] ;;
    *)
        local n
        n=$(PGPASSFILE=$state/pgpass "$(pg_tool psql)" -XAtq -d "$(libpq_uri "$store")" \
            -c "select count(*) from pg_catalog.pg_tables where schemaname = current_schema()")
        [ "$n" = 0 ]
        ;;
    esac
}

take_snapshot() {  # a consistent copy of the store to DEST, then only the newest $backup_keep kept there
    local store=$1 dest=$2 kind name tmp
    kind=$(store_kind "$store")
    name=mlflow-$(date -u +%Y%m%dT%H%M%S.%3NZ).$kind
    tmp=$(mktemp -d "$state/snapshot.XXXXXX")
    trap 'rm -rf "$tmp"; trap - RETURN' RETURN
    case "$kind" in
    sqlite.gz)
        # the online backup API: a consistent copy while MLflow writes, checked before it leaves
        python - "${store#sqlite:///}" "$tmp/mlflow.db" <<'EOF'
import sqlite3, sys
src, dst = sqlite3.connect(sys.argv[1], timeout=60), sqlite3.connect(sys.argv[2])
src.backup(dst)
ok = dst.execute("pragma integrity_check").fetchone()[0]
sys.exit(0 if ok == "ok" else f"error: the snapshot of {sys.argv[1]} fails SQLite's integrity check: {ok}")
EOF
        gzip -c "$tmp/mlflow.db" > "$tmp/$name"
        ;;
    pgdump)
        # one transaction's view of the database; no owner or grants, so it restores into any database
        PGPASSFILE=$state/pgpass "$(pg_tool pg_dump)" -Fc --no-owner --no-privileges -f "$tmp/$name" "$(libpq_uri "$store")"
        ;;
    esac
    put "$tmp/$name" "$dest/$name"
    local old
    for old in $(snapshots "$dest" "$kind" | head -n "-$backup_keep"); do remove "$dest/$old"; done
    echo "snapshot of MLflow's store: $dest/$name ($(snapshots "$dest" "$kind" | wc -l) kept, the newest $backup_keep)"
}

restore_snapshot() {  # restore_snapshot STORE DEST [NAME]: the store (empty) from a snapshot, the newest by default
    local store=$1 dest=$2 name=${3:-} kind tmp
    kind=$(store_kind "$store")
    [ -n "$name" ] || name=$(snapshots "$dest" "$kind" | tail -n 1)
    if [ -z "$name" ]; then
        echo "MLflow's store is new and empty: no snapshot (*.$kind) in $dest to restore"
        return
    fi
    tmp=$(mktemp -d "$state/restore.XXXXXX")
    trap 'rm -rf "$tmp"; trap - RETURN' RETURN
    get "$dest/$name" "$tmp/$name"
    case "$kind" in
    sqlite.gz)
        local db=${store#sqlite:///}
        gunzip -c "$tmp/$name" > "$tmp/mlflow.db"
        mkdir -p "$(dirname "$db")" && mv "$tmp/mlflow.db" "$db"
        ;;
    pgdump)
        PGPASSFILE=$state/pgpass "$(pg_tool pg_restore)" --no-owner --no-privileges --exit-on-error \
            -d "$(libpq_uri "$store")" "$tmp/$name"
        ;;
    esac
    echo "restored MLflow's store from the snapshot $dest/$name"
}

stop_own() {  # stop_own PIDFILE WHAT: the process group this script started, if the pid is still it
    local pidfile=$1 what=$2 pid
    [ -f "$pidfile" ] || return 0
    pid=$(cat "$pidfile")
    # a stale pid file may name someone else's process by now
    if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q "$what"; then
        # its own process group (setsid): the server and its workers, or the loop and its snapshot
        kill -TERM -- "-$pid" 2>/dev/null || true
        for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -KILL -- "-$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
}

case "${1:-}" in
ip)
    node_ip
    ;;
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
    if [ -z "${4:-}" ]; then   # the head (a worker is given HEAD_IP): where the store and its snapshots are
        cat >> ~/raystudy.env <<EOF
# a grid driver that ends runs this once: a snapshot of MLflow's store (docs/cluster.md)
export RAYSTUDY_SNAPSHOT_CMD='RAYSTUDY_STATE=$state bash $(readlink -f "$0") snapshot'
# the server's own database, which a driver here reads what is done from in one query (its secret
# in pgpass, as for the server): not the server's search, which sends every run whole
if [ -r $state/mlflow-store ]; then export RAYSTUDY_TRACKING_STORE=\$(cat $state/mlflow-store); fi
if [ -r $state/pgpass ]; then export PGPASSFILE=$state/pgpass; fi
EOF
    fi
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
    port=${2:?PORT}; store=${3:?STORE}; artifacts=${4:?ARTIFACTS_DESTINATION}; backups=${5:-${RAYSTUDY_BACKUPS:-}}
    check_backup_settings
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
    echo "$store" > "$state/mlflow-store"   # what `snapshot` copies (no secret: refused above)
    if [ -n "$backups" ]; then
        echo "${backups%/}" > "$state/mlflow-backups"
        echo "$backup_keep" > "$state/mlflow-backup-keep"
        # before MLflow starts: a new head (or a lost store) gets the study's record back
        if store_is_empty "$store"; then restore_snapshot "$store" "${backups%/}"; fi
    else
        rm -f "$state/mlflow-backups" "$state/mlflow-backup-keep"
        echo "MLflow's store is not backed up: give cluster/node.sh mlflow a BACKUPS destination (docs/cluster.md)"
    fi
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
            # RAYSTUDY_CREDENTIALS_AT: where they persist when $state does not (a SLURM job's copy)
            echo "Its user and password: ${RAYSTUDY_CREDENTIALS_AT:-$state/mlflow-credentials on the head} (docs/cluster.md)"
            echo "From a laptop: ssh -N -L $port:$ip:$port <user>@${RAYSTUDY_LOGIN_AT:-<head>} then open http://localhost:$port"
            if [ -n "$backups" ]; then
                setsid bash -c 'echo $$ > "$0"; exec "$@"' "$state/backups.pid" \
                    bash "$(readlink -f "$0")" backup-loop > /dev/null 2>&1 < /dev/null &
                echo "Snapshots of the store: every $backup_minutes minutes to ${backups%/}, the newest $backup_keep kept"
            fi
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
    stop_own "$state/backups.pid" "node.sh backup-loop"
    stop_own "$state/mlflow.pid" "mlflow server"
    ;;
snapshot)
    # as many kept as the head's loop keeps, whoever asks (a grid's driver, a user)
    if [ -z "${RAYSTUDY_BACKUP_KEEP:-}" ] && [ -s "$state/mlflow-backup-keep" ]; then
        backup_keep=$(cat "$state/mlflow-backup-keep")
    fi
    check_backup_settings
    store=$(recorded mlflow-store); dest=$(recorded mlflow-backups)
    mkdir -p "$state"
    exec 9> "$state/snapshot.lock"
    flock 9   # one at a time: the loop's and one asked for by hand
    rm -rf "$state"/snapshot.??????   # what a snapshot stopped midway left
    if [ -f "$state/pgpass" ]; then export PGPASSFILE=$state/pgpass; fi
    # an empty store's snapshot, the newest, would be what a new head restores
    if store_is_empty "$store"; then
        echo "error: MLflow's store $store is empty: nothing to snapshot (it restores from $dest when MLflow starts)" >&2
        exit 2
    fi
    take_snapshot "$store" "$dest"
    ;;
restore)
    store=$(recorded mlflow-store); dest=$(recorded mlflow-backups)
    if ! store_is_empty "$store"; then
        echo "error: MLflow's store $store is not empty: stop MLflow and move it aside first (docs/cluster.md)" >&2
        exit 2
    fi
    restore_snapshot "$store" "$dest" "${2:-}"
    ;;
backup-loop)
    check_backup_settings
    seconds=$(awk -v m="$backup_minutes" 'BEGIN { print m * 60 }')
    while sleep "$seconds"; do
        bash "$0" snapshot >> "$state/backups.log" 2>&1 || echo "$(date -u +%FT%TZ) snapshot failed" >> "$state/backups.log"
    done
    ;;
*)
    sed -n '2,20p' "$0" >&2
    exit 2
    ;;
esac
