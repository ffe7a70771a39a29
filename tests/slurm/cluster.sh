# A single-node Slurm for the tests, started here and ended here (source this file, then slurm_start DIR).
# Debian's slurm-wlm 22.05 and munge: munged as user munge on a private socket and key, slurmctld and
# slurmd as root in the foreground, each pid recorded and ended by pid (slurm_stop, run by the caller's
# trap). Nothing of the machine's own Slurm or munge (if any) is used or touched: every file is in DIR,
# the ports are free ones. Fails loudly (exit 1) when Slurm cannot start: a Slurm test never skips.
#
# The node has this machine's real CPUs (slurmd -C). Slurm lets more tasks than CPUs onto it only with
# srun/sbatch/salloc -O (--overcommit); a partition's OverSubscribe does not. With SLURM_SECOND_NODE=1 a
# second slurmd (-N n2, same host) gives two-node allocations.

slurm_pids=()

slurm_die() { echo "cluster.sh: $*" >&2; for f in "$SLURM_DIR"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -20 "$f" >&2; }; done; exit 1; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

slurm_start() {
    SLURM_DIR=$1
    local host
    host=$(hostname -s)
    for b in munged slurmctld slurmd srun sbatch salloc scancel sinfo; do
        command -v $b >/dev/null || slurm_die "$b not found: install slurm-wlm and munge (.ci/setup does)"
    done
    [ "$(id -u)" = 0 ] || slurm_die "slurmctld and slurmd must start as root"
    mkdir -p "$SLURM_DIR"/{munge,state,spool,spool2} || slurm_die "cannot make $SLURM_DIR"
    chown munge:munge "$SLURM_DIR/munge" && chmod 0700 "$SLURM_DIR/munge" || slurm_die "chown munge"
    head -c 1024 /dev/urandom >"$SLURM_DIR/munge/munge.key" && chown munge:munge "$SLURM_DIR/munge/munge.key" && chmod 0400 "$SLURM_DIR/munge/munge.key"
    setpriv --reuid=munge --regid=munge --init-groups munged -F --force --socket="$SLURM_DIR/munge/sock" \
        --key-file="$SLURM_DIR/munge/munge.key" --pid-file="$SLURM_DIR/munge/pid" --seed-file="$SLURM_DIR/munge/seed" \
        --log-file="$SLURM_DIR/munge/log" 2>>"$SLURM_DIR/munged.log" &
    slurm_pids+=($!)
    local i
    for i in $(seq 50); do [ -S "$SLURM_DIR/munge/sock" ] && break; sleep 0.1; done
    [ -S "$SLURM_DIR/munge/sock" ] || slurm_die "munged did not start"
    local node second=""
    node=$(slurmd -C | head -1 | sed 's/ RealMemory=[0-9]*//; s/ UpTime=.*//')
    [ -n "$node" ] || slurm_die "slurmd -C said nothing"
    if [ "${SLURM_SECOND_NODE:-0}" = 1 ]; then
        second="NodeName=n2 NodeHostname=$host Port=$(free_port) ${node#NodeName=* }"
    fi
    cat >"$SLURM_DIR/slurm.conf" <<CONF
ClusterName=gcdtest
SlurmctldHost=$host
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SLURM_DIR/munge/sock
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool/%n
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/slurmd.%n.pid
SlurmctldLogFile=$SLURM_DIR/slurmctld.log
SlurmdLogFile=$SLURM_DIR/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SwitchType=switch/none
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
MailProg=/bin/true
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
$node
$second
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
    export SLURM_CONF=$SLURM_DIR/slurm.conf
    slurmctld -D -i -f "$SLURM_CONF" >>"$SLURM_DIR/slurmctld.out" 2>&1 &
    slurm_pids+=($!)
    slurmd -D -f "$SLURM_CONF" >>"$SLURM_DIR/slurmd.out" 2>&1 &
    slurm_pids+=($!)
    if [ -n "$second" ]; then
        slurmd -D -N n2 -f "$SLURM_CONF" >>"$SLURM_DIR/slurmd2.out" 2>&1 &
        slurm_pids+=($!)
    fi
    local want=1
    [ -n "$second" ] && want=2
    for i in $(seq 150); do
        [ "$(sinfo -h -o '%T' 2>/dev/null | grep -cE '^(idle|mixed|allocated)')" -ge 1 ] &&
            [ "$(sinfo -h -N -o '%N %T' 2>/dev/null | grep -cE ' (idle|mixed|allocated)$')" -ge $want ] && return 0
        for p in "${slurm_pids[@]}"; do kill -0 "$p" 2>/dev/null || slurm_die "a Slurm daemon (pid $p) exited"; done
        sleep 0.2
    done
    slurm_die "no node became idle in 30 s: $(sinfo -N 2>&1)"
}

# Ends every job, then each daemon by its pid (TERM, then KILL after 5 s); the steps' processes that
# slurmd started are its children's children and end with the jobs.
slurm_stop() {
    [ -n "${SLURM_CONF:-}" ] && scancel --full -u root >/dev/null 2>&1
    local p i
    for ((i = ${#slurm_pids[@]} - 1; i >= 0; i--)); do kill -TERM "${slurm_pids[$i]}" 2>/dev/null; done
    for i in $(seq 50); do
        local alive=0
        for p in "${slurm_pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ $alive = 0 ] && break
        sleep 0.1
    done
    for p in "${slurm_pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
    for p in "${slurm_pids[@]}"; do wait "$p" 2>/dev/null; done
    slurm_pids=()
}
