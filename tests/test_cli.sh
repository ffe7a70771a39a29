#!/usr/bin/env bash
# The command line end to end: usage errors (exit 2, the flag named, before any rank starts), the exit
# status of run, the reports it leaves and their renderings. A few launches, many checks each.
# usage: test_cli.sh GRADCHECK_DIST SOURCE_DIR PYTHON FAULT_LIB
set -u
G=$1 SRC=$2 PY=${3:-/usr/bin/python3} FAULT=${4:-}
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
export COLUMNS=200   # the tables whole (check_report.py reads every cell's norm); the widths are tested below

# ---- usage errors
usage_error() {   # FLAG ARGS...: exit 2 and one line naming FLAG
    local flag=$1 out rc
    shift
    out=$("$G" "$@" 2>&1) && rc=0 || rc=$?
    [ "$rc" = 2 ] || fail "'$*' exited $rc, expected 2: $out"
    grep -q -- "$flag" <<<"$out" || fail "'$*': the message does not name $flag: $out"
    [ "$(wc -l <<<"$out")" = 1 ] || fail "'$*': expected one line, got: $out"
}
usage_error --world run --world 0
usage_error --world run --world four
usage_error --world run --world
usage_error --world run --world=
usage_error --probe run --probe resnet
usage_error --mode run --mode sideways
usage_error --mode run --mode on,on
usage_error --inputs run --inputs some
usage_error --seed run --seed -1
usage_error --steps run --steps x
usage_error --seed run --seed 9007199254740992
usage_error --json run --json --summary-only
usage_error --inputs run --probe contrastive --inputs random
usage_error --world run --world 1025
usage_error --batch run --probe contrastive --batch 1048576 --dim-img 1048576
usage_error --steps run --steps 1000000
usage_error --lr run --lr 0
usage_error --batch run --batch 0
usage_error --hostfile run --hostfile "$work/no-such-dir/hosts"   # absent: made by no one but this test
usage_error --backend run --backend gloo
usage_error --local-loss run --probe simplenet --local-loss
usage_error --no-json run --no-json --json x.json
usage_error --bogus run --bogus
usage_error --no-json run --no-json=1
usage_error frobnicate frobnicate
usage_error --format report x.json --format pdf
usage_error FILE report
"$G" >/dev/null 2>&1; [ $? = 2 ] || fail "no command must exit 2"
[ ! -e reports ] || fail "a usage error created reports/"
"$G" --help | grep -q "exit status" || fail "--help does not document the exit status"
"$G" run --help | grep -q -- "--mode" || fail "run --help does not list --mode"
"$G" --version | grep -Eq "^gradcheck-dist [0-9]+\.[0-9]+\.[0-9]+$" || fail "--version: $("$G" --version)"
"$G" --version | grep -Eq "^BLAS: OpenBLAS [0-9.]+ .*, linked in$" || fail "--version must name the BLAS: $("$G" --version)"
for v in -V version; do [ "$("$G" $v)" = "$("$G" --version)" ] || fail "$v must print the version: $("$G" $v 2>&1)"; done
# each command's --help is its own usage: its options, not the others'
"$G" run --help >help_run.txt && grep -q -- "--mode" help_run.txt && ! grep -q -- "--snippet\|--format" help_run.txt || fail "run --help: $(head -3 help_run.txt)"
"$G" check --help >help_check.txt && grep -q -- "--snippet" help_check.txt && ! grep -q -- "--mode\|--format" help_check.txt || fail "check --help: $(head -3 help_check.txt)"
"$G" report --help >help_report.txt && grep -q -- "--format" help_report.txt && ! grep -q -- "--mode\|--snippet" help_report.txt || fail "report --help: $(head -3 help_report.txt)"
"$G" --help | grep -q -- "--snippet" && "$G" --help | grep -q -- "--mode" || fail "--help must show every command"
# near misses: the nearest flag or command, named; nothing suggested for what is near nothing
near() {   # SUGGESTION ARGS...: exit 2, "did you mean SUGGESTION?"
    local want=$1 out rc
    shift
    out=$("$G" "$@" 2>&1) && rc=0 || rc=$?
    [ $rc = 2 ] && grep -qF "did you mean $want?" <<<"$out" || fail "'$*': exit $rc, expected 2 and 'did you mean $want?': $out"
}
near --world run --wrold 2
near --world run --worl=2
near --summary-only run --summary-onyl
near --json check --jsn x.json d.st
near --format report x.json --formt md
near run rnu
near --version --verison
near off run --mode of
near off run --mode on,of
near contrastive run --probe contrastiv
near nccl run --backend ncl
near random run --inputs rand
near junit report x.json --format junti
# one options table: every option --help lists is one the parser takes, and no other command's
for cmd in run check report; do
    for flag in $("$G" $cmd --help | grep -oE '^  --[a-z-]+' | sort -u); do
        "$G" $cmd $flag --end 2>&1 | grep -q -- "$flag: unknown option" && fail "$cmd --help lists $flag, which $cmd refuses as unknown"
    done
done
"$G" check --mode on d.st 2>&1 | grep -q -- "--mode: unknown option" || fail "check must refuse run's --mode"
near report reprot x.json
"$G" run --bogus 2>&1 | grep -q "did you mean" && fail "--bogus is near no flag, yet a flag was suggested"
usage_error --summary-only run --summary-only --no-json
"$G" run --summary-only --no-json 2>&1 | grep -q -- "--no-json" || fail "--summary-only with --no-json: the message must name both"

