"""`report --format md` is a ticket body: its title and environment lines, and its size bound.

usage: /usr/bin/python3 tests/test_ticket_md.py GRADCHECK_DIST SOURCE_DIR   (numpy, jsonschema)

- title and environment of a run report (`--mode off`, `--mode avg`) and of a check report whose dumps
  recorded Python, torch and Lightning versions (made-up ones, so they can only come from the dumps);
- the Markdown stays under 60,000 characters (GitHub refuses bodies over 65,536) for the default run, a
  world-32 run, and reports built here at the largest sizes the CLI accepts (--world 4096 with a
  hostfile, --batch and every --dim at 2^20, distinct hosts and devices; a check of 4096 dumps with
  20,000 long parameter names and a 4096-argument command): too large to run, so made from a real
  --summary-only report, scaled up, and validated against reports/schema.json (the run reports). Also with the tensors
  elided ({"elided": true, ...}, the reports' contract for tensors over 4096 elements without --full).
Prints one line per check and `N passed, M failed`; exits 1 on any failure.
"""
import copy
import json
import math
import os
import subprocess
import sys
import tempfile
import atexit
import shutil

import jsonschema

G, SRC = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
sys.path.insert(0, os.path.join(SRC, "tests"))
import st_writer as w  # noqa: E402

LIMIT = 60000
BIG = 1 << 20   # --batch, --dim-img, --dim-txt, --dim-emb: the most the CLI accepts
WORLD = 4096    # --world: the most the CLI accepts
passed = failed = 0


def check(ok, name, detail=""):
    global passed, failed
    passed, failed = passed + bool(ok), failed + (not ok)
    print(f"{'ok  ' if ok else 'FAIL'} {name}{'' if ok else ': ' + str(detail)[:300]}", flush=True)


def run(*args, want=(0, 1)):
    p = subprocess.run([G, *args], capture_output=True, text=True, timeout=300)
    if p.returncode not in want:
        raise SystemExit(f"FAIL gradcheck-dist {' '.join(args)}: exit {p.returncode}: {p.stderr}")
    return p.stdout


def md(path):
    return run("report", path, "--format", "md", want=(0,))


def lines(text, prefix):
    return [line for line in text.split("\n") if line.startswith(prefix)]


WORK = tempfile.mkdtemp(prefix="test_ticket_md.")
atexit.register(shutil.rmtree, WORK, True)   # the test removes what it made (issue 33)
os.chdir(WORK)
version = run("--version").split("\n")[0].split()[-1]   # "gradcheck-dist X.Y.Z", then the BLAS line
schema = json.load(open(os.path.join(SRC, "reports", "schema.json")))

# ---- a run report: the title in the library's words, from the findings' numbers
run("run", "--world", "2", "--probe", "simplenet", "--mode", "off", "--json", "off.json")
t = md("off.json")
check(t.split("\n")[0] == "# Lightning all_gather(sync_grads=False): fc1.weight, fc1.bias get no gradient at world 2",
      "run title (off)", t.split("\n")[0])
check(f"- gradcheck-dist {version}, backend mpi, world 2, float64, tolerance 1e-09" in t.split("\n"), "run environment: tool line",
      lines(t, "- gradcheck-dist"))
check(len(lines(t, "- MPI: Open MPI")) == 1 and len(lines(t, "- hosts: ")) == 1, "run environment: MPI and hosts lines", lines(t, "- "))
check(not lines(t, "- NCCL"), "no NCCL line without NCCL")
run("run", "--world", "2", "--probe", "simplenet", "--mode", "avg", "--json", "avg.json")
t = md("avg.json")
check(t.split("\n")[0] == "# Horovod allgather (backward averages over ranks): fc1.weight, fc1.bias get x0.5 the gradient (1/world) at world 2",
      "run title (avg)", t.split("\n")[0])

# ---- hostile names cannot put code into the script: it parses, and PARAMS holds the name exactly
import ast  # noqa: E402
import re  # noqa: E402


def setup_of(d, r):   # schema /2: one setup per probe at the top; /1: in the run
    return r.get("setup") or next(s for s in d["setups"] if s["probe"] == r["probe"])


