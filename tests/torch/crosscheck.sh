#!/usr/bin/env bash
# Real PyTorch agrees with gradcheck-dist: reports of every probe and mode at worlds 1-4 (a one-rank
# process group, rank-distinct inputs, the local loss) replayed on gloo with real DDP.
# usage: crosscheck.sh GRADCHECK_DIST PYTHON SOURCE_DIR
set -u
G=$1 PY=$2 SRC=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
"$PY" -c "import torch" || { echo "crosscheck: torch cannot be imported by $PY (apt-get install python3-torch)"; echo "0 passed, 1 failed"; exit 1; }
for args in "--world 1" "--world 2 --inputs random" "--world 3 --probe contrastive --local-loss" "--world 4 --probe contrastive"; do
    name=$(tr -d ' -' <<<"$args").json
    "$G" run $args --full --json "$name" >/dev/null 2>run.err || { echo "gradcheck-dist run $args failed: $(cat run.err)"; echo "0 passed, 1 failed"; exit 1; }
    reports+=("$name")
done
# the workers import torch.distributed.nn, which makes a directory in TMPDIR that their os._exit never
# removes: TMPDIR is this test's own, removed with it
TMPDIR=$work GCD_CROSSCHECK_TIMEOUT=240 timeout 600 "$PY" "$SRC/tests/torch/crosscheck.py" "${reports[@]}" 2>&1 | grep -v "reducer.cpp\|InitGoogleLogging"
exit "${PIPESTATUS[0]}"
