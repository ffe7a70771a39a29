"""Checks a gradcheck-dist JSON report with independent tools.

usage: check_report.py SCHEMA REPORT [TEXT]

- the report validates against reports/schema.json (jsonschema);
- every DDP-mean gradient equals the mean of the per-rank gradients, and its norm the one reported;
- the text table (if given) shows the status and norm the JSON holds, cell by cell;
- every run's reference gradient equals central differences of the objective recomputed here in
  numpy from the report's replay setup alone (params' init values, every rank's inputs), at up to
  256 coordinates of each parameter;
- schema /2: one setup per probe in the top-level "setups" and none in the runs (/1: one in every
  run); a tensor over the limit elided ({elided, numel, norm, first}) unless the report says --full,
  and none at or under it.
Prints the first differing values and exits non-zero on any failure.
"""
import json
import sys

import jsonschema
import numpy as np

failures = 0


def fail(msg):
    global failures
    failures += 1
    print("FAIL", msg, file=sys.stderr)


def num(v):
    return {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}.get(v, v) if isinstance(v, str) else (np.nan if v is None else v)


def arr(values, shape):
    return np.array([num(v) for v in values], dtype=np.float64).reshape(shape)


def elided(v):
    return isinstance(v, dict) and v.get("elided") is True


def run_setup(report, run):
    """the run's setup: in the run (schema /1) or the top-level "setups" entry of its probe (/2)"""
    if "setup" in run:
        return run["setup"]
    return next((s for s in report.get("setups", []) if s["probe"] == run["probe"]), None)


def check_values(report):
    """every tensor-valued field elided exactly when it must be, and its summary true to its shape"""
    values = report.get("values") or {}
    limit = None if values.get("full") or report["schema"].endswith("/1") else values.get("limit")
    fields = []  # (where, shape, value)
    for s in report.get("setups", []) + [r["setup"] for r in report["runs"] if "setup" in r]:
        fields += [(f"setup {s.get('probe', '(schema /1)')} {p['name']} init", p["shape"], p["init"]) for p in s["params"]]
        fields += [(f"setup {s.get('probe', '(schema /1)')} rank {r['rank']} {t['name']}", t["shape"], t["data"]) for r in s["inputs"] for t in r["tensors"]]
    for run in report["runs"]:
        for p in run["params"]:
            where = f"{run['probe']} {run['mode']} {p['name']}"
            fields += [(f"{where} {k}", p["shape"], p.get(k)) for k in ("reduced", "reference")]
            fields += [(f"{where} local[{k}]", p["shape"], v) for k, v in enumerate(p.get("local") or [])]
    n_elided = 0
    for where, shape, v in fields:
        if v is None or shape is None:
            continue
        n = int(np.prod(shape))
        if (limit is not None and n > limit) != elided(v):
            fail(f"{where}: {n} elements, limit {limit}: {'elided' if elided(v) else 'written whole'}")
        elif elided(v):
            n_elided += 1
            if v["numel"] != n or len(v["first"]) != min(16, n):
                fail(f"{where}: elided numel {v['numel']}, {len(v['first'])} first values for shape {shape}")
        elif len(v) != n:
            fail(f"{where}: {len(v)} values for shape {shape}")
    if report["schema"].endswith("/1"):
        if any("setup" not in r for r in report["runs"] if r["probe"] != "check"):
            fail("schema /1: a run without its setup")
    else:
        probes = [s["probe"] for s in report.get("setups", [])]
        if sorted(probes) != sorted({r["probe"] for r in report["runs"] if r["probe"] != "check"}) or any("setup" in r for r in report["runs"]):
            fail(f"schema /2: setups for {probes}, not one per probe run, or a setup inside a run")
    return n_elided


# ---------------------------------------------------------------------------- objectives in numpy

def relu(v):
    return np.maximum(v, 0.0)


def normalize(v):
    return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)


def cross_entropy(z, labels):
    m = z.max(axis=1, keepdims=True)
    lse = (m + np.log(np.exp(z - m).sum(axis=1, keepdims=True)))[:, 0]
    return np.mean(lse - z[np.arange(len(labels)), labels])


def layer_norm(v, w, b):
    m, var = v.mean(axis=1, keepdims=True), v.var(axis=1, keepdims=True)
    return (v - m) / np.sqrt(var + 1e-5) * w + b


def objective(run, P, inputs):
    """mean over ranks of each rank's loss, every rank's inputs in one process"""
    W = run["world"]
    if run["probe"] == "tp":  # the block unsplit on the whole sequence; every rank's loss is this one
        h = layer_norm(np.vstack([inputs[k]["x"] for k in range(W)]), P["norm.weight"], P["norm.bias"])
        return np.mean((relu(h @ P["fc1.weight"].T + P["fc1.bias"]) @ P["fc2.weight"].T) ** 2)
    if run["probe"] == "simplenet":
        x = np.concatenate([relu(inputs[k]["input1"] @ P["fc1.weight"].T + P["fc1.bias"]).ravel() for k in range(W)])
        y = np.concatenate([relu(inputs[k]["input2"] @ P["fc2.weight"].T + P["fc2.bias"]).ravel() for k in range(W)])
        return np.mean((x * y) ** 2)  # identical on every rank
    I = [normalize(inputs[k]["x_img"] @ P["img.weight"].T + P["img.bias"]) for k in range(W)]
    T = [normalize(inputs[k]["x_txt"] @ P["txt.weight"].T + P["txt.bias"]) for k in range(W)]
    Ia, Ta, s = np.vstack(I), np.vstack(T), np.exp(P["logit_scale"])
    B = I[0].shape[0]
    if not run["local_loss"]:
        logits = s * Ia @ Ta.T
        labels = np.arange(W * B)
        return (cross_entropy(logits, labels) + cross_entropy(logits.T, labels)) / 2
    losses = []
    for r in range(W):
        labels = r * B + np.arange(B)
        losses.append((cross_entropy(s * I[r] @ Ta.T, labels) + cross_entropy(s * T[r] @ Ia.T, labels)) / 2)
    return np.mean(losses)


