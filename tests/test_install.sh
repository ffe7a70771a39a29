#!/usr/bin/env bash
# One package, installed as a user installs it: pip into fresh venvs, then used from a directory outside
# the source tree, with no GRADCHECK_DIST and PATH = the venv's bin + the system's.
#   A: pip install SOURCE_DIR (over Debian's torch: --system-site-packages): --version agrees with
#      __version__; run --world 2; the README's example dumps and check (exit 0, and exit 1 naming
#      logit_scale for the no-grad gather); a pytest calling check_ddp with the venv's bin NOT on PATH and
#      a decoy gradcheck-dist there instead (the package must find its own program).
#   python -m build: an sdist, and a wheel built from that sdist in a fresh isolated env.
#   B: pip install the wheel into a second fresh venv: the same, quicker (version, run, check, pytest).
#   C: pip install the sdist as a machine with only a C compiler builds it: no MPI (GCD_MPI=OFF), cJSON
#      and xxHash fetched by CMake (GCD_FETCH_DEPS, SHA256-pinned), no OpenBLAS (GCD_BLAS=OFF), no
#      pkg-config, CMake from PyPI (cmake.version above the system's): check works, run exits 2 saying
#      there is no MPI and how to get one.
# usage: test_install.sh SOURCE_DIR   (needs python3-venv, Debian's python3-torch, and PyPI: scikit-build-core,
#        build, pytest, cmake; GitHub or deb.debian.org for C's sources)
set -u
SRC=$(realpath "$1")
passed=0 failed=0
ok() { echo "ok $1"; passed=$((passed + 1)); }
bad() { echo "FAIL $1: $2"; failed=$((failed + 1)); }
work=$(mktemp -d /tmp/gradcheck-install.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
unset GRADCHECK_DIST PYTHONPATH VIRTUAL_ENV
SYS_PATH=/usr/local/bin:/usr/bin:/bin
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
want_version=$(head -n1 "$SRC/python/gradcheck_dist/VERSION")
cp "$SRC/python/examples/clip_step.py" .

# a gradcheck-dist on PATH that is not the package's: whoever runs it fails, loudly
mkdir decoy
printf '#!/bin/sh\necho "decoy gradcheck-dist ran: $*" >&2\nexit 97\n' >decoy/gradcheck-dist
chmod +x decoy/gradcheck-dist

cat >test_installed.py <<'EOF'
# check_ddp from an installed gradcheck_dist: its own program, not the decoy on PATH, not GRADCHECK_DIST
import os, sys, torch
import gradcheck_dist
from gradcheck_dist import check_ddp
from gradcheck_dist.harness import find_binary

BIN = os.path.join(os.path.dirname(sys.executable), "gradcheck-dist")

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(6, 5), torch.nn.Linear(5, 1)
    def forward(self, x, y):
        return torch.nn.functional.mse_loss(self.b(torch.tanh(self.a(x))), y)

def step(model, batch, rank, world):
    return model(*batch)

def test_finds_its_own_binary():
    assert "GRADCHECK_DIST" not in os.environ
    assert not gradcheck_dist.__file__.startswith(os.environ["GCD_SRC"] + os.sep), gradcheck_dist.__file__
    assert find_binary() == BIN, (find_binary(), BIN)

def test_check_ddp():
    report = check_ddp(Net, step, (torch.randn(8, 6), torch.randn(8, 1)), world=2)
    assert report["result"] == "pass", report["result"]
EOF

# venv NAME [--system-site-packages]: a fresh venv in $work/NAME
venv() { /usr/bin/python3 -m venv "${@:2}" "$work/$1" || { bad "$1" "python3 -m venv failed"; exit 1; }; }
# quick NAME: the installed program and package agree, from $work, GRADCHECK_DIST unset
quick() {
    local v=$work/$1 out rc
    out=$(PATH=$v/bin:$SYS_PATH gradcheck-dist --version 2>&1); rc=$?
    local where; where=$(PATH=$v/bin:$SYS_PATH command -v gradcheck-dist)
    local pyv; pyv=$("$v/bin/python" -c 'import gradcheck_dist; print(gradcheck_dist.__version__)' 2>&1)
    if [ $rc = 0 ] && [ "$where" = "$v/bin/gradcheck-dist" ] && [ "$(head -n1 <<<"$out")" = "gradcheck-dist $want_version" ] && [ "$pyv" = "$want_version" ]; then
        ok "$1: gradcheck-dist on the venv's PATH ($where); --version and __version__ both $want_version"
    else
        bad "$1 version" "exit $rc, on PATH: $where, --version: $(head -n1 <<<"$out"), __version__: $pyv, VERSION: $want_version"
    fi
}
# checks NAME: run --world 2, check on dumps (exit 0 and 1), pytest with check_ddp (own binary, decoy on PATH)
checks() {
    local v=$work/$1 rc
    PATH=$v/bin:$SYS_PATH timeout 300 gradcheck-dist run --world 2 --no-json >"$1.run.out" 2>&1; rc=$?
    if [ $rc = 0 ] && grep -q "result: pass (exit 0)" "$1.run.out"; then ok "$1: run --world 2 exits 0"; else bad "$1 run" "exit $rc: $(tail -3 "$1.run.out")"; fi
    PATH=$v/bin:$SYS_PATH timeout 60 gradcheck-dist check dumps --ref ref/rank0.safetensors --no-json >"$1.check.out" 2>&1; rc=$?
    if [ $rc = 0 ]; then ok "$1: check on the example's dumps exits 0"; else bad "$1 check" "exit $rc: $(tail -3 "$1.check.out")"; fi
    PATH=$v/bin:$SYS_PATH timeout 60 gradcheck-dist check nograd --ref ref/rank0.safetensors --no-json >"$1.nograd.out" 2>&1; rc=$?
    if [ $rc = 1 ] && grep -q "receives a gradient: logit_scale" "$1.nograd.out"; then ok "$1: check on the no-grad gather's dumps exits 1 naming logit_scale"
    else bad "$1 check nograd" "exit $rc: $(tail -3 "$1.nograd.out")"; fi
    PATH=$work/decoy:$SYS_PATH GCD_SRC=$SRC timeout 600 "$v/bin/python" -m pytest -q -p no:cacheprovider test_installed.py >"$1.pytest.out" 2>&1; rc=$?
    if [ $rc = 0 ] && grep -q "2 passed" "$1.pytest.out"; then ok "$1: pytest: check_ddp runs the package's own program (a decoy first on PATH, no GRADCHECK_DIST)"
    else bad "$1 pytest" "exit $rc: $(grep -v '^$' "$1.pytest.out" | tail -12)"; fi
}

# ---- A: pip install SOURCE_DIR, over Debian's torch
venv a --system-site-packages
"$work/a/bin/python" -m pip install -q pytest==9.2.0 build==1.6.1 >pip-tools.out 2>&1 || { bad "A tools" "$(tail -5 pip-tools.out)"; exit 1; }
t0=$(date +%s%N)
if "$work/a/bin/python" -m pip install -q "$SRC" >pip-a.out 2>&1; then
    ok "A: pip install SOURCE_DIR ($(( ($(date +%s%N) - t0) / 1000000 )) ms)"
else
    bad "A: pip install SOURCE_DIR" "$(tail -20 pip-a.out)"; exit 1
fi
quick a
# the README's example, with the venv's python (dumps on 2 gloo ranks, the reference, the no-grad gather)
py=$work/a/bin/python
if PATH=$work/a/bin:$SYS_PATH timeout 300 "$py" clip_step.py --world 2 --out dumps >ex.out 2>&1 &&
   PATH=$work/a/bin:$SYS_PATH timeout 300 "$py" clip_step.py --out ref >>ex.out 2>&1 &&
   PATH=$work/a/bin:$SYS_PATH timeout 300 "$py" clip_step.py --world 2 --out nograd --gather nograd >>ex.out 2>&1; then
    ok "A: the example dumped its gradients (dumps, ref, nograd)"
else
    bad "A example" "$(grep -v reducer ex.out | tail -5)"
fi
checks a

# ---- the sdist, and a wheel built from it (python -m build: each in a fresh isolated env)
if "$work/a/bin/python" -m build --outdir "$work/dist" "$SRC" >build.out 2>&1 && ls dist/*.tar.gz dist/*.whl >/dev/null 2>&1; then
    ok "python -m build: $(cd dist && echo *)"
else
    bad "python -m build" "$(tail -20 build.out)"; exit 1
fi

# ---- B: the wheel in a second fresh venv
venv b --system-site-packages
if "$work/b/bin/python" -m pip install -q pytest==9.2.0 dist/*.whl >pip-b.out 2>&1; then ok "B: pip install the wheel"; else bad "B: pip install the wheel" "$(tail -20 pip-b.out)"; fi
quick b
checks b

# ---- C: the sdist on a bare machine (no MPI, fetched cJSON and xxHash, no OpenBLAS, no pkg-config, PyPI's CMake)
venv c
cflags=(--config-settings=cmake.version=">3.25.1" --config-settings=cmake.define.GCD_MPI=OFF --config-settings=cmake.define.GCD_FETCH_DEPS=ON --config-settings=cmake.define.GCD_BLAS=OFF
        --config-settings=cmake.define.CMAKE_DISABLE_FIND_PACKAGE_PkgConfig=ON --config-settings=build.verbose=true)
if "$work/c/bin/python" -m pip install -v "${cflags[@]}" dist/*.tar.gz >pip-c.out 2>&1; then
    ok "C: pip install the sdist without MPI, OpenBLAS or pkg-config"
else
    bad "C: pip install the sdist" "$(tail -30 pip-c.out)"; exit 1
fi
for w in "backend mpi: OFF" "cJSON: 1.7.15 from source, SHA256-pinned" "xxHash: 0.8.1 from source, SHA256-pinned" "BLAS: none, plain loops"; do
    grep -q "$w" pip-c.out || bad "C configure" "CMake did not say \"$w\""
done
grep -Eq "cmake(/data)?/bin/cmake|Downloading cmake|cmake-[0-9.]+-py" pip-c.out || bad "C cmake" "no sign that CMake came from PyPI: $(grep -i cmake pip-c.out | head -5)"
quick c
if ldd "$work/c/bin/gradcheck-dist" | grep -Eq "libmpi|libcjson|libxxhash|openblas"; then bad "C libraries" "$(ldd "$work/c/bin/gradcheck-dist")"; else ok "C: the program links no MPI, cJSON, xxHash or BLAS library"; fi
PATH=$work/c/bin:$SYS_PATH timeout 60 gradcheck-dist check dumps --ref ref/rank0.safetensors --no-json >c.check.out 2>&1; rc=$?
if [ $rc = 0 ]; then ok "C: check on the example's dumps exits 0"; else bad "C check" "exit $rc: $(tail -3 c.check.out)"; fi
PATH=$work/c/bin:$SYS_PATH timeout 60 gradcheck-dist check nograd --ref ref/rank0.safetensors --no-json >c.nograd.out 2>&1; rc=$?
if [ $rc = 1 ] && grep -q "receives a gradient: logit_scale" c.nograd.out; then ok "C: check on the no-grad dumps exits 1 naming logit_scale"; else bad "C check nograd" "exit $rc: $(tail -3 c.nograd.out)"; fi
PATH=$work/c/bin:$SYS_PATH timeout 60 gradcheck-dist run --world 2 >c.run.out 2>&1; rc=$?
if [ $rc = 2 ] && grep -q "this build has no MPI" c.run.out && grep -q "apt-get install libopenmpi-dev openmpi-bin" c.run.out; then
    ok "C: run exits 2: $(head -n1 c.run.out)"
else
    bad "C run" "exit $rc, expected 2 and the no-MPI message: $(cat c.run.out)"
fi

echo "$passed passed, $failed failed"
[ $failed = 0 ]
