#!/usr/bin/env bash
# usage: run.sh SOURCE_DIR GRADCHECK_DIST TEST   (one zoo test, ctest label torch2; TEST with a / : that file)
#        run.sh SOURCE_DIR GRADCHECK_DIST --listed TEST...   (fails unless TEST... are test_zoo.py's cases)
# Runs tests/zoo/test_zoo.py::TEST in .venv-torch2 (made by .ci/torch2). Without that venv it FAILS, and a
# skipped, xfailed or deselected test fails too: it passes only by passing.
set -uo pipefail
src=$1 bin=$2 test=$3
py=$src/.venv-torch2/bin/python
if [ ! -x "$py" ]; then
    echo "FAIL: $src/.venv-torch2 is missing: run 'bash .ci/torch2' (CI does), or link a venv holding its pins there" >&2
    exit 1
fi
cd "$src" || exit 1
if [ "$test" = --listed ]; then   # run.sh SRC BIN --listed NAME...: ctest's list is every case of test_zoo.py
    shift 3
    want=$("$py" -m pytest -q -p no:cacheprovider --collect-only tests/zoo/test_zoo.py 2>&1 | sed -n 's/^tests\/zoo\/test_zoo.py:://p')
    [ -n "$want" ] || { echo "FAIL: pytest collected no zoo case" >&2; exit 1; }
    diff <(printf '%s\n' "$want") <(printf '%s\n' "$@") >&2 || {
        echo "FAIL: tests/CMakeLists.txt's GCD_ZOO_TESTS (right) differs from test_zoo.py's cases (left)" >&2
        exit 1
    }
    echo "ok: $# zoo cases, each its own ctest"
    exit 0
fi
out=$(mktemp)
tmp=$(mktemp -d)   # the test's private TMPDIR: what it keeps (a failing check's workdir, torch's own) goes with it (issue 33)
trap 'rm -f "$out"; rm -rf "$tmp"' EXIT
case $test in */*) target=$test ;; *) target=tests/zoo/test_zoo.py::$test ;; esac   # or a file of the torch2 tier
TMPDIR=$tmp GRADCHECK_DIST=$bin PYTHONDONTWRITEBYTECODE=1 "$py" -m pytest -q -p no:cacheprovider --runxfail -rsx \
    "$target" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
[ "$rc" = 0 ] || exit "$rc"
tail -n 1 "$out" | grep -Eq '^[0-9]+ passed' && ! tail -n 1 "$out" | grep -Eq 'skipped|xfail|xpass|deselected|error' || {
    echo "FAIL: $test did not simply pass (see pytest's last line)" >&2
    exit 1
}
