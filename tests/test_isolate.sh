#!/bin/bash
# tests/isolate.sh, which every ctest runs under, fails a test that leaves a file in its TMPDIR or a process
# running (in its session, or escaped from it with setsid), ends one past its deadline, and removes and
# kills what was left: each case runs the wrapper on a small command and checks its exit, its message,
# and that nothing is left afterwards.
#
#   bash tests/test_isolate.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
fails=0
out=$(mktemp -d "${TMPDIR:-/tmp}/test_isolate.XXXXXX") || exit 3
trap 'rm -rf "$out"' EXIT
base=$out/base   # the wrappers' TMPDIR: each makes its private directory in it, and must remove it
mkdir "$base"

fail() { echo "FAIL $1: $2"; sed 's/^/    /' "$out/err"; fails=$((fails + 1)); }

# case NAME WANT_RC WANT_MESSAGE COMMAND: the wrapper's exit must be WANT_RC, its stderr contain WANT_MESSAGE
# (none when empty), and afterwards nothing of the case may be left: no directory in base, no process
# carrying the case's marker (the marker is an argument of every process a command starts)
case_() {
    local name=$1 want=$2 msg=$3
    shift 3
    TMPDIR=$base TEST_ISOLATE_LIMIT=${LIMIT:-60} bash "$here/isolate.sh" "$@" >"$out/out" 2>"$out/err"
    local rc=$?
    [ "$rc" = "$want" ] || { fail "$name" "exit $rc, expected $want"; return; }
    if [ -n "$msg" ]; then grep -qF -- "$msg" "$out/err" || { fail "$name" "no '$msg' in its stderr"; return; }
    elif [ -s "$out/err" ]; then fail "$name" "said something"; return; fi
    [ -z "$(ls -A "$base")" ] || { fail "$name" "left in TMPDIR: $(ls -A "$base")"; rm -rf "${base:?}"/*; return; }
    local p
    p=$(pgrep -f "marker-$name" || true)
    [ -z "$p" ] || { fail "$name" "processes left: $p"; kill -KILL $p; return; }
    echo "ok   $name"
}

case_ clean 0 "" bash -c 'f=$(mktemp); echo hi > "$f"; rm "$f"; sleep 0.1 & wait'
case_ exit_code_kept 5 "" bash -c 'exit 5'
case_ skip_code_kept 77 "" bash -c 'exit 77'
case_ private_tmpdir 0 "" bash -c '[ "$(stat -c %a "$TMPDIR")" = 1777 ] && [ "$TMPDIR" != "'"$base"'" ] && case "$TMPDIR" in "'"$base"'"/gt.*) ;; *) exit 9;; esac'
case_ left_file 1 "left 1 file(s) in its TMPDIR" bash -c 'touch "$TMPDIR/leftover"'
case_ left_dir 1 "tmp_remote" bash -c 'mkdir "$TMPDIR/tmp_remote" && touch "$TMPDIR/tmp_remote/_remote_module_non_scriptable.py"'
case_ pytest_root_is_not_a_leftover 0 "" bash -c 'mkdir -p "$PYTEST_DEBUG_TEMPROOT/pytest-of-root/pytest-0"'
# a process marked: bash -c 'sleep N; :' marker-NAME (the ';' keeps bash from exec'ing sleep: pgrep finds the marker)
case_ left_process 1 "left 2 process(es) running" bash -c 'bash -c "sleep 300; :" marker-left_process & exit 0'
case_ left_process_fails_a_skip 1 "left 2 process(es) running" bash -c 'bash -c "sleep 300; :" marker-left_process_fails_a_skip & exit 77'
case_ escaped_with_setsid 1 "left 2 process(es) running" bash -c 'setsid bash -c "sleep 300; :" marker-escaped_with_setsid & exit 0'
case_ escaped_with_env_cleared 1 "left 2 process(es) running" bash -c 'env -i /bin/bash -c "sleep 300; :" marker-escaped_with_env_cleared & exit 0'
case_ exits_within_grace 0 "" bash -c 'bash -c "sleep 1; :" marker-exits_within_grace & exit 0'
LIMIT=2 case_ deadline 124 "still running after 2 s" bash -c 'sleep 300; :' marker-deadline
LIMIT=2 case_ deadline_with_children 124 "left 3 process(es) running" bash -c 'bash -c "sleep 300; :" marker-deadline_with_children & sleep 300; :' marker-deadline_with_children

echo "$fails failed"
[ "$fails" = 0 ]
