#!/usr/bin/env bash
# bench.sh compares equal work: at a tiny size (world 4, every mode) bench_torch.py's DDP means and
# reference equal the report's `reduced` and `reference` (relative 1e-12, None where the report has
# none). Fails, loudly, when torch is missing: it never skips.
# usage: test_bench_torch.sh GRADCHECK_DIST PYTHON SOURCE_DIR
set -u
G=$1 PY=$2 SRC=$3
work=$(mktemp -d) || exit 1
trap 'rm -rf "$work"' EXIT
"$PY" -c "import torch" || { echo "FAIL: torch cannot be imported by $PY (apt-get install python3-torch)"; exit 1; }
"$G" run --world 4 --probe contrastive --batch 3 --dim-img 5 --dim-txt 4 --dim-emb 3 --json "$work/r.json" >"$work/out" 2>&1 \
    || { echo "FAIL: gradcheck-dist run exited $?:"; cat "$work/out"; exit 1; }
timeout 100 "$PY" "$SRC/tests/bench/bench_torch.py" --check "$work/r.json" --timeout 90
