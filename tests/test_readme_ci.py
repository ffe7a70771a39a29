#!/usr/bin/env python3
"""The GitHub Actions job in docs/reports.md (between <!-- ci --> and <!-- /ci -->), run as GitHub would run it
on one machine: actions/checkout is a copy of the repository's files (tracked and untracked, not the
ignored build/ or .venv) into a temporary directory; each `run:` step is a bash -e script there, with
the workflow's, the job's and the step's env, in order, stopping at the first that fails; then the
upload step must run always (`if: always()`) and every file it names must exist: the JSON report of a
passing run and a JUnit file of the shape CI tools read (tests/check_junit.py).

usage: test_readme_ci.py SOURCE_DIR   (needs python3-yaml)"""
import json
import os
import re
import shutil
import sys
import tempfile

import yaml

SRC = os.path.realpath(sys.argv[1])
sys.path.insert(0, os.path.join(SRC, "tests"))
import check_junit  # noqa: E402
import workflow  # noqa: E402


def fail(why):
    print(f"FAIL: {why}", file=sys.stderr)
    sys.exit(1)


readme = open(os.path.join(SRC, "docs", "reports.md")).read()
m = re.search(r"^<!-- ci -->\n```yaml\n(.*?)^```\n<!-- /ci -->$", readme, re.S | re.M)
if not m:
    fail("docs/reports.md has no <!-- ci --> block holding a ```yaml fence")
wf = yaml.safe_load(m.group(1))
job, names = workflow.one_job(wf)
if job is None:
    fail(f"expected one job, got {names}")
steps = job["steps"]
uses = [s["uses"].split("@")[0] for s in steps if "uses" in s]
if uses != ["actions/checkout", "actions/upload-artifact"]:
    fail(f"expected checkout, then run steps, then upload-artifact; the actions are {uses}")
upload = steps[-1]
if "uses" not in upload or str(upload.get("if", "")).strip("${} ") != "always()":
    fail(f"the last step must be the upload, with if: always(): {upload}")

work = tempfile.mkdtemp(prefix="gradcheck-ci.")
try:
    workflow.checkout(SRC, work)   # actions/checkout: this tree's files as a clone would have them
    n, failed = workflow.run_steps(wf, job, work, "", timeout=800)
    if failed:
        k, s, r = failed
        fail(f"step {k} {s.get('name')!r} exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    if n < 3:
        fail(f"expected install, build and run steps, got {n} run steps")
    # upload: every file it names exists, and they are what they claim to be
    paths = [p.strip() for p in str(upload["with"]["path"]).splitlines() if p.strip()]
    for p in paths:
        if not os.path.isfile(os.path.join(work, p)):
            fail(f"the upload step names {p}, which the steps did not write")
    reports = [p for p in paths if p.endswith(".json")]
    junits = [p for p in paths if p.endswith(".xml")]
    if len(reports) != 1 or len(junits) != 1:
        fail(f"the upload step must keep one JSON report and one JUnit file: {paths}")
    d = json.load(open(os.path.join(work, reports[0])))
    if d.get("schema") not in ("gradcheck-dist.report/1", "gradcheck-dist.report/2", "gradcheck-dist.report/3") or d["result"] != "pass":
        fail(f"{reports[0]}: not a passing gradcheck-dist report: {d.get('schema')} {d.get('result')}")
    why, total = check_junit.check(os.path.join(work, junits[0]), {"tests": len(d["runs"]), "failures": 0, "errors": 0})
    if why:
        fail(f"{junits[0]}: " + "; ".join(why))
    print(f"ok: {n} run steps, upload keeps {paths}; {total['tests']} testcases, {total['passed']} passed")
finally:
    shutil.rmtree(work, ignore_errors=True)
