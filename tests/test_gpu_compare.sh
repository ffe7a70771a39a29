#!/usr/bin/env bash
# The GPU check's comparison (tests/gpu/compare.py) must be able to fail. A real MPI report at world 1
# (what tests/gpu/run.sh compares on one GPU) and a copy relabelled as NCCL must pass; every altered
# pair must fail: no runs (an error report), no runs on either side, a run missing, one gradient value
# off by 1e-9, a status changed, a failed run, MPI compared with itself, nothing but None gradients.
# usage: test_gpu_compare.sh GRADCHECK_DIST SOURCE_DIR PYTHON
set -u
G=$1 SRC=$2 PY=${3:-python3}
fails=0 out=""
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1

"$G" run --world 1 --steps 3 --json mpi.json >/dev/null 2>&1 || fail "the MPI run at world 1 failed"
# nccl.json: NAME PYTHON-STATEMENTS (on d, the relabelled copy; m is the MPI report)
fabricate() {
    "$PY" - "$1" "$2" <<'PY'
import json, sys
m = json.load(open("mpi.json"))
d = json.load(open("mpi.json"))
d["environment"].update(backend="nccl", nccl_version="2.28.9", cuda_version="runtime 13.0, driver 13.0", devices=["host: GPU 0 H200"])
exec(sys.argv[2])
json.dump(d, open(sys.argv[1] + ".json", "w"))
json.dump(m, open(sys.argv[1] + ".mpi.json", "w"))
PY
}
expect() {   # NAME 0|1 PYTHON-STATEMENTS
    fabricate "$1" "$3" || { fail "$1: could not fabricate"; return; }
    out=$("$PY" "$SRC/tests/gpu/compare.py" "$1.mpi.json" "$1.json" 2>&1) && rc=0 || rc=$?
    [ "$rc" = "$2" ] || fail "$1: compare.py exited $rc, expected $2: $out"
}
expect faithful 0 ""
grep -q "gradients compared" <<<"$out" || fail "faithful: no summary: $out"
[[ $out =~ ([0-9]+)\ gradients\ compared ]] && [ "${BASH_REMATCH[1]}" -gt 0 ] || fail "faithful: no gradient compared: $out"
expect error_report 1 'd.update(result="error", exit_code=3, error={"message": "ncclAllGather: no progress", "rank": 0}, runs=[])'
expect no_runs_at_all 1 'd["runs"] = []; m["runs"] = []'
expect run_missing 1 'd["runs"].pop()'
# the first and the last gradient there is, one value each, 1e-9 relative
expect gradient_off 1 'p = [p for r in d["runs"] for p in r["params"] if p["reduced"] and p["reduced"][0]][0]; p["reduced"][0] *= 1 + 1e-9'
expect reference_off 1 'p = [p for r in d["runs"] for p in r["params"] if p["reference"] and p["reference"][-1]][-1]; p["reference"][-1] *= 1 + 1e-9'
expect local_off 1 'p = [p for r in d["runs"] for p in r["params"] if p["local"] and p["local"][0] and p["local"][0][0]][0]; p["local"][0][0] *= 1 + 1e-9'
expect status_changed 1 'd["runs"][0]["params"][0]["status"] = "mismatch"'
expect failed_run 1 'd.update(result="fail", exit_code=1)'
expect mpi_against_mpi 1 'd["environment"].update(backend="mpi", nccl_version=None)'
expect only_none 1 '
for r in d["runs"] + m["runs"]:
    for p in r["params"]:
        p.update(reduced=None, reference=None, local=None)'
echo "test_gpu_compare: $fails failure(s)"
[ $fails = 0 ]
