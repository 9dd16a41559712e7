#!/usr/bin/env bash
# A one-node SLURM on this machine, for the tests (.ci/run starts it) and for trying cluster/slurm/job.sh:
#
#   eval "$(bash cluster/slurm/local.sh start DIR)"   # munged, slurmctld and slurmd; prints export SLURM_CONF=...
#   bash cluster/slurm/local.sh node DIR               # on another host of DIR's cluster (below): its slurmd
#   bash cluster/slurm/local.sh stop DIR               # the daemons this script started from DIR, by their pid files
#
# Debian's slurm-wlm and munge (apt-get install slurm-wlm munge), run as root: no systemd and no
# cgroups (proctrack/linuxproc, task/none), one partition `debug` holding this host with all its CPUs.
# Everything lives in DIR: the configuration, state, spool, logs, pid files, and a munged of its own
# (its key, and its socket, which slurm.conf names), so the machine's /etc/slurm and /etc/munge are
# never touched and a stop leaves no daemon behind; commands find the cluster through
# SLURM_CONF=DIR/slurm.conf (without it they look for a configuration server in DNS, and fail).
# A start over a running one (the same DIR) leaves it as it is. DIR and the folders above it must be
# open to all (munged refuses a socket others cannot reach): /tmp/raystudy-slurm, not under a 700 folder.
# Several hosts sharing DIR (cluster/hosts.py's): RAYSTUDY_SLURM_NODES="h1=10.77.0.1 h2=10.77.0.2" at
# start (the first one runs slurmctld and munged), RAYSTUDY_SLURM_CPUS each one's CPUs (default: all);
# NODE:HOST=ADDR names a node otherwise than its host, as some clusters do (n1:h1=10.77.0.1).
# RAYSTUDY_SLURMD_TIMEOUT: seconds before the controller takes a silent node for down (SLURM's 300).
set -euo pipefail
shopt -s inherit_errexit   # a failure inside $(...) stops the script too

dir=${2:?DIR}
mkdir -p "$dir"
dir=$(readlink -f "$dir")
conf=$dir/slurm.conf
munge_dir=$dir/munge   # munged's socket and pid file (mode 755); its key, log and seed in munge/key (700)
socket=$munge_dir/munge.socket

answers() {  # the controller knows this host, and it is idle or busy (not down)
    SLURM_CONF=$conf timeout 10 sinfo -h -o %T 2> /dev/null | grep -Eq '^(idle|mixed|allocated|completing)'
}

munge_up() {
    munge -S "$socket" -n 2> /dev/null | unmunge -S "$socket" > /dev/null 2>&1
}

start_munge() {  # DIR's own munged, as root (slurmd runs as root too)
    if [ -n "$(own_pid "$munge_dir/munged.pid" munged)" ] && munge_up; then return 0; fi
    mkdir -p "$munge_dir/key"
    chmod 755 "$munge_dir" && chmod 700 "$munge_dir/key"
    if [ ! -s "$munge_dir/key/munge.key" ]; then
        (umask 077 && dd if=/dev/urandom of="$munge_dir/key/munge.key" bs=1024 count=1 status=none)
    fi
    rm -f "$socket" "$socket.lock"
    munged --socket="$socket" --pid-file="$munge_dir/munged.pid" --key-file="$munge_dir/key/munge.key" \
        --log-file="$munge_dir/key/munged.log" --seed-file="$munge_dir/key/munged.seed" \
        || { tail -n 3 "$munge_dir/key/munged.log" >&2; exit 1; }
    for _ in $(seq 20); do munge_up && return 0; sleep 0.5; done
    echo "error: munged did not start (see $munge_dir/key/munged.log)" >&2
    exit 1
}

node_lines() {  # NodeName=... for each node of RAYSTUDY_SLURM_NODES (NAME[:HOST][=ADDR]; default: this host)
    local cpus mem spec name line
    cpus=${RAYSTUDY_SLURM_CPUS:-$(nproc)}
    mem=$(awk '/MemTotal/ { print int($2 / 1024 * 0.8) }' /proc/meminfo)
    for spec in ${RAYSTUDY_SLURM_NODES:-$(hostname -s)}; do
        name=${spec%%=*}
        line="NodeName=${name%%:*}"
        if [[ "$name" == *:* ]]; then line+=" NodeHostname=${name#*:}"; fi
        if [[ "$spec" == *=* ]]; then line+=" NodeAddr=${spec#*=}"; fi
        echo "$line CPUs=$cpus RealMemory=$mem State=UNKNOWN"
    done
}

