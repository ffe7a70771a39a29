"""The PyTorch script in `report --format md` reproduces the report's numbers with the libraries' code.

usage: python tests/torch/test_ticket_repro.py GRADCHECK_DIST   (torch, pytorch-lightning, torchmetrics)

For each run below: gradcheck-dist writes a report, the script is cut out of its Markdown and run with
this Python (W gloo processes, real DDP, the library's own gather); every parameter's printed DDP gradient
norm must be None exactly where the report says none, and otherwise equal the report's norm, and the
printed single-process norm the report's reference norm, within 1e-12 (relative). The last run's weights
and inputs are too large to be inline: its script must read them from the JSON report. Prints one line
per check and `N passed, M failed`; exits 1 on any failure, a missing torch included (never a skip).
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import atexit
import shutil

G = os.path.abspath(sys.argv[1])
TOL = 1e-12
RUNS = [  # (arguments, the script reads the JSON report)
    (["--world", "2", "--probe", "simplenet", "--mode", "off"], False),       # Lightning sync_grads=False: fc1 None
    (["--world", "2", "--probe", "contrastive", "--mode", "on"], False),      # Lightning sync_grads=True
    (["--world", "3", "--probe", "contrastive", "--local-loss", "--mode", "local"], False),  # torchmetrics
    (["--world", "2", "--probe", "contrastive", "--mode", "avg", "--batch", "64", "--dim-img", "64"], True),
]
passed = failed = 0


def check(ok, name, detail=""):
    global passed, failed
    passed, failed = passed + bool(ok), failed + (not ok)
    print(f"{'ok  ' if ok else 'FAIL'} {name}{'' if ok else ': ' + str(detail)[:2000]}", flush=True)
    return ok


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-300)


try:
    import torch  # noqa: F401  (the script needs it; say so here, loudly)
except ImportError as e:
    check(False, "torch imports", e)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1)

WORK = tempfile.mkdtemp(prefix="test_ticket_repro.")
atexit.register(shutil.rmtree, WORK, True)   # the test removes what it made (issue 33)
os.environ["TMPDIR"] = WORK   # and what its torch processes make (torch.distributed.nn writes a module to TMPDIR)
os.chdir(WORK)
for k, (args, from_json) in enumerate(RUNS):
    name = f"run{k}.json"
    what = " ".join(args)
    p = subprocess.run([G, "run", *args, "--json", name], capture_output=True, text=True, timeout=300)
    if not check(p.returncode in (0, 1), f"gradcheck-dist run {what}", p.stderr):
        continue
    md = subprocess.run([G, "report", name, "--format", "md"], capture_output=True, text=True, timeout=60).stdout
    m = re.search(r"^(`{3,})python\n(.*?)^\1$", md, re.S | re.M)
    if not check(m and "import torch" in m.group(2), f"{what}: the Markdown has a PyTorch script"):
        continue
    script = m.group(2)
    check(("PARAMS, INPUTS = None, None" in script) == from_json, f"{what}: weights and inputs {'from the JSON report' if from_json else 'inline'}")
    open(f"repro{k}.py", "w").write(script)
    p = subprocess.Popen([sys.executable, f"repro{k}.py"] + ([name] if from_json else []), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)   # the script and its workers
        out, err = p.communicate()
        err = f"no result within 240 s: {err}"
    if not check(p.returncode == 0, f"{what}: the script runs", out + err):
        continue
    run = next(r for r in json.load(open(name))["runs"] if r["role"] == "test")
    printed = {}
    for line in out.split("\n"):
        f = line.split()
        if len(f) == 3 and f[0] != "parameter":
            printed[f[0]] = (None if f[1] == "None" else float(f[1]), float(f[2]))
    for q in run["params"]:
        g, ref = printed.get(q["name"], ("missing", None))
        if g == "missing":
            check(False, f"{what}: {q['name']} printed", out)
            continue
        if q["status"] == "none":
            check(g is None, f"{what}: {q['name']}: None in torch as in the report", g)
        else:
            check(g is not None and rel(g, q["norm"]) <= TOL, f"{what}: {q['name']}: DDP norm {g} = report's {q['norm']}")
        check(rel(ref, q["reference_norm"]) <= TOL, f"{what}: {q['name']}: single-process norm {ref} = report's {q['reference_norm']}")
    if args[5:6] == ["off"]:
        check(printed["fc1.weight"][0] is None and printed["fc1.bias"][0] is None, f"{what}: fc1 gets None")

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed or not passed else 0)
