#!/usr/bin/env bash
# Figures, not pass/fail: launch cost, the default run, and a large contrastive run (time and the
# peak resident memory of the largest rank). Shared, noisy machines: read medians, compare like with like.
# usage: bash tests/bench/bench.sh [path/to/gradcheck-dist]
set -u
G=$(realpath "${1:-build/gradcheck-dist}")
cd "$(mktemp -d)" || exit 1
root=()
[ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
/usr/bin/python3 - "$G" "${root[@]}" <<'PY'
import os, resource, statistics, subprocess, sys, time
g, extra = sys.argv[1], sys.argv[2:]

def measure(cmd, reps):
    walls = []
    for _ in range(reps):
        t = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        walls.append(time.perf_counter() - t)
    return statistics.median(walls), min(walls)

rows = [
    ("mpirun -np 4 true (bare launch)", ["mpirun", "-q", "--oversubscribe", *extra, "-np", "4", "true"], 5),
    ("gradcheck-dist run --world 4", [g, "run", "--world", "4", "--no-json"], 5),
    ("run --world 4 --steps 20", [g, "run", "--world", "4", "--steps", "20", "--no-json"], 3),
    ("contrastive B=256 Di=512 Dt=256 E=128, world 4, 4 modes", [g, "run", "--world", "4", "--probe", "contrastive", "--batch", "256",
      "--dim-img", "512", "--dim-txt", "256", "--dim-emb", "128", "--summary-only", "--json", "big.json"], 1),
]
print(f"{'what':58} {'median s':>9} {'min s':>7}")
for name, cmd, reps in rows:
    med, lo = measure(cmd, reps)
    print(f"{name:58} {med:9.3f} {lo:7.3f}")
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(f"peak resident memory of the largest process: {rss:.0f} MiB")
print(f"report of the large run (summary only): {os.path.getsize('big.json') / 1024:.0f} KiB")
PY