# ---- the run a CI job makes: sync_grads=False under test must fail
"$G" run --world 4 --mode off --no-json >off.txt 2>off.err
rc=$?
[ $rc = 1 ] || fail "run --world 4 --mode off exited $rc, expected 1"
grep -q "fc1.weight and fc1.bias receive no gradient on any rank" off.txt || fail "mode off: no verdict naming fc1: $(cat off.txt)"
grep -q "only 1 of 5 parameters receives a gradient: logit_scale" off.txt || fail "mode off: no verdict naming logit_scale"
grep -qxF "          path: fc1.weight -> linear(fc1) -> relu -> all_gather[off] ✂ under no_grad (Lightning sync_grads=False) -> view -> mul -> mse_loss" off.txt ||
    fail "mode off: no path line under the fc1 finding: $(grep 'path:' off.txt)"
[ ! -e reports ] || fail "--no-json wrote a report"

# ---- the default run: on under test, the other modes as controls; the report and its round trip
"$G" run --world 4 --json run.json >run.txt 2>run.err
rc=$?
[ $rc = 0 ] || fail "run --world 4 exited $rc, expected 0: $(cat run.txt run.err)"
for m in off on local avg; do grep -q "^  $m " run.txt || fail "the table has no verdict line for mode $m"; done
grep -q "^report: run.json$" run.txt || fail "run did not print the report's path"
"$G" report run.json >report.txt || fail "report run.json failed"
diff <(grep -v '^report: ' run.txt) report.txt >/dev/null || fail "report text differs from what run printed: $(diff <(grep -v '^report: ' run.txt) report.txt | head)"
"$PY" "$SRC/tests/check_report.py" "$SRC/reports/schema.json" run.json run.txt || fail "check_report.py on run.json"

"$G" report run.json --format junit >junit.xml || fail "report --format junit failed"
"$PY" - junit.xml <<'PY' || fail "junit.xml is not the JUnit expected"
import sys, xml.etree.ElementTree as E
root = E.parse(sys.argv[1]).getroot()
assert root.tag == "testsuites", root.tag
cases = root.findall(".//testcase")
assert len(cases) == 12, len(cases)   # three probes x four modes
assert not root.findall(".//failure"), "a passing run has no failure"
assert not root.findall(".//skipped"), "the nine controls that behaved pass (test_junit.sh checks the rest)"
PY
"$G" report run.json --format md >run.md || fail "report --format md failed"
for want in '^# No gradient finding under Lightning all_gather(sync_grads=True) at world 4 ' '^## Environment' '^## Findings' '^| fc1.weight | (2,2) |' '^gradcheck-dist run --world 4 --json run.json$' '^<details>' '^</details>'; do
    grep -q -- "$want" run.md || fail "the Markdown has no line matching $want"
done

# ---- the words: the key, one spelling for factors, a result that says what it means
grep -qF "(control) a configuration known to drop or scale gradients, which the tool must catch" run.txt || fail "no key for (control): $(grep -A2 '^key' run.txt)"
grep -q "^key: ! a finding; - a note; (test) the configuration under test" run.txt || fail "the key must explain !, - and (test): $(grep -A2 '^key' run.txt)"
grep -q "gradients are the reference x0.25 (= 1/world) while fc2.weight and fc2.bias are x1$" run.txt || fail "scales are written x0.25: $(grep 'the reference (=' run.txt)"
grep -Eq "[0-9]x( |$)" run.txt && fail "a factor is written 0.25x: $(grep -E '[0-9]x( |$)' run.txt)"
grep -A1 "^result: pass (exit 0)$" run.txt | grep -qx "  pass: the configuration under test is clean and every known-bad configuration was caught" ||
    fail "result: pass must say what it means: $(tail -3 run.txt)"
grep -A1 "^result: fail (exit 1)$" off.txt | grep -q "^  fail: the configuration under test has gradient findings" || fail "result: fail must say what it means: $(tail -3 off.txt)"

# ---- the table fits the width: COLUMNS, else the terminal's, else 100; a gradient's path: broken at its arrows
widest() {   # FILE: the longest line, in characters
    "$PY" -c 'import sys; print(max(len(l) for l in open(sys.argv[1], encoding="utf-8").read().split("\n")))' "$1"
}
fits() {   # WIDTH FILE WHAT
    local w
    w=$(widest "$2")
    [ "$w" -le "$1" ] || fail "$3: a line of $w characters at width $1: $(awk -v w="$1" 'length > w' "$2" | head -2)"
    for m in off on local avg; do grep -q " | $m (" "$2" || fail "$3: the table at width $1 lost mode $m"; done
}
for w in 60 80 100 177; do
    COLUMNS=$w "$G" report run.json >w$w.txt
    fits $w w$w.txt "report run.json"
