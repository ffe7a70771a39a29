#!/usr/bin/env bash
# Throughput of `gradcheck-dist check`, side by side with its peer (numpy doing the same checks over
# the same files) and this machine's single-thread memcpy bandwidth, in one run. Figures, not
# pass/fail, except that check must exit 0: the dumps hold identical ranks and an equal reference.
# For each dtype (F32, BF16): write 4 ranks + ref of GCD_BENCH_BYTES each (default 1G), warm the
# page cache, time check (the scan: --no-json; and with its report, which adds the XXH3-128 of every
# file, hashed on a pool of threads while the scan runs) and numpy_check.py (process wall time, best of GCD_BENCH_REPS, default 3),
# drop the files. GB/s is over the bytes of all the files read (4 ranks + ref). The column "2 refs" times
# the same check with a second reference (a copy of the first: --ref A --ref B, issue 32's measured noise)
# and "2ref/1ref" is its time over the one-reference scan's (the target: at most 1.3).
# usage: bash tests/bench/check_bench.sh [path/to/gradcheck-dist]
#   env: GCD_BENCH_BYTES=256M (a quick run), GCD_BENCH_REPS=3, GCD_BENCH_TMP=/some/dir (temp parent),
#        GCD_BENCH_DTYPES="F32" (default "F32 BF16")
set -u
here=$(cd "$(dirname "$0")" && pwd)
G=$(realpath -m "${1:-build/gradcheck-dist}")
PY=/usr/bin/python3
BYTES=${GCD_BENCH_BYTES:-1G}
REPS=${GCD_BENCH_REPS:-3}
WORLD=4
tmp=$(mktemp -d "${GCD_BENCH_TMP:-${TMPDIR:-/tmp}}/gcd-check-bench.XXXXXX") || exit 3
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

cc -std=c11 -O2 -o "$tmp/memcpy_bw" "$here/memcpy_bw.c" || { echo "check_bench: cannot build memcpy_bw" >&2; exit 3; }
memcpy=$("$tmp/memcpy_bw" 256 10 2>/dev/null | awk '$1 == "memcpy_gbs" {print $2}')

load0=$(cut -d' ' -f1 /proc/loadavg)
have_check=1
if ! "$G" check --help >/dev/null 2>&1; then
    have_check=0
    echo "check_bench: '$G check --help' fails: no check subcommand to time (numpy and memcpy only)" >&2
fi

# best wall time of REPS runs of a command, in seconds, into $best; its last exit status into $last_rc
best_of() {
    local t0 t1 dt i
    best="" last_rc=""
    for ((i = 0; i < REPS; i++)); do
        t0=$EPOCHREALTIME
        "$@" >"$tmp/out" 2>&1
        last_rc=$?
        t1=$EPOCHREALTIME
        dt=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", b - a}')
        if [ -z "$best" ] || awk -v a="$dt" -v b="$best" 'BEGIN {exit !(a < b)}'; then best=$dt; fi
        [ "$last_rc" = 0 ] || break
    done
}

rows=()
status=0
for dtype in ${GCD_BENCH_DTYPES:-F32 BF16}; do
    d="$tmp/$dtype"
    "$PY" "$here/write_dumps.py" "$d" --world "$WORLD" --bytes-per-rank "$BYTES" --dtype "$dtype" --stage reduced \
        || { echo "check_bench: write_dumps.py failed for $dtype" >&2; exit 3; }
    cat "$d"/*.safetensors >/dev/null
    scanned=$(cat "$d"/*.safetensors | wc -c)

    cs="n/a" cg="n/a" ratio="n/a" hs="n/a" hg="n/a" hratio="n/a" ts="n/a" tratio="n/a"
    if [ "$have_check" = 1 ]; then
        best_of "$G" check "$d" --ref "$d/ref.safetensors" --no-json
        cs=$best
        if [ "$last_rc" = 0 ]; then
            echo "check_bench: $dtype: check exited 0 (clean verdict on identical ranks and an equal reference)" >&2
            cg=$(awk -v b="$scanned" -v s="$cs" 'BEGIN {printf "%.2f", b / s / 1e9}')
            ratio=$(awk -v c="$cg" -v m="$memcpy" 'BEGIN {printf "%.2f", c / m}')
            best_of "$G" check "$d" --ref "$d/ref.safetensors" --json "$tmp/report.json"
            hs=$best
            cp "$d/ref.safetensors" "$tmp/ref2.safetensors"
            best_of "$G" check "$d" --ref "$d/ref.safetensors" --ref "$tmp/ref2.safetensors" --no-json
            ts=$best
            tratio=$(awk -v a="$ts" -v b="$cs" 'BEGIN {printf "%.2f", a / b}')
            rm -f "$tmp/ref2.safetensors"
            hg=$(awk -v b="$scanned" -v s="$hs" 'BEGIN {printf "%.2f", b / s / 1e9}')
            hratio=$(awk -v c="$hg" -v m="$memcpy" 'BEGIN {printf "%.2f", c / m}')
        else
            echo "check_bench: $dtype: check exited $last_rc, expected 0 (clean); its output:" >&2
            tail -n 30 "$tmp/out" >&2
            status=1 cs="rc=$last_rc"
        fi
    fi

    best_of "$PY" "$here/numpy_check.py" "$d" --ref "$d/ref.safetensors"
    ns=$best
    if [ "$last_rc" = 0 ]; then
        ng=$(awk -v b="$scanned" -v s="$ns" 'BEGIN {printf "%.2f", b / s / 1e9}')
    else
        echo "check_bench: $dtype: numpy_check.py exited $last_rc, expected 0; its output:" >&2
        tail -n 30 "$tmp/out" >&2
        status=1 ns="rc=$last_rc" ng="n/a"
    fi
    rows+=("$(printf '%-6s %11.3f %9s %9s %9s %9s %9s %9s %9s %12s %14s %9s %9s' "$dtype" \
        "$(awk -v b="$scanned" 'BEGIN {print b / 1e9}')" "$cs" "$cg" "$hs" "$hg" "$ns" "$ng" "$memcpy" "$ratio" "$hratio" "$ts" "$tratio")")
    rm -rf "$d"
done

echo
echo "gradcheck-dist check vs numpy: $WORLD ranks + ref, $BYTES per file, page cache warm, best of $REPS, $(nproc) cores"
echo "load average (1 min) at start $load0, at end $(cut -d' ' -f1 /proc/loadavg) (a busy machine lowers every figure)"
printf '%-6s %11s %9s %9s %9s %9s %9s %9s %9s %12s %14s %9s %9s\n' dtype scanned check check "+digest" "+digest" numpy numpy memcpy check/memcpy +digest/memcpy "2 refs" 2ref/1ref
printf '%-6s %11s %9s %9s %9s %9s %9s %9s %9s %12s %14s %9s %9s\n' "" GB s GB/s s GB/s s GB/s GB/s ratio ratio s ratio
printf '%s\n' "${rows[@]}"
[ "$have_check" = 1 ] || status=1
exit "$status"
