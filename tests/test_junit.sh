#!/usr/bin/env bash
# JUnit for CI: `run --junit` and `check --junit` write the file directly (also with --no-json), whole or
# not at all, and every file is the shape CI tools read (tests/check_junit.py: counts and times on every
# suite, tests = failures + errors + skipped + passed): a clean run, controls that showed their defect
# (passing, the finding in <system-out>), findings under test (failures), a control that did not show
# its signature (failure), runtime errors (<error>), check reports; bad paths exit 2 naming --junit.
# usage: test_junit.sh GRADCHECK_DIST SOURCE_DIR PYTHON [FAULT_LIB]
set -u
G=$1 SRC=$2 PY=${3:-/usr/bin/python3} FAULT=${4:-}
CJ="$SRC/tests/check_junit.py"
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1

# ---- a clean run: 8 testcases, the 6 controls pass with what they showed in <system-out>
"$G" run --world 2 --json run.json --junit run.xml >run.txt 2>&1
rc=$?
[ $rc = 0 ] || fail "run --world 2 --junit exited $rc: $(tail -5 run.txt)"
grep -qx "junit: run.xml" run.txt || fail "run did not print the JUnit file's path"
"$PY" "$CJ" run.xml tests=12 failures=0 errors=0 skipped=0 passed=12 || fail "run.xml: not the JUnit expected for a clean run"
"$PY" - run.xml run.json <<'PY' || fail "run.xml: the controls' testcases or times are not as expected"
import json, sys, xml.etree.ElementTree as E
cases = E.parse(sys.argv[1]).getroot().findall(".//testcase")
runs = json.load(open(sys.argv[2]))["runs"]
controls = [c for c in cases if c.get("name").endswith("(control)")]
assert len(controls) == 9, [c.get("name") for c in cases]
for c in controls:
    out = c.find("system-out").text
    assert "shows exactly its known defect" in out and ("\nnone: " in out or "\nscaled: " in out or "\ndisagree: " in out), out
assert all(r["seconds"] > 0 for r in runs), [r["seconds"] for r in runs]
assert [float(c.get("time")) for c in cases] == [round(r["seconds"], 6) for r in runs], "testcase times are not the runs' seconds"
PY
"$G" report run.json --format junit | cmp -s - run.xml || fail "run --junit differs from report --format junit of its JSON"
# an older report without per-run seconds still renders valid JUnit (times 0)
"$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); [r.pop("seconds") for r in d["runs"]]; json.dump(d,open(sys.argv[2],"w"))' run.json old.json
"$G" report old.json --format junit >old.xml && "$PY" "$CJ" old.xml tests=12 passed=12 || fail "a report without seconds: bad JUnit"

# ---- a control that did not show its signature is a failure, on that control's testcase
"$PY" - run.json nosig.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
e = next(e for e in d["expectations"] if e["role"] == "control" and e["mode"] == "avg")
e["met"], e["message"] = False, "simplenet mode avg (control): did not show its known defect at world 2"
d["result"], d["exit_code"] = "fail", 1
json.dump(d, open(sys.argv[2], "w"))
PY
"$G" report nosig.json --format junit >nosig.xml || fail "report --format junit of nosig.json failed"
"$PY" "$CJ" nosig.xml tests=12 failures=1 errors=0 passed=11 || fail "nosig.xml: a control without its signature must be the one failure"
"$PY" -c '
import sys, xml.etree.ElementTree as E
c = [c for c in E.parse(sys.argv[1]).getroot().iter("testcase") if c.find("failure") is not None]
assert [(x.get("classname"), x.get("name")) for x in c] == [("gradcheck-dist.simplenet", "mode avg (control)")], c
assert "did not show its known defect" in c[0].find("failure").get("message")' nosig.xml || fail "nosig.xml: the failure is not on simplenet's avg control"