done
grep -q " | status    |g|       vs ref" w177.txt || fail "at 177 columns the norms are shown"
grep -q "|g| left out at this width (COLUMNS=138 shows it)" w100.txt || fail "at 100 columns the norms are left out, saying so: $(grep -n 'xC' w100.txt | head -1)"
[ "$(grep -c "^  parameter " w80.txt)" = 6 ] || fail "at 80 columns two blocks of modes a probe (three probes) are stacked: $(grep -c '^  parameter ' w80.txt)"
(unset COLUMNS; "$G" report run.json >w_default.txt)
cmp -s w_default.txt w100.txt || fail "not a terminal, no COLUMNS: the width must be 100"
if command -v script >/dev/null; then   # a terminal 70 wide: TIOCGWINSZ
    (unset COLUMNS; script -qec "stty cols 70 rows 40; $(printf %q "$G") report run.json" /dev/null >w70.txt) || fail "script: report failed"
    tr -d '\r' <w70.txt >w70.clean
    fits 70 w70.clean "report on a 70-column terminal"
fi
"$G" run --world 2 --probe contrastive --mode off,on --steps 30 --json steps30.json >/dev/null 2>&1
for w in 60 80; do
    COLUMNS=$w "$G" report steps30.json >s$w.txt
    w2=$(widest s$w.txt)
    [ "$w2" -le $w ] || fail "--steps: a line of $w2 characters at width $w: $(awk -v w=$w 'length > w' s$w.txt | head -2)"
done
# check's table: a dtype column, and a name too long for the line gets a line of its own
mkdir -p dumps
PYTHONPATH=$SRC/tests "$PY" - <<'PY' || fail "could not write the dumps"
import numpy as np, st_writer as w
r = np.random.default_rng(0)
g = {"model.encoder.layers.11.attention.self.query.weight": r.standard_normal((64, 64)), "head.bias": r.standard_normal(3)}
w.write_world("dumps", [g, dict(g, **{"head.bias": 2 * g["head.bias"]})])
PY
for w in 60 80; do
    COLUMNS=$w "$G" check dumps --no-json >c$w.txt
    [ $? = 1 ] && [ "$(widest c$w.txt)" -le $w ] || fail "check at width $w: a line of $(widest c$w.txt) characters: $(awk -v w=$w 'length > w' c$w.txt | head -2)"
done
grep -qx "  model.encoder.layers.11.attention.self.query.weight" c60.txt || fail "check at 60: the long name must have a line of its own"
# the launcher hands its width to rank 0 (whose stdout is mpirun's pipe)
COLUMNS=80 "$G" run --world 2 --probe simplenet --no-json >launch80.txt 2>/dev/null
[ "$(widest launch80.txt)" -le 80 ] && grep -q "^  parameter " launch80.txt || fail "run at COLUMNS=80: a line of $(widest launch80.txt) characters"

# ---- progress on stderr: one line a probe and mode when not a terminal, a live line on one
"$G" run --world 2 --probe simplenet --no-json >/dev/null 2>progress.txt
[ "$(grep -Ec '^gradcheck-dist: [1-4]/4 simplenet, mode (off|on|local|avg): gradients in [0-9.]+ s, [0-9.]+ s elapsed$' progress.txt)" = 4 ] ||
    fail "not a terminal: one progress line per run expected: $(cat progress.txt)"
grep -q $'\r' progress.txt && fail "not a terminal: no carriage returns expected"
if command -v script >/dev/null; then
    script -qec "$(printf %q "$G") run --world 2 --probe contrastive --mode on --steps 200 --no-json" /dev/null >tty.txt
    grep -q $'\r\e\[K1/1 contrastive, mode on: step 200/200, [0-9.]* s' tty.txt || fail "on a terminal: a live line ending at step 200/200: $(od -c tty.txt | head -5)"
    grep -q "^gradcheck-dist: 1/1" tty.txt && fail "on a terminal: no per-run lines"
fi

# ---- world 1: a note every run has is said once
"$G" run --world 1 --no-json >w1.txt 2>/dev/null
[ "$(grep -c "world 1: a one-rank process group" w1.txt)" = 1 ] || fail "world 1: the note must be said once, not $(grep -c 'world 1: a one-rank' w1.txt) times"
grep -q "^  all   - world 1: a one-rank process group" w1.txt || fail "world 1: the note must be marked for all modes: $(grep 'world 1:' w1.txt)"

# ---- with findings: the Markdown's title names the first one, JUnit fails it
"$G" run --world 2 --probe contrastive --mode off,on --json off.json >/dev/null 2>&1
[ $? = 1 ] || fail "--mode off,on must exit 1"
"$G" report off.json --format md | head -1 | grep -qF "# Lightning all_gather(sync_grads=False): img.weight, img.bias, txt.weight, txt.bias get no gradient at world 2" || fail "md title: $("$G" report off.json --format md | head -1)"
"$G" report off.json --format md | grep -qF '  - path: `img.weight -> linear(img) -> normalize -> all_gather[off] ✂ under no_grad' ||
    fail "the Markdown must show the chain under the finding"
"$PY" - off.json <<'PY' || fail "off.json: every encoder tensor must break at the gather, logit_scale nowhere"
import json, sys
run = json.load(open(sys.argv[1]))["runs"][0]
for p in run["params"]:
    at = p["breaks_at"]
    if p["name"] == "logit_scale":
        assert at is None and p["path"][-1]["op"] == "mean", p
    else:
        assert p["path"][at]["op"] == "all_gather" and p["path"][at]["detached"] and "no_grad" in p["path"][at]["reason"], p
PY
[ "$("$G" report off.json --format junit | grep -c '<failure')" = 1 ] || fail "junit must fail mode off only"

