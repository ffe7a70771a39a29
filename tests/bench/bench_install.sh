#!/usr/bin/env bash
# The install time of the package without torch: REPS times, a fresh venv (not timed), then
# `pip install SOURCE_DIR` (timed: scikit-build-core's isolated env, CMake configure, the C build, the
# install); then the wheel that build makes, installed into a fresh venv (timed). pip's cache is kept
# (scikit-build-core comes from it after the first run), as a user's second install would find it.
# usage: bash tests/bench/bench_install.sh [SOURCE_DIR] [REPS]   (default: this checkout, 3)
set -euo pipefail
SRC=$(realpath "${1:-$(dirname "$0")/../..}")
REPS=${2:-3}
work=$(mktemp -d /tmp/gradcheck-bench-install.XXXXXX)
trap 'rm -rf "$work"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
echo "pip install of $SRC ($(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo '?')), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load $(cut -d' ' -f1-3 /proc/loadavg)"
src_ms=() whl_ms=()
for r in $(seq "$REPS"); do
    rm -rf "$work/v" "$work/w" "$work/dist"
    /usr/bin/python3 -m venv "$work/v"
    t=$(date +%s%N); "$work/v/bin/pip" install -q "$SRC"; src_ms+=("$(ms "$t")")
    "$work/v/bin/pip" wheel -q --no-deps -w "$work/dist" "$SRC" >/dev/null
    /usr/bin/python3 -m venv "$work/w"
    t=$(date +%s%N); "$work/w/bin/pip" install -q "$work"/dist/*.whl; whl_ms+=("$(ms "$t")")
    echo "run $r: pip install SOURCE_DIR ${src_ms[-1]} ms, pip install the wheel ${whl_ms[-1]} ms ($(du -k "$work"/dist/*.whl | cut -f1) KiB), load $(cut -d' ' -f1-3 /proc/loadavg)"
done
echo "median: pip install SOURCE_DIR $(printf '%s\n' "${src_ms[@]}" | sort -n | sed -n "$(( (REPS + 1) / 2 ))p") ms, the wheel $(printf '%s\n' "${whl_ms[@]}" | sort -n | sed -n "$(( (REPS + 1) / 2 ))p") ms"
