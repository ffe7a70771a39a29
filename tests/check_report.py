"""Checks a gradcheck-dist JSON report with independent tools.

usage: check_report.py SCHEMA REPORT [TEXT]

- the report validates against reports/schema.json (jsonschema);
- every DDP-mean gradient equals the mean of the per-rank gradients, and its norm the one reported;
- the text table (if given) shows the status and norm the JSON holds, cell by cell;
- every run's reference gradient equals central differences of the objective recomputed here in
  numpy from the report's replay setup alone (params' init values, every rank's inputs).
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


# ---------------------------------------------------------------------------- objectives in numpy

def relu(v):
    return np.maximum(v, 0.0)


def normalize(v):
    return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)


def cross_entropy(z, labels):
    m = z.max(axis=1, keepdims=True)
    lse = (m + np.log(np.exp(z - m).sum(axis=1, keepdims=True)))[:, 0]
    return np.mean(lse - z[np.arange(len(labels)), labels])


def objective(run, P, inputs):
    """mean over ranks of each rank's loss, every rank's inputs in one process"""
    W = run["world"]
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


def check_reference(run):
    setup = run["setup"]
    P = {p["name"]: arr(p["init"], p["shape"]) for p in setup["params"]}
    inputs = [{t["name"]: arr(t["data"], t["shape"]) for t in r["tensors"]} for r in setup["inputs"]]
    f0 = objective(run, P, inputs)
    if abs(f0 - num(run["loss"]["reference"])) > 1e-12 * max(1, abs(f0)):
        fail(f"{run['probe']} {run['mode']}: objective {f0!r} != report's reference loss {run['loss']['reference']!r}")
    eps, worst = 1e-6, 0.0
    for p in run["params"]:
        ref = arr(p["reference"], p["shape"] or ())
        x = P[p["name"]]
        fd = np.zeros_like(ref)
        for i in np.ndindex(x.shape):
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
        rows = {ln.split()[0]: ln.split(" | ")[1:] for ln in lines[at + 3:] if ln.startswith("  ") and " | " in ln and not ln.startswith("  |g|")}
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
            local = np.array([[num(v) for v in l] if l is not None else [0.0] * len(p["reduced"]) for l in p["local"]])
            mean, red = local.mean(axis=0), np.array([num(v) for v in p["reduced"]])
            if np.abs(mean - red).max() > 1e-14 * max(1e-300, np.abs(local).max()):  # summation order only
                fail(f"{run['probe']} {run['mode']} {p['name']}: reduced {red} != mean of local {mean}")
            if abs(np.linalg.norm(red) - num(p["norm"])) > 1e-14 * np.linalg.norm(red):
                fail(f"{p['name']}: norm {p['norm']} != ||reduced|| {np.linalg.norm(red)}")
        if run["setup"]["params"][0]["init"] is not None:
            worst = max(worst, check_reference(run))
            checked += 1
    if len(sys.argv) > 3:
        check_table(report, open(sys.argv[3]).read())
    print(f"check_report: {len(report['runs'])} runs, {checked} references against numpy central differences "
          f"(worst {worst:.1e}), {failures} failure(s)")
    sys.exit(1 if failures else 0)


main()