write_conf() {
    local host first ctl
    host=$(hostname -s)
    first=${RAYSTUDY_SLURM_NODES:-$host}
    first=${first%% *}
    ctl=${first%%=*}
    ctl=${ctl#*:}   # the controller's host
    if [[ "$first" == *=* ]]; then ctl="$ctl(${first#*=})"; fi
    mkdir -p "$dir/state" "$dir/spool" "$dir/log"
    cat > "$conf" <<EOF
# written by cluster/slurm/local.sh: a SLURM of its own, its controller on $host
ClusterName=raystudy
SlurmctldHost=$ctl
SlurmUser=root
SlurmctldPort=${RAYSTUDY_SLURMCTLD_PORT:-6917}
SlurmdPort=${RAYSTUDY_SLURMD_PORT:-6918}
AuthType=auth/munge
AuthInfo=socket=$socket
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SlurmdTimeout=${RAYSTUDY_SLURMD_TIMEOUT:-300}
JobRequeue=1
KillWait=60
MinJobAge=600
SchedulerParameters=bf_interval=1,sched_min_interval=100000
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%h
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%h.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%h.log
$(node_lines)
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
}

own_pid() {  # own_pid PIDFILE NAME: the pid in PIDFILE if it is still NAME's, else nothing
    local pid
    [ -s "$1" ] || return 0
    pid=$(cat "$1")
    if kill -0 "$pid" 2> /dev/null && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q "$2"; then echo "$pid"; fi
}

case "${1:-}" in
start)
    if [ "$(id -u)" != 0 ]; then
        echo "error: cluster/slurm/local.sh starts SLURM's daemons as root (slurmd runs jobs as their users)" >&2
        exit 2
    fi
    for prog in slurmctld slurmd munged sinfo; do
        if ! command -v "$prog" > /dev/null && [ ! -x "/usr/sbin/$prog" ]; then
            echo "error: no $prog on this machine: apt-get install slurm-wlm munge" >&2
            exit 2
        fi
    done
    if [ -n "$(own_pid "$munge_dir/munged.pid" munged)" ] && [ -n "$(own_pid "$dir/slurmctld.pid" slurmctld)" ] \
        && [ -n "$(own_pid "$dir/slurmd-$(hostname -s).pid" slurmd)" ] && answers; then
        echo "export SLURM_CONF=$conf"
        exit 0
    fi
    bash "$0" stop "$dir" > /dev/null
    start_munge
    write_conf
    # -c: a clean start, no jobs kept from an earlier one in this DIR
    SLURM_CONF=$conf /usr/sbin/slurmctld -c -f "$conf"
    SLURM_CONF=$conf /usr/sbin/slurmd -f "$conf"
    for _ in $(seq 60); do
        if answers; then
            echo "export SLURM_CONF=$conf"
            exit 0
        fi
        sleep 0.5
    done
    echo "error: SLURM did not come up; last lines of $dir/log:" >&2
    tail -n 5 "$dir/log/slurmctld.log" "$dir/log/slurmd-$(hostname -s).log" >&2 || true
    exit 1
    ;;
node)
    [ -s "$conf" ] || { echo "error: no $conf: local.sh start DIR on the first host first" >&2; exit 2; }
    if [ -z "$(own_pid "$dir/slurmd-$(hostname -s).pid" slurmd)" ]; then SLURM_CONF=$conf /usr/sbin/slurmd -f "$conf"; fi
    echo "export SLURM_CONF=$conf"
    ;;
stop)
    names=()
    # slurmd.pid: a slurmd an earlier local.sh started (one node, before the file took the host's name)
    for f in "$dir"/slurmd.pid "$dir"/slurmd-*.pid; do [ -e "$f" ] && names+=("$(basename "$f" .pid)"); done
    for name in "${names[@]}" slurmctld munge/munged; do
        pid=$(own_pid "$dir/$name.pid" "$(basename "${name%%-*}")")
        [ -n "$pid" ] || continue
        kill -TERM "$pid" 2> /dev/null || true
        for _ in $(seq 40); do kill -0 "$pid" 2> /dev/null || break; sleep 0.25; done
        kill -KILL "$pid" 2> /dev/null || true
    done
    ;;
*)
    sed -n '2,19p' "$0" >&2
    exit 2
    ;;
esac
