#!/usr/bin/env bash
# Every MPI call a rank makes has the deadline (--timeout): a rank stopped (SIGSTOP, by the fault shim)
# as it enters MPI_Init, the final MPI_Bcast or MPI_Finalize ends the job with exit 3 in about the
# timeout, naming the call, and leaves no process behind. Before: the last two hung past any timeout.
# usage: test_deadlines.sh GRADCHECK_DIST FAULT_SHIM
G=$1 FAULT=$2
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
work=$(mktemp -d)
cd "$work" || exit 1
trap 'pkill -KILL -f -- "--seed 77000[0-9]" 2>/dev/null; rm -rf "$work"' EXIT
left() { pgrep -f -- "--seed $1" || true; }
for call in Init Bcast Finalize; do
    seed=$((770000 + ${#call}))
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
[ $fails = 0 ] || { echo "$fails failure(s)" >&2; exit 1; }
echo "test_deadlines: ok"
