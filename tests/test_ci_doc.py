#!/usr/bin/env python3
"""docs/ci.md's GitHub Actions job, run here step by step on the page's own model and test.

A temporary project holds the page's two files (mymodel.py, tests/test_gradients.py), a copy of this
repository in gradcheck-dist/ (the second checkout: tracked and untracked files, not build/ or venvs) and
a .venv that already holds torch: a fresh venv that sees .venv-torch2's packages through a .pth file
(the install step then skips torch and installs gradcheck_dist into that venv, from the copy). Each
`run:` step is a bash -e script there, in order, with the job's env. Twice:
  - as written: every step passes and the JUnit file says 1 test, 0 failures;
  - with the planted defect (gather() replaced by a gather without gradients, as Lightning's
    all_gather(sync_grads=False) does): the pytest step fails, its output names the encoders' parameters
    as None on every rank, and the JUnit file holds the failure.

usage: test_ci_doc.py SOURCE_DIR   (python3-yaml; SOURCE_DIR/.venv-torch2 from .ci/torch2; fails without it)"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workflow  # noqa: E402

SRC = os.path.realpath(sys.argv[1])
PLANTED = '''def gather(x):
    """A gather without gradients (the planted defect)."""
    if not dist.is_initialized():
        return x
    out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(out, x.contiguous())
    return torch.cat(out)
'''


def fail(why):
    print(f"FAIL: {why}", file=sys.stderr)
    sys.exit(1)


def block(doc, name, lang):
    m = re.search(rf"^<!-- {name} -->\n```{lang}\n(.*?)^```\n<!-- /{name} -->$", doc, re.S | re.M)
    if not m:
        fail(f"docs/ci.md has no <!-- {name} --> block holding a ```{lang} fence")
    return m.group(1)


doc = open(os.path.join(SRC, "docs", "ci.md")).read()
wf = yaml.safe_load(block(doc, "ci-workflow", "yaml"))
model, test = block(doc, "ci-model", "python"), block(doc, "ci-test", "python")
job, names = workflow.one_job(wf)
if job is None:
    fail(f"expected one job, got {names}")
steps = job["steps"]
uses = [s["uses"].split("@")[0] for s in steps if "uses" in s]
if uses != ["actions/checkout", "actions/checkout", "actions/upload-artifact"]:
    fail(f"expected two checkouts, the run steps, then upload-artifact; the actions are {uses}")
if steps[1].get("with", {}).get("path") != "gradcheck-dist":
    fail(f"the second checkout must put gradcheck-dist in gradcheck-dist/: {steps[1]}")
upload = steps[-1]
if str(upload.get("if", "")).strip("${} ") != "always()" or str(upload["with"]["path"]).strip() != "gradients.xml":
    fail(f"the last step must upload gradients.xml, with if: always(): {upload}")
gather_def = re.search(r"^def gather\(x\):\n(?:    .*\n|\n)*?(?=\n\nclass )", model, re.M)
if not gather_def:
    fail("mymodel.py on the page has no def gather(x) before its class")

venv_torch2 = os.path.join(SRC, ".venv-torch2")
site = glob.glob(os.path.join(venv_torch2, "lib", "python3*", "site-packages"))
if not site:
    fail(f"{venv_torch2} is missing (run bash .ci/torch2, as CI does): its torch stands in for the install step's")

def project(planted):
    work = tempfile.mkdtemp(prefix="gradcheck-ci-doc.")
    workflow.checkout(SRC, os.path.join(work, "gradcheck-dist"))   # actions/checkout of gradcheck-dist into gradcheck-dist/
    os.makedirs(os.path.join(work, "tests"))
    m = model.replace(gather_def.group(0), PLANTED) if planted else model
    if planted and m == model:
        fail("the planted gather did not replace the page's")
    open(os.path.join(work, "mymodel.py"), "w").write(m)
    open(os.path.join(work, "tests", "test_gradients.py"), "w").write(test)
    py = os.path.realpath(os.path.join(venv_torch2, "bin", "python"))
    subprocess.run([py, "-m", "venv", os.path.join(work, ".venv")], check=True)
    mine = glob.glob(os.path.join(work, ".venv", "lib", "python3*", "site-packages"))[0]
    open(os.path.join(mine, "zz-torch2.pth"), "w").write(site[0] + "\n")
    return work


def run_steps(work, name):
    """Runs the run: steps in order; returns (index of the first failing step or None, the step, its output)."""
    _, failed = workflow.run_steps(wf, job, work, f"{name}: ", timeout=900, unset=("GRADCHECK_DIST",))
    if not failed:
        return None, None, ""
    n, s, r = failed
    return n, s, r.stdout + r.stderr


def junit(work):
    path = os.path.join(work, "gradients.xml")
    if not os.path.isfile(path):
        fail("the pytest step wrote no gradients.xml, which the upload step keeps")
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    return {k: int(suite.get(k)) for k in ("tests", "failures", "errors", "skipped")}


pytest_step = [i for i, s in enumerate([s for s in steps if "run" in s], 1) if "-m pytest" in s["run"]]
if len(pytest_step) != 1:
    fail(f"expected one step that runs pytest: {pytest_step}")
for planted in (False, True):
    name = "planted no-grad gather" if planted else "as written"
    work = project(planted)
    # the steps' temporaries (a failing check_ddp keeps its gcd-ddp-* directory, as it says; torch's
    # inductor cache) go inside the project, removed with it
    os.makedirs(os.path.join(work, "tmp"))
    outer_tmp = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = os.path.join(work, "tmp")
    try:
        n, s, out = run_steps(work, name)
        if not planted:
            if n is not None:
                fail(f"{name}: step {n} {s.get('name')!r} failed:\n{out[-4000:]}")
            counts = junit(work)
            if counts != {"tests": 1, "failures": 0, "errors": 0, "skipped": 0}:
                fail(f"{name}: gradients.xml says {counts}")
        else:
            if n != pytest_step[0]:
                fail(f"{name}: expected the pytest step ({pytest_step[0]}) to fail, got {n}:\n{out[-4000:]}")
            want = ["img.weight", "img.bias", "txt.weight", "txt.bias"]
            if not all(p in out for p in want) or "None" not in out:
                fail(f"{name}: the failure does not name the encoders' parameters as None:\n{out[-4000:]}")
            counts = junit(work)
            if counts["tests"] != 1 or counts["failures"] != 1:
                fail(f"{name}: gradients.xml says {counts}, expected the one test failing")
        print(f"ok: {name}: {counts}")
    finally:
        os.environ.pop("TMPDIR") if outer_tmp is None else os.environ.update(TMPDIR=outer_tmp)
        shutil.rmtree(work, ignore_errors=True)
