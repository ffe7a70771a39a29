#!/usr/bin/env bash
# usage: run.sh SOURCE_DIR GRADCHECK_DIST TEST   (one zoo test, ctest label torch2)
# Runs tests/zoo/test_zoo.py::TEST in .venv-torch2 (made by .ci/torch2). Without that venv it FAILS, and a
# skipped, xfailed or deselected test fails too: it passes only by passing (--runxfail: a pending case fails).
set -uo pipefail
src=$1 bin=$2 test=$3
py=$src/.venv-torch2/bin/python
if [ ! -x "$py" ]; then
    echo "FAIL: $src/.venv-torch2 is missing: run 'bash .ci/torch2' (CI does), or link a venv holding its pins there" >&2
    exit 1
fi
cd "$src" || exit 1
out=$(mktemp)
trap 'rm -f "$out"' EXIT
GRADCHECK_DIST=$bin PYTHONDONTWRITEBYTECODE=1 "$py" -m pytest -q -p no:cacheprovider --runxfail -rsx \
    "tests/zoo/test_zoo.py::$test" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
[ "$rc" = 0 ] || exit "$rc"
tail -n 1 "$out" | grep -Eq '^[0-9]+ passed' && ! tail -n 1 "$out" | grep -Eq 'skipped|xfail|xpass|deselected|error' || {
    echo "FAIL: $test did not simply pass (see pytest's last line)" >&2
    exit 1
}