# ---- --json -: the JSON on stdout, the table on stderr; default path under reports/
"$G" run --world 2 --probe simplenet --json - >stdout.json 2>stderr.txt
"$PY" -c 'import json,sys; d=json.load(open("stdout.json")); assert d["result"]=="pass"' || fail "--json -: stdout is not the report"
grep -q "^simplenet (inputs seed, world 2)" stderr.txt || fail "--json -: the table is not on stderr"
"$G" run --world 1 --probe simplenet --mode on --summary-only >default.txt || fail "a world-1 run failed"
path=$(sed -n 's/^report: //p' default.txt)
[[ $path == reports/gradcheck-*Z.json ]] && [ -f "$path" ] || fail "default report path: '$path'"
"$PY" - "$path" <<'PY' || fail "--summary-only kept values"
import json, sys
d = json.load(open(sys.argv[1]))
p = d["runs"][0]["params"][0]
assert "local" not in p and "reduced" not in p and p["status"] == "ok", p
PY
ls reports/*.tmp.* >/dev/null 2>&1 && fail "a temporary file was left in reports/"

# ---- steps: the loss moves while the encoders never do
"$G" run --world 2 --probe contrastive --mode off --steps 20 --no-json >steps.txt 2>&1
[ $? = 1 ] || fail "--steps 20 --mode off must exit 1"
grep -q "learning stopped: the loss went" steps.txt || fail "no 'learning stopped' finding: $(cat steps.txt)"
grep -q "^contrastive (world 2)$" steps.txt || fail "contrastive inputs always differ per rank: the title must not say 'inputs seed': $(grep '^contrastive' steps.txt)"
# the curve covers every step: its last value is the one the finding quotes
"$G" run --world 2 --probe contrastive --mode off --steps 600 --no-json >long.txt 2>&1
curve_last=$(grep -A1 "^  loss over 600 SGD steps" long.txt | tail -1 | awk '{print $NF}')
said_last=$(sed -n 's/.*the loss went [^ ]* -> \([^ ]*\) over 600 steps.*/\1/p' long.txt)
[ -n "$said_last" ] && [ "$curve_last" = "$said_last" ] || fail "--steps 600: the curve ends at '$curve_last', the finding says '$said_last'"

# divergence is a finding, also in the configuration under test
"$G" run --world 2 --probe contrastive --mode on --steps 5 --lr 1e308 --no-json >diverged.txt 2>&1
rc=$?
[ $rc = 1 ] && grep -q "training diverged: the loss is not finite from step" diverged.txt || fail "--lr 1e308 must be a 'diverged' finding, exit 1: exit $rc, $(grep '!' diverged.txt)"
"$G" report run.json >/dev/full 2>full.err
[ $? = 3 ] && grep -q "writing to stdout" full.err || fail "report > /dev/full must exit 3 naming the write"

# ---- bad report files: exit 2, one line, the file named
echo '{"hello": 1}' >foreign.json
head -c 300 run.json >truncated.json
sed 's#gradcheck-dist.report/[0-9]*#gradcheck-dist.report/9#' run.json >newer.json
for f in foreign.json truncated.json newer.json missing.json; do
    out=$("$G" report "$f" 2>&1) && rc=0 || rc=$?
    [ $rc = 2 ] || fail "report $f exited $rc, expected 2"
    grep -q "$f" <<<"$out" || fail "report $f: the message does not name the file: $out"
done
"$G" report truncated.json 2>&1 | grep -q "truncated" || fail "a truncated report must be called truncated"
# not a regular file: refused at once (a FIFO with no writer must not hang), stdin as "-"
mkfifo report.fifo
for f in report.fifo /dev/zero /dev/urandom .; do
    out=$(timeout 10 "$G" report "$f" 2>&1) && rc=0 || rc=$?
    [ $rc = 2 ] && grep -q "not a regular file" <<<"$out" || fail "report $f: exit $rc, expected 2 'not a regular file': $out"
done
"$G" report - <run.json | diff - report.txt >/dev/null || fail "report - must read the report from stdin"
# hostile strings in a report: JUnit stays well-formed XML, Markdown's fences and items cannot be broken
"$PY" - run.json escapes.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
r["command"] = ["gradcheck-dist", "run", "a\n```\n# injected", "````x", "it's"]
f = r["runs"][0]["findings"][0]
f["message"], f["counts"] = "<&\"'> line\nbreak \u0001 ```", True
r["expectations"][0]["met"], r["expectations"][0]["message"] = False, "bad <tag> & \"quote\"\n# heading"
json.dump(r, open(sys.argv[2], "w"))
PY
# a report of 240 runs: JUnit renders every one it counts; the text says what its tables leave out
"$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); d["runs"]*=20; d["expectations"]*=20; json.dump(d,open(sys.argv[2],"w"))' run.json many.json
[ "$("$G" report many.json --format junit | grep -c '<testcase ')" = 240 ] || fail "JUnit must render all 240 runs it counts"
"$G" report many.json | grep -q "176 more runs are in the report" || fail "the text must say which runs its tables leave out"
"$G" report escapes.json --format junit >escapes.xml || fail "junit of escapes.json failed"
"$PY" -c 'import sys, xml.etree.ElementTree as E; E.parse(sys.argv[1])' escapes.xml || fail "the JUnit of hostile strings is not well-formed XML"
"$G" report escapes.json --format md >escapes.md || fail "md of escapes.json failed"
"$PY" - escapes.md <<'PY' || fail "the Markdown of hostile strings can be broken out of"
import re, sys
md = open(sys.argv[1]).read().split("\n")
assert not any(l.startswith("# injected") or l.startswith("# heading") for l in md), "a line broke out"
i = md.index("## Reproduce") + 2
fence = re.match(r"^(`{3,})sh$", md[i]).group(1)
assert md[i + 2] == fence and fence not in md[i + 1], (md[i:i + 3])
PY
"$G" report newer.json 2>&1 | grep -q "newer" || fail "a newer schema must be called newer"

