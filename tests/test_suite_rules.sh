#!/usr/bin/env bash
# The suite's own rules (issue 33), checked on this build's test list and on the test sources:
# - the README's quick set (ctest -LE slow) passes after .ci/setup alone: none of it needs .venv-torch2
#   (label torch2) or PyPI's install run (label install);
# - a test never assumes a path is absent: no test names /nonexistent (which may exist on a machine);
#   it names an absent path inside its own temporary directory;
# - every test runs under tests/isolate.sh (nothing left behind): each command ctest runs starts with it.
# usage: test_suite_rules.sh SOURCE_DIR BUILD_DIR
set -u
SRC=$1 BUILD=$2
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

quick=$(ctest --test-dir "$BUILD" -N -LE slow | sed -n 's/^ *Test *#[0-9]*: //p')
[ -n "$quick" ] || fail "ctest -N -LE slow listed no test"
for label in torch2 install; do
    both=$(ctest --test-dir "$BUILD" -N -LE slow -L "$label" | sed -n 's/^ *Test *#[0-9]*: //p')
    [ -z "$both" ] || fail "in the quick set (-LE slow) but labelled $label (needs more than .ci/setup): $(echo $both)"
done

named=$(grep -rnI --exclude=test_suite_rules.sh -- '/nonexistent' "$SRC/tests" | sed -E 's,(^|[[:space:]:])(#|//).*$,,' |
        grep -- '/nonexistent' | cut -d: -f1,2)   # comments aside
[ -z "$named" ] || fail "tests naming /nonexistent (a path that may exist): $(echo $named)"

unwrapped=$(grep -h '^add_test(' "$BUILD"/tests/CTestTestfile.cmake | grep -v '"bash" "[^"]*/tests/isolate.sh"')
[ -z "$unwrapped" ] || fail "tests not run under tests/isolate.sh: $(echo "$unwrapped" | cut -c1-200)"

echo "$(echo "$quick" | wc -l) tests in the quick set; $fails failed"
[ $fails = 0 ]