# ---- findings under test (--mode off,on: every mode under test), JUnit only (--no-json)
"$G" run --world 2 --mode off,on --no-json --junit off.xml >off.txt 2>&1
rc=$?
[ $rc = 1 ] || fail "--mode off,on --no-json --junit exited $rc, expected 1"
[ ! -e reports ] || fail "--no-json --junit wrote a JSON report: $(ls reports)"
"$PY" "$CJ" off.xml tests=6 failures=3 errors=0 passed=3 || fail "off.xml: mode off must fail in every probe"
"$PY" -c '
import sys, xml.etree.ElementTree as E
f = [(c.get("classname"), c.get("name"), c.find("failure").text) for c in E.parse(sys.argv[1]).getroot().iter("testcase") if c.find("failure") is not None]
assert [x[:2] for x in f] == [("gradcheck-dist.simplenet", "mode off (test)"), ("gradcheck-dist.contrastive", "mode off (test)"),
                         ("gradcheck-dist.tp", "mode off (test)")], f
assert "fc1.weight and fc1.bias receive no gradient" in f[0][2] and "logit_scale" in f[1][2] and "norm.weight" in f[2][2], f' off.xml || fail "off.xml: the failures do not name the findings"

# ---- runtime errors: an <error> testcase, and the JSON and the JUnit say the same
if [ -n "$FAULT" ]; then
    LD_PRELOAD=$FAULT GCD_FAULT_ALLGATHER=7 GCD_FAULT_RANK=0 "$G" run --world 2 --json err.json --junit err.xml >/dev/null 2>err.txt
    rc=$?
    [ $rc = 3 ] || fail "an MPI failure with --junit exited $rc, expected 3"
    grep -q "JUnit written to err.xml" err.txt || fail "the fatal path does not say it wrote the JUnit file: $(cat err.txt)"
    "$PY" "$CJ" err.xml errors=1 || fail "err.xml: an MPI failure must be one <error>"
    "$PY" - err.xml err.json <<'PY' || fail "err.xml: the error does not name the failed call, or it disagrees with err.json"
import json, sys, xml.etree.ElementTree as E
root, d = E.parse(sys.argv[1]).getroot(), json.load(open(sys.argv[2]))
e = root.find(".//error")
assert "MPI_Allgather" in e.get("message") and d["error"]["message"] in e.get("message"), (e.get("message"), d["error"])
assert int(root.get("tests")) == len(d["runs"]) + 1, (root.get("tests"), len(d["runs"]))
PY
else
    fail "no FAULT_LIB given: the MPI failure case did not run"
fi
# the JSON cannot be written: exit 3, and the JUnit says why
"$G" run --world 2 --probe simplenet --mode on --json /dev/full --junit full.xml >/dev/null 2>&1
rc=$?
[ $rc = 3 ] || fail "--json /dev/full --junit exited $rc, expected 3"
"$PY" "$CJ" full.xml tests=2 errors=1 passed=1 || fail "full.xml: a failed JSON write must be an <error>"
grep -q 'message="rank 0: report: cannot write /dev/full' full.xml || fail "full.xml: the error must name /dev/full: $(grep '<error' full.xml)"
# the JUnit cannot be written: exit 3, the flag named, and the JSON (written first) rewritten to say so
"$G" run --world 2 --probe simplenet --mode on --json j.json --junit /dev/full >jfull.txt 2>&1
rc=$?
[ $rc = 3 ] || fail "--junit /dev/full exited $rc, expected 3"
grep -q "^gradcheck-dist: --junit: cannot write /dev/full" jfull.txt || fail "--junit /dev/full: the message must name the flag: $(cat jfull.txt)"
grep -q "^result: error (exit 3)$" jfull.txt || fail "--junit /dev/full: the text must say exit 3"
"$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["exit_code"] == 3 and "--junit" in d["error"]["message"], d["error"]' j.json ||
    fail "--junit /dev/full: the JSON must say the run ended in error"
"$G" run --world 2 --probe simplenet --mode on --no-json --junit /dev/null >/dev/null 2>&1 || fail "--junit /dev/null failed"
[ -c /dev/null ] || fail "/dev/null is no longer a character device"
# stdout: the XML alone, the table on stderr
"$G" run --world 2 --probe simplenet --mode on --no-json --junit - >stdout.xml 2>stderr.txt || fail "--junit - failed"
"$PY" "$CJ" stdout.xml tests=1 passed=1 || fail "--junit -: stdout is not the JUnit file"
grep -q "^result: pass" stderr.txt || fail "--junit -: the table is not on stderr"

