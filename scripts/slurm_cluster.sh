#!/usr/bin/env bash
# Starts and stops a private, single-node Slurm cluster (munged, slurmctld,
# slurmd) for tests, entirely inside one directory, without systemd and
# without touching /etc/slurm, /etc/munge or any system-wide daemon.
#
# Usage:
#   scripts/slurm_cluster.sh start DIR   # create DIR if needed, start, wait until the node is idle
#   scripts/slurm_cluster.sh stop DIR    # kill exactly the daemons listed in DIR/pids
#
# After start, `source DIR/env` points the Slurm clients (sbatch, srun,
# squeue, scancel, scontrol, sinfo) at the private cluster.
#
# Layout of DIR:
#   slurm.conf, plugstack.conf, env, pids ("name pid" per line)
#   munge/   munge.key, munge.socket.2, munged.pid, munged.log, munged.seed
#   state/   slurmctld StateSaveLocation     spool/  slurmd SlurmdSpoolDir
#   log/     slurmctld.log, slurmd.log, and the daemons' stdout/stderr
#
# Needs root (slurmd launches jobs as the submitting user) and Debian's
# slurm-wlm and munge packages. Both commands are idempotent: start does
# nothing when the daemons in DIR/pids are alive, stop does nothing when
# there is no DIR/pids.
set -euo pipefail

usage() {
    echo "usage: $0 {start|stop} DIR" >&2
    exit 2
}

