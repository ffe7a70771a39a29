#!/usr/bin/env bash
# The launcher's two races (issue 33), each made to happen on demand with a fake mpirun:
#
# 1. nested_signal: a second signal must not run the handler inside the first (signals++ is a read and a
#    write: a nested handler between them loses a count, and the second Ctrl-C never becomes SIGKILL).
#    The first handler is held inside itself: the file it creates ("interrupted", in the launcher's
#    private directory) is made a FIFO first, so its open() waits for a reader. A SIGTERM sent then
#    must stay pending (blocked by the handler's mask), not be delivered. Released, the two signals
#    must both count: the fake mpirun ignores INT and TERM, so only the second one's SIGKILL ends it.
# 2. stale_pgid (root: a PID namespace of its own): once mpirun is reaped its process-group id may be
#    another's. The fake mpirun exits at once, leaving a helper (its own session) that holds the
#    launcher's stderr pipe open; after the launcher reaps mpirun, an impostor is started with mpirun's
#    pid as its own session and group (ns_last_pid). Then what used to signal mpirun's group: a flood
#    past 1 MiB before any rank started (the job is ended: SIGTERM) and two SIGINTs (SIGKILL) must
#    leave the impostor untouched.
# usage: test_races.sh GRADCHECK_DIST PYTHON3
set -u
if [ "${1:-}" = --stale-pgid-inside ]; then   # run by case 2 as pid 1 of a new PID namespace
    shift
    inside=1
fi
G=$1 PY=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
wait_for() {   # SECONDS COMMAND...: poll until the command succeeds
    local end=$((SECONDS + $1))
    shift
    until "$@"; do [ $SECONDS -lt $end ] || return 1; sleep 0.05; done
}
mask() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status" 2>/dev/null; }   # PID FIELD: hex
has_sig() { local m; m=$(mask "$1" "$2"); [ -n "$m" ] && (( 0x$m & (1 << ($3 - 1)) )); }   # PID FIELD SIGNO
gone() { [ ! -e "/proc/$1" ]; }
past_1mib() { [ "$(stat -c %s "$1")" -ge 1048576 ]; }
mkdir "$work/bin"

stale_pgid() {
    cat >"$work/bin/mpirun" <<'SH'
#!/bin/sh
echo $$ >"$FAKE_PIDFILE"
setsid "$FAKE_PY" "$FAKE_HOLDER" &   # its own session, holding our stderr (the launcher's pipe)
exit 0
SH
    cat >"$work/holder.py" <<'PY'
import os, time
while not os.path.exists(os.environ["FAKE_GO"]):   # quiet: the launcher reaps mpirun meanwhile
    time.sleep(0.05)
for _ in range(1100):                               # past 1 MiB before any rank started
    os.write(2, b"x" * 1023 + b"\n")
open(os.environ["FAKE_GO"] + ".flooded", "w").close()   # all but the pipe's last 64 KiB read by the launcher
while not os.path.exists(os.environ["FAKE_STOP"]):  # then a trickle: the launcher keeps reading
    os.write(2, b".")
    time.sleep(0.05)
PY
    cat >"$work/impostor.py" <<'PY'
import signal, sys, time
def note(sig, _):
    with open(sys.argv[1], "a") as f:
        f.write(f"{sig}\n")
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, note)
open(sys.argv[2], "w").close()
end = time.time() + 120
while time.time() < end:
    time.sleep(0.1)
