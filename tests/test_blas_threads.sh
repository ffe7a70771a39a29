#!/usr/bin/env bash
# The launcher shares this machine's cores out as BLAS threads: OPENBLAS_NUM_THREADS = cores / world (at
# least 1), forwarded with -x, each rank bound to that many cores (--map-by slot:PE=N) when N > 1; a
# value the user set is kept. A fake mpirun records its arguments and the variable. The core count
# comes from the OS (lscpu's online CPUs, one per distinct core and socket), never from the program.
# usage: test_blas_threads.sh GRADCHECK_DIST
set -u
G=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
mkdir -p "$work/bin"
cat >"$work/bin/mpirun" <<'SH'
#!/bin/sh
printf '%s\n' "$@" >"$FAKE_ARGV"
echo "$OPENBLAS_NUM_THREADS" >"$FAKE_ARGV.threads"
echo 0 >"$GCD_RESULT_FILE"
SH
chmod +x "$work/bin/mpirun"
launch() {   # WORLD [VAR=VALUE...]: sets args (mpirun's arguments) and threads (the variable it got)
    local world=$1
    shift
    rm -f "$work/argv" "$work/argv.threads"
    env -u OPENBLAS_NUM_THREADS PATH="$work/bin:$PATH" FAKE_ARGV="$work/argv" "$@" "$G" run --world "$world" --probe simplenet --no-json >/dev/null 2>&1 ||
        fail "the launcher with a fake mpirun (world $world $*) failed"
    args=" $(tr '\n' ' ' <"$work/argv" 2>/dev/null) "
    threads=$(cat "$work/argv.threads" 2>/dev/null)
}
cores=$(lscpu -p=Core,Socket 2>/dev/null | grep -v '^#' | sort -u | wc -l)
[ "$cores" -gt 0 ] 2>/dev/null || { echo "FAIL: lscpu -p gave no cores" >&2; exit 1; }
launch 1
[ "$threads" = "$cores" ] || fail "world 1: OPENBLAS_NUM_THREADS must be the $cores physical cores lscpu counts, got '$threads'"
[[ $args == *" -x OPENBLAS_NUM_THREADS "* ]] || fail "world 1: OPENBLAS_NUM_THREADS not forwarded with -x:$args"
if [ "$cores" -gt 1 ] 2>/dev/null; then
    [[ $args == *" --map-by slot:PE=$cores "* ]] || fail "world 1, $cores threads: the rank must be bound to $cores cores:$args"
else
    [[ $args == *" --map-by "* ]] && fail "world 1, one core: no --map-by expected:$args"
fi
launch $((cores + 1))   # more ranks than cores: one thread each, Open MPI's own binding
[ "$threads" = 1 ] || fail "world $((cores + 1)) on $cores cores: OPENBLAS_NUM_THREADS must be 1, got '$threads'"
[[ $args == *" --map-by "* ]] && fail "world $((cores + 1)): one thread a rank needs no --map-by:$args"
launch 1 OPENBLAS_NUM_THREADS=1   # the user's choice is kept
[ "$threads" = 1 ] || fail "a user's OPENBLAS_NUM_THREADS=1 must be kept, got '$threads'"
[[ $args == *" --map-by "* ]] && fail "a user's OPENBLAS_NUM_THREADS=1 needs no --map-by:$args"
[ $fails = 0 ] && echo "test_blas_threads: passed (world 1: $cores threads)"
exit $((fails != 0))
