#!/usr/bin/env python3
"""`gradcheck-dist check` on pieces placed on a device mesh (issue 39): boxes sharded along any dimension
(uneven as torch.chunk splits, strided as FSDP2 over TP makes them), Replicate copies compared before the
reference, Partial pieces added; the ranks located by their (dp, tp) coordinates; hostile maps refused in
bounded time. Byte-level fixtures (tests/st_writer.py), no torch.

    test_check_mesh.py GRADCHECK_DIST

Prints `ok NAME` or `FAIL NAME: why` per case; exits 1 if any failed. Helpers: test_check_inputs.py's.
"""
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_writer as w  # noqa: E402
import test_check_inputs as t  # noqa: E402
from test_check_inputs import expect, need, status  # noqa: E402

CASES = []
R = np.random.default_rng(39)
REP, PART = {"kind": "replicate"}, {"kind": "partial", "op": "sum"}


def case(fn):
    CASES.append(fn)
    return fn


def shard(d):
    return {"kind": "shard", "dim": d}


def chunks(n, parts):
    """torch.chunk's split of n: ceil(n / parts) each, the last ones shorter or empty."""
    c = -(-n // parts)
    return [(min(i * c, n), min((i + 1) * c, n)) for i in range(parts)]


def mesh_dumps(name, mesh_shape, pieces, ref, mesh_of=None):
    """pieces: per rank {param: (array, entry or None)}; writes the ranks' dumps on a (dp, tp) mesh (rank
    k at coordinates (k // tp, k % tp), or mesh_of(k)) and the reference; returns (dir, ref path)."""
    d = t.fresh(name)
    W, names = len(pieces), list(ref)
    for k, p in enumerate(pieces):
        m = w.meta(k, W, "reduced", names)
        ents = {n: e for n, (_, e) in p.items() if e is not None}
        if ents:
            m["gradcheck.shards"] = json.dumps(ents)
        coords = mesh_of(k) if mesh_of else [k // mesh_shape[1], k % mesh_shape[1]]
        m["gradcheck.mesh"] = json.dumps({"shape": mesh_shape, "names": ["dp", "tp"], "coords": coords,
                                          "ranks": list(range(W))})
        w.write_dump(f"{d}/r{k}.safetensors", {n: np.ascontiguousarray(a) for n, (a, _) in p.items()}, metadata=m, params=names)
    refp = w.write_dump(f"{d}.ref.safetensors", ref, metadata=w.meta(0, 1, "reduced", names), params=names)
    return d, refp


def box(shape, placements, offsets, lengths):
    return {"shape": list(shape), "placements": placements, "offsets": list(offsets), "lengths": list(lengths)}


def tp_world2(norm_parts=None, w_fn=None, name="tp2"):
    """world 2, mesh (1, 2): col (5, 7) Shard(0) uneven 3/2, row (7, 5) Shard(1) uneven 3/2, norm (7) as given."""
    col, row, norm = R.standard_normal((5, 7)).astype(np.float32), R.standard_normal((7, 5)).astype(np.float32), R.standard_normal(7).astype(np.float32)
    parts = norm_parts(norm) if norm_parts else [(norm, box([7], [REP, REP], [0], [7]))] * 2
    pieces = []
    for k, (a, b) in enumerate(chunks(5, 2)):
        c, r = col[a:b], row[:, a:b]
        if w_fn:
            c, r = w_fn(k, c, r)
        pieces.append({"col": (c, box([5, 7], [REP, shard(0)], [a, 0], [b - a, 7])),
                       "row": (r, box([7, 5], [REP, shard(1)], [0, a], [7, b - a])), "norm": parts[k]})
    return mesh_dumps(name, [1, 2], pieces, {"col": col, "row": row, "norm": norm})


@case
def shards_along_any_dim_uneven_and_partial_sums_pass():
    d, refp = tp_world2(lambda n: [(n * 0.3, box([7], [REP, PART], [0], [7])), (n * 0.7, box([7], [REP, PART], [0], [7]))])
    text, rep = expect([d, "--ref", refp], 0, report=True)
    need(set(status(rep).values()) == {"ok"}, f"statuses {status(rep)}")


@case
def partial_taken_as_replicated_is_named_with_coordinates():
    d, refp = tp_world2(lambda n: [(n * 0.3, box([7], [REP, REP], [0], [7])), (n * 0.7, box([7], [REP, REP], [0], [7]))])
    text, rep = expect([d, "--ref", refp], 1, "norm: replicated across the tensor-parallel ranks, but the copies differ",
                       "never all-reduced", "rank 1 (dp 0, tp 1) against rank 0 (dp 0, tp 0)", report=True)
    need(status(rep) == {"col": "ok", "row": "ok", "norm": "disagree"}, f"statuses {status(rep)}")
    need(rep["runs"][0]["mesh"] == {"names": ["dp", "tp"], "coords": [[0, 0], [0, 1]]}, f"mesh {rep['runs'][0].get('mesh')}")


@case
def a_zeroed_shard_on_one_rank_is_caught():
    d, refp = tp_world2(w_fn=lambda k, c, r: (c, r * 0) if k == 1 else (c, r))
    text, rep = expect([d, "--ref", refp], 1, "row", report=True)
    need(status(rep)["row"] in ("mismatch", "scaled") and status(rep)["col"] == "ok", f"statuses {status(rep)}")


@case
def a_replicated_bias_all_reduced_twice_is_x2():
    b = R.standard_normal(6).astype(np.float32)
    pieces = [{"b": (b * 2, box([6], [REP, REP], [0], [6]))} for _ in range(2)]
    d, refp = mesh_dumps("twice", [1, 2], pieces, {"b": b})
    expect([d, "--ref", refp], 1, "b", "x2")


@case
def dp_by_tp_strided_boxes_assemble():
    # FSDP2 over TP on a (2, 2) mesh: (_StridedShard(0, sf=2), Shard(0)) of an (8, 3) weight: rank (dp i, tp j)
    # holds rows [4j + 2i, 4j + 2i + 2); the norm (Shard(0) on dp, Partial on tp)
    g, n = R.standard_normal((8, 3)).astype(np.float32), R.standard_normal(4).astype(np.float32)
    pieces = []
    for k in range(4):
        i, j = k // 2, k % 2
        a = 4 * j + 2 * i
        half = n[2 * i:2 * i + 2] * (0.25 if j == 0 else 0.75)
        pieces.append({"w": (g[a:a + 2], box([8, 3], [{"kind": "strided_shard", "dim": 0, "split_factor": 2}, shard(0)], [a, 0], [2, 3])),
                       "norm": (half, box([4], [shard(0), PART], [2 * i], [2]))})
    d, refp = mesh_dumps("dpxtp", [2, 2], pieces, {"w": g, "norm": n})
    text, rep = expect([d, "--ref", refp], 0, report=True)
    need(set(status(rep).values()) == {"ok"}, f"statuses {status(rep)}")


@case
def partial_pieces_copied_along_dp_are_added_once():
    # DDP over dp of a tp-partial norm: (Replicate, Partial) on a (2, 2) mesh: each tp part held by both dp ranks
    n = R.standard_normal(6).astype(np.float32)
    parts = [n * 0.4, n * 0.6]
    pieces = [{"norm": (parts[k % 2], box([6], [REP, PART], [0], [6]))} for k in range(4)]
    d, refp = mesh_dumps("partial_dp", [2, 2], pieces, {"norm": n})
    text, rep = expect([d, "--ref", refp], 0, report=True)
    need(status(rep) == {"norm": "ok"}, f"statuses {status(rep)}")


# ---- hostile maps: exit 2 naming the tensor, at once

def hostile(name, entries, needle, mesh_of=None, arrays=None):
    g = R.standard_normal((4, 6)).astype(np.float32)
    pieces = [{"w": ((arrays or [g[:2], g[2:]])[k], entries[k])} for k in range(2)]
    d, refp = mesh_dumps(name, [1, 2], pieces, {"w": g}, mesh_of=mesh_of)
    t0 = time.monotonic()
    expect([d, "--ref", refp], 2, *needle)
    need(time.monotonic() - t0 < 2, f"took {time.monotonic() - t0:.2f} s")


@case
def a_dimension_out_of_range_is_refused():
    hostile("dim_range", [box([4, 6], [REP, shard(2)], [0, 0], [2, 6]), box([4, 6], [REP, shard(2)], [2, 0], [2, 6])], ["tensor 'w'", "out of range"])


@case
def overlapping_pieces_are_refused():
    hostile("overlap", [box([4, 6], [REP, shard(0)], [0, 0], [2, 6]), box([4, 6], [REP, shard(0)], [1, 0], [2, 6])], ["tensor 'w'", "overlaps"])


@case
def missing_pieces_are_refused():
    g = R.standard_normal((4, 6)).astype(np.float32)
    hostile("missing", [box([4, 6], [REP, shard(0)], [0, 0], [1, 6]), box([4, 6], [REP, shard(0)], [2, 0], [2, 6])], ["tensor 'w'", "no rank's piece"],
            arrays=[g[:1], g[2:]])


@case
def sizes_near_2_to_31_are_refused_at_once():
    big = 2147483647
    hostile("big", [box([big, big], [REP, shard(0)], [0, 0], [2, 6]), box([big, big], [REP, shard(0)], [2, 0], [2, 6])], ["tensor 'w'"])


@case
def a_coordinate_outside_the_mesh_is_refused():
    hostile("coord", [box([4, 6], [REP, shard(0)], [0, 0], [2, 6]), box([4, 6], [REP, shard(0)], [2, 0], [2, 6])], ["outside the mesh"],
            mesh_of=lambda k: [0, 5 * k])


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: test_check_mesh.py GRADCHECK_DIST")
    t.BIN = os.path.abspath(sys.argv[1])
    t.run_cases(CASES, "gcd-check-mesh-")


if __name__ == "__main__":
    main()