evil = json.load(open("off.json"))
name = 'x"): 1}\nimport os; os.system("echo PWNED")  # \\\' \x01'
setup_of(evil, evil["runs"][0])["params"][0]["name"] = evil["runs"][0]["params"][0]["name"] = name
evil["runs"][0]["library"] = 'Lightning\nimport os; os.system("echo PWNED")'
json.dump(evil, open("evil.json", "w"))
m = re.search(r"^(`{3,})python\n(.*?)^\1$", md("evil.json"), re.S | re.M)
try:
    tree = ast.parse(m.group(2))
    params = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "PARAMS")
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "system"]
    check(name in params and not calls, "hostile names stay strings in the script", list(params)[:1])
except (AttributeError, SyntaxError, StopIteration, ValueError) as e:
    check(False, "hostile names stay strings in the script", e)

# ---- a check report: the title from its findings, the versions its dumps recorded
names = ["visual.conv.weight", "visual.conv.bias", "visual.proj.weight", "text.proj.weight", "logit_scale"]
os.mkdir("dumps")
for r in range(4):
    grads = {"text.proj.weight": w.np.full((3, 2), 0.5, dtype=w.np.float32), "logit_scale": w.np.float32([0.25]).reshape(())}
    m = w.meta(r, 4, "reduced", names, gradcheck_python="3.99.1", gradcheck_torch="9.8.7", gradcheck_lightning="7.6.5")
    w.write_dump(f"dumps/rank{r}.safetensors", grads, params=names, metadata=m)
run("check", "dumps", "--json", "check.json")
t = md("check.json")
check(t.split("\n")[0] == "# visual.* gets no gradient at world 4 (check of dumps)", "check title", t.split("\n")[0])
check("- as the dumps recorded: Python 3.99.1, torch 9.8.7, Lightning 7.6.5" in t.split("\n"), "check environment: recorded versions",
      lines(t, "- "))
check(lines(t, f"- gradcheck-dist {version}, `check` of 4 dumps (stage reduced)"), "check environment: tool line", lines(t, "- "))
check("dump_grads(ddp_model" in t and "gradcheck-dist check grads --ref ref.safetensors" in t and "```python" in t,
      "check: the harness commands instead of a script")
check("expectations met" not in t and ", mode " not in t and "(test)" not in t and "**Result: fail** (exit 1)." in t
      and "(stage reduced, world 4)** (under test)" in t and "| stage reduced |" in t,
      "check: no run-only words (mode, expectations, test/control), the stage instead", [l for l in t.split("\n") if "Result" in l or "stage" in l])

# ---- size: real runs
for args in (["run", "--json", "default.json"], ["run", "--world", "32", "--json", "w32.json"]):
    run(*args)
    n = len(md(args[-1]))
    check(n < LIMIT, f"md of `gradcheck-dist {' '.join(args)}`: {n} characters", n)


# ---- size: the largest sizes the CLI accepts, built from a real --summary-only report
def elide(values, numel):
    return {"elided": True, "numel": numel, "norm": 1.0, "first": [0.5] * 16}


def largest_run(base, elided):
    d = copy.deepcopy(base)
    d["command"] = [G, "run", "--world", str(WORLD), "--hostfile", "hosts", "--backend", "nccl", "--batch", str(BIG), "--dim-img", str(BIG),
                    "--dim-txt", str(BIG), "--dim-emb", str(BIG), "--json", "largest.json"]
    env = d["environment"]
    env.update(backend="nccl", world=WORLD, nccl_version="2.21.5", cuda_version="12.4",
               hostnames=[f"node{k // 8:04d}.a-long-cluster-domain.example.org" for k in range(WORLD)],
               devices=[f"cuda:{k % 8} NVIDIA H100 80GB HBM3 (UUID GPU-{k:08d}-0000-0000-0000-000000000000)" for k in range(WORLD)])
    shapes = {"img.weight": [BIG, BIG], "img.bias": [BIG], "txt.weight": [BIG, BIG], "txt.bias": [BIG]}
    for r in d["runs"]:
        r["world"], r["dims"] = WORLD, {"batch": BIG, "dim_img": BIG, "dim_txt": BIG, "dim_emb": BIG}
        r["loss"]["per_rank"] = [r["loss"]["per_rank"][0]] * WORLD
        s = setup_of(d, r)   # shared by a probe's runs: every change below is idempotent
        for p in s["params"] + r["params"]:
            p["shape"] = shapes.get(p["name"], p["shape"])
            numel = math.prod(p["shape"])
            if elided and "init" in p and r["probe"] == "contrastive" and numel > 4096:
                p["init"] = elide(p["init"], numel)
        ins = s["inputs"]
        s["inputs"] = [copy.deepcopy(ins[0]) for _ in range(WORLD)]
        for k, x in enumerate(s["inputs"]):
            x["rank"] = k
            for tensor in x["tensors"]:
                if r["probe"] == "contrastive":
                    tensor["shape"] = [BIG, BIG]
                    if elided:
                        tensor["data"] = elide(tensor["data"], BIG * BIG)
    return d


