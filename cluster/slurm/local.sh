#!/usr/bin/env bash
# A one-node SLURM on this machine, for the tests (.ci/run starts it) and for trying cluster/slurm/job.sh:
#
#   bash cluster/slurm/local.sh start DIR   # munged (if none answers), slurmctld and slurmd; prints SLURM_CONF=...
#   bash cluster/slurm/local.sh stop DIR    # the daemons this script started from DIR, by their pid files
#
# Debian's slurm-wlm and munge (apt-get install slurm-wlm munge), run as root: no systemd and no
# cgroups (proctrack/linuxproc, task/none), one partition `debug` holding this host with all its CPUs.
# Everything but munge's socket lives in DIR: the configuration, state, spool, logs and pid files, so
# the machine's /etc/slurm is never touched; commands find the cluster through SLURM_CONF=DIR/slurm.conf.
# A start over a running one (the same DIR) leaves it as it is.
set -euo pipefail
shopt -s inherit_errexit   # a failure inside $(...) stops the script too

dir=${2:?DIR}
mkdir -p "$dir"
dir=$(readlink -f "$dir")
conf=$dir/slurm.conf

answers() {  # the controller knows this host, and it is idle or busy (not down)
    SLURM_CONF=$conf timeout 10 sinfo -h -o %T 2> /dev/null | grep -Eq '^(idle|mixed|allocated|completing)'
}

munge_up() {
    munge -n 2> /dev/null | unmunge > /dev/null 2>&1
}

start_munge() {
    munge_up && return 0
    if [ ! -s /etc/munge/munge.key ]; then
        mkdir -p /etc/munge
        (umask 077 && dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none)
    fi
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    runuser -u munge -- munged
    for _ in $(seq 20); do munge_up && return 0; sleep 0.5; done
    echo "error: munged did not start (see /var/log/munge/munged.log)" >&2
    exit 1
}

write_conf() {
    local host cpus mem
    host=$(hostname -s)
    cpus=$(nproc)
    mem=$(awk '/MemTotal/ { print int($2 / 1024 * 0.8) }' /proc/meminfo)
    mkdir -p "$dir/state" "$dir/spool" "$dir/log"
    cat > "$conf" <<EOF
# written by cluster/slurm/local.sh: a one-node SLURM on $host
ClusterName=raystudy
SlurmctldHost=$host
SlurmUser=root
SlurmctldPort=${RAYSTUDY_SLURMCTLD_PORT:-6917}
SlurmdPort=${RAYSTUDY_SLURMD_PORT:-6918}
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
JobRequeue=1
KillWait=60
MinJobAge=600
SchedulerParameters=bf_interval=1,sched_min_interval=100000
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
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
    start_munge
    if [ -n "$(own_pid "$dir/slurmctld.pid" slurmctld)" ] && [ -n "$(own_pid "$dir/slurmd.pid" slurmd)" ] && answers; then
        echo "SLURM_CONF=$conf"
        exit 0
    fi
    bash "$0" stop "$dir" > /dev/null
    write_conf
    # -c: a clean start, no jobs kept from an earlier one in this DIR
    SLURM_CONF=$conf /usr/sbin/slurmctld -c -f "$conf"
    SLURM_CONF=$conf /usr/sbin/slurmd -f "$conf"
    for _ in $(seq 60); do
        if answers; then
            echo "SLURM_CONF=$conf"
            exit 0
        fi
        sleep 0.5
    done
    echo "error: SLURM did not come up; last lines of $dir/log:" >&2
    tail -n 5 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 || true
    exit 1
    ;;
stop)
    for name in slurmd slurmctld; do
        pid=$(own_pid "$dir/$name.pid" "$name")
        [ -n "$pid" ] || continue
        kill -TERM "$pid" 2> /dev/null || true
        for _ in $(seq 40); do kill -0 "$pid" 2> /dev/null || break; sleep 0.25; done
        kill -KILL "$pid" 2> /dev/null || true
    done
    ;;
*)
    sed -n '2,9p' "$0" >&2
    exit 2
    ;;
esac