def check_reference(run, setup):
    P = {p["name"]: arr(p["init"], p["shape"]) for p in setup["params"]}
    inputs = [{t["name"]: arr(t["data"], t["shape"]) for t in r["tensors"]} for r in setup["inputs"]]
    f0 = objective(run, P, inputs)
    if abs(f0 - num(run["loss"]["reference"])) > 1e-12 * max(1, abs(f0)):
        fail(f"{run['probe']} {run['mode']}: objective {f0!r} != report's reference loss {run['loss']['reference']!r}")
    eps, worst = 1e-6, 0.0
    for p in run["params"]:
        ref = arr(p["reference"], p["shape"] or ())
        x = P[p["name"]]
        fd = ref.copy()  # central differences at up to 256 coordinates, evenly spread (all of a small tensor)
        for i in [np.unravel_index(j, x.shape) for j in np.unique(np.linspace(0, x.size - 1, min(x.size, 256)).astype(int))] if x.size else []:
            x0 = x[i]
            x[i] = x0 + eps
            fp = objective(run, P, inputs)
            x[i] = x0 - eps
            fm = objective(run, P, inputs)
            x[i] = x0
            fd[i] = (fp - fm) / (2 * eps)
        err = np.abs(fd - ref) / np.maximum(1.0, np.abs(fd))
        worst = max(worst, float(err.max(initial=0)))
        if err.max(initial=0) > 1e-6:
            i = np.unravel_index(np.argmax(err), err.shape) if err.ndim else ()
            fail(f"{run['probe']} {run['mode']} {p['name']}{list(i)}: reference {ref[i]!r}, numpy central difference {fd[i]!r}")
    return worst


# ---------------------------------------------------------------------------- the table

def title(run):
    if run["probe"] == "simplenet":   # only simplenet can give every rank the same inputs
        return f"simplenet (inputs {run['inputs']}, world {run['world']})"
    return f"{run['probe']} ({'local_loss, ' if run['local_loss'] else ''}world {run['world']})"


def check_table(report, text):
    lines = text.splitlines()
    for run in report["runs"]:
        t = title(run)
        if t not in lines:
            fail(f"text: no table titled {t!r}")
            continue
        at = lines.index(t)
        modes = [c.split()[0] for c in lines[at + 1].split(" | ")[1:]]
        col = modes.index(run["mode"])
        end = next((i for i in range(at + 3, len(lines)) if not lines[i].startswith("  ") or lines[i].startswith("  |g|")), len(lines))
        rows = {}  # this table's rows only: another table (a later probe's, the steps') may name the same parameters
        for ln in lines[at + 3:end]:
            if " | " in ln:
                rows.setdefault(ln.split()[0], ln.split(" | ")[1:])
        for p in run["params"]:
            cell = rows[p["name"]][col].split()
            norm = "-" if p["norm"] is None else f"{num(p['norm']):.3e}"
            if cell[:2] != [p["status"], norm]:
                fail(f"text {t} {run['mode']} {p['name']}: table shows {cell[:2]}, JSON has {[p['status'], norm]}")


def main():
    schema, report = (json.load(open(a)) for a in sys.argv[1:3])
    jsonschema.validate(report, schema)
    worst, checked = 0.0, 0
    for run in report["runs"]:
        for p in run["params"]:
            if "local" not in p:
                continue  # --summary-only
            if p["reduced"] is None:
                if any(l is not None for l in p["local"]):
                    fail(f"{p['name']}: reduced is None but a rank has a gradient")
                continue
            if elided(p["reduced"]):  # the norm is what an elided tensor keeps
                if abs(num(p["reduced"]["norm"]) - num(p["norm"])) > 1e-14 * abs(num(p["norm"])):
                    fail(f"{p['name']}: elided reduced norm {p['reduced']['norm']} != norm {p['norm']}")
                continue
            local = np.array([[num(v) for v in l] if l is not None else [0.0] * len(p["reduced"]) for l in p["local"]])
            # a tensor-parallel probe's sharded parameter: disjoint pieces, whose sum is the whole
            mean = local.sum(axis=0) if p.get("tensor_parallel") == "sharded" else local.mean(axis=0)
            red = np.array([num(v) for v in p["reduced"]])
            if np.abs(mean - red).max() > 1e-14 * max(1e-300, np.abs(local).max()):  # summation order only
                fail(f"{run['probe']} {run['mode']} {p['name']}: reduced {red} != mean of local {mean}")
            if abs(np.linalg.norm(red) - num(p["norm"])) > 1e-14 * np.linalg.norm(red):
                fail(f"{p['name']}: norm {p['norm']} != ||reduced|| {np.linalg.norm(red)}")
        setup = run_setup(report, run)
        whole = [setup["params"][0]["init"]] + [t["data"] for r in setup["inputs"] for t in r["tensors"]] + [p.get("reference") for p in run["params"]]
        if all(v is not None and not elided(v) for v in whole):
            worst = max(worst, check_reference(run, setup))
            checked += 1
    n_elided = check_values(report)
    if len(sys.argv) > 3:
        check_table(report, open(sys.argv[3]).read())
    print(f"check_report: {len(report['runs'])} runs, {checked} references against numpy central differences "
          f"(worst {worst:.1e}), {n_elided} elided tensors, {failures} failure(s)")
    sys.exit(1 if failures else 0)


main()
