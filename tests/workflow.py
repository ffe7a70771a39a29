"""A GitHub Actions job run here, step by step (test_readme_ci.py, test_ci_doc.py): the checkout as
actions/checkout would make it, and each `run:` step as a `bash -e` script with the workflow's, the job's
and the step's env, in order."""
import os
import shutil
import subprocess


def one_job(wf):
    """(the workflow's one job, or None, and the job names)"""
    jobs = wf.get("jobs") or {}
    return (next(iter(jobs.values())) if len(jobs) == 1 else None), list(jobs)


def checkout(src, dst):
    """This tree's files as a clone would have them (tracked and untracked, not ignored; uncommitted edits
    included), copied into dst."""
    files = subprocess.run(["git", "-C", src, "ls-files", "-z", "-co", "--exclude-standard"], check=True,
                           capture_output=True).stdout.decode().split("\0")
    for f in filter(None, files):
        path = os.path.join(src, f)
        if os.path.isfile(path) and not os.path.islink(path):
            os.makedirs(os.path.dirname(os.path.join(dst, f)) or dst, exist_ok=True)
            shutil.copy2(path, os.path.join(dst, f))


def run_steps(wf, job, work, label, timeout, unset=()):
    """Runs the job's run: steps in work, stopping at the first that fails. Returns (run steps started,
    None or (its number, the step, its CompletedProcess))."""
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update({k: str(v) for k, v in (wf.get("env") or {}).items()})
    env.update({k: str(v) for k, v in (job.get("env") or {}).items()})
    n = 0
    for s in job["steps"]:
        if "run" not in s:
            continue
        n += 1
        script = os.path.join(work, f".step{n}.sh")
        with open(script, "w") as f:
            f.write(s["run"])
        step_env = dict(env, **{k: str(v) for k, v in (s.get("env") or {}).items()})
        r = subprocess.run(["bash", "-e", script], cwd=work, env=step_env, capture_output=True, text=True, timeout=timeout)
        print(f"{label}step {n} ({s.get('name', s['run'][:40])}): exit {r.returncode}")
        if r.returncode != 0:
            return n, (n, s, r)
    return n, None