def largest_check(base):
    d = copy.deepcopy(base)
    n = 20000
    long = "model.transformer.resblocks.{}.attention_with_an_unusually_long_descriptive_name.in_proj_weight_" + "x" * 100
    d["command"] = [G, "check"] + [f"/a/long/path/to/the/gradient/dumps/of/this/run/rank{k}.safetensors" for k in range(WORLD)]
    d["environment"]["world"] = WORLD
    r = d["runs"][0]
    r["world"] = WORLD
    r["dumps"] = [dict(r["dumps"][0], path=f"/a/long/path/rank{k}.safetensors", rank=k) for k in range(WORLD)]
    proto = {p["status"]: p for p in r["params"]}
    r["params"] = []
    for k in range(n):
        p = copy.deepcopy(proto["none" if k % 3 == 0 else "present"])
        p["name"] = long.format(k)
        p["per_rank"] = []
        r["params"].append(p)
    none = [p["name"] for p in r["params"] if p["status"] == "none"]
    r["findings"] = [{"kind": "none", "counts": True, "params": none, "message": " and ".join(none) + " receive no gradient on any rank"}] * 5
    return d


def sized(doc, name, validate=True):
    if validate:
        try:
            jsonschema.validate(doc, schema)
        except jsonschema.ValidationError as e:
            check(False, f"{name}: valid against reports/schema.json", f"{e.message[:150]} at {list(e.absolute_path)}: {[c.message[:150] for c in (e.context or [])][:4]}")
    with open(name, "w") as f:
        json.dump(doc, f)
    t = md(name)
    check(len(t) < LIMIT, f"md of {name} ({os.path.getsize(name) / 1e6:.1f} MB JSON): {len(t)} characters", len(t))
    check(t.startswith("# ") and "\n## Reproduce\n" in t and "attach" in t, f"md of {name}: title, reproduce, the note to attach the report")
    return t


run("run", "--world", "3", "--summary-only", "--json", "summary.json")
base = json.load(open("summary.json"))
t = sized(largest_run(base, elided=False), "largest_run.json")
check("PARAMS, INPUTS = None, None" in t, "largest run: the script reads the weights and inputs from the JSON report")
check("node0000.a-long-cluster-domain.example.org x8" in t and " and 504 more" in t, "largest run: 4096 hosts said in one short line")
check("\n- NCCL 2.21.5, CUDA 12.4\n" in t, "largest run: the NCCL and CUDA versions")
sized(largest_run(base, elided=True), "largest_run_elided.json", validate=True)   # elided tensors
jsonschema.validate(json.load(open("check.json")), schema)   # a real check report, with None parameters (null shape, dtype)
t = sized(largest_check(json.load(open("check.json"))), "largest_check.json")
check("more rows, all in the JSON report" in t, "largest check: says what the table leaves out")

# ---- size: many long findings (the findings section stops early), and environment strings of any length
many = copy.deepcopy(base)   # 200 findings of 500 characters: 100,000 characters uncapped
many["runs"][0]["findings"] = [{"kind": "mismatch", "counts": True, "params": ["img.weight"], "message": f"finding {k}: " + "y" * 480}
                               for k in range(200)]
t = sized(many, "many_findings.json", validate=False)
check("more findings in the JSON report" in t, "many findings: says how many more are in the JSON report")
huge = copy.deepcopy(base)
huge["environment"].update(nccl_version="2." * 100000, cuda_version="12" * 100000, start_time="T" * 200000)
sized(huge, "huge_environment.json", validate=False)
huge = copy.deepcopy(json.load(open("check.json")))
huge["environment"].update(python_version="3" * 200000, torch_version="2" * 200000, lightning_version="1" * 200000, start_time="T" * 200000)
sized(huge, "huge_check_environment.json", validate=False)

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed or not passed else 0)