[ $# -eq 2 ] || usage
action=$1
dir=$2

start_timeout=30  # seconds to wait for the node to become idle
stop_timeout=10   # seconds between SIGTERM and SIGKILL

# Whether the process "name pid" from DIR/pids still runs. The name check
# keeps a recycled pid from passing for one of our daemons; the state check
# counts a zombie as dead (the daemons end up children of init, which here
# may be slow to reap them, or never do).
alive() {
    local name=$1 pid=$2 comm stat
    comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
    stat=${stat##*) }  # the fields after "(comm)"; the first is the state
    [ "$comm" = "$name" ] && [ "${stat%% *}" != Z ]
}

# Prints the last lines of every log, for a caller (e.g. ctest) that only
# sees our output when start fails. The Slurm daemons' *.out (their stderr)
# rather than their *.log: under -D they log everything there as well, plus
# the fatal errors from before they open their log file.
dump_logs() {
    local f
    for f in "$dir"/log/*.out "$dir"/munge/munged.log; do
        [ -s "$f" ] || continue
        echo "---- tail of $f" >&2
        tail -n 20 "$f" >&2
    done
}

# Whether a TCP port has a listener on it. ss sees listeners on every
# address, which a connect to 127.0.0.1 alone would miss.
port_in_use() {
    ss -Htln "sport = :$1" 2>/dev/null | grep -q . && return 0
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Two consecutive free ports from a random start in 20000-59999, so that
# clusters started side by side (parallel ctest) rarely collide.
pick_ports() {
    local p
    for _ in $(seq 1 200); do
        p=$((20000 + (RANDOM * 32768 + RANDOM) % 40000))
        if ! port_in_use "$p" && ! port_in_use $((p + 1)); then
            echo "$p $((p + 1))"
            return 0
        fi
    done
    echo "slurm_cluster: no free pair of TCP ports found" >&2
    return 1
}

# Job steps run under slurmstepd processes that slurmd detaches from itself,
# so killing the daemons would leave running jobs behind. Cancel them through
# Slurm while it still runs, and wait (bounded) until they are gone.
cancel_jobs() {
    local conf=$dir/slurm.conf deadline=$((SECONDS + 15))
    [ -f "$conf" ] || return 0
    export SLURM_CONF=$conf
    # The configuration has a single partition, so this filter means "all jobs".
    timeout 10 scancel --quiet --partition=debug 2>/dev/null || true
    while [ -n "$(timeout 5 squeue -h -o %i 2>/dev/null || true)" ]; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "slurm_cluster: jobs still not ended 15s after scancel; stopping anyway" >&2
            break
        fi
        sleep 0.5
    done
    unset SLURM_CONF
}

stop_cluster() {
    local pidfile=$dir/pids name pid deadline left up=0
    [ -f "$pidfile" ] || return 0
    local -a names=() pids=()
    while read -r name pid; do
        [ -n "${pid:-}" ] || continue
        names+=("$name")
        pids+=("$pid")
        case $name in slurmctld | slurmd) alive "$name" "$pid" && up=$((up + 1)) ;; esac
    done <"$pidfile"
    [ "$up" -eq 2 ] && cancel_jobs

    # slurmd first, so it does not log the controller going away; munged
    # last, because both Slurm daemons talk to it while shutting down.
    local order=(slurmd slurmctld munged) n i
    for n in "${order[@]}"; do
        for i in "${!pids[@]}"; do
            if [ "${names[$i]}" = "$n" ] && alive "$n" "${pids[$i]}"; then
                kill -TERM "${pids[$i]}" 2>/dev/null || true
            fi
        done
    done

    deadline=$((SECONDS + stop_timeout))
    while :; do
        left=0
        for i in "${!pids[@]}"; do
            alive "${names[$i]}" "${pids[$i]}" && left=1
        done
        [ "$left" -eq 0 ] && break
        if [ "$SECONDS" -ge "$deadline" ]; then
            for i in "${!pids[@]}"; do
                if alive "${names[$i]}" "${pids[$i]}"; then
                    echo "slurm_cluster: ${names[$i]} (pid ${pids[$i]}) ignored SIGTERM, sending SIGKILL" >&2
                    kill -KILL "${pids[$i]}" 2>/dev/null || true
                fi
            done
            sleep 0.5
            for i in "${!pids[@]}"; do
                if alive "${names[$i]}" "${pids[$i]}"; then
                    echo "slurm_cluster: ${names[$i]} (pid ${pids[$i]}) survived SIGKILL" >&2
                    return 1
                fi
            done
            break
        fi
        sleep 0.2
    done
    rm -f "$pidfile"
    echo "slurm_cluster: stopped ${names[*]:-nothing} in $dir"
}

write_conf() {
    local host=$1 ctld_port=$2 slurmd_port=$3
    # An empty plugstack.conf keeps whatever SPANK plugins the system has
    # out of the test cluster.
    : >"$dir/plugstack.conf"
    cat >"$dir/slurm.conf" <<EOF
# Written by scripts/slurm_cluster.sh; regenerated (with new ports) on every start.
ClusterName=bigbatch-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root

# munge with a private key and socket; the clients read the socket from here too.
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket.2
CredType=cred/munge

StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$dir/plugstack.conf

# No cgroups: works in containers and without systemd. proctrack/pgid, not
# linuxproc: linuxproc follows parent links, so a job's background child that
# outlives its shell (reparented to init) escapes it and keeps running after
# the job ends; pgid kills the step's whole process group.
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none

ReturnToService=2
JobRequeue=1
KillWait=5
MessageTimeout=10
SlurmdTimeout=60
InactiveLimit=0
MinJobAge=300
SchedulerType=sched/backfill
# Debian ships no /bin/mail; without this slurmctld logs an error at start.
MailProg=/bin/true

# RealMemory is set low so the node is never drained for having less memory
# than configured; CR_CPU ignores memory when placing jobs.
NodeName=$host NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

# munged refuses to run as root, and refuses keys, sockets and logs in
# directories other users could write to; its socket directory must also be
# searchable by everyone, so clients can connect. Hence runuser and a
# munge-owned 0755 directory (the key itself is 0400).
start_munged() {
    local m=$dir/munge
    mkdir -p "$m"
    chown munge:munge "$m"
    chmod 0755 "$m"
    if [ ! -s "$m/munge.key" ]; then
        # A fresh key keeps this cluster from trusting (or being trusted
        # by) the system's munge.
        mungekey --create --keyfile="$m/munge.key"
    fi
    chown munge:munge "$m/munge.key"
    chmod 0400 "$m/munge.key"
    rm -f "$m/munge.socket.2" "$m/munge.socket.2.lock" "$m/munged.pid"
    # munged daemonizes and returns once its socket is ready and its pid
    # file written; its own pid (not runuser's) is read from that file.
    runuser -u munge -- munged \
        --socket="$m/munge.socket.2" \
        --key-file="$m/munge.key" \
        --pid-file="$m/munged.pid" \
        --log-file="$m/munged.log" \
        --seed-file="$m/munged.seed" \
        </dev/null >>"$dir/log/munged.out" 2>&1
    local pid
    pid=$(cat "$m/munged.pid")
    echo "munged $pid" >>"$dir/pids"
}

# Starts a Slurm daemon in the foreground mode (-D) but detached: own
# session, no terminal, stdio to a file, so it neither receives the caller's
# Ctrl-C nor keeps a caller's pipe (ctest's) open.
start_daemon() {
    local name=$1
    shift
    setsid "$name" -D -f "$dir/slurm.conf" "$@" \
        </dev/null >>"$dir/log/$name.out" 2>&1 &
    # setsid execs in place (a background job is not a group leader), so
    # $! is the daemon itself. disown: stop reports its fate, not bash.
    echo "$name $!" >>"$dir/pids"
    disown $!
}

on_start_exit() {
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        dump_logs
        stop_cluster >&2 || true
    fi
    exit "$rc"
}

start_cluster() {
    local started=$SECONDS
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)

    if [ -f "$dir/pids" ]; then
        local name pid all=1 any=0
        while read -r name pid; do
            [ -n "${pid:-}" ] || continue
            if alive "$name" "$pid"; then any=1; else all=0; fi
        done <"$dir/pids"
        if [ "$any" -eq 1 ] && [ "$all" -eq 1 ]; then
            echo "slurm_cluster: already running in $dir ($(tr '\n' ' ' <"$dir/pids"| sed 's/ $//'))"
            return 0
        fi
        # Half a cluster is no use; clear it away and start afresh.
        stop_cluster
    fi

    # munged runs as the munge user, which must be able to reach DIR (a DIR
    # under /root, for one, is out of its reach).
    if ! runuser -u munge -- test -x "$dir"; then
        echo "slurm_cluster: user munge cannot reach $dir; use a directory outside private ones such as /root" >&2
        return 1
    fi

    local host ports ctld_port slurmd_port
    host=$(hostname -s)
    ports=$(pick_ports)
    read -r ctld_port slurmd_port <<<"$ports"
    # Jobs of an earlier run died with its daemons; old state would only
    # bring them back as failed jobs, and old logs would muddle dump_logs.
    rm -rf "$dir/state" "$dir/spool" "$dir/log" "$dir/munge/munged.log"
    mkdir -p "$dir/state" "$dir/spool" "$dir/log"
    chmod 0755 "$dir" "$dir/state" "$dir/spool" "$dir/log"
    rm -f "$dir/pids" "$dir/slurmctld.pid" "$dir/slurmd.pid"
    write_conf "$host" "$ctld_port" "$slurmd_port"
    cat >"$dir/env" <<EOF
# source this file to use the Slurm cluster in $dir
export SLURM_CONF=$dir/slurm.conf
EOF

    # From here on, a failure (set -e included) leaves no half-started
    # daemons behind and shows why it failed. An EXIT trap, because an ERR
    # trap would not fire inside the functions below.
    trap on_start_exit EXIT
    start_munged
    start_daemon slurmctld
    start_daemon slurmd -N "$host"

    local state="" deadline=$((SECONDS + start_timeout)) n p
    while :; do
        state=$(SLURM_CONF=$dir/slurm.conf timeout 5 sinfo -h -N -n "$host" -o '%T' 2>/dev/null || true)
        [ "$state" = idle ] && break
        local dead=""
        while read -r n p; do
            alive "$n" "$p" || dead+=" $n"
        done <"$dir/pids"
        if [ -n "$dead" ]; then
            echo "slurm_cluster: daemon(s) exited during start:$dead" >&2
            return 1
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "slurm_cluster: node $host not idle after ${start_timeout}s (state: '${state:-no answer}')" >&2
            return 1
        fi
        sleep 0.5
    done
    trap - EXIT
    echo "slurm_cluster: started munged, slurmctld, slurmd in $dir" \
        "(node $host idle, ports $ctld_port,$slurmd_port, $((SECONDS - started))s); source $dir/env"
}

case $action in
    start) start_cluster ;;
    stop)
        if [ ! -f "$dir/pids" ]; then
            echo "slurm_cluster: nothing running in $dir"
            exit 0
        fi
        dir=$(cd "$dir" && pwd)
        stop_cluster
        ;;
    *) usage ;;
esac
