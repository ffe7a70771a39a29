#!/usr/bin/env python3
"""`gradcheck-dist check` with both stages where the ranks disagree after the reduce (issue 38): the local
dumps' values say why, from byte-level fixtures (tests/st_writer.py), world 4:

  - every rank's reduced gradient is its own local one: no all-reduce ran (the forward around the wrapper);
    the same for some parameters only: outside DDP;
  - R_k = mean_j E_j + (L_k - E_k), E the gradient accumulated before the last backward (NAME@earlier): the
    last backward did not sync; the same numbers without NAME@earlier: part averaged, part own;
  - a rank that changed its gradient after the all-reduce (rank 0 holds the reference, rank 2 halved): none of
    these, today's words, and which rank holds the reference.

    test_check_stages.py GRADCHECK_DIST
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_writer as w  # noqa: E402
import test_check_inputs as t  # noqa: E402
from test_check_inputs import expect, need  # noqa: E402

CASES = []
W = 4
R = np.random.default_rng(38)
NAMES = ["body.weight", "body.bias", "head.weight"]


def case(fn):
    CASES.append(fn)
    return fn


def grads(scale=1.0):
    return {n: (R.standard_normal(s) * scale).astype(np.float32) for n, s in zip(NAMES, [(16, 8), (16,), (2, 16)])}


def mean(per_rank):
    return {n: (sum(g[n].astype(np.float64) for g in per_rank) / len(per_rank)).astype(np.float32) for n in per_rank[0]}


def write(d, local, reduced, ref, earlier=None):
    """local, reduced: one dict per rank; earlier: one dict per rank written beside local as NAME@earlier."""
    os.makedirs(f"{d}/local", exist_ok=True)
    os.makedirs(f"{d}/reduced", exist_ok=True)
    for k in range(W):
        loc = dict(local[k])
        if earlier is not None:
            loc.update({n + "@earlier": v for n, v in earlier[k].items()})
        w.write_dump(f"{d}/local/rank{k}.safetensors", loc, rank=k, world=W, stage="local", params=NAMES)
        w.write_dump(f"{d}/reduced/rank{k}.safetensors", reduced[k], rank=k, world=W, stage="reduced", params=NAMES)
    return w.write_dump(f"{d}.ref.safetensors", ref, params=NAMES)


def check(d, refp, *needles):
    text, rep = expect([f"{d}/local", f"{d}/reduced", "--ref", refp], 1, *needles, report=True)
    first = [f for f in rep["runs"][0]["findings"] if f["counts"]][0]
    return text, rep, first


@case
def own_local_on_every_rank_is_no_all_reduce():
    d = t.fresh("unreduced")
    local = [grads() for _ in range(W)]
    refp = write(d, local, local, mean(local))
    text, rep, first = check(d, refp)
    need(first["kind"] == "disagree" and "no all-reduce ran for them" in first["message"], f"first finding: {first}")
    need("went around the DDP wrapper" in first["message"] and "Fix: call the wrapper" in first["message"], first["message"])
    need("no rank holds it" in first["message"], first["message"])
    p = {q["name"]: q for q in rep["runs"][0]["params"]}["body.weight"]
    need(p["stage_cause"] == "unreduced" and all(r["own_local_rel"] == 0 for r in p["per_rank"]), f"params: {p}")


@case
def own_local_for_some_parameters_is_outside_ddp():
    d = t.fresh("outside")
    local = [grads() for _ in range(W)]
    m = mean(local)
    reduced = [{**m, "head.weight": local[k]["head.weight"]} for k in range(W)]
    refp = write(d, local, reduced, m)
    text, rep, first = check(d, refp, "head.weight: no all-reduce ran for it")
    need("outside DDP" in first["message"] and "went around the DDP wrapper (a method" not in first["message"], first["message"])


@case
def mean_of_earlier_plus_own_last_is_the_last_backward_unsynced():
    d = t.fresh("unsynced")
    earlier, last = [grads() for _ in range(W)], [grads() for _ in range(W)]
    me = mean(earlier)
    local = [{n: earlier[k][n] + last[k][n] for n in NAMES} for k in range(W)]
    reduced = [{n: me[n] + last[k][n] for n in NAMES} for k in range(W)]
    refp = write(d, local, reduced, mean(local), earlier=earlier)
    text, rep, first = check(d, refp, "the last backward of the gradient accumulation did not sync")
    need("require_backward_grad_sync" in first["message"] and "Fix: decide before each forward" in first["message"], first["message"])
    p = {q["name"]: q for q in rep["runs"][0]["params"]}["body.weight"]
    need(p["stage_cause"] == "last_unsynced" and p["split_rel"] < 1e-5, f"params: {p}")
    # the same numbers without the earlier part: only that part of each was averaged, not where it was split
    d2 = t.fresh("part")
    refp = write(d2, local, reduced, mean(local))
    text, rep, first = check(d2, refp, "part the ranks' mean and part its own")
    need("did not sync" in first["message"] and "NAME@earlier" in first["message"], first["message"])


@case
def a_rank_changed_after_the_all_reduce_keeps_todays_words_and_names_who_holds_the_reference():
    d = t.fresh("changed")
    earlier, last = [grads() for _ in range(W)], [grads() for _ in range(W)]
    local = [{n: earlier[k][n] + last[k][n] for n in NAMES} for k in range(W)]
    m = mean(local)
    reduced = [dict(m) for _ in range(W)]
    reduced[2] = {n: v * np.float32(0.5) for n, v in m.items()}   # rank 2 halved its gradient after the all-reduce
    refp = write(d, local, reduced, m, earlier=earlier)
    text, rep, first = check(d, refp, "a gradient changed after the all-reduce")
    msg = first["message"]
    need("ranks 0, 1 and 3 hold it, the other not" in msg, msg)
    for wrong in ("no all-reduce ran", "did not sync", "part the ranks' mean"):
        need(wrong not in msg, f"'{wrong}' named: {msg}")


@case
def earlier_tensors_of_unlisted_names_are_refused():
    d = t.fresh("unlisted")
    local = [grads() for _ in range(W)]
    refp = write(d, local, local, mean(local), earlier=[{"body.weight": local[k]["body.weight"]} for k in range(W)])
    w.write_dump(f"{d}/local/rank1.safetensors", {**local[1], "nope@earlier": local[1]["body.bias"]}, rank=1, world=W, stage="local",
                 params=NAMES)
    expect([f"{d}/local", f"{d}/reduced", "--ref", refp], 2, "tensor 'nope@earlier' is not in gradcheck.params")


def with_losses(d, losses, shard_losses, scale=W, rank_meta=None, ref_meta=None):
    """x1/scale (1/world) reduced dumps (world 4) recording each rank's loss, and a reference recording the batches'
    own; rank_meta, ref_meta: more metadata (the reference's gradcheck.loss, gradcheck.accumulate, ...)"""
    os.makedirs(d, exist_ok=True)
    ref = grads()
    for k in range(W):
        m = {**w.meta(k, W, "reduced", NAMES), **(rank_meta or {})}
        if losses is not None:
            m["gradcheck.loss"] = losses[k]
        w.write_dump(f"{d}/rank{k}.safetensors", {n: v / np.float32(scale) for n, v in ref.items()}, metadata=m, params=NAMES)
    m = {**w.meta(0, 1, "reduced", NAMES), **(ref_meta or {})}
    if shard_losses is not None:
        m["gradcheck.shard_losses"] = shard_losses
    return w.write_dump(f"{d}.ref.safetensors", ref, metadata=m, params=NAMES)


@case
def recorded_losses_name_a_double_reduction_and_bad_ones_are_exit_2():
    d = t.fresh("losses")
    refp = with_losses(f"{d}/ok", ["0.5"] * W, "[0.3, 0.4, 0.6, 0.7]")
    expect([f"{d}/ok", "--ref", refp], 1, "x0.25 (= 1/world): a double reduction")
    refp = with_losses(f"{d}/differ", ["0.3", "0.4", "0.6", "0.7"], "[0.3, 0.4, 0.6, 0.7]")
    text, _ = expect([f"{d}/differ", "--ref", refp], 1, "x0.25 (= 1/world)")
    need("double reduction" not in text, text)
    refp = with_losses(f"{d}/nan", ["nan"] * W, "[0.3, 0.4, 0.6, 0.7]")   # a diverged loss: recorded, says nothing
    text, _ = expect([f"{d}/nan", "--ref", refp], 1, "x0.25 (= 1/world)")
    need("double reduction" not in text, text)
    refp = with_losses(f"{d}/word", ["0.5", "half", "0.5", "0.5"], "[0.3, 0.4, 0.6, 0.7]")
    expect([f"{d}/word", "--ref", refp], 2, "metadata gradcheck.loss is 'half', not a number")
    refp = with_losses(f"{d}/short", ["0.5"] * W, "[0.3, 0.4]")
    expect([f"{d}/short", "--ref", refp], 2, "gradcheck.shard_losses is not a list of 4 numbers")
    refp = with_losses(f"{d}/str", ["0.5"] * W, '[0.3, "0.4", 0.6, 0.7]')
    expect([f"{d}/str", "--ref", refp], 2, "gradcheck.shard_losses[1] is not a finite number")


@case
def recorded_losses_name_a_summed_loss_only_against_the_steps_own_objective():
    d = t.fresh("summed")
    own, shards = ["0.3", "0.4", "0.6", "0.7"], "[0.3, 0.4, 0.6, 0.7]"   # each rank's loss its batch's own; mean 0.5
    refp = with_losses(f"{d}/w", own, shards, ref_meta={"gradcheck.loss": "2.0"})   # the objective: mean x world
    expect([f"{d}/w", "--ref", refp], 1, "x0.25 (= 1/world): a loss summed over rows")
    refp = with_losses(f"{d}/k", own, shards, 8, {"gradcheck.accumulate": "2"}, {"gradcheck.loss": "4.0"})
    text, _ = expect([f"{d}/k", "--ref", refp], 1, "(= 1/(world x 2 accumulation steps)): a loss summed over rows")
    need("gradient accumulation steps where" not in text, text)
    for name, scale, acc, loss in (("wo", W, {}, "2.0"), ("ko", 8, {"gradcheck.accumulate": "2"}, "4.0")):
        refp = with_losses(f"{d}/{name}", own, shards, scale, acc, {"gradcheck.loss": loss, "gradcheck.objective": "reference"})
        text, _ = expect([f"{d}/{name}", "--ref", refp], 1, "x0.125" if scale == 8 else "x0.25")
        need("world): a loss summed over rows" not in text and "steps)): a loss summed" not in text, text)   # not the step's
    refp = with_losses(f"{d}/bad-k", own, shards, 8, {"gradcheck.accumulate": "0"}, {"gradcheck.loss": "4.0"})
    expect([f"{d}/bad-k", "--ref", refp], 2, "metadata gradcheck.accumulate is '0', not a count of micro-batches")
    refp = with_losses(f"{d}/bad-o", own, shards, ref_meta={"gradcheck.loss": "2.0", "gradcheck.objective": "mine"})
    expect([f"{d}/bad-o", "--ref", refp], 2, "metadata gradcheck.objective is 'mine', not 'step' or 'reference'")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: test_check_stages.py GRADCHECK_DIST")
    t.BIN = os.path.abspath(sys.argv[1])
    t.run_cases(CASES, "gcd-check-stages-")


if __name__ == "__main__":
    main()
