#!/usr/bin/env bash
# Fuzz the safetensors reader: build tests/fuzz_safetensors.c with clang (libFuzzer, ASan, UBSan) into
# BUILD_DIR, write the seed corpus (tests/fuzz_seeds.py), run for GCD_FUZZ_SECONDS (default 60).
#   tests/fuzz.sh BUILD_DIR [PYTHON]
# Any crash, leak, UB report, timeout (5 s an input) or RSS over 2 GB fails; the reproducer is left in
# BUILD_DIR/artifacts. Needs clang and libclang-rt-14-dev (libFuzzer) on Debian 12.
# The last line is `1 passed, 0 failed` or `0 passed, 1 failed`.
set -u
build=${1:?usage: fuzz.sh BUILD_DIR [PYTHON]}
python=${2:-/usr/bin/python3}
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

# shellcheck disable=SC2086
"$cc" -g -O1 -std=gnu11 -Wall -Wextra -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -I"$root/src" "$root/src/safetensors.c" "$root/src/util.c" "$root/tests/fuzz_safetensors.c" $cjson -lm -lpthread \
    -o "$build/fuzz_safetensors" ||
    fail "the fuzz target does not build (libFuzzer is in libclang-rt-14-dev on Debian 12)"

rm -rf "$build/seeds" "$build/artifacts"
mkdir -p "$build/seeds" "$build/corpus" "$build/artifacts"
"$python" "$root/tests/fuzz_seeds.py" "$build/seeds" || fail "fuzz_seeds.py failed"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# the corpus directory comes first: what the fuzzer finds goes there and is kept for the next run
"$build/fuzz_safetensors" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=5 -max_len=16384 \
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
    fail "libFuzzer exit $rc; reproduce with: $build/fuzz_safetensors ${left:-ARTIFACT}"
fi
echo "1 passed, 0 failed"
