#!/usr/bin/env bash
# Every MPI call a rank makes has the deadline (--timeout): a rank stopped (SIGSTOP, by the fault shim)
# as it enters MPI_Init, the final MPI_Bcast or MPI_Finalize ends the job with exit 3 in about the
# timeout, naming the call, and leaves no process behind. Before: the last two hung past any timeout.
# Then the launcher's own bounds: an endless error flood from mpirun, OPENBLAS_NUM_THREADS out of range,
# and Ctrl-C (SIGINT to the launcher's process group).
# usage: test_deadlines.sh GRADCHECK_DIST FAULT_SHIM
G=$1 FAULT=$2
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
work=$(mktemp -d)
cd "$work" || exit 1
# this copy's runs are told apart by their seeds (another copy of this test may run at the same time)
base=$(( (770000 + $$ % 100000) * 100 ))
trap 'for s in $(seq $base $((base + 30))); do pkill -KILL -f -- "--seed $s( |$)"; done 2>/dev/null; rm -rf "$work"' EXIT
left() { pgrep -f -- "--seed $1( |$)" || true; }
for call in Init Bcast Finalize; do
    seed=$((base + ${#call}))   # Init +4, Bcast +5, Finalize +8
    t0=$SECONDS
    LD_PRELOAD=$FAULT GCD_FAULT_STOP=$call GCD_FAULT_RANK=1 timeout -k 5 60 "$G" run --world 2 --probe simplenet --mode on \
        --seed $seed --timeout 3 --json $call.json >$call.txt 2>&1
    rc=$?
    dt=$((SECONDS - t0))
    [ $rc = 3 ] || fail "rank 1 stopped in MPI_$call: exit $rc, expected 3 (124: the job hung): $(tail -5 $call.txt)"
    [ $dt -le 30 ] || fail "rank 1 stopped in MPI_$call: $dt s with --timeout 3"
    grep -Eq "rank 0: MPI_[A-Za-z]+: not complete after 3 s" $call.txt || fail "MPI_$call: the message must name rank 0's call and the timeout: $(cat $call.txt)"
    for i in $(seq 50); do [ -z "$(left $seed)" ] && break; sleep 0.2; done
    [ -z "$(left $seed)" ] || fail "MPI_$call: processes left: $(left $seed)"
    echo "rank 1 stopped in MPI_$call: exit $rc in $dt s"
done
grep -q "rank 0: MPI_Init: not complete after 3 s" Init.txt || fail "the MPI_Init deadline must be named: $(cat Init.txt)"
[ ! -e Init.json ] || fail "a job that never started left a report"

# mpirun reading a parameter file that never ends writes an endless error flood and never starts a rank
# (before: 434 MB passed on in 60 s, no end): at most 1 MiB passed on, then the job is ended, exit 3
t0=$SECONDS
OMPI_MCA_mca_base_param_files=/dev/zero timeout -k 5 60 "$G" run --world 2 --probe simplenet --mode on --no-json --seed $((base + 10)) >flood.out 2>flood.err
rc=$?
bytes=$(wc -c <flood.err)
[ $rc = 3 ] || fail "an endless mpirun error flood: exit $rc, expected 3 (124: no end)"
[ "$bytes" -le 1100000 ] || fail "an endless mpirun error flood: $bytes bytes passed on, expected at most 1 MiB and a few lines"
grep -q "more than 1 MiB to stderr before any rank started" flood.err || fail "the flood's end must be said: $(tail -c 400 flood.err)"
echo "mpirun error flood: exit $rc in $((SECONDS - t0)) s, $bytes bytes passed on"

for v in 9223372036854775807 0 1025 x; do
    OPENBLAS_NUM_THREADS=$v "$G" run --world 2 --no-json >blas.txt 2>&1
    rc=$?
    [ $rc = 2 ] && grep -q "OPENBLAS_NUM_THREADS: expected a number of threads from 1 to 1024, got '$v'" blas.txt ||
        fail "OPENBLAS_NUM_THREADS=$v: exit $rc, expected 2 naming it: $(cat blas.txt)"
done

# Ctrl-C: the terminal sends SIGINT to the launcher's process group. mpirun, in a group of its own, gets
# one SIGINT (from the launcher): every process ends, no report is left, and the words say so once.
mkdir -p tmpc
setsid bash -c 'cd "$1" && TMPDIR=$1/tmpc exec "$0" run --world 2 --probe contrastive --mode on --batch 32 --steps 100000 --seed $2 >ctrlc.txt 2>&1' "$G" "$work" $((base + 20)) &
pid=$!
for i in $(seq 300); do compgen -G "tmpc/gradcheck-dist.*/report" >/dev/null && break; sleep 0.2; done
sleep 0.5
kill -INT -- -$pid
wait $pid
rc=$?
[ $rc = 3 ] || fail "Ctrl-C: exit $rc, expected 3: $(cat ctrlc.txt)"
[ "$(grep -c "cancelled by signal 2 " ctrlc.txt)" = 1 ] || fail "Ctrl-C: 'cancelled by signal 2' must be said once: $(cat ctrlc.txt)"
! grep -Eq "another rank|was killed by signal" ctrlc.txt || fail "Ctrl-C: a guess about a dead rank: $(cat ctrlc.txt)"
for i in $(seq 75); do [ -z "$(left $((base + 20)))" ] && break; sleep 0.2; done
[ -z "$(left $((base + 20)))" ] || fail "Ctrl-C: processes left: $(left $((base + 20)))"
[ -z "$(ls reports 2>/dev/null)" ] || fail "Ctrl-C: a report was left: $(ls reports)"
[ $fails = 0 ] || { echo "$fails failure(s)" >&2; exit 1; }
echo "test_deadlines: ok"