# ---- inside an MPI job: --world must agree with the job
root=()
[ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
out=$(mpirun -q "${root[@]}" --oversubscribe -np 2 "$G" run --world 3 --no-json 2>&1) && rc=0 || rc=$?
[ $rc = 2 ] && grep -q -- "--world" <<<"$out" || fail "--world 3 inside a 2-rank job: exit $rc: $out"

# ---- a runtime failure (an MPI call made to fail through PMPI): exit 3, the rank and call named, and
# rank 0, alive, leaves a whole report saying "error"
if [ -n "$FAULT" ]; then
    LD_PRELOAD=$FAULT GCD_FAULT_ALLGATHER=7 GCD_FAULT_RANK=0 "$G" run --world 2 --json err.json >err.out 2>err.txt
    rc=$?
    [ $rc = 3 ] || fail "an MPI failure on rank 0 exited $rc, expected 3"
    grep -q "rank 0: MPI_Allgather" err.txt || fail "the failure must name rank 0 and MPI_Allgather: $(cat err.txt)"
    "$PY" - err.json "$SRC/reports/schema.json" <<'PY' || fail "err.json is not a whole error report"
import json, sys, jsonschema
d = json.load(open(sys.argv[1]))
jsonschema.validate(d, json.load(open(sys.argv[2])))
assert d["result"] == "error" and d["exit_code"] == 3 and d["error"]["rank"] == 0, (d["result"], d["error"])
assert "MPI_Allgather" in d["error"]["message"], d["error"]
PY
    LD_PRELOAD=$FAULT GCD_FAULT_ALLGATHER=7 GCD_FAULT_RANK=1 "$G" run --world 2 --json err1.json >/dev/null 2>err1.txt
    rc=$?
    [ $rc = 3 ] || fail "an MPI failure on rank 1 exited $rc, expected 3"
    grep -q "rank 1: MPI_Allgather" err1.txt || fail "the failure must name rank 1: $(cat err1.txt)"
    ls err1.json.tmp.* >/dev/null 2>&1 && fail "a temporary report was left behind"
fi

# ---- launch and runtime failures are never findings: exit 3, with what mpirun said
printf 'localhost slots=1\n' >few.hosts
out=$("$G" run --world 3 --hostfile few.hosts --no-json 2>&1) && rc=0 || rc=$?
[ $rc = 3 ] || fail "a hostfile with too few slots exited $rc, expected 3: $out"
grep -q "not enough slots" <<<"$out" || fail "mpirun's own message must be shown: $out"
grep -q "before rank 0 gave its verdict" <<<"$out" || fail "the launcher must say the job ended without a verdict: $out"
usage_error --json run --json "$work/no-such-dir/x.json"
usage_error --json run --json .
[ ! -e "$work/no-such-dir" ] || fail "a usage error created $work/no-such-dir"
# the code the text prints is the code the process returns, and a device is written, never replaced
"$G" run --world 2 --probe simplenet --mode on --json /dev/full >full.txt 2>&1
rc=$?
[ $rc = 3 ] || fail "--json /dev/full exited $rc, expected 3 (ENOSPC)"
grep -q "^result: error (exit 3)$" full.txt || fail "the text must say exit 3: $(tail -3 full.txt)"
[ -c /dev/full ] || fail "/dev/full is no longer a character device"
"$G" run --world 2 --probe simplenet --mode on --json /dev/null >/dev/null 2>&1 || fail "--json /dev/null failed"
[ -c /dev/null ] || fail "/dev/null is no longer a character device"
"$G" run --world 2 --probe simplenet --mode off --no-json >off2.txt 2>&1
rc=$?
grep -q "^result: fail (exit $rc)$" off2.txt || fail "the text's exit code differs from the process's ($rc): $(tail -1 off2.txt)"
# a fatal error on rank 0 ends every rank (MPI_Abort), even where mpirun would leave the others running
if [ -n "$FAULT" ]; then
    OMPI_MCA_orte_abort_on_non_zero_status=0 LD_PRELOAD=$FAULT GCD_FAULT_ALLGATHER=7 GCD_FAULT_RANK=0 timeout 60 "$G" run --world 2 --no-json >abort.txt 2>&1
    rc=$?
    [ $rc = 3 ] || fail "a fatal error on rank 0 with orte_abort_on_non_zero_status=0 exited $rc, expected 3 (124: the job hung)"
fi

# ---- never hang, never leave anything behind: a stopped rank, signals to the launcher, stdin, names
ranks_of() { pgrep -f -- "$G run .*--steps $1" || true; }   # this binary's: another checkout's test_cli may run at once
rank_pid() {   # STEPS RANK: the pid of that rank of the run marked by its --steps
    local p
    for p in $(ranks_of "$1"); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && { echo "$p"; return; }
    done
}
has_rank() { [ -n "$(rank_pid "$1" "$2")" ]; }
# rank 0 has its report path and handlers set (the launcher's private directory under TMPDIR holds the
# "report" file it left): a rank found by its environment alone may still be in MPI_Init, where killing
# it leaves rank 0 no pid to name (the "dead rank must be named" flake under load)
rank0_ready() { compgen -G "$1/gradcheck-dist.*/report" >/dev/null; }
no_ranks() { [ -z "$(ranks_of "$1")" ]; }
wait_for() {   # SECONDS COMMAND...: poll until the command succeeds
    local end=$((SECONDS + $1))
    shift
    until "$@"; do [ $SECONDS -lt $end ] || return 1; sleep 0.2; done
}
mkdir -p tmp99911 tmp99915
TMPDIR=$PWD/tmp99911 "$G" run --world 2 --probe contrastive --mode on --batch 32 --steps 99911 --timeout 3 --json stopped.json >stopped.txt 2>&1 &
run=$!
wait_for 60 rank0_ready tmp99911 && wait_for 20 has_rank 99911 1 && sleep 0.5 && kill -STOP "$(rank_pid 99911 1)"   # past MPI_Init (which has the deadline too)
stopped_at=$SECONDS
timeout 60 tail --pid=$run -f /dev/null || kill -CONT $(ranks_of 99911) 2>/dev/null
wait $run
rc=$?
[ $rc = 3 ] || fail "a stopped rank with --timeout 3 exited $rc, expected 3"
# 3 s and the launcher's few; a deadline 10x too long could not end it before 30 s
[ $((SECONDS - stopped_at)) -le 27 ] || fail "a stopped rank with --timeout 3 ended the job $((SECONDS - stopped_at)) s later, expected 3 s and the launcher's few"
grep -Eq "MPI_[A-Za-z_]+: not complete after 3 s, in probe contrastive, mode on" stopped.txt || fail "the timeout must name the collective and the run: $(cat stopped.txt)"
"$PY" -c 'import json,sys; d=json.load(open("stopped.json")); assert d["exit_code"] == 3 and "not complete" in d["error"]["message"]' || fail "no error report after the timeout"
wait_for 10 no_ranks 99911 || fail "processes left after the timeout: $(ranks_of 99911)"

mkdir -p sig && cd sig || exit 1
"$G" run --world 2 --probe contrastive --mode on --batch 32 --steps 99912 >term.txt 2>&1 &
run=$!
wait_for 20 has_rank 99912 0 && sleep 0.5 && kill -TERM $run
wait $run
rc=$?
[ $rc = 3 ] && grep -q "cancelled by signal 15" term.txt || fail "SIGTERM to the launcher: exit $rc: $(cat term.txt)"
wait_for 10 no_ranks 99912 || fail "SIGTERM to the launcher left processes: $(ranks_of 99912)"
[ -z "$(ls reports 2>/dev/null)" ] || fail "SIGTERM to the launcher left a report: $(ls reports)"
# a launcher killed by SIGKILL cannot remove its private directory (gradcheck-dist.*): given a TMPDIR of
# its own here, the test removes it (the ranks and mpirun must still go)
mkdir -p ../tmp99913
TMPDIR=$PWD/../tmp99913 "$G" run --world 2 --probe contrastive --mode on --batch 32 --steps 99913 >kill.txt 2>&1 &
run=$!
wait_for 20 has_rank 99913 0 && sleep 0.5 && kill -KILL $run
wait $run 2>/dev/null
wait_for 10 no_ranks 99913 || fail "SIGKILL to the launcher left processes: $(ranks_of 99913)"
[ -z "$(ls reports 2>/dev/null)" ] || fail "SIGKILL to the launcher left a report: $(ls reports)"
rm -rf ../tmp99913
# a rank killed by a signal: named with its pid and host, and rank 0, alive, still writes the error report
TMPDIR=$PWD/../tmp99915 "$G" run --world 3 --probe contrastive --mode on --batch 32 --steps 99915 --json dead.json --junit dead.xml >dead.txt 2>&1 &
run=$!
wait_for 60 rank0_ready ../tmp99915 && wait_for 20 has_rank 99915 2 && sleep 0.5 && victim=$(rank_pid 99915 2) && kill -KILL "$victim"
timeout 60 tail --pid=$run -f /dev/null
wait $run
rc=$?
[ $rc = 3 ] || fail "a rank killed by SIGKILL exited $rc, expected 3"
grep -qF "rank 2 (pid ${victim:-?} on $(hostname)) was killed by signal 9" dead.txt || fail "the dead rank must be named: $(cat dead.txt)"
"$PY" - dead.json "${victim:-0}" <<'PY' || fail "dead.json: no error report naming rank 2"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["result"] == "error" and d["exit_code"] == 3 and d["error"]["rank"] == 2, (d["result"], d["error"])
assert f"rank 2 (pid {sys.argv[2]} on " in d["error"]["message"] and "killed by signal 9" in d["error"]["message"], d["error"]
PY
grep -q "<error type=\"runtime\" message=\"rank 2: rank 2 (pid ${victim:-?} on [^\"]*killed by signal 9" dead.xml || fail "dead.xml: the JUnit error must name rank 2 too: $(grep '<error' dead.xml)"
wait_for 10 no_ranks 99915 || fail "a killed rank left processes: $(ranks_of 99915)"
# the ranks read no stdin: a caller's while-read loop keeps its lines
got=$(printf 'a\nb\n' | while read -r x; do "$G" run --world 2 --probe simplenet --mode on --no-json >/dev/null; printf '%s' "$x"; done)
[ "$got" = ab ] || fail "gradcheck-dist run swallowed the caller's stdin: read '$got'"
# four runs started together: four reports, each whole
for i in 1 2 3 4; do "$G" run --world 1 --probe simplenet --mode on --summary-only >/dev/null 2>&1 & done
wait
[ "$(ls reports/*.json | wc -l)" = 4 ] || fail "four runs at once must leave four reports: $(ls reports)"
for f in reports/*.json; do "$PY" -c 'import json,sys; json.load(open(sys.argv[1]))' "$f" || fail "$f is not a whole report"; done
# a killed writer's temporary is removed by the next write once it is stale, a fresh one is not
touch -d '2 hours ago' r.json.tmp.AAAAAA
touch r.json.tmp.BBBBBB r.json.tmp.CCCCCCC
"$G" run --world 1 --probe simplenet --mode on --json r.json >/dev/null 2>&1
[ ! -e r.json.tmp.AAAAAA ] && [ -e r.json.tmp.BBBBBB ] && [ -e r.json.tmp.CCCCCCC ] || fail "stale temporaries: $(ls r.json.tmp.* 2>&1)"
cd .. || exit 1
# ---- the launcher forwards every GCD_ and NCCL_ variable to the ranks with -x (Open MPI starts ranks on
# other nodes without this environment), and nothing else: a fake mpirun records its arguments
mkdir -p fakebin
cat >fakebin/mpirun <<'SH'
#!/bin/sh
printf '%s\n' "$@" >"$FAKE_ARGV"
printf '%s|%s\n' "$HWLOC_COMPONENTS" "$HWLOC_PLUGINS_BLACKLIST" >"$FAKE_ARGV.hwloc"
echo 0 >"$GCD_RESULT_FILE"
SH
chmod +x fakebin/mpirun
for hosts in "" "--hostfile few.hosts"; do
    # shellcheck disable=SC2086
    PATH=$work/fakebin:$PATH FAKE_ARGV=$work/argv GCD_NCCL_TIMEOUT=7 NCCL_DEBUG=WARN NCCL_SOCKET_IFNAME=lo GCDX=1 \
        "$G" run --world 2 $hosts --no-json >/dev/null 2>&1 || fail "the launcher with a fake mpirun ($hosts) failed"
    args=" $(tr '\n' ' ' <argv)"
    for v in GCD_RESULT_FILE GCD_NCCL_TIMEOUT NCCL_DEBUG NCCL_SOCKET_IFNAME; do
        [[ $args == *" -x $v "* ]] || fail "launcher ($hosts): mpirun was not given -x $v:$args"
    done
    [[ $args == *" -x GCDX "* || $args == *" -x PATH "* ]] && fail "launcher ($hosts): forwarded a variable that is not GCD_/NCCL_:$args"
    # one node: ob1 (skips cm's psm/psm2 sleeps), the shared-memory BTL, libnbc's recursive-doubling
    # all-gather, hwloc without I/O discovery; several hosts keep Open MPI's choices
    hw=$(cat argv.hwloc)
    if [ -z "$hosts" ]; then
        for m in "pml ob1" "btl self,vader" "coll_libnbc_iallgather_algorithm 2"; do
            [[ $args == *" --mca $m "* ]] || fail "launcher: a single-node job must get --mca $m:$args"
        done
        [ "$hw" = "-linuxio|hwloc_pci,hwloc_opencl,hwloc_gl,hwloc_xml_libxml" ] || fail "launcher: hwloc must skip I/O discovery on one node: '$hw'"
    else
        [[ $args == *" pml "* || $args == *" btl "* || $args == *" coll_libnbc"* ]] && fail "launcher ($hosts): with --hostfile the PML, BTLs and collectives are Open MPI's choice:$args"
        [ "$hw" = "|" ] || fail "launcher ($hosts): hwloc's discovery is Open MPI's choice with --hostfile: '$hw'"
    fi
done
# a PML, BTL list or hwloc setting the user chose is kept
PATH=$work/fakebin:$PATH FAKE_ARGV=$work/argv OMPI_MCA_pml=ucx OMPI_MCA_btl=self,tcp HWLOC_COMPONENTS=x86 "$G" run --world 2 --no-json >/dev/null 2>&1 ||
    fail "the launcher with a fake mpirun (OMPI_MCA_pml) failed"
args=" $(tr '\n' ' ' <argv)"
[[ $args == *" pml "* || $args == *" btl "* ]] && fail "launcher: OMPI_MCA_pml and OMPI_MCA_btl are set, yet mpirun was given a PML or BTLs:$args"
[[ $args == *" --mca coll_libnbc_iallgather_algorithm 2 "* ]] || fail "launcher: the user's PML and BTLs must not drop the all-gather setting:$args"
[[ $(cat argv.hwloc) == "x86|"* ]] || fail "launcher: the user's HWLOC_COMPONENTS must be kept: $(cat argv.hwloc)"
# a resource manager's allocation of several nodes keeps them too (mpirun may start ranks elsewhere);
# Slurm's one-node allocation is one node
for rm in "SLURM_JOB_ID=7 SLURM_JOB_NUM_NODES=2" "PBS_NODEFILE=/tmp/nodes" "SLURM_JOB_ID=7 SLURM_JOB_NUM_NODES=1"; do
    # shellcheck disable=SC2086
    env PATH="$work/fakebin:$PATH" FAKE_ARGV="$work/argv" $rm "$G" run --world 2 --no-json >/dev/null 2>&1 || fail "the launcher with a fake mpirun ($rm) failed"
    args=" $(tr '\n' ' ' <argv)"
    if [[ $rm == *"NUM_NODES=1" ]]; then
        [[ $args == *" --mca btl self,vader "* ]] || fail "launcher ($rm): a one-node allocation is one node:$args"
    else
        [[ $args == *" btl "* || $args == *" pml "* ]] && fail "launcher ($rm): an allocation of several nodes keeps Open MPI's choices:$args"
        [ "$(cat argv.hwloc)" = "|" ] || fail "launcher ($rm): hwloc's discovery must be kept: $(cat argv.hwloc)"
    fi
done
# ---- every rank must run one command: ranks started with other options are refused before any
# collective that depends on them (exit 2, the rank named); the same command on every rank runs
out=$(timeout 60 mpirun --allow-run-as-root --oversubscribe -np 1 "$G" run --seed 1 --no-json : -np 2 "$G" run --seed 2 --no-json 2>&1)
rc=$?
[ $rc = 2 ] && grep -q "rank 1 was started with other options than rank 0" <<<"$out" ||
    fail "ranks with other options (MPMD): rc $rc, $(head -c 600 <<<"$out")"
out=$(timeout 60 mpirun --allow-run-as-root --oversubscribe -np 1 "$G" run --no-json : -np 1 "$G" run --backend nccl --no-json 2>&1)
rc=$?
[ $rc = 2 ] && grep -q "rank 1 was started with other options than rank 0" <<<"$out" ||
    fail "a rank with another --backend must be refused before any collective of the backend: rc $rc, $(head -c 600 <<<"$out")"
out=$(timeout 60 mpirun --allow-run-as-root --oversubscribe -np 1 "$G" run --seed 1 --no-json : -np 1 "$G" run --seed 1 --no-json 2>&1) ||
    fail "the same command on every rank (MPMD form) must run: $(tail -c 600 <<<"$out")"

# ---- NCCL without a usable GPU: exit 2, one line, suggest mpi
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    usage_error --backend run --backend nccl --world 1
    out=$("$G" run --backend nccl --world 1 2>&1)
    grep -q -- "--backend mpi" <<<"$out" || fail "--backend nccl must suggest --backend mpi"
    # what is missing first: the build ("not built"), or the device, before any driver detail
    grep -Eq -- "--backend: nccl: (not built: |no CUDA device visible \(cudaGetDeviceCount: )" <<<"$out" || fail "--backend nccl without a GPU: $out"
fi
# the NCCL backend is a module loaded for --backend nccl only: the program links neither CUDA nor NCCL,
# and without the module a CPU run runs while --backend nccl is exit 2 with the loader's words
if [ -e "$(dirname "$G")/gradcheck-dist-nccl.so" ]; then
    ldd "$G" | grep -Eq "libcudart|libnccl" && fail "the program links CUDA or NCCL: $(ldd "$G" | grep -E 'cudart|nccl')"
    ldd "$(dirname "$G")/gradcheck-dist-nccl.so" | grep -q libnccl || fail "the NCCL module does not link NCCL"
    mkdir -p lone/bin && cp "$G" lone/bin/   # lone/lib/gradcheck-dist holds no module
    lone() { lone/bin/gradcheck-dist "$@"; }
    lone run --world 1 --probe simplenet --mode on --no-json >/dev/null 2>&1 || fail "without the NCCL module a CPU run must run"
    out=$(lone run --world 1 --backend nccl --no-json 2>&1) && rc=0 || rc=$?
    [ $rc = 2 ] && grep -q -- "--backend: nccl: cannot load the NCCL backend: .*gradcheck-dist-nccl.so" <<<"$out" ||
        fail "--backend nccl without its module: exit $rc: $out"
    # installed: <prefix>/bin and <prefix>/lib/gradcheck-dist, found whatever the prefix
    mkdir -p lone/lib/gradcheck-dist && cp "$(dirname "$G")/gradcheck-dist-nccl.so" lone/lib/gradcheck-dist/
    out=$(lone run --world 1 --backend nccl --no-json 2>&1)
    grep -q "cannot load" <<<"$out" && fail "the installed module (lone/lib/gradcheck-dist) was not found: $out"
fi

# ---- a caller's stderr closed under the launcher (a pipe into head): no SIGPIPE death, the run finishes
"$G" run --world 2 --probe simplenet --no-json --steps 200 2> >(head -c 1 >/dev/null) >pipe.txt
rc=$?
[ $rc = 0 ] && grep -q "^result: pass (exit 0)$" pipe.txt || fail "stderr closed early: exit $rc (141: killed by SIGPIPE), expected 0 and the table"

echo "test_cli: $fails failure(s)"
[ $fails = 0 ]
