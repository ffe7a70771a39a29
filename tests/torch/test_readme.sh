#!/usr/bin/env bash
# The README's recipe and pytest example, run as written: each recipe line must exit 0, or the code its
# comment says ("# exit N"); the pytest example must fail for self.all_gather(x) and pass with
# sync_grads=True. usage: test_readme.sh SOURCE_DIR BUILD_DIR
set -u
SRC=$(realpath "$1") BUILD=$(realpath "$2")
passed=0 failed=0
ok() { echo "ok $1"; passed=$((passed + 1)); }
bad() { echo "FAIL $1: $2"; failed=$((failed + 1)); }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
ln -s "$SRC/python" python
ln -s "$BUILD" build
# .venv: the repository's (Debian's torch + gradcheck_dist), with this build's program first on PATH once
# activated, so that the recipe's `gradcheck-dist` is the one under test, not the copy pip put in .venv/bin
mkdir -p .venv/bin
printf '. "%s/.venv/bin/activate"\nPATH="%s:$PATH"\n' "$SRC" "$BUILD" >.venv/bin/activate
block() { sed -n "/^<!-- $1 -->\$/,/^<!-- \/$1 -->\$/p" "$SRC/README.md" | sed '1,2d;$d' | sed '$d'; }

# ---- the recipe, line by line, in one shell (the venv stays activated)
block recipe >recipe.sh
[ -s recipe.sh ] || bad recipe "no recipe block in README.md"
n=0
while IFS= read -r line; do
    n=$((n + 1))
    want=0
    [[ $line =~ \#\ exit\ ([0-9]) ]] && want=${BASH_REMATCH[1]}
    echo "$line" >>run.sh
    echo "rc=\$?; [ \$rc = $want ] || { echo \"recipe line $n exited \$rc, expected $want: $(printf %q "$line")\"; exit 1; }" >>run.sh
done <recipe.sh
if timeout 600 bash run.sh >recipe.out 2>&1; then ok "recipe ($n lines)"; else bad recipe "$(grep -v reducer recipe.out | tail -5)"; fi
grep -q "only 1 of 5 parameters receives a gradient: logit_scale" recipe.out || bad recipe-words "the nograd check does not say what the README says"

# ---- the pytest example
block pytest-example >test_readme_example.py
GRADCHECK_DIST="$BUILD/gradcheck-dist" timeout 900 "$SRC/.venv/bin/python" -m pytest -q -p no:cacheprovider test_readme_example.py >pytest.out 2>&1
rc=$?
if [ $rc = 1 ] && grep -q "1 failed, 1 passed" pytest.out && grep -q "only 1 of 5 parameters receives a gradient: logit_scale" pytest.out; then
    ok "pytest example: clip_default fails naming logit_scale, clip_sync passes"
else
    bad "pytest example" "exit $rc: $(tail -15 pytest.out)"
fi
# a failing check keeps its directory and names it ("kept in DIR", GradcheckFailure), as the README's example
# means to: those named directories are removed here; anything else left in TMPDIR fails the test (isolate.sh)
grep -ho "kept in ${TMPDIR:-/tmp}/gcd-[a-z]*-[A-Za-z0-9_]*" recipe.out pytest.out | sort -u | while read -r _ _ d; do rm -rf -- "$d"; done
echo "$passed passed, $failed failed"
[ $failed = 0 ]
