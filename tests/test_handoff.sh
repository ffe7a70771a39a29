#!/usr/bin/env bash
# The launcher's exit code: rank 0 hands its verdict over in a file, and mpirun's own exit status still
# counts after it (a rank that fails after the hand-off is exit 3, never the verdict alone). A fake
# mpirun writes the verdict (or nothing) and exits as told.
# usage: test_handoff.sh GRADCHECK_DIST
set -u
G=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
mkdir -p "$work/bin"
cat >"$work/bin/mpirun" <<'SH'
#!/bin/sh
[ -n "$FAKE_VERDICT" ] && echo "$FAKE_VERDICT" >"$GCD_RESULT_FILE"
if [ -n "${FAKE_HANG:-}" ]; then   # the verdict given, mpirun never exits by itself: only the launcher's SIGTERM ends it
    trap 'exit 0' TERM
    while :; do sleep 0.2; done
fi
exit "$FAKE_STATUS"
SH
chmod +x "$work/bin/mpirun"
# VERDICT (empty: none handed over) MPIRUN_STATUS EXPECTED_EXIT [WORDS]
expect() {
    PATH="$work/bin:$PATH" FAKE_VERDICT=$1 FAKE_STATUS=$2 "$G" run --world 2 --probe simplenet --no-json >"$work/out" 2>&1
    local rc=$?
    [ $rc = "$3" ] || fail "verdict '$1', mpirun exit $2: exit $rc, expected $3: $(tail -3 "$work/out")"
    [ -z "${4:-}" ] || grep -q -- "$4" "$work/out" || fail "verdict '$1', mpirun exit $2: no '$4' in: $(tail -3 "$work/out")"
}
expect 0 0 0
expect 1 0 1
expect 0 1 3 "rank 0 gave exit 0, but the MPI job then failed (mpirun exited with 1)"
expect 1 2 3 "rank 0 gave exit 1, but the MPI job then failed (mpirun exited with 2)"
expect "" 0 3 "the MPI job ended before rank 0 gave its verdict"
# the exit deadline (docs/launcher.md): mpirun still running --timeout + 30 s after rank 0's verdict is
# ended (SIGTERM, SIGKILL 10 s later) and the run is exit 3 saying so; ignored, the launcher waits forever
t0=$(date +%s)
PATH="$work/bin:$PATH" FAKE_VERDICT=0 FAKE_STATUS=0 FAKE_HANG=1 timeout -s KILL 75 "$G" run --world 2 --probe simplenet --no-json --timeout 1 >"$work/out" 2>&1
rc=$? took=$(( $(date +%s) - t0 ))
echo "exit deadline: exit $rc after $took s"
[ $rc = 3 ] && [ $took -le 50 ] || fail "mpirun hanging after the verdict (--timeout 1): exit $rc after $took s, expected exit 3 within 31-45 s: $(tail -3 "$work/out")"
grep -q "had not exited 31 s after rank 0 gave its verdict" "$work/out" || fail "the exit deadline's words missing: $(tail -3 "$work/out")"
left=$(pgrep -f "$work/bin/mpirun")
[ -z "$left" ] || { fail "the fake mpirun outlived the launcher: pids $left"; kill -KILL $left; }
[ $fails = 0 ] && echo "test_handoff: passed"
exit $((fails != 0))
