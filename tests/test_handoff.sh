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
[ $fails = 0 ] && echo "test_handoff: passed"
exit $((fails != 0))
