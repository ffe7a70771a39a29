#!/usr/bin/env bash
# Figures, not pass/fail: `gradcheck-dist run` against an MPI hello (launch, worlds 1-32) and against
# the same contrastive work in PyTorch (B=256 and 1024, mode on and all modes, world 4): medians,
# ratios, peak memory, report sizes, in one run. With OLD too, before and after side by side.
# Shared, noisy machines: the header prints the load; compare like with like. See bench.py for details.
# usage: bash tests/bench/bench.sh [--quick] [--reps N] [NEW [OLD]]     (NEW: build/gradcheck-dist)
#   OLD from main: git clone -q /work/main /tmp/gcd-base && cmake -S /tmp/gcd-base -B /tmp/gcd-base/build
#                  && cmake --build /tmp/gcd-base/build -j2      -> /tmp/gcd-base/build/gradcheck-dist
# Measured on the 2-core build machine: --quick with NEW only 56 s (load average ~3); everything with
# OLD and --reps 1 26 min (load average 4-9, other builds running); the default reps take longer.
set -u
here=$(cd "$(dirname "$0")" && pwd)
opts=() bins=()
while [ $# -gt 0 ]; do
    case $1 in
        --quick) opts+=("$1") ;;
        --reps) opts+=("$1" "${2:?--reps needs a number}"); shift ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        -*) echo "bench.sh: unknown option $1" >&2; exit 2 ;;
        *) bins+=("$1") ;;
    esac
    shift
done
[ ${#bins[@]} -le 2 ] || { echo "bench.sh: at most two binaries, NEW and OLD" >&2; exit 2; }
[ ${#bins[@]} -ge 1 ] || bins=(build/gradcheck-dist)
for b in "${bins[@]}"; do
    [ -x "$b" ] || { echo "bench.sh: $b: not an executable (build it first)" >&2; exit 2; }
done
tmp=$(mktemp -d) || exit 3
trap 'rm -rf "$tmp"' EXIT
mpicc -O2 -o "$tmp/mpi_hello" "$here/mpi_hello.c" || { echo "bench.sh: mpicc cannot build mpi_hello.c" >&2; exit 3; }
/usr/bin/python3 "$here/bench.py" --hello "$tmp/mpi_hello" "${opts[@]}" "${bins[@]}"
