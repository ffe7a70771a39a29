#!/usr/bin/env bash
# The GPU checks in one go, for a machine with one CUDA device (the lent H200): build with NCCL, run
# every probe and mode at world 1 over NCCL and over MPI and compare the gradients (1e-6 relative),
# then make sure --world 2 on one GPU ends with a clear message instead of a hang or a raw NCCL error.
# usage: bash tests/gpu/run.sh [OUTDIR]
set -u
out=${1:-${OUT:-/tmp/gcd-gpu}}
mkdir -p "$out"
cd "$(dirname "$0")/../.." || exit 1
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

nvidia-smi -L || { echo "no GPU here"; exit 3; }
if ! command -v mpirun >/dev/null || ! pkg-config --exists libcjson; then
    apt-get install -y -qq libopenmpi-dev openmpi-bin libcjson-dev pkg-config cmake >/dev/null || { echo "cannot install Open MPI / cJSON"; exit 3; }
fi
cmake -S . -B build-gpu -DGCD_WITH_NCCL=ON >"$out/cmake.log" 2>&1 || { cat "$out/cmake.log"; exit 3; }
grep "backend nccl" "$out/cmake.log"
grep -q "backend nccl: ON" "$out/cmake.log" || fail "configure did not enable NCCL"
cmake --build build-gpu -j8 >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 3; }
G=build-gpu/gradcheck-dist

for loss in "" --local-loss; do
    tag=${loss:+local}
    for b in mpi nccl; do
        timeout 300 $G run --world 1 --backend $b --mode all $loss --steps 3 --json "$out/$b$tag.json" >"$out/$b$tag.txt" 2>&1
        echo "world 1 --backend $b $loss: exit $?"
    done
    python3 - "$out/mpi$tag.json" "$out/nccl$tag.json" <<'PY' || fail "NCCL and MPI gradients differ ${loss}"
import json, math, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
assert b["environment"]["backend"] == "nccl" and b["environment"]["nccl_version"], b["environment"]
print("nccl", b["environment"]["nccl_version"], "cuda", b["environment"]["cuda_version"], "devices", b["environment"]["devices"])
worst, n = 0.0, 0
for ra, rb in zip(a["runs"], b["runs"]):
    for pa, pb in zip(ra["params"], rb["params"]):
        assert pa["status"] == pb["status"], (ra["probe"], ra["mode"], pa["name"], pa["status"], pb["status"])
        for key in ("reduced", "reference"):
            x, y = pa[key] or [], pb[key] or []
            nx = math.sqrt(sum(v * v for v in x)) or 1.0
            d = math.sqrt(sum((u - v) ** 2 for u, v in zip(x, y))) / nx
            worst, n = max(worst, d), n + 1
assert worst <= 1e-6, worst
print(f"{n} gradients compared, worst relative difference {worst:.2e}")
PY
done

# two ranks on one GPU: a clear message and exit 2, from the launcher and from inside mpirun
start=$(date +%s)
msg=$(timeout 120 $G run --world 2 --backend nccl --no-json 2>&1); rc=$?
echo "launcher, --world 2 on one GPU: exit $rc in $(($(date +%s) - start)) s: $msg"
[ $rc = 2 ] && grep -q "one GPU per rank" <<<"$msg" || fail "launcher: expected exit 2 and 'one GPU per rank'"
start=$(date +%s)
msg=$(timeout 120 mpirun -q -np 2 $G run --backend nccl --no-json 2>&1); rc=$?
echo "inside mpirun -np 2 on one GPU: exit $rc in $(($(date +%s) - start)) s: $msg"
[ $rc = 2 ] && grep -q "one GPU per rank" <<<"$msg" || fail "inside mpirun: expected exit 2 and 'one GPU per rank'"

cat "$out/nccl.txt"
echo "gpu checks: $fails failure(s)"
[ $fails = 0 ]
