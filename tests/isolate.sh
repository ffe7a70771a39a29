#!/bin/bash
# Every ctest runs under this (tests/CMakeLists.txt's gcd_test): nothing a test makes outlives it.
#
#   bash tests/isolate.sh COMMAND [ARG...]
#
# The test gets a private TMPDIR (tempfile's, mktemp's, torch's; pytest's tmp_path root apart, in
# PYTEST_DEBUG_TEMPROOT, which pytest keeps by design and this removes), runs in a session of its own
# (setsid) with every process it starts carrying a tag in its environment, and is ended after
# TEST_ISOLATE_LIMIT seconds (default 1500; gcd_test sets it under the test's ctest TIMEOUT). After it
# ends, a file left in its TMPDIR or a process left in its session or carrying its tag (3 s grace to
# exit) FAILS it: each is printed, the processes killed by pid, the directory removed. Exit: the test's
# own code, 124 on the deadline, or 1 for what it left behind.
set -u
[ $# -ge 1 ] || { echo "usage: isolate.sh COMMAND [ARG...]" >&2; exit 2; }
limit=${TEST_ISOLATE_LIMIT:-1500}
# short names: a socket a test makes in its TMPDIR (multiprocessing's forkserver, Open MPI's) has 107 bytes
base=${TMPDIR:-/tmp}
tmp=$(mktemp -d "$base/gt.XXXXXX") && meta=$(mktemp -d "$base/gm.XXXXXX") ||
    { echo "isolate: cannot make private directories in $base" >&2; rm -rf "${tmp:-}"; exit 3; }
# the test's TMPDIR as /tmp is (test_hostile plants links as nobody there); meta: the sid, pytest's root
chmod 1777 "$tmp" && chmod 711 "$meta" || exit 3
tag=gcd-isolate-$$-$SRANDOM
caught=0
trap 'caught=1' INT TERM HUP

# the session leader writes its pid (= the session id) before it becomes the test; the tag outlives a setsid
TMPDIR=$tmp PYTEST_DEBUG_TEMPROOT=$meta TEST_ISOLATE="${TEST_ISOLATE:-}:$tag" \
    timeout -k 10 "$limit" setsid bash -c 'echo $$ > "$0" && exec "$@"' "$meta/sid" "$@" &
runner=$!
wait "$runner"
rc=$?
[ "$caught" = 1 ] && { rc=130; kill -TERM "$runner" 2>/dev/null; wait "$runner"; }
[ "$rc" = 124 ] && echo "isolate: the test was still running after $limit s: ended (TERM, KILL 10 s later)" >&2
sid=$(cat "$meta/sid" 2>/dev/null)

# its processes: in its session, or carrying its tag (a daemon that left the session keeps its environment);
# not a zombie (dead, its parent's to reap: that parent is counted if it is the test's)
left() {
    { [ -n "$sid" ] && ps -e -o pid=,sid=,stat= | awk -v s="$sid" '$2 == s && $3 !~ /^Z/ { print $1 }'
      grep -lzF -- "$tag" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3; } | sort -un
}
pids=$(left)
for _ in $(seq 30); do [ -z "$pids" ] && break; sleep 0.1; pids=$(left); done
if [ -n "$pids" ]; then
    echo "isolate: the test left $(echo $pids | wc -w) process(es) running (killed now, by pid):" >&2
    ps -o pid,ppid,sid,stat,etime,args -p "$(echo $pids | tr ' ' ,)" >&2
    for p in $pids; do kill -KILL "$p" 2>/dev/null; done
    [ "$rc" = 0 ] || [ "$rc" = 77 ] && rc=1
fi

files=$(find "$tmp" -mindepth 1 -maxdepth 3 2>/dev/null)
if [ -n "$files" ]; then
    echo "isolate: the test left $(find "$tmp" -mindepth 1 | wc -l) file(s) in its TMPDIR (removed now):" >&2
    echo "$files" | sed "s|^$tmp/||" | head -40 >&2
    [ "$rc" = 0 ] || [ "$rc" = 77 ] && rc=1
fi
rm -rf "$tmp" "$meta" || { echo "isolate: cannot remove $tmp or $meta" >&2; [ "$rc" = 0 ] && rc=1; }
exit "$rc"
