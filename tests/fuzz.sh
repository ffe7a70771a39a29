#!/usr/bin/env bash
# Fuzz a parser with clang (libFuzzer, ASan, UBSan), built into BUILD_DIR, for GCD_FUZZ_SECONDS (default 60):
#   safetensors: the dump reader (tests/fuzz_safetensors.c), seeds from tests/fuzz_seeds.py;
#   report:      the report loader and the renderings (tests/fuzz_report.c), seeds: reports that
#                GRADCHECK_DIST writes (run and check), and edge cases.
#   tests/fuzz.sh BUILD_DIR [PYTHON] [safetensors|report] [GRADCHECK_DIST]
# Any crash, leak, UB report, timeout (5 s an input) or RSS over 2 GB fails; the reproducer is left in
# BUILD_DIR/artifacts. Needs clang and libclang-rt-14-dev (libFuzzer) on Debian 12.
# The last line is `1 passed, 0 failed` or `0 passed, 1 failed`.
set -u
build=${1:?usage: fuzz.sh BUILD_DIR [PYTHON]}
python=${2:-/usr/bin/python3}
target=${3:-safetensors}
gcd=${4:-}
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${GCD_FUZZ_SECONDS:-60}
cc=${GCD_FUZZ_CC:-clang}

fail() {
    echo "fuzz.sh: $*" >&2
    echo "0 passed, 1 failed"
    exit 1
}

mkdir -p "$build" || fail "cannot create $build"
build=$(cd "$build" && pwd)
command -v "$cc" >/dev/null || fail "no $cc: apt-get install clang libclang-rt-14-dev"
cjson=$(pkg-config --cflags --libs libcjson) || fail "no libcjson (pkg-config): apt-get install libcjson-dev"

case $target in
    safetensors) sources=("$root/src/check/safetensors.c" "$root/src/check/f16.c") ;;
    report) sources=("$root/src/report/report_load.c" "$root/src/report/report_print.c" "$root/src/report/report_text.c" "$root/src/report/report_md.c" "$root/src/report/report_junit.c") ;;
    *) fail "unknown target '$target': safetensors or report" ;;
esac
exe=$build/fuzz_$target
# shellcheck disable=SC2086
"$cc" -g -O1 -std=gnu11 -Wall -Wextra -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -DGCD_VERSION='"fuzz"' \
    -I"$root/src" -I"$root" "${sources[@]}" "$root/src/util.c" "$root/tests/fuzz_$target.c" $cjson -lm -lpthread \
    -o "$exe" ||
    fail "the fuzz target does not build (libFuzzer is in libclang-rt-14-dev on Debian 12)"

rm -rf "$build/seeds" "$build/artifacts"
mkdir -p "$build/seeds" "$build/corpus" "$build/artifacts"   # one BUILD_DIR per target
if [ "$target" = safetensors ]; then
    "$python" "$root/tests/fuzz_seeds.py" "$build/seeds" || fail "fuzz_seeds.py failed"
else   # real reports of every kind, and the edges that once crashed a rendering
    [ -x "$gcd" ] || fail "the report target needs GRADCHECK_DIST (4th argument) to write its seeds"
    (cd "$build/seeds" && "$gcd" run --world 1 --json run1.json >/dev/null 2>&1 && "$gcd" run --world 2 --probe contrastive --steps 3 \
        --local-loss --json steps.json >/dev/null 2>&1 && "$gcd" run --world 2 --probe simplenet --summary-only --json summary.json >/dev/null 2>&1 &&
        "$gcd" run --world 2 --probe contrastive --mode on --batch 3 --dim-img 1400 --json elided.json >/dev/null 2>&1) ||
        fail "gradcheck-dist could not write the seed reports"
    "$python" - "$build/seeds" <<'PY' || fail "the edge seeds could not be written"
import json, sys, os
d = sys.argv[1]
r = json.load(open(os.path.join(d, "steps.json")))
r["runs"][0]["loss"]["per_step"] = [["-inf", "-inf"], [5, 5], [3, "nan"], ["inf", 1]]
json.dump(r, open(os.path.join(d, "inf_steps.json"), "w"))
r["command"] = ["gradcheck-dist", "run", "a\n```\nb", "`x`", "'q'"]
r["runs"][0]["findings"][0]["message"] = "<&\"'>\u0001\udcff"
json.dump(r, open(os.path.join(d, "escapes.json"), "w"))
r = json.load(open(os.path.join(d, "steps.json")))   # DEL in strings: once printed back raw
r["command"] = ["gradcheck-dist", "run", "\x7f"]
r["runs"][0]["findings"][0]["message"] = "a\x7fb"
json.dump(r, open(os.path.join(d, "del.json"), "w"))
r = json.load(open(os.path.join(d, "run1.json")))   # schema /1: the setup in every run
setups = {s.pop("probe"): s for s in r.pop("setups")}
r.pop("values")
r["schema"] = "gradcheck-dist.report/1"
for run in r["runs"]:
    run["setup"] = setups[run["probe"]]
json.dump(r, open(os.path.join(d, "schema1.json"), "w"))
PY
fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# the corpus directory comes first: what the fuzzer finds goes there and is kept for the next run
"$exe" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=5 -max_len=$([ "$target" = report ] && echo 262144 || echo 16384) \
    -print_final_stats=1 -artifact_prefix="$build/artifacts/" "$build/corpus" "$build/seeds" >"$build/fuzz.log" 2>&1
rc=$?
grep -E '^(#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units|stat::average_exec_per_sec|stat::peak_rss_mb)' "$build/fuzz.log"
left=$(find "$build/artifacts" -type f | head -5)
if [ "$rc" -ne 0 ] || [ -n "$left" ]; then
    tail -n 60 "$build/fuzz.log" >&2
    for a in $left; do
        echo "reproducer $a (base64):" >&2
        base64 -w 0 "$a" >&2
        echo >&2
    done
    fail "libFuzzer exit $rc; reproduce with: $exe ${left:-ARTIFACT}"
fi
echo "1 passed, 0 failed"
