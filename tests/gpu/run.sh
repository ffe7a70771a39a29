#!/usr/bin/env bash
# The GPU check, for a machine with CUDA devices (written for a lent one-GPU H200, where it passed 12 of
# 12 on 2026-12-04: docs/nccl.md). Every check prints PASS or FAIL; the last line is "N passed, M failed", and the exit status is
# non-zero when any failed. What it asserts:
#  - a CUDA device is visible; configure enables the NCCL backend; it builds;
#  - every probe and mode, global and local loss, at the largest world the GPUs allow (world 1 on one
#    GPU), over MPI and over NCCL: each exits 0 with result "pass", and compare.py finds the same runs,
#    n > 0 gradients, the same statuses, NCCL equal to MPI to 1e-12;
#  - one rank more than GPUs is refused with exit 2 and "one GPU per rank", by the launcher and inside
#    mpirun (there through the device UUIDs gathered over the node);
#  - the watchdog: with the test-only shim tests/gpu/stall.c preloaded, a rank's first collective sleeps
#    on its stream; the run must end with exit 3, naming the rank and the call and "no progress", and
#    leave an error report; with two GPUs or more the sleeper is rank 1 and rank 0 waits for it.
# No test-only override lets two ranks share one GPU (NCCL itself refuses a device twice in one
# communicator), so one GPU means world 1.
# usage: bash tests/gpu/run.sh [OUTDIR]
set -u
out=${1:-${OUT:-/tmp/gcd-gpu}}
mkdir -p "$out"
cd "$(dirname "$0")/../.." || exit 1
passed=0 failed=0
result() {   # STATUS EXPECTATION [WHAT HAPPENED]: PASS or FAIL for the check just made
    local what=${3:+ -- $3}
    if [ "$1" = 0 ]; then echo "PASS: $2$what"; passed=$((passed + 1)); else echo "FAIL: $2$what"; failed=$((failed + 1)); fi
}
finish() {
    echo "$passed passed, $failed failed"
    [ $failed = 0 ] && exit 0 || exit 1
}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$ngpu" -gt 0 ]
result $? "a CUDA device is visible" "nvidia-smi -L lists $ngpu"
if ! command -v mpirun >/dev/null || ! pkg-config --exists libcjson || ! dpkg -s libopenblas-dev >/dev/null 2>&1; then
    apt-get install -y -qq libopenmpi-dev openmpi-bin libcjson-dev libxxhash-dev libopenblas-dev pkg-config cmake >/dev/null
fi
cmake -S . -B build-gpu -DGCD_WITH_NCCL=ON >"$out/cmake.log" 2>&1 && grep -q "backend nccl: ON" "$out/cmake.log"
result $? "configure enables the NCCL backend" "$(grep -o "backend nccl.*" "$out/cmake.log" || tail -3 "$out/cmake.log")"
cmake --build build-gpu -j8 >"$out/build.log" 2>&1
result $? "it builds" "log: $out/build.log"
[ -x build-gpu/gradcheck-dist ] || finish
G=$PWD/build-gpu/gradcheck-dist
world=$((ngpu < 1 ? 1 : ngpu > 4 ? 4 : ngpu))
if [ "$ngpu" = 0 ]; then
    echo "world 1: no GPU here, so the checks that need one fail"
elif [ "$ngpu" = 1 ]; then
    echo "world 1: one GPU (no override lets two ranks share it; NCCL refuses a device twice in one communicator)"
else
    echo "world $world: $ngpu GPUs"
fi

# ---- NCCL against MPI, every probe and mode, global and local loss
for loss in "" --local-loss; do
    tag=${loss:+-local}
    for b in mpi nccl; do
        timeout 300 "$G" run --world "$world" --backend $b $loss --steps 3 --json "$out/$b$tag.json" >"$out/$b$tag.txt" 2>&1
        rc=$?
        [ $rc = 0 ] && python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); sys.exit(d["result"] != "pass")' "$out/$b$tag.json"
        result $? "world $world --backend $b${loss:+ $loss}: exit 0, result \"pass\"" "exit $rc, output $out/$b$tag.txt"
    done
    python3 tests/gpu/compare.py "$out/mpi$tag.json" "$out/nccl$tag.json" >"$out/compare$tag.txt" 2>&1
    rc=$?
    result $rc "NCCL equals MPI${loss:+ $loss}: same runs, n > 0 gradients, 1e-12" "$(tail -1 "$out/compare$tag.txt")"
    [ $rc = 0 ] || [ "$(wc -l <"$out/compare$tag.txt")" -le 1 ] || head -20 "$out/compare$tag.txt"