# ---- bad paths: exit 2 before any rank starts, one line naming --junit; nothing written
usage_error() {   # ARGS...
    local out rc
    out=$("$G" "$@" 2>&1) && rc=0 || rc=$?
    [ "$rc" = 2 ] || fail "'$*' exited $rc, expected 2: $out"
    grep -q -- "--junit" <<<"$out" || fail "'$*': the message does not name --junit: $out"
    [ "$(wc -l <<<"$out")" = 1 ] || fail "'$*': expected one line, got: $out"
}
mkdir d
usage_error run --junit "$work/no-such-dir/x.xml"   # a path this test knows is absent (never /nonexistent: a machine may have one)
usage_error run --junit d
usage_error run --junit
usage_error run --json same.xml --junit same.xml
usage_error run --json - --junit -
usage_error check d --junit "$work/no-such-dir/x.xml"
usage_error check d --no-json --junit d
[ ! -e reports ] && [ ! -e same.xml ] || fail "a usage error left files: $(ls)"

# ---- check: one testcase; passing dumps pass, a None gradient fails, also with --no-json
"$PY" - "$SRC/tests" <<'PY'
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import st_writer as w
import os
a, b = np.arange(6, dtype=np.float32).reshape(2, 3) + 1, np.ones(3, np.float32)
os.makedirs("clean"), os.makedirs("none")
w.write_world("clean", [{"a": a, "b": b}] * 2)
w.write_world("none", [{"a": a, "b": None}] * 2)
PY
"$G" check clean --json clean.json --junit clean.xml >clean.txt 2>&1
rc=$?
[ $rc = 0 ] || fail "check clean --junit exited $rc: $(cat clean.txt)"
"$PY" "$CJ" clean.xml tests=1 failures=0 errors=0 passed=1 || fail "clean.xml: a clean check must be one passing testcase"
grep -q '<testcase classname="gradcheck-dist.check" name="stage reduced (test)" time="' clean.xml || fail "clean.xml: $(grep '<testcase' clean.xml)"
"$G" report clean.json --format junit | cmp -s - clean.xml || fail "check --junit differs from report --format junit of its JSON"
"$G" check none --no-json --junit none.xml >none.txt 2>&1
rc=$?
[ $rc = 1 ] || fail "check of a None gradient with --junit exited $rc, expected 1"
"$PY" "$CJ" none.xml tests=1 failures=1 || fail "none.xml: a None gradient must be a failure"
grep -q "none: " none.xml || fail "none.xml: the failure does not list the finding"

# ---- one file, two flags: never the JUnit over the JSON (however the path is spelled, hard links too)
"$G" run --world 1 --probe simplenet --json same.json --junit ./same.json >same.txt 2>&1
rc=$?
[ $rc = 2 ] && [ ! -e same.json ] && grep -q -- "--junit: './same.json' is also the --json path" same.txt ||
    fail "--junit ./X with --json X: exit $rc, expected 2 naming --junit: $(cat same.txt)"
: >linked.json && ln linked.json linked.xml
"$G" run --world 1 --probe simplenet --json linked.json --junit linked.xml >/dev/null 2>&1
[ $? = 2 ] && [ ! -s linked.json ] || fail "--junit a hard link to the --json file must be refused"
# ---- --json - and a JUnit write that fails: stdout holds one JSON document, the one saying why
"$G" run --world 2 --probe simplenet --mode on --json - --junit /dev/full >one.json 2>one.txt
rc=$?
[ $rc = 3 ] || fail "--json - --junit /dev/full exited $rc, expected 3"
"$PY" -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["result"] == "error" and "/dev/full" in d["error"]["message"], d["error"]' one.json 2>/dev/null ||
    fail "--json - --junit /dev/full: stdout must be one JSON document naming /dev/full: $(grep -c '"schema"' one.json) documents"

echo "test_junit: $fails failure(s)"
[ $fails = 0 ]
