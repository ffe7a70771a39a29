#!/usr/bin/env python3
"""`gradcheck-dist check` on dumps written byte by byte (tests/st_writer.py): every finding, every dtype,
every hostile input, and files that change while they are read.

    test_check_inputs.py GRADCHECK_DIST

Each case runs the binary (20 s limit: a hang is a failure; a signal is a failure) and asserts the exit
code and that the output names what it must: the file, the tensor, the rank. Prints `ok NAME` or
`FAIL NAME: why` per case and ends with `N passed, M failed`; exits 1 if any failed.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_writer as w  # noqa: E402

BIN = None
TMP = None
TIMEOUT = 20
os.environ["COLUMNS"] = "1000"   # the needles are phrases: the text unwrapped (test_cli.sh tests the widths)
CASES = []


class Fail(Exception):
    pass


def case(fn):
    CASES.append(fn)
    return fn


def need(cond, why):
    if not cond:
        raise Fail(why)


def fresh(name):
    d = os.path.join(TMP, name)
    os.makedirs(d, exist_ok=True)
    return d


def run(args, timeout=TIMEOUT, cmd="check"):
    argv = [BIN] + ([cmd] if cmd else []) + list(args)
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Fail(f"no answer after {timeout} s (a hang): {' '.join(argv[1:])}")
    out, err = p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")
    if p.returncode < 0:
        raise Fail(f"killed by signal {-p.returncode}: {' '.join(argv[1:])}\n{err[-800:]}")
    return p.returncode, out, err


def expect(args, code, *needles, report=False, timeout=TIMEOUT):
    """Runs check, asserts the exit code and every needle in stdout+stderr; returns (text, report)."""
    args = list(args)
    path = None
    if report:
        path = os.path.join(TMP, f"report-{time.monotonic_ns()}.json")
        args += ["--json", path]
    elif "--json" not in args:
        args += ["--no-json"]
    rc, out, err = run(args, timeout)
    text = out + err
    need(rc == code, f"exit {rc}, expected {code}: check {' '.join(args)}\n{text[-1500:]}")
    for n in needles:
        need(n in text, f"the output lacks {n!r}:\n{text[-1500:]}")
    rep = None
    if report:
        need(os.path.exists(path), "no JSON report written")
        with open(path) as f:
            rep = json.load(f)
        need(rep["exit_code"] == code, f"report exit_code {rep['exit_code']} != {code}")
    return text, rep


def params(rep):
    return {p["name"]: p for p in rep["runs"][0]["params"]}


def status(rep):
    return {p["name"]: p["status"] for p in rep["runs"][0]["params"]}


def kinds(rep):
    return [f["kind"] for f in rep["runs"][0]["findings"]]


def finding(rep, kind):
    for f in rep["runs"][0]["findings"]:
        if f["kind"] == kind:
            return f
    raise Fail(f"no {kind} finding among {kinds(rep)}")


def close(a, b, rel=1e-12):
    return a is not None and b is not None and abs(a - b) <= rel * max(abs(a), abs(b), 1e-300)


def hostile(name, content, *needles, tensor=None, extra=()):
    """A single broken file: exit 2, the message names the file (and the tensor)."""
    d = fresh("hostile")
    path = w.write(os.path.join(d, name + ".safetensors"), content)
    n = [path] + list(needles) + ([f"tensor '{tensor}'"] if tensor is not None else [])
    text, _ = expect([path, *extra], 2, *n)
    need("gradcheck-dist: check: " in text, f"no 'gradcheck-dist: check:' prefix: {text}")


R = np.random.default_rng(7)
A = np.array([1.0, -2.0, 0.5, 4.0], dtype=np.float32)
B = np.array([[0.25, 1.0, -3.0], [2.0, 0.0, 8.0]], dtype=np.float32)


def rnd(*shape, dtype=np.float64):
    return R.standard_normal(shape).astype(dtype)


# ----------------------------------------------------------------------------
# findings and statuses


@case
def finding_none_absent_on_every_rank():
    d = fresh("none")
    w.write_world(d, [{"a": A, "head": None}] * 2)
    text, rep = expect([d], 1, "head", report=True)
    need(status(rep) == {"a": "present", "head": "none"}, f"statuses {status(rep)}")
    need("none" in kinds(rep) and "head" in finding(rep, "none")["params"], f"findings {rep['runs'][0]['findings']}")
    need(params(rep)["head"]["ranks_with_grad"] == 0, "ranks_with_grad of a None param is not 0")


@case
def finding_partial_names_the_rank():
    d = fresh("partial")
    w.write_world(d, [{"a": A, "b": B}, {"a": A, "b": B}, {"a": A, "b": None}, {"a": A, "b": B}])
    text, rep = expect([d], 1, "rank 2", report=True)
    need(status(rep)["b"] == "partial", f"statuses {status(rep)}")
    f = finding(rep, "partial")
    need("rank 2" in f["message"] and "b" in f["params"], f"partial finding {f}")
    pr = params(rep)["b"]["per_rank"]
    need([r["present"] for r in pr] == [True, True, False, True], f"per_rank present {pr}")
    need(not any("path" in p or "breaks_at" in p for p in params(rep).values()), "a check report has no graph: no path, no breaks_at")
    need("path:" not in text, f"check prints no path line:\n{text}")


@case
def finding_zero_without_ref():
    d = fresh("zero")
    z = np.zeros(4, np.float32)
    w.write_world(d, [{"a": A, "z": z}] * 2)
    text, rep = expect([d], 1, "z", "exactly zero", report=True)
    need(status(rep) == {"a": "present", "z": "zero"}, f"statuses {status(rep)}")
    need("zero" in kinds(rep), f"kinds {kinds(rep)}")


@case
def finding_zero_with_ref_where_reference_is_not():
    d = fresh("zero_ref")
    z = np.zeros(4, np.float32)
    w.write_world(d, [{"a": A, "z": z}] * 2)
    ref = w.write_dump(os.path.join(TMP, "zero_ref.safetensors"), {"a": A, "z": A})
    text, rep = expect([d, "--ref", ref], 1, "z", "exactly zero where the reference", report=True)
    need(status(rep) == {"a": "ok", "z": "zero"}, f"statuses {status(rep)}")


@case
def zero_with_zero_reference_is_ok():
    d = fresh("zero_zero")
    z = np.zeros(4, np.float32)
    w.write_world(d, [{"a": A, "z": z}] * 2)
    ref = w.write_dump(os.path.join(TMP, "zero_zero_ref.safetensors"), {"a": A, "z": z})
    text, rep = expect([d, "--ref", ref], 0, report=True)
    need(status(rep) == {"a": "ok", "z": "ok"}, f"statuses {status(rep)}")


X8 = np.arange(1, 9, dtype=np.float32)


def nonfinite_case(name, per_rank, want, stage="reduced"):
    """per_rank: {index: value} planted into X8 on each rank; want: [(count, first index)] per rank."""
    d = fresh(name)
    grads = []
    for plant in per_rank:
        x = X8.copy()
        for i, v in plant.items():
            x[i] = v
        grads.append({"p": x, "ok": X8})
    w.write_world(d, grads, stage=stage)
    bad = [k for k, (c, _) in enumerate(want) if c]
    text, rep = expect([d], 1, "p", "rank %d" % bad[0], "first at index %d" % want[bad[0]][1], report=True)
    need(status(rep) == {"p": "nonfinite", "ok": "present"}, f"statuses {status(rep)}")
    got = [(r["nonfinite"], r["first_nonfinite"]) for r in params(rep)["p"]["per_rank"]]
    need(got == want, f"per-rank (count, first index) {got}, expected {want}")
    need("nonfinite" in kinds(rep), f"kinds {kinds(rep)}")


@case
def finding_nonfinite_nan_on_rank_1_only():
    # stage reduced: g is rank 0's gradient, which is finite; rank 1's NaN must still be found
    nonfinite_case("nonfinite_nan", [{}, {5: np.nan}], [(0, None), (1, 5)])


@case
def finding_nonfinite_nan_on_rank_1_stage_local():
    nonfinite_case("nonfinite_nan_local", [{}, {5: np.nan}], [(0, None), (1, 5)], stage="local")


@case
def finding_nonfinite_pos_inf_first_index_per_rank():
    nonfinite_case("nonfinite_pinf", [{0: np.inf}, {3: np.inf, 6: np.inf}], [(1, 0), (2, 3)])


@case
def finding_nonfinite_neg_inf_on_every_rank():
    nonfinite_case("nonfinite_ninf", [{7: -np.inf}, {7: -np.inf}, {7: -np.inf}], [(1, 7)] * 3)


@case
def finding_nonfinite_inf_on_rank_2_only_is_not_disagree():
    nonfinite_case("nonfinite_inf_r2", [{}, {}, {1: np.inf}], [(0, None), (0, None), (1, 1)])


@case
def finding_disagree_stage_reduced_names_rank_3():
    d = fresh("disagree")
    g = rnd(5, 3)
    bad = g.copy(); bad[2, 1] += 0.5
    w.write_world(d, [{"w": g, "u": A}, {"w": g, "u": A}, {"w": g, "u": A}, {"w": bad, "u": A}])
    text, rep = expect([d], 1, "rank 3", report=True)
    need(status(rep) == {"w": "disagree", "u": "present"}, f"statuses {status(rep)}")
    p = params(rep)["w"]
    need([r["differs"] for r in p["per_rank"]] == [False, False, False, True], f"differs {p['per_rank']}")
    need(close(p["max_rank_diff"], 0.5, 1e-9), f"max_rank_diff {p['max_rank_diff']}")
    need("rank 3" in finding(rep, "disagree")["message"], "disagree message lacks rank 3")


@case
def stage_local_mean_matches_reference():
    d = fresh("local_ok")
    g = [rnd(6, 2) for _ in range(4)]
    mean = sum(g) / 4
    w.write_world(d, [{"w": g[k], "b": g[k][0]} for k in range(4)], stage="local")
    ref = w.write_dump(os.path.join(TMP, "local_ok_ref.safetensors"), {"w": mean, "b": mean[0]})
    text, rep = expect([d, "--ref", ref], 0, report=True)
    need(status(rep) == {"w": "ok", "b": "ok"}, f"statuses {status(rep)}")
    need(rep["runs"][0]["stage"] == "local", f"stage {rep['runs'][0]['stage']}")
    need(close(params(rep)["w"]["norm"], float(np.linalg.norm(mean)), 1e-12), "norm is not ||sum/world||")


@case
def stage_local_partial_counts_none_as_zeros():
    d = fresh("local_partial")
    g = [rnd(5) for _ in range(3)]
    w.write_world(d, [{"w": g[0], "a": A}, {"w": None, "a": A}, {"w": g[2], "a": A}], stage="local")
    mean = (g[0] + g[2]) / 3   # rank 1's None counts as zeros
    ref = w.write_dump(os.path.join(TMP, "local_partial_ref.safetensors"), {"w": mean, "a": A})
    text, rep = expect([d, "--ref", ref], 1, "rank 1", report=True)
    need(status(rep) == {"w": "partial", "a": "ok"}, f"statuses {status(rep)}")
    p = params(rep)["w"]
    need(close(p["norm"], float(np.linalg.norm(mean)), 1e-12), f"norm {p['norm']} != ||(g0+g2)/3|| {np.linalg.norm(mean)}")
    need(p["rel_err"] is not None and p["rel_err"] < 1e-12, f"rel_err {p['rel_err']}: None is not counted as zeros")


@case
def ok_matches_reference_exit_0():
    d = fresh("ok")
    g = rnd(3, 4)
    w.write_world(d, [{"w": g, "a": A}] * 3)
    ref = w.write_dump(os.path.join(TMP, "ok_ref.safetensors"), {"w": g, "a": A})
    text, rep = expect([d, "--ref", ref], 0, "matches the single-process reference", report=True)
    need(status(rep) == {"w": "ok", "a": "ok"}, f"statuses {status(rep)}")
    need(rep["result"] == "pass", f"result {rep['result']}")


@case
def scaled_quarter_is_one_over_world():
    d = fresh("scaled")
    r = rnd(4, 4)
    w.write_world(d, [{"w": r / 4, "a": A}] * 4)
    ref = w.write_dump(os.path.join(TMP, "scaled_ref.safetensors"), {"w": r, "a": A})
    text, rep = expect([d, "--ref", ref], 1, "0.25", "= 1/world", report=True)
    need(status(rep) == {"w": "scaled", "a": "ok"}, f"statuses {status(rep)}")
    need(close(params(rep)["w"]["scale"], 0.25, 1e-12), f"scale {params(rep)['w']['scale']}")
    need("scaled" in kinds(rep), f"kinds {kinds(rep)}")


@case
def scaled_by_a_negative_factor_is_mismatch():
    d = fresh("negscale")
    r = rnd(10)
    w.write_world(d, [{"w": -2 * r}] * 2)
    ref = w.write_dump(os.path.join(TMP, "negscale_ref.safetensors"), {"w": r})
    text, rep = expect([d, "--ref", ref], 1, "w", report=True)
    need(status(rep) == {"w": "mismatch"}, f"statuses {status(rep)}")
    need(close(params(rep)["w"]["cosine"], -1.0, 1e-12), f"cosine {params(rep)['w']['cosine']}")


@case
def mismatch_reports_relative_error_and_cosine():
    d = fresh("mismatch")
    g, r = rnd(50), rnd(50)
    w.write_world(d, [{"w": g}] * 2)
    ref = w.write_dump(os.path.join(TMP, "mismatch_ref.safetensors"), {"w": r})
    rel = float(np.linalg.norm(g - r) / np.linalg.norm(r))
    cos = float(g @ r / np.linalg.norm(g) / np.linalg.norm(r))
    text, rep = expect([d, "--ref", ref], 1, "relative error %.3g" % rel, "cosine %.3g" % cos, report=True)
    p = params(rep)["w"]
    need(p["status"] == "mismatch" and close(p["rel_err"], rel, 1e-9) and close(p["cosine"], cos, 1e-9), f"param {p}")
    need("mismatch" in kinds(rep), f"kinds {kinds(rep)}")


@case
def present_without_ref_exit_0():
    d = fresh("present")
    w.write_world(d, [{"w": rnd(3), "a": A}] * 2)
    text, rep = expect([d], 0, report=True)
    need(status(rep) == {"w": "present", "a": "present"}, f"statuses {status(rep)}")
    need(rep["runs"][0]["reference"] is None, "reference is not null")


@case
def unused_head_reference_none_too():
    d = fresh("unused")
    w.write_world(d, [{"a": A, "head.w": None}] * 2)
    ref = w.write_dump(os.path.join(TMP, "unused_ref.safetensors"), {"a": A, "head.w": None})
    # not a distributed-training defect: a note (test_check_verdicts.py has the mixed case)
    text, rep = expect([d, "--ref", ref], 0, "head.w", "nor in the single-process reference", report=True)
    need(status(rep) == {"a": "ok", "head.w": "none"}, f"statuses {status(rep)}")
    need("none" not in kinds(rep), f"a none finding for an unused parameter: {kinds(rep)}")


@case
def ignore_a_failing_param_exits_0():
    d = fresh("ignore")
    w.write_world(d, [{"a": A, "head.w": None, "head.b": None}] * 2)
    expect([d], 1, "head")
    text, rep = expect([d, "--ignore", "head.*"], 0, report=True)
    need(status(rep) == {"a": "present"}, f"statuses {status(rep)}")
    expect([d, "--ignore=head.w", "--ignore", "head.b"], 0)


@case
def tol_override():
    d = fresh("tol")
    r = rnd(100)
    g = r + 1e-4 * np.linalg.norm(r) / 10 * rnd(100)   # relative error ~1e-4, not parallel
    w.write_world(d, [{"w": g}] * 2)
    ref = w.write_dump(os.path.join(TMP, "tol_ref.safetensors"), {"w": r})
    text, rep = expect([d, "--ref", ref], 1, report=True)   # F64: 1e-9
    need(status(rep) == {"w": "mismatch"}, f"statuses {status(rep)}")
    text, rep = expect([d, "--ref", ref, "--tol", "1e-3"], 0, "tolerance 0.001 (--tol)", report=True)
    need(rep["tolerance"] == 1e-3 and rep["runs"][0]["tolerance"] == 1e-3, f"tolerance {rep['tolerance']}")
    need(rep["runs"][0]["tolerance_from_dtypes"] == 1e-9, f"from dtypes {rep['runs'][0]['tolerance_from_dtypes']}")
    expect([d, "--ref", ref, "--tol=1e-3"], 0)


@case
def default_tolerance_per_dtype():
    x = np.array([1.0, 2.0, -0.5])
    for dt, raw, tol in [("F64", x, 1e-9), ("F32", x.astype(np.float32), 1e-5), ("F16", x.astype(np.float16), 1e-2),
                         ("BF16", w.bf16(x), 1e-2)]:
        d = fresh("tol_" + dt)
        w.write_world(d, [{"w": raw}] * 2)
        text, rep = expect([d], 0, "the loosest %g (from the dtypes)" % tol, report=True)
        need(rep["tolerance"] == tol, f"{dt}: tolerance {rep['tolerance']}, expected {tol}")
        need(params(rep)["w"]["dtype"] == dt, f"{dt}: dtype {params(rep)['w']['dtype']}")
        need(params(rep)["w"]["tol"] == tol and params(rep)["w"]["tol_source"] == "claimed", f"{dt}: {params(rep)['w']}")
    d = fresh("tol_mixed")   # per tensor: the F16 one's 1e-2 never loosens the F64 one
    w.write_world(d, [{"w": x, "v": x.astype(np.float16)}] * 2)
    text, rep = expect([d], 0, "the loosest 0.01", report=True)
    need(params(rep)["w"]["tol"] == 1e-9 and params(rep)["v"]["tol"] == 1e-2, f"mixed: {params(rep)}")


@case
def directory_or_list_of_files_same_verdict():
    d = fresh("dir_vs_files")
    g = rnd(4)
    # names that sort differently from their ranks
    paths = [w.write_dump(os.path.join(d, n), {"w": g, "z": np.zeros(2)}, rank=k, world=3)
             for k, n in [(2, "a.safetensors"), (0, "b.safetensors"), (1, "c.safetensors")]]
    w.write(os.path.join(d, "notes.txt"), b"not a dump")
    _, r1 = expect([d], 1, report=True)
    _, r2 = expect(paths[::-1], 1, report=True)
    need(status(r1) == status(r2) == {"w": "present", "z": "zero"}, f"{status(r1)} vs {status(r2)}")
    need([x["rank"] for x in r1["runs"][0]["dumps"]] == [0, 1, 2], f"dumps {r1['runs'][0]['dumps']}")


@case
def ref_inside_dump_dir_is_skipped():
    d = fresh("ref_inside")
    g = rnd(4)
    w.write_world(d, [{"w": g}] * 2)
    ref = w.write_dump(os.path.join(d, "ref.safetensors"), {"w": g})
    text, rep = expect([d, "--ref", ref], 0, report=True)
    need(len(rep["runs"][0]["dumps"]) == 2, f"dumps {rep['runs'][0]['dumps']}")
    need(status(rep) == {"w": "ok"}, f"statuses {status(rep)}")


@case
def json_to_stdout():
    d = fresh("json_stdout")
    w.write_world(d, [{"w": A}] * 2)
    rc, out, err = run([d, "--json", "-"])
    need(rc == 0, f"exit {rc}: {err}")
    rep = json.loads(out)
    need(rep["result"] == "pass" and "present" in err, f"stdout {out[:200]} stderr {err[:200]}")


# ----------------------------------------------------------------------------
# dtypes

F16_BITS = [0x0000, 0x8000, 0x0001, 0x03ff, 0x0400, 0x3c00, 0xc000, 0x7bff, 0xfbff, 0x3555]
BF16_BITS = [0x0000, 0x0001, 0x007f, 0x0080, 0x3f80, 0xbfa0, 0x7f7f, 0xff7f, 0x4049, 0x3e80]


def f16_from_bits(bits):
    return w.Raw("F16", [len(bits)], np.array(bits, "<u2").tobytes())


def bf16_from_bits(bits):
    return w.Raw("BF16", [len(bits)], np.array(bits, "<u2").tobytes())


def f16_values(bits):
    return np.array(bits, "<u2").view(np.float16).astype(np.float64)


def bf16_values(bits):
    return (np.array(bits, "<u4") << 16).view(np.float32).astype(np.float64)


@case
def dtypes_read_exactly():
    d = fresh("dtypes")
    f64 = np.array([1e-300, -2.5, 3.0e300 / 1e300, np.pi, -1e-5, 7.0])
    f32 = np.array([1.5e-45, -2.5, 3.4028234663852886e38 / 1e30, 0.1, 1e-38, 9.0], np.float32)
    want = {"f64": f64, "f32": f32.astype(np.float64), "f16": f16_values(F16_BITS), "bf16": bf16_values(BF16_BITS)}
    grads = {"f64": f64, "f32": f32, "f16": f16_from_bits(F16_BITS), "bf16": bf16_from_bits(BF16_BITS)}
    w.write_world(d, [grads] * 2)
    ref = w.write_dump(os.path.join(TMP, "dtypes_ref.safetensors"), want)   # the same values in F64
    text, rep = expect([d, "--ref", ref], 0, report=True)
    p = params(rep)
    for name, v in want.items():
        need(p[name]["dtype"] == name.upper(), f"{name}: dtype {p[name]['dtype']}")
        need(close(p[name]["norm"], float(np.sqrt(np.sum(v * v))), 1e-13), f"{name}: norm {p[name]['norm']!r} != numpy {np.linalg.norm(v)!r}")
        need(p[name]["rel_err"] == 0, f"{name}: rel_err {p[name]['rel_err']!r}: a value is read differently from numpy")
        need(p[name]["status"] == "ok", f"{name}: status {p[name]['status']}")


@case
def mixed_dtypes_across_ranks():
    d = fresh("mixed")
    x = np.array([0.5, -1.25, 3.0, 1024.0, 0.0, -0.375])   # exact in every dtype
    per_rank = [{"w": x.astype(np.float32)}, {"w": x}, {"w": x.astype(np.float16)}, {"w": w.bf16(x)}]
    w.write_world(d, per_rank)
    ref = w.write_dump(os.path.join(TMP, "mixed_ref.safetensors"), {"w": x})
    text, rep = expect([d, "--ref", ref], 0, report=True)
    p = params(rep)["w"]
    need(p["status"] == "ok" and p["rel_err"] == 0, f"param {p}")
    need(not any(r["differs"] for r in p["per_rank"]), f"ranks differ: {p['per_rank']}")
    need(rep["tolerance"] == 1e-2, f"tolerance {rep['tolerance']}")


@case
def unsupported_dtype_i64_unless_ignored():
    d = fresh("i64")
    paths = w.write_world(d, [{"w": A, "x": np.arange(3, dtype=np.int64)}] * 2)
    expect([d], 2, "unsupported dtype I64 for tensor 'x'", paths[0])
    text, rep = expect([d, "--ignore", "x"], 0, report=True)
    need(status(rep) == {"w": "present"}, f"statuses {status(rep)}")


# ----------------------------------------------------------------------------
# hostile files: exit 2, the file (and tensor) named, no crash, no hang

HDR_OK = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
M = w.meta(0, 1, "reduced", ["a"])


def one(entry, data=b"\0" * 8, name="a"):
    return w.file_bytes({"__metadata__": w.meta(0, 1, "reduced", [name]), name: entry}, data)


@case
def hostile_short_files():
    for n in (0, 1, 7):
        hostile(f"short{n}", b"\x01" * n, f"{n} bytes", "too short")


@case
def hostile_header_length_0():
    hostile("len0", struct.pack("<Q", 0) + b"{}", "header length is 0")


@case
def hostile_header_length_larger_than_file():
    hostile("lenbig", w.file_bytes({"__metadata__": M}, length=1000), "header length 1000", "larger than the file")


@case
def hostile_header_length_over_100mb():
    hostile("len100m", struct.pack("<Q", 100 * 2**20 + 1) + b"{}", "100 MB")


@case
def hostile_header_length_2_64_minus_1():
    hostile("lenmax", struct.pack("<Q", 2**64 - 1) + b"{}" + b" " * 100, str(2**64 - 1))


@case
def hostile_header_not_utf8():
    hostile("notutf8", w.file_bytes(b'{"a\xff\xfe":{}}'), "not UTF-8")
    hostile("overlong", w.file_bytes(b'{"\xc0\xaf":{}}'), "not UTF-8")
    hostile("surrogate", w.file_bytes(b'{"\xed\xa0\x80":{}}'), "not UTF-8")
    hostile("cut_utf8", w.file_bytes(b'{"__metadata__":{}}\xe2\x82', pad=False), "not UTF-8")


@case
def hostile_header_not_json():
    hostile("notjson", w.file_bytes(b'{"a": {"dtype": '), "not JSON")
    hostile("garbage_after", w.file_bytes(b'{} {}'), "after its JSON object")
    hostile("deep", w.file_bytes(b"[" * 5000 + b"]" * 5000), "not JSON")


@case
def hostile_header_not_object():
    for nm, h in [("array", b"[1, 2]"), ("string", b'"abc"'), ("number", b"42"), ("null", b"null")]:
        hostile("notobj_" + nm, w.file_bytes(h), "not a JSON object")


@case
def hostile_unknown_dtype():
    hostile("dtype", one({"dtype": "F128", "shape": [2], "data_offsets": [0, 8]}), "unknown dtype 'F128'", tensor="a")
    hostile("dtype_num", one({"dtype": 4, "shape": [2], "data_offsets": [0, 8]}), "dtype", tensor="a")


@case
def hostile_shape_negative():
    hostile("shape_neg", one({"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}), "shape[0]", tensor="a")


@case
def hostile_shape_not_integers():
    hostile("shape_frac", one({"dtype": "F32", "shape": [1.5], "data_offsets": [0, 8]}), "shape[0]", tensor="a")
    hostile("shape_str", one({"dtype": "F32", "shape": ["2"], "data_offsets": [0, 8]}), "shape[0]", tensor="a")
    hostile("shape_notarray", one({"dtype": "F32", "shape": 2, "data_offsets": [0, 8]}), "shape", tensor="a")
    hostile("shape_9d", one({"dtype": "F32", "shape": [1] * 8 + [2], "data_offsets": [0, 8]}), "dimensions", tensor="a")


@case
def hostile_shape_product_overflows():
    big = 2**31 - 1
    hostile("shape_ovf", one({"dtype": "F32", "shape": [big, big, big], "data_offsets": [0, 8]}), "overflows 64 bits", tensor="a")
    hostile("bytes_ovf", one({"dtype": "F32", "shape": [big, big, 4], "data_offsets": [0, 8]}), "overflows 64 bits", tensor="a")


@case
def hostile_offsets_begin_after_end():
    hostile("begin_end", one({"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}), "begin is after end", tensor="a")


def two(offa, offb, nbytes):
    h = {"__metadata__": w.meta(0, 1, "reduced", ["a", "b"]),
         "a": {"dtype": "F32", "shape": [3], "data_offsets": offa},
         "b": {"dtype": "F32", "shape": [3], "data_offsets": offb}}
    return w.file_bytes(h, b"\0" * nbytes)


@case
def hostile_offsets_overlap():
    hostile("overlap", two([0, 12], [8, 20], 20), "overlap", tensor="b")
    hostile("same", two([0, 12], [0, 12], 12), "overlap")


@case
def hostile_offsets_hole():
    hostile("hole", two([0, 12], [16, 28], 28), "hole of 4 bytes", tensor="b")
    hostile("hole_first", two([4, 16], [16, 28], 28), "hole of 4 bytes", tensor="a")


@case
def hostile_trailing_bytes():
    hostile("trailing", one({"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, b"\0" * 12), "4 bytes after the last tensor")


@case
def hostile_data_past_end_of_file():
    hostile("past_end", one({"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, b"\0" * 5), "past the end", tensor="a")


@case
def hostile_length_not_dtype_size_times_shape():
    hostile("length", one({"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}), "hold 8 bytes", "need 12", tensor="a")


@case
def hostile_offsets_malformed():
    for nm, off in [("3", [0, 4, 8]), ("1", [8]), ("str", ["0", "8"]), ("null", None), ("neg", [-8, 0]), ("frac", [0, 7.5])]:
        hostile("offsets_" + nm, one({"dtype": "F32", "shape": [2], "data_offsets": off}), "data_offsets", tensor="a")
    hostile("entry_notobj", one([1, 2]), "not an object", tensor="a")


@case
def hostile_duplicate_tensor_names():
    m = json.dumps(w.meta(0, 1, "reduced", ["a"]))
    h = ('{"__metadata__":%s,"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
         '"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}' % m)
    hostile("dup_name", w.file_bytes(h, b"\0" * 8), "appears twice", tensor="a")


@case
def hostile_duplicate_metadata():
    m = json.dumps(w.meta(0, 1, "reduced", ["a"]))
    h = '{"__metadata__":%s,"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":%s}' % (m, m)
    hostile("dup_meta", w.file_bytes(h, b"\0" * 8), "__metadata__ appears twice")
    h = '{"__metadata__":{"gradcheck.rank":"0","gradcheck.rank":"0"}}'
    hostile("dup_meta_key", w.file_bytes(h), "gradcheck.rank", "twice")


@case
def check_writes_no_report_unasked():
    """Issue 33: check wrote ./reports/ in the current directory unasked. Without --json it writes no report
    anywhere (and says none); with --json PATH it writes there and prints 'report: PATH'."""
    d = fresh("unasked")
    os.makedirs(os.path.join(d, "dumps"), exist_ok=True)
    w.write_world(os.path.join(d, "dumps"), [{"a": A}] * 2)
    p = subprocess.run([BIN, "check", "dumps"], cwd=d, stdin=subprocess.DEVNULL, capture_output=True, timeout=TIMEOUT)
    out = (p.stdout + p.stderr).decode(errors="replace")
    need(p.returncode == 0, f"check dumps: exit {p.returncode}: {out[-800:]}")
    need(sorted(os.listdir(d)) == ["dumps"], f"check without --json left {sorted(os.listdir(d))} in its directory")
    need("report:" not in out, f"check without --json names a report: {out[-400:]}")
    p = subprocess.run([BIN, "check", "dumps", "--json", "r.json"], cwd=d, stdin=subprocess.DEVNULL, capture_output=True,
                       timeout=TIMEOUT)
    need(p.returncode == 0 and b"\nreport: r.json\n" in p.stdout and os.path.isfile(os.path.join(d, "r.json")),
         f"check --json r.json: exit {p.returncode}, {p.stdout[-300:]!r}")


@case
def every_rendering_of_one_check_tells_one_outcome():
    """Issue 33: check --json /dev/full was exit 3 while another rendering of the same check said exit 0. One
    output that cannot be written makes the run exit 3, and every rendering written says so: the JUnit an
    error, the JSON exit_code 3 and result error, the text 'result: error (exit 3)'."""
    if not os.path.exists("/dev/full"):
        raise Fail("/dev/full is missing: this case needs a device that is always full")
    d = fresh("one_outcome")
    os.makedirs(os.path.join(d, "dumps"), exist_ok=True)
    w.write_world(os.path.join(d, "dumps"), [{"a": A}] * 2)
    dumps, xml, js = os.path.join(d, "dumps"), os.path.join(d, "full.xml"), os.path.join(d, "full.json")
    rc, out, err = run([dumps, "--json", "/dev/full", "--junit", xml])
    need(rc == 3 and "result: error (exit 3)" in out, f"--json /dev/full --junit FILE: exit {rc}: {out[-300:]} {err[-300:]}")
    with open(xml) as f:
        x = f.read()
    need('errors="1"' in x.split("\n", 2)[1] and "/dev/full" in x, f"--json /dev/full: the JUnit written says no error: {x[:400]}")
    rc, out, err = run([dumps, "--json", js, "--junit", "/dev/full"])
    need(rc == 3 and "result: error (exit 3)" in out, f"--json FILE --junit /dev/full: exit {rc}: {out[-300:]} {err[-300:]}")
    with open(js) as f:
        r = json.load(f)
    need(r["exit_code"] == 3 and r["result"] == "error" and "--junit" in r["error"]["message"],
         f"--junit /dev/full: the JSON written says exit_code {r['exit_code']}, result {r['result']}")


@case
def forty_thousand_dump_files_are_read():
    """Issue 33: 40,000 dump files (one world) ended in exit 3, 'out of memory: 2 bytes'. It is the user's input,
    within what the system maps at once: read, exit 0, in bounded time."""
    maps = int(open("/proc/sys/vm/max_map_count").read())
    need(maps - 8192 >= 40000, f"vm.max_map_count {maps}: this system cannot map 40,000 dumps at once")
    d = fresh("forty_thousand")
    g = np.arange(2.0)
    for k in range(40000):
        with open(os.path.join(d, f"rank{k}.safetensors"), "wb") as f:
            f.write(w.dump_bytes({"w": g}, rank=k, world=40000))
    t0 = time.monotonic()
    expect([d], 0, "40000 dumps", timeout=60)
    need(time.monotonic() - t0 < 30, f"40,000 files read in {time.monotonic() - t0:.1f} s")
    shutil.rmtree(d)


@case
def more_files_than_the_kernel_maps_is_exit_2():
    """Issue 33: one dump per rank of a world as large as the format allows (65,536 files, past Linux's default
    vm.max_map_count) ended in 'out of memory: 7340032 bytes', exit 3. It is the user's input: exit 2, naming
    the limit, at once."""
    maps = int(open("/proc/sys/vm/max_map_count").read())
    n = min(maps - 8192 + 1, 65536)
    need(n > 0 and maps - 8192 + 1 <= 65536, f"vm.max_map_count {maps}: past what one world of dumps can reach")
    d = fresh("many_files")
    g = np.arange(2.0)
    for k in range(n):
        with open(os.path.join(d, f"rank{k}.safetensors"), "wb") as f:
            f.write(w.dump_bytes({"w": g}, rank=k, world=n))
    t0 = time.monotonic()
    expect([d], 2, "vm.max_map_count", f"{n} dump files")
    need(time.monotonic() - t0 < 10, f"{n} files refused after {time.monotonic() - t0:.1f} s")
    shutil.rmtree(d)


@case
def hostile_metadata_100000_keys_in_linear_time():
    """Issue 33: 100,000 __metadata__ keys took 34 s (each key looked up among those before it): now one
    sort. Read within 5 s; the same with the last key a duplicate of the first: exit 2 naming it, within 5 s."""
    d = fresh("many_meta")
    m = w.meta(0, 1, "reduced", ["a"])
    extra = "".join(',"k%06d":"v"' % i for i in range(100000))
    body = json.dumps(m)[:-1] + extra
    for name, tail, code, needles in (("ok", "}", 0, ()), ("dup", ',"k000000":"v"}', 2, ("'k000000' appears twice",))):
        h = '{"__metadata__":%s,"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}' % (body + tail)
        path = w.write(os.path.join(d, name + ".safetensors"), w.file_bytes(h, A[:2].tobytes()))
        t0 = time.monotonic()
        expect([path], code, *needles)
        took = time.monotonic() - t0
        need(took < 5, f"{name}: 100,000 metadata keys took {took:.1f} s (quadratic?)")


@case
def hostile_metadata_values_not_strings():
    m = w.meta(0, 1, "reduced", ["a"])
    m["gradcheck.rank"] = 0
    hostile("meta_int", w.file_bytes({"__metadata__": m, "a": HDR_OK["a"]}, b"\0" * 8), "gradcheck.rank", "not a string")
    m = w.meta(0, 1, "reduced", ["a"])
    m["gradcheck.params"] = ["a"]
    hostile("meta_list", w.file_bytes({"__metadata__": m, "a": HDR_OK["a"]}, b"\0" * 8), "gradcheck.params", "not a string")
    hostile("meta_notobj", w.file_bytes({"__metadata__": "x"}), "__metadata__ is not an object")


def with_meta(**changes):
    m = w.meta(0, 1, "reduced", ["a"])
    for k, v in changes.items():
        k = k.replace("_", ".")
        if v is None:
            del m[k]
        else:
            m[k] = v
    return w.file_bytes({"__metadata__": m, "a": HDR_OK["a"]}, b"\0\0\x80\x3f" * 2)


@case
def hostile_params_not_a_json_array():
    hostile("params_obj", with_meta(gradcheck_params='{"a": 1}'), "gradcheck.params", "JSON array")
    hostile("params_bad", with_meta(gradcheck_params='["a"'), "gradcheck.params", "JSON array")


@case
def hostile_params_not_strings():
    hostile("params_num", with_meta(gradcheck_params='["a", 3]'), "gradcheck.params[1]", "not a string")


@case
def hostile_params_duplicates():
    hostile("params_dup", with_meta(gradcheck_params='["a", "b", "a"]'), "gradcheck.params", "'a' twice")


@case
def hostile_missing_metadata_keys():
    for key in ("format", "rank", "world", "stage"):
        hostile("missing_" + key, with_meta(**{"gradcheck_" + key: None}), "gradcheck." + key)


@case
def hostile_missing_params_key():
    hostile("missing_params", with_meta(gradcheck_params=None), "gradcheck.params")
    hostile("no_metadata", w.file_bytes({"a": HDR_OK["a"]}, b"\0" * 8), "not a gradcheck dump")


@case
def hostile_metadata_values_out_of_range():
    hostile("format2", with_meta(gradcheck_format="2"), "gradcheck.format '2'")
    hostile("stage_x", with_meta(gradcheck_stage="after"), "gradcheck.stage", "after")
    hostile("rank_x", with_meta(gradcheck_rank="zero"), "gradcheck.rank", "zero")
    hostile("rank_neg", with_meta(gradcheck_rank="-1"), "gradcheck.rank", "-1")
    hostile("world_0", with_meta(gradcheck_world="0"), "gradcheck.world")
    hostile("world_huge", with_meta(gradcheck_world="99999999999999999999"), "gradcheck.world")


@case
def hostile_rank_not_below_world():
    hostile("rank_eq_world", with_meta(gradcheck_rank="1"), "gradcheck.rank", "'1'")
    d = fresh("rank_ge_world")
    p = w.write_dump(os.path.join(d, "r5.safetensors"), {"a": A}, rank=5, world=4)
    expect([p], 2, p, "gradcheck.rank", "'5'")


@case
def hostile_missing_rank_is_named():
    d = fresh("missing_rank")
    for k in (0, 1, 3):
        w.write_dump(os.path.join(d, f"rank{k}.safetensors"), {"a": A}, rank=k, world=4)
    expect([d], 2, "world 4", "rank 2", "rank0.safetensors")


@case
def hostile_two_files_same_rank():
    d = fresh("same_rank")
    p0 = w.write_dump(os.path.join(d, "x.safetensors"), {"a": A}, rank=1, world=2)
    p1 = w.write_dump(os.path.join(d, "y.safetensors"), {"a": A}, rank=1, world=2)
    expect([d], 2, p0, p1, "rank 1")


@case
def hostile_world_differs():
    d = fresh("world_differs")
    w.write_dump(os.path.join(d, "r0.safetensors"), {"a": A}, rank=0, world=2)
    p1 = w.write_dump(os.path.join(d, "r1.safetensors"), {"a": A}, rank=1, world=3)
    expect([d], 2, p1, "gradcheck.world is 3", "says 2")


@case
def hostile_stage_differs():
    d = fresh("stage_differs")
    w.write_dump(os.path.join(d, "r0.safetensors"), {"a": A}, rank=0, world=2, stage="local")
    p1 = w.write_dump(os.path.join(d, "r1.safetensors"), {"a": A}, rank=1, world=2, stage="reduced")
    expect([d], 2, p1, "gradcheck.stage is reduced", "local")


@case
def hostile_params_differ_between_ranks():
    d = fresh("params_differ")
    w.write_dump(os.path.join(d, "r0.safetensors"), {"a": A, "b": None}, rank=0, world=2)
    p1 = w.write_dump(os.path.join(d, "r1.safetensors"), {"a": A}, rank=1, world=2)
    expect([d], 2, p1, "rank 1", "lacks 'b'")
    d = fresh("params_differ2")
    w.write_dump(os.path.join(d, "r0.safetensors"), {"a": A}, rank=0, world=2)
    p1 = w.write_dump(os.path.join(d, "r1.safetensors"), {"a": A, "c": None}, rank=1, world=2)
    expect([d], 2, p1, "rank 1", "lists 'c'")


@case
def hostile_tensor_not_in_params():
    d = fresh("not_in_params")
    p = w.write_dump(os.path.join(d, "r0.safetensors"), {"a": A, "extra": A}, params=["a"])
    expect([p], 2, p, "tensor 'extra'", "not in gradcheck.params")


@case
def hostile_shapes_differ_between_ranks():
    d = fresh("shape_ranks")
    w.write_dump(os.path.join(d, "r0.safetensors"), {"a": A}, rank=0, world=3)
    w.write_dump(os.path.join(d, "r1.safetensors"), {"a": A}, rank=1, world=3)
    p2 = w.write_dump(os.path.join(d, "r2.safetensors"), {"a": A.reshape(2, 2)}, rank=2, world=3)
    expect([d], 2, "tensor 'a'", "(2,2) on rank 2", p2, "(4) on rank 0")


@case
def hostile_shape_differs_from_reference():
    d = fresh("shape_ref")
    w.write_world(d, [{"a": A}] * 2)
    ref = w.write_dump(os.path.join(TMP, "shape_ref_ref.safetensors"), {"a": A[:3]})
    expect([d, "--ref", ref], 2, "tensor 'a'", ref, "(3)", "(4)")


@case
def hostile_reference_world_not_1():
    d = fresh("ref_world")
    w.write_world(d, [{"a": A}] * 2)
    ref = w.write_dump(os.path.join(TMP, "ref_world2.safetensors"), {"a": A}, rank=0, world=2)
    expect([d, "--ref", ref], 2, ref, "world 1")


@case
def hostile_reference_broken_or_missing():
    d = fresh("ref_broken")
    w.write_world(d, [{"a": A}] * 2)
    ref = w.write(os.path.join(TMP, "ref_broken.safetensors"), b"\x05")
    expect([d, "--ref", ref], 2, ref, "too short")
    expect([d, "--ref", os.path.join(TMP, "no_such_ref.safetensors")], 2, "no_such_ref.safetensors")
    ref = w.write_dump(os.path.join(TMP, "ref_params.safetensors"), {"a": A, "b": None})
    expect([d, "--ref", ref], 2, ref, "'b'")


@case
def hostile_directory_without_dumps():
    d = fresh("empty_dir")
    w.write(os.path.join(d, "readme.txt"), b"x")
    expect([d], 2, d, "no *.safetensors")


@case
def hostile_path_does_not_exist():
    p = os.path.join(TMP, "does", "not", "exist.safetensors")
    expect([p], 2, p, "No such file")


@case
def hostile_bad_path_after_a_good_directory():
    d = fresh("good_then_bad")
    w.write_world(d, [{"a": A}] * 2)
    p = os.path.join(TMP, "missing.safetensors")
    expect([d, p], 2, p)
    e = fresh("good_then_empty")
    expect([d, e], 2, e, "no *.safetensors")


@case
def hostile_dump_is_a_directory():
    d = fresh("isdir")
    sub = os.path.join(d, "r0.safetensors")
    os.makedirs(sub, exist_ok=True)
    expect([sub], 2, sub, "directory")
    w.write_dump(os.path.join(d, "r1.safetensors"), {"a": A})
    expect([d], 2, sub, "directory")


@case
def hostile_dump_is_a_fifo():
    d = fresh("fifo")
    p = os.path.join(d, "r0.safetensors")
    if not os.path.exists(p):
        os.mkfifo(p)
    expect([p], 2, p, timeout=10)
    w.write_dump(os.path.join(d, "r1.safetensors"), {"a": A})
    expect([d], 2, p, timeout=10)


@case
def hostile_control_bytes_in_tensor_name():
    h = {"__metadata__": w.meta(0, 1, "reduced", ["a\nb"]), "a\nb": {"dtype": "F99", "shape": [2], "data_offsets": [0, 8]}}
    hostile("ctrl_name", w.file_bytes(h, b"\0" * 8), "tensor 'a?b'", "unknown dtype")
    long = "n" * 500
    h = {"__metadata__": w.meta(0, 1, "reduced", [long]), long: {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}
    hostile("long_name", w.file_bytes(h, b"\0" * 8), "nnnn...'")


@case
def hostile_format_directives_in_names():
    n = "%s%n%p%99999d"
    h = {"__metadata__": w.meta(0, 1, "reduced", [n]), n: {"dtype": "Q8", "shape": [2], "data_offsets": [0, 8]}}
    hostile("fmt_name", w.file_bytes(h, b"\0" * 8), f"tensor '{n}'", "unknown dtype 'Q8'")
    d = fresh("fmt_name2")
    p = w.write_dump(os.path.join(d, "r0.safetensors"), {"a": A, n: A}, params=["a"])
    expect([p], 2, p, f"tensor '{n}'", "not in gradcheck.params")
    p = w.write_dump(os.path.join(d, "r1.safetensors"), {n: A})   # a valid dump: the name goes to the report as is
    text, rep = expect([p], 0, n, report=True)
    need(status(rep) == {n: "present"}, f"statuses {status(rep)}")


@case
def many_params_no_quadratic_hang():
    # 30000 parameters x 2 ranks (a large MoE model; a hostile header holds far more): the name
    # look-ups must not be quadratic. A linear pass takes well under a second.
    d = fresh("many_params")
    g = {f"layers.{i}.experts.w": np.full(2, 1.0 + i % 7, np.float32) for i in range(30000)}
    w.write_world(d, [g] * 2)
    t0 = time.monotonic()
    text, rep = expect([d], 0, report=True, timeout=120)   # a hang, not a slow machine: 20 s failed at load average 38
    need(len(rep["runs"][0]["params"]) == 30000, "not every parameter is in the report")
    print(f"# many_params: {time.monotonic() - t0:.1f} s")


@case
def usage_errors_name_the_flag():
    d = fresh("usage")
    w.write_world(d, [{"a": A}] * 2)
    for args, flag in [([], "check"), ([d, "--tol", "0"], "--tol"), ([d, "--tol", "x"], "--tol"), ([d, "--tol=1"], "--tol"),
                       ([d, "--tol", "nan"], "--tol"), ([d, "--bogus"], "--bogus"), ([d, "--tol"], "--tol"),
                       ([d, "--ref"], "--ref"), ([d, "--ignore="], "--ignore"), ([d, "--no-json=1"], "--no-json"),
                       ([d, "--json", os.path.join(TMP, "no", "dir", "r.json")], "--json"),
                       ([d, "--json", TMP], "--json"), ([d, "--json", "x.json", "--no-json"], "--no-json")]:
        rc, out, err = run(args)
        need(rc == 2, f"check {' '.join(args)}: exit {rc}, expected 2: {err}")
        need(f"gradcheck-dist: {flag}:" in err, f"check {' '.join(args)}: the message does not name {flag}: {err}")


@case
def report_cannot_be_written_is_exit_3():
    if not os.path.exists("/dev/full"):
        return
    d = fresh("exit3")
    w.write_world(d, [{"a": A}] * 2)
    expect([d, "--json", "/dev/full"], 3, "/dev/full")


# ----------------------------------------------------------------------------
# files that change while they are read: never a signal

BIG = None


def big_dump():
    """A ~200 MB dump (world 1, F32), written once and copied for each try."""
    global BIG
    if BIG is None:
        BIG = os.path.join(TMP, "big.safetensors")
        n = 50 * 2**20
        header, _ = w.build([], w.meta(0, 1, "reduced", ["a", "w"]))
        header["a"] = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}
        header["w"] = {"dtype": "F32", "shape": [n], "data_offsets": [16, 16 + 4 * n]}
        with open(BIG, "wb") as f:
            f.write(w.file_bytes(header))
            f.write(A.tobytes())
            np.random.default_rng(1).standard_normal(n, dtype=np.float32).tofile(f)
    return BIG


def while_running(path, delay, act, args=()):
    """Runs check on path and calls act() after delay seconds; returns (rc, output, acted_while_running)."""
    p = subprocess.Popen([BIN, "check", path, "--no-json", *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    time.sleep(delay)
    running = p.poll() is None
    act()
    try:
        out, err = p.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise Fail(f"no answer after {TIMEOUT} s (a hang) once {path} changed")
    text = (out + err).decode(errors="replace")
    if p.returncode < 0:
        raise Fail(f"killed by signal {-p.returncode} (delay {delay} s): {text[-600:]}")
    return p.returncode, text, running


def changed_ok(rc, text, path, delay):
    need(rc in (0, 1, 2), f"delay {delay} s: exit {rc}: {text[-600:]}")
    if rc == 2:
        need(path in text and ("changed" in text or "shrank" in text or "replaced" in text or "truncated" in text),
             f"delay {delay} s: exit 2 without naming the file and the change: {text[-600:]}")


@case
def truncated_while_being_read():
    src = big_dump()
    seen = []
    for delay in (0.0, 0.02, 0.05, 0.1, 0.2, 0.4):
        path = os.path.join(TMP, "trunc.safetensors")
        shutil.copyfile(src, path)
        rc, text, running = while_running(path, delay, lambda: os.truncate(path, 4096))
        changed_ok(rc, text, path, delay)
        seen.append((delay, rc, running, "SIGBUS" in text))
    print("# truncated: (delay, exit, running when truncated, SIGBUS caught):", seen)
    need(any(rc == 2 for _, rc, _, _ in seen), f"the truncation was never noticed: {seen}")


@case
def replaced_while_being_read():
    src = big_dump()
    seen = []
    for delay in (0.05, 0.2):
        path = os.path.join(TMP, "replace.safetensors")
        shutil.copyfile(src, path)
        new = os.path.join(TMP, "replace.new")
        w.write_dump(new, {"a": A, "w": np.zeros(3, np.float32)})
        rc, text, running = while_running(path, delay, lambda: os.replace(new, path))
        changed_ok(rc, text, path, delay)
        seen.append((delay, rc, running))
    print("# replaced: (delay, exit, running when replaced):", seen)


# ----------------------------------------------------------------------------


def need_digests(rep):
    """every dump's digest in the report (and the reference's) is what xxh128sum prints for that file"""
    run = rep["runs"][0]
    files = run["dumps"] + ([run["reference"]] if run["reference"] else []) + run.get("local_dumps", [])
    out = subprocess.run(["xxh128sum", *[x["path"] for x in files]], capture_output=True, text=True, check=True).stdout
    want = {os.path.realpath(name.lstrip("*")): h for h, name in (ln.split(None, 1) for ln in out.splitlines())}
    need(len(set(want.values())) == len(files), f"xxh128sum: {len(set(want.values()))} distinct digests for {len(files)} distinct files")
    for x in files:
        need(want.get(os.path.realpath(x["path"])) == x["xxh128"], f"{x['path']}: report xxh128 {x['xxh128']}, xxh128sum {want.get(os.path.realpath(x['path']))}")


@case
def report_lists_and_digests_the_local_dumps_too():
    """Issue 33: with both stages (reduced and local, as check_ddp gives them), the report names every input it
    read: the local (pre-reduce) dumps too, under local_dumps, each with its xxh128sum digest."""
    d = fresh("digest_local")
    red, loc = os.path.join(d, "reduced"), os.path.join(d, "local")
    os.makedirs(red), os.makedirs(loc)
    g = [rnd(3, 4) for _ in range(2)]
    mean = (g[0] + g[1]) / 2
    w.write_world(red, [{"w": mean}, {"w": mean}])
    w.write_world(loc, [{"w": g[0]}, {"w": g[1]}], stage="local")
    ref = w.write_dump(os.path.join(d, "ref.safetensors"), {"w": mean})
    _, rep = expect([red, loc, "--ref", ref], 0, report=True)
    local = rep["runs"][0].get("local_dumps")
    need(local is not None and sorted(os.path.realpath(x["path"]) for x in local) ==
         sorted(os.path.realpath(os.path.join(loc, f)) for f in os.listdir(loc)), f"local_dumps: {local}")
    need_digests(rep)


@case
def report_digest_of_every_dump_equals_xxh128sum():
    """each file's digest, made by the scan as it reads (tensors in the file in the parameters' order) or
    by the pool of threads (another order): one piece (KiB) and several (rank 0's 40 MB, more than one
    16 MiB piece), bytes the scan never reads (an --ignore'd tensor, the header, a gap before the data)"""
    d = fresh("digest")
    world = 9
    per_rank = [{"a": rnd(4, 5), "big": rnd(5_000_000) if k == 0 else None, "b": None} for k in range(world)]
    paths = w.write_world(d, per_rank, params=["a", "big", "b"])
    ref = w.write_dump(os.path.join(d, "ref.safetensors"), {"a": rnd(4, 5), "big": rnd(5_000_000), "b": None})
    _, rep = expect([*paths, "--ref", ref], 1, "big", report=True)
    need_digests(rep)
    # odd ranks laid out in another order than the parameters (the pool hashes those), the reference too;
    # the first tensor left out (--ignore: hashed on the way to the next)
    d = fresh("digest_order")
    g = {"a": rnd(3), "b": rnd(70_000), "c": rnd(2, 2)}
    paths = [w.write_dump(f"{d}/rank{k}.safetensors", g if k % 2 == 0 else dict(reversed(g.items())), rank=k, world=4,
                          params=["a", "b", "c"]) for k in range(4)]
    ref = w.write_dump(f"{d}/ref.bin", dict(reversed(g.items())))
    for extra in ([], ["--ignore", "a"], ["--ignore", "b"], ["--ignore", "c"]):
        _, rep = expect([*paths, "--ref", ref, *extra], 0, report=True)
        need_digests(rep)


# ---- sketch dumps (dump_grads(..., sketch=K), docs/dumps.md): rows of 15 + K float64, sketched here with a
# seeded Gaussian matrix (check never recomputes a sketch: it reads the rows)

SK = 8


def sk_row(g, k=SK, start=0, shape=None, dtype=1, seed=3):
    """The row of gradient piece g (flat, from `start` in a parameter of `shape`): its non-finite count, first
    non-finite index, norm of the finite values, start, count, dtype code, ndim, shape, then P g (P seeded)."""
    g = np.asarray(g, dtype=np.float64).reshape(-1)
    shape = list(shape if shape is not None else [g.size])
    n = int(np.prod(shape)) if shape else 1
    P = np.random.default_rng(seed).standard_normal((k, n))[:, start:start + g.size]
    bad = ~np.isfinite(g)
    row = np.zeros(15 + k)
    row[0] = bad.sum()
    row[1] = start + int(np.argmax(bad)) if bad.any() else -1
    row[2] = np.linalg.norm(np.where(bad, 0, g))
    row[3:7] = [start, g.size, dtype, len(shape)]
    row[7:7 + len(shape)] = shape
    row[15:] = P @ g
    return row


def sk_meta(rank, world, params, k=SK, seed=0, stage="reduced", **extra):
    m = w.meta(rank, world, stage, params)
    m.update({"gradcheck.sketch": str(k), "gradcheck.seed": str(seed), "gradcheck.precision": "fp32",
              "gradcheck.projections": "sign-hash/4096"})
    m.update(extra)
    return m


def sk_dump(path, rows, rank=0, world=1, params=None, **kw):
    params = list(rows) if params is None else params
    return w.write(path, w.dump_bytes(rows, params=params, metadata=sk_meta(rank, world, params, **kw)))


@case
def sketch_verdicts_from_rows():
    d = fresh("sketch_verdicts")
    r, s, m = rnd(40), rnd(6, 5), rnd(300)
    z, f, n = rnd(7), rnd(9), rnd(4)
    mm = m + 0.5 * np.linalg.norm(m) / np.sqrt(m.size) * rnd(300)
    nan = f.copy()
    nan[4] = np.nan
    ranks = [{"ok": sk_row(r), "scaled": sk_row(s.ravel() * 0.25, shape=[6, 5]), "mism": sk_row(mm), "none": None,
              "zero": sk_row(np.zeros(7)), "nan": sk_row(nan if k == 1 else f)} for k in range(2)]
    paths = [sk_dump(f"{d}/rank{k}.safetensors", rows, rank=k, world=2) for k, rows in enumerate(ranks)]
    ref = sk_dump(os.path.join(d, "ref.bin"), {"ok": sk_row(r), "scaled": sk_row(s.ravel(), shape=[6, 5]), "mism": sk_row(m),
                                               "none": sk_row(n), "zero": sk_row(z), "nan": sk_row(f)})
    _, rep = expect([*paths, "--ref", ref], 1, report=True)
    want = {"ok": "ok", "scaled": "scaled", "mism": "mismatch", "none": "none", "zero": "zero", "nan": "nonfinite"}
    need(status(rep) == want, f"statuses {status(rep)}")
    need(close(params(rep)["scaled"]["scale"], 0.25, 1e-9), f"scale {params(rep)['scaled']['scale']}")
    need(params(rep)["scaled"]["shape"] == [6, 5], f"shape {params(rep)['scaled']['shape']}")
    nf = finding(rep, "nonfinite")
    need("rank 1" in nf["message"] and "index 4" in nf["message"], nf["message"])


@case
def sketch_scale_needs_the_norms_to_agree():
    # a sketch that is exactly 0.5 x the reference's (as today's one-direction sketch of a small tensor always is
    # some multiple), but a norm 0.9 x: not a scale, a wrong gradient; the same with the norm 0.5 x: scaled
    d = fresh("sketch_scale_norm")
    r = rnd(30)
    ref = sk_dump(os.path.join(d, "ref.bin"), {"w": sk_row(r)})
    for norm, want in ((0.9, "mismatch"), (0.5, "scaled")):
        row = sk_row(r * 0.5)
        row[2] = norm * np.linalg.norm(r)
        p = sk_dump(os.path.join(d, f"n{norm}.safetensors"), {"w": row})
        _, rep = expect([p, "--ref", ref], 1, report=True)
        need(status(rep) == {"w": want}, f"norm x{norm}: statuses {status(rep)}")


@case
def sketch_disagree_names_the_rank():
    d = fresh("sketch_disagree")
    g = rnd(50)
    paths = [sk_dump(f"{d}/rank{k}.safetensors", {"w": sk_row(g * (1.001 if k == 2 else 1))}, rank=k, world=3) for k in range(3)]
    _, rep = expect(paths, 1, "rank 2", report=True)
    need(status(rep) == {"w": "disagree"}, f"statuses {status(rep)}")
    need([p["differs"] for p in params(rep)["w"]["per_rank"]] == [False, False, True], params(rep)["w"]["per_rank"])


@case
def sketch_shards_add_to_the_whole():
    d = fresh("sketch_shards")
    g = rnd(10, 7)
    flat = g.ravel()
    for name, second in (("ok", flat[33:]), ("bad", flat[33:] * 2)):
        paths = [sk_dump(f"{d}/{name}{k}.safetensors", {"w": sk_row(p, start=a, shape=[10, 7])}, rank=k, world=2)
                 for k, (a, p) in enumerate(((0, flat[:33]), (33, second)))]
        ref = sk_dump(os.path.join(d, f"ref-{name}.bin"), {"w": sk_row(flat, shape=[10, 7])})
        _, rep = expect([*paths, "--ref", ref], 0 if name == "ok" else 1, report=True)
        need(status(rep) == {"w": "ok" if name == "ok" else "mismatch"}, f"{name}: statuses {status(rep)}")
    # pieces that overlap, or leave a hole: refused, naming the tensor
    for what, pieces in (("overlap", ((0, flat[:40]), (33, flat[33:]))), ("hole", ((0, flat[:30]), (33, flat[33:])))):
        paths = [sk_dump(f"{d}/{what}{k}.safetensors", {"w": sk_row(p, start=a, shape=[10, 7])}, rank=k, world=2)
                 for k, (a, p) in enumerate(pieces)]
        expect(paths, 2, "tensor 'w'", "overlap" if what == "overlap" else "pieces hold 67 of its 70 elements")


@case
def sketch_reference_from_another_world():
    d = fresh("sketch_w2")
    g = rnd(20)
    paths = [sk_dump(f"{d}/rank{k}.safetensors", {"w": sk_row(g)}, rank=k, world=4) for k in range(4)]
    ref = sk_dump(os.path.join(TMP, "w2-rank1.safetensors"), {"w": sk_row(g)}, rank=1, world=2)
    _, rep = expect([d, "--ref", ref], 0, report=True)
    need(status(rep) == {"w": "ok"}, f"statuses {status(rep)}")
    full = w.write_dump(os.path.join(TMP, "w2-full-rank0.safetensors"), {"w": g}, rank=0, world=2)
    expect([w.write_dump(os.path.join(d, "..", "f.safetensors"), {"w": g}), "--ref", full], 2, full, "one process")
    piece = sk_dump(os.path.join(TMP, "w2-piece.safetensors"), {"w": sk_row(g[:10], shape=[20])}, rank=0, world=2)
    expect([d, "--ref", piece], 2, piece, "a piece of 'w'")


@case
def sketch_refused_mixed_and_hostile():
    d = fresh("sketch_hostile")
    g = rnd(12)
    good = sk_dump(f"{d}/good.safetensors", {"w": sk_row(g)})
    full = w.write_dump(os.path.join(TMP, "sk-full.safetensors"), {"w": g})
    expect([good, "--ref", full], 2, full, "is a full dump", good)
    expect([full, "--ref", good], 2, full, "is a full dump")
    k4 = sk_dump(os.path.join(TMP, "sk-k4.safetensors"), {"w": sk_row(g, k=4)}, k=4)
    expect([good, "--ref", k4], 2, "K=4", good, "share K and seed")
    s1 = sk_dump(os.path.join(TMP, "sk-seed1.safetensors"), {"w": sk_row(g)}, seed=1)
    expect([good, "--ref", s1], 2, "seed 1", "share K and seed")
    gpu = sk_dump(os.path.join(TMP, "sk-gpu.safetensors"), {"w": sk_row(g)}, **{"gradcheck.projections": "torch-generator/cuda"})
    expect([good, "--ref", gpu], 2, gpu, "torch-generator/cuda", "same gradcheck_dist")
    for i, (k, needle) in enumerate((("nan", "'nan'"), ("1e3", "'1e3'"), ("99999999999999999999", "integer from 1 to 4096"),
                                     ("4097", "'4097'"), ("0", "'0'"), ("-8", "'-8'"), (" 8", "' 8'"), ("8x", "'8x'"))):
        p = sk_dump(os.path.join(d, f"k{i}.st"), {"w": sk_row(g)}, k=k)
        expect([p], 2, p, "gradcheck.sketch is", needle)
    p = w.write(os.path.join(d, "noseed.st"), w.dump_bytes({"w": sk_row(g)}, metadata={
        **w.meta(0, 1, "reduced", ["w"]), "gradcheck.sketch": str(SK)}))
    expect([p], 2, p, "gradcheck.seed is '(missing)'")
    # tensors of the wrong form; rows whose columns are impossible
    for i, (t, needle) in enumerate(((sk_row(g)[:-1], "one F64 vector of 23"), (sk_row(g).astype(np.float32), "F32"),
                                     (sk_row(g).reshape(1, -1), "2 dimensions"))):
        p = sk_dump(os.path.join(d, f"form{i}.st"), {"w": t})
        expect([p], 2, p, "tensor 'w'", needle)
    def bad(col, v):
        r = sk_row(g)
        r[col] = v
        return r
    for i, (r, needle) in enumerate(((bad(2, np.nan), "its norm"), (bad(2, -1), "its norm"), (bad(3, -1), "its piece"),
                                     (bad(4, 13), "its piece"), (bad(3, 0.5), "its piece"), (bad(6, 9), "number of dimensions"),
                                     (bad(6, np.nan), "number of dimensions"), (bad(7, 1e300), "a dimension"),
                                     (bad(0, 13), "non-finite count"), (bad(0, np.inf), "non-finite count"),
                                     (bad(15, np.nan), "its sketch"), (bad(5, 7), "dtype code"),
                                     (bad(0, 1), "first non-finite"))):
        p = sk_dump(os.path.join(d, f"row{i}.st"), {"w": r})
        expect([p], 2, p, "tensor 'w'", needle)
    # shapes that differ between files; stage local; a second --ref
    other = sk_dump(os.path.join(TMP, "sk-shape.safetensors"), {"w": sk_row(g, shape=[3, 4])})
    expect([good, "--ref", other], 2, "tensor 'w'", "its shape in")
    loc = [sk_dump(f"{d}/local{k}.st", {"w": sk_row(g)}, rank=k, world=2, stage="local") for k in range(2)]
    expect(loc, 2, "sketch dumps are read for the reduced stage only")
    good2 = sk_dump(os.path.join(TMP, "sk-good2.safetensors"), {"w": sk_row(g)})
    expect([good, "--ref", good2, "--ref", sk_dump(os.path.join(TMP, "sk-good3.safetensors"), {"w": sk_row(g)})], 2,
           "a second --ref")


def run_cases(cases, prefix):
    """Runs each case (with GCD_TEST_ONLY, those whose name holds it) in one fresh temporary directory,
    TMP; prints ok/FAIL a line and exits 1 on any failure. test_check_verdicts.py runs its cases here too."""
    global TMP
    only = os.environ.get("GCD_TEST_ONLY")
    passed = failed = 0
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        TMP = tmp
        for fn in cases:
            if only and only not in fn.__name__:
                continue
            try:
                fn()
                print(f"ok {fn.__name__}", flush=True)
                passed += 1
            except Fail as e:
                print(f"FAIL {fn.__name__}: {e}", flush=True)
                failed += 1
            except Exception as e:   # a bug in the test itself is a failure too
                print(f"FAIL {fn.__name__}: {type(e).__name__}: {e}", flush=True)
                failed += 1
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


def main():
    global BIN
    if len(sys.argv) != 2:
        sys.exit("usage: test_check_inputs.py GRADCHECK_DIST")
    BIN = os.path.abspath(sys.argv[1])
    run_cases(CASES, "gcd-check-inputs-")


if __name__ == "__main__":
    main()