PY
    chmod +x "$work/bin/mpirun"
    mkdir "$work/tmp"
    PATH="$work/bin:$PATH" TMPDIR=$work/tmp FAKE_PIDFILE=$work/mpirun.pid FAKE_PY=$PY FAKE_HOLDER=$work/holder.py \
        FAKE_GO=$work/go FAKE_STOP=$work/stop "$G" run --world 2 --probe simplenet --no-json >"$work/out" 2>&1 &
    local L=$! mpid imp=
    wait_for 20 test -s "$work/mpirun.pid" || { fail "stale_pgid: the fake mpirun did not start: $(tail -3 "$work/out")"; kill -KILL $L; return; }
    mpid=$(cat "$work/mpirun.pid")
    wait_for 20 gone "$mpid" || fail "stale_pgid: mpirun (pid $mpid) was not reaped"
    for _ in 1 2 3 4 5; do   # the impostor: mpirun's pid, as its own session and process group
        echo $((mpid - 1)) >/proc/sys/kernel/ns_last_pid
        setsid "$PY" "$work/impostor.py" "$work/impostor.log" "$work/impostor.ready" &
        imp=$!
        [ "$imp" = "$mpid" ] && break
        kill -KILL "$imp"; wait "$imp" 2>/dev/null; imp=
    done
    if [ -z "$imp" ]; then
        fail "stale_pgid: no process could be given pid $mpid"
    else
        wait_for 20 test -e "$work/impostor.ready" || fail "stale_pgid: the impostor did not start"
        touch "$work/go"
        wait_for 30 past_1mib "$work/out" && wait_for 30 test -e "$work/go.flooded" ||
            fail "stale_pgid: the flood never reached the launcher ($(stat -c %s "$work/out") bytes of its stderr)"
        sleep 1   # the launcher reads on past its 1 MiB: the job is ended there (what once signalled the group)
        [ ! -s "$work/impostor.log" ] || fail "stale_pgid: a flood after mpirun was reaped signalled its group id, now another's: the impostor got signal $(cat "$work/impostor.log")"
        kill -INT $L; sleep 0.2; kill -INT $L; sleep 1
        gone "$imp" && fail "stale_pgid: two SIGINTs after mpirun was reaped killed its group id, now another's (the impostor, pid $imp)"
        [ ! -s "$work/impostor.log" ] || fail "stale_pgid: the impostor got signal(s) $(tr '\n' ' ' <"$work/impostor.log")after two SIGINTs"
    fi
    touch "$work/stop"
    timeout 20 tail --pid=$L -f /dev/null || { fail "stale_pgid: the launcher did not exit after its stderr closed"; kill -KILL $L; }
    [ -n "$imp" ] && { kill -KILL "$imp"; wait "$imp"; } 2>/dev/null
    wait
}

if [ -n "${inside:-}" ]; then
    stale_pgid
    exit $((fails != 0))
fi

# ---- 1. nested_signal
cat >"$work/bin/mpirun" <<'SH'
#!/bin/sh
echo $$ >"$FAKE_PIDFILE"
trap '' INT TERM HUP   # only the launcher's SIGKILL (a second signal) ends it
while :; do sleep 0.2; done
SH
chmod +x "$work/bin/mpirun"
mkdir "$work/tA"
PATH="$work/bin:$PATH" TMPDIR=$work/tA FAKE_PIDFILE=$work/A.pid "$G" run --world 2 --probe simplenet --no-json >"$work/A.out" 2>&1 &
L=$!
if wait_for 20 test -s "$work/A.pid"; then
    mpid=$(cat "$work/A.pid")
    dir=$(echo "$work"/tA/gradcheck-dist.*)
    mkfifo "$dir/interrupted" || fail "nested_signal: no FIFO in the launcher's directory ($dir)"
    kill -INT $L
    if ! wait_for 10 has_sig $L SigBlk 2; then
        fail "nested_signal: the launcher never stayed in its SIGINT handler (its open of $dir/interrupted did not wait for a reader?)"
    else
        kill -TERM $L
        sleep 0.5
        has_sig $L ShdPnd 15 || has_sig $L SigPnd 15 ||
            fail "nested_signal: a SIGTERM sent while the SIGINT handler ran was delivered inside it (SigBlk $(mask $L SigBlk)), not held until it returned: signals++ can lose a count"
    fi
    exec 8<>"$dir/interrupted"   # a reader: the handler(s) go on
    t0=$SECONDS
    timeout 8 tail --pid=$L -f /dev/null || fail "nested_signal: two signals did not end the job within 8 s (the second was not counted: no SIGKILL)"
    exec 8<&-
    wait $L
    rc=$?
    [ $rc = 3 ] && grep -q "cancelled by signal 2" "$work/A.out" || fail "nested_signal: exit $rc: $(tail -3 "$work/A.out")"
    gone "$mpid" || { fail "nested_signal: the fake mpirun (pid $mpid) outlived the launcher"; kill -KILL "$mpid"; }
    [ -z "$(ls -A "$work/tA")" ] || fail "nested_signal: the launcher left $(ls -A "$work/tA") in its TMPDIR"
    echo "nested_signal: ended $((SECONDS - t0)) s after the handler was released"
else
    fail "nested_signal: the fake mpirun did not start: $(tail -3 "$work/A.out")"
fi
kill -KILL $L 2>/dev/null

# ---- 2. stale_pgid, as root in a PID namespace of its own (its pids are ours to choose)
if [ "$(id -u)" != 0 ]; then
    echo "test_races: stale_pgid needs root (a PID namespace and ns_last_pid): not run" >&2
    exit 77
fi
unshare --pid --fork --mount-proc bash "$0" --stale-pgid-inside "$G" "$PY" || fail "stale_pgid (above)"
[ $fails = 0 ] && echo "test_races: passed"
exit $((fails != 0))