done

# ---- more ranks than GPUs: exit 2 and a clear message, from the launcher and from inside mpirun
over=$((ngpu + 1))
start=$(date +%s)
msg=$(timeout 120 "$G" run --world $over --backend nccl --no-json 2>&1)
rc=$?
[ $rc = 2 ] && grep -q "one GPU per rank" <<<"$msg"
result $? "launcher, --world $over on $ngpu GPU(s): exit 2, \"one GPU per rank\"" "exit $rc in $(($(date +%s) - start)) s: $msg"
start=$(date +%s)
msg=$(timeout 120 mpirun -q -np $over "$G" run --backend nccl --no-json 2>&1)
rc=$?
[ $rc = 2 ] && grep -q "one GPU per rank needed: local ranks .* share GPU GPU-" <<<"$msg"
result $? "inside mpirun -np $over on $ngpu GPU(s): exit 2, two local ranks share one GPU's UUID" "exit $rc in $(($(date +%s) - start)) s: $msg"

# ---- the watchdog: a rank asleep inside its first collective (test-only shim); the limit is 3 s
shim=$PWD/build-gpu/tests/libgpu_stall.so
stall_rank=$((world > 1 ? 1 : 0))
start=$(date +%s)
LD_PRELOAD=$shim GCD_TEST_STALL_RANK=$stall_rank GCD_TEST_STALL_SECONDS=30 GCD_NCCL_TIMEOUT=3 \
    timeout 120 "$G" run --world "$world" --backend nccl --probe simplenet --mode on --json "$out/stall.json" >"$out/stall.txt" 2>&1
rc=$?
took=$(($(date +%s) - start))
# rank 0 leaves the error report when its own watchdog ends the job (always at world 1; at world 2 and
# more the sleeper's may end it first)
report_ok() {
    python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); sys.exit(not (d["result"] == "error" and d["exit_code"] == 3 and "no progress" in d["error"]["message"]))' "$out/stall.json"
}
[ $rc = 3 ] && grep -Eq "rank [0-9]+: nccl(AllGather|AllReduce|ReduceScatter): no progress 3 s" "$out/stall.txt" &&
    { [ "$world" -gt 1 ] || report_ok; }
result $? "watchdog, rank $stall_rank asleep in a collective for 30 s, GCD_NCCL_TIMEOUT=3: exit 3, \"no progress 3 s\"" \
    "exit $rc after $took s: $(grep -m1 "no progress" "$out/stall.txt" || tail -1 "$out/stall.txt")"

# ---- the guard (issue 35) on CUDA tensors over NCCL: torch's own process group, one rank per GPU; needs a
# python3 with CUDA torch (FAIL without one). Untested until a GPU machine runs it.
if python3 -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    GRADCHECK_DIST_LIB=$PWD/build-gpu/libgradcheck_dist.so timeout 600 python3 tests/gpu/guard_gpu.py "$world" >"$out/guard.txt" 2>&1
    rc=$?
    grep -E "^(PASS|FAIL)" "$out/guard.txt"
    [ $rc = 0 ]
    result $? "guard on CUDA/NCCL (tests/gpu/guard_gpu.py): every case as expected" "exit $rc, output $out/guard.txt"
    timeout 300 python3 tests/gpu/sketch_gpu.py build-gpu/gradcheck-dist >"$out/sketch.txt" 2>&1
    rc=$?
    grep -E "^(PASS|FAIL)" "$out/sketch.txt"
    [ $rc = 0 ]
    result $? "sketch dumps of CUDA gradients (tests/gpu/sketch_gpu.py): every case as expected" "exit $rc, output $out/sketch.txt"
else
    result 1 "guard on CUDA/NCCL: a python3 with CUDA torch" "none here: pip install torch (CUDA), then run again"
fi

finish
