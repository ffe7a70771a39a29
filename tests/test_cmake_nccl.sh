#!/usr/bin/env bash
# CMake reads NCCL's version from nccl.h (NCCL_MAJOR, NCCL_MINOR) and builds the backend from 2.14 on
# only, saying why when it does not: configure against fake headers, 2.12 and 2.14.
# usage: test_cmake_nccl.sh SOURCE_DIR
set -u
SRC=$1
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

configure() {   # MINOR: configure against a nccl.h saying 2.MINOR.3; prints the nccl line and warnings
    mkdir -p "$work/inc$1"
    printf '#define NCCL_MAJOR 2\n#define NCCL_MINOR %s\n#define NCCL_PATCH 3\n' "$1" >"$work/inc$1/nccl.h"
    cmake -S "$SRC" -B "$work/build$1" -DBUILD_TESTING=OFF -DNCCL_INCLUDE_DIR="$work/inc$1" 2>&1 | grep -A3 "backend nccl\|CMake Warning"
}
out=$(configure 12)
grep -q "backend nccl: OFF (NCCL 2.12.3 ($work/inc12/nccl.h) is older than 2.14" <<<"$out" || fail "2.12 must turn the backend off, saying why: $out"
grep -q "CMake Warning" <<<"$out" || fail "2.12: no warning: $out"
out=$(configure 14)
grep -q "backend nccl: ON (CUDA .*, NCCL 2.14.3," <<<"$out" || fail "2.14 must build the backend: $out"
echo "test_cmake_nccl: $fails failure(s)"
[ $fails = 0 ]
