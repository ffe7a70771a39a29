#!/usr/bin/python3
"""Figures, not pass/fail: gradcheck-dist `run` against its floors and its peer, side by side, in one run.

    bench.py --hello MPI_HELLO [--quick] [--reps N] NEW [OLD]      (bench.sh builds MPI_HELLO and calls this)

1. launch: an MPI_Init/Finalize hello vs `run --no-json` (default probes and modes) at worlds 1, 2, 4,
   8, 16, 32 (--quick: 1, 2, 4). The hello is launched as NEW launches its ranks: NEW is run once per
   world with a fake mpirun on PATH that records its arguments and environment, and the hello gets
   those (its MCA settings, the hwloc variables); "plain" is the hello under mpirun's defaults (only
   --oversubscribe), for the floor Open MPI itself sets.
2. contrastive Di=512 Dt=256 E=128, world 4, B in {256, 1024} (--quick: 256), mode on and all four
   modes, `run --no-json` vs bench_torch.py (the same work in PyTorch float64 on gloo); ratio =
   torch / gcd (> 1: gradcheck-dist is faster); the peak resident memory of the largest process of each
   (GNU time's %M: the child and every descendant it waited for); gcd's report size, written with the
   default options and with --summary-only (one run each, their wall time beside).
3. check: tests/bench/check_bench.sh per binary, 4 ranks + ref of 256 MiB F32 (--quick: 64 MiB), page
   cache warm: `check --no-json` and `check` with its report (an XXH3-128 per file) vs numpy and memcpy.
4. dump writers: tests/bench/bench_dump.py, gradcheck_dist.dump_grads vs safetensors.torch.save_file vs a
   raw write, 4 x Linear(8192, 8192) float32 gradients (--quick: 2 x 4096), with GCD_BENCH_DUMP_PYTHON (a
   venv with PyPI torch 2.x and safetensors), else the repository's .venv, else /usr/bin/python3.
With OLD, every gcd column is repeated for it: before and after from the same run. Runs of one row are
interleaved (hello, NEW, OLD, torch, then again) and medians taken, so a load that comes and goes hits
all columns alike. Reps: --reps N for every row (default 5 for launch, 3 for contrastive; --quick 3, 1).
Exit 0; 1 when a run did not exit 0 (the row says rc=N); 3 when a binary fails its first check.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DIMS = ["--dim-img", "512", "--dim-txt", "256", "--dim-emb", "128"]
ROOT = ["--allow-run-as-root"] if os.geteuid() == 0 else []
failed = []


def timed(cmd, tmp, env=None):
    """(wall s, peak RSS MiB of the largest process, exit code, stdout) of one run"""
    tfile = os.path.join(tmp, "time")
    t = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", tfile, *cmd], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=1800, env=env)
    wall = time.perf_counter() - t
    with open(tfile) as f:
        kb = int(f.read().split()[-1])
    if p.returncode != 0:
        failed.append(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()[-400:]}")
    return wall, kb / 1024, p.returncode, p.stdout


def paired(cmds, reps, tmp, envs=None):
    """{name: (median s, max peak MiB, worst rc, [stdouts])}; each rep runs every command once, in turn"""
    got = {n: [] for n in cmds}
    for _ in range(reps):
        for n, c in cmds.items():
            got[n].append(timed(c, tmp, (envs or {}).get(n)))
    return {n: (statistics.median(r[0] for r in v), max(r[1] for r in v),
                max(r[2] for r in v), [r[3] for r in v]) for n, v in got.items()}


def fmt_s(r):
    return f"rc={r[2]}" if r[2] else f"{r[0]:.3f}"


def size(n):
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def ratio(a, b):
    return "n/a" if a[2] or b[2] else f"{a[0] / b[0]:.2f}"


FAKE_MPIRUN = """#!/usr/bin/python3
import json, os, sys
json.dump({"argv": sys.argv[1:], "env": dict(os.environ)}, open(os.environ["FAKE_LAUNCH"], "w"))
open(os.environ["GCD_RESULT_FILE"], "w").write("0\\n")
"""


def tool_launch(g, w, hello, tmp):
    """(mpirun command, environment) that run the hello as `g run --world w` launches its ranks"""
    fake = os.path.join(tmp, "fakebin")
    os.makedirs(fake, exist_ok=True)
    with open(os.path.join(fake, "mpirun"), "w") as f:
        f.write(FAKE_MPIRUN)
    os.chmod(os.path.join(fake, "mpirun"), 0o755)
    rec = os.path.join(tmp, "launch.json")
    env = dict(os.environ, PATH=fake + ":" + os.environ["PATH"], FAKE_LAUNCH=rec)
    subprocess.run([g, "run", "--world", str(w), "--no-json"], env=env, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True)
    with open(rec) as f:
        got = json.load(f)
    argv = got["argv"]
    exe = next(i for i, a in enumerate(argv) if os.path.realpath(a) == g)   # mpirun's options end at the tool
    opts = []   # without the tool's own GCD_ variables (the hello has no use for them)
    for a in argv[:exe]:
        if opts and opts[-1] == "-x" and a.startswith("GCD_"):
            opts.pop()
        else:
            opts.append(a)
    env = {k: v for k, v in got["env"].items() if k not in ("FAKE_LAUNCH", "PATH") and not k.startswith("GCD_")}
    return ["mpirun", *opts, hello], dict(env, PATH=os.environ["PATH"])


def machine(gcds, torch_ok):
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    print(f"machine: {os.cpu_count()} cores (nproc {len(os.sched_getaffinity(0))}), {cpu}, "
          f"load average {open('/proc/loadavg').read().split()[0]} (1 min) at start")
    for name, g in gcds.items():
        ver = subprocess.run([g, "--version"], stdout=subprocess.PIPE, text=True).stdout.strip().split("\n")
        blas = [ln.split("=>")[-1].split("(")[0].strip() for ln in
                subprocess.run(["ldd", g], stdout=subprocess.PIPE, text=True).stdout.splitlines() if "blas" in ln]
        blas = [os.path.realpath(b) + " (shared)" for b in blas] + [v.split(": ", 1)[1] for v in ver[1:] if v.startswith("BLAS: ")]
        print(f"{name}: {g} ({ver[0]}; BLAS: {', '.join(blas) or 'none'})")
    if torch_ok:
        v = subprocess.run(["/usr/bin/python3", "-c", "import torch; print(torch.__version__)"],
                           stdout=subprocess.PIPE, text=True).stdout.strip()
        blas = os.path.realpath("/usr/lib/x86_64-linux-gnu/libblas.so.3")
        th = os.environ.get("OMP_NUM_THREADS") or f"max(1, cores / 4) = {max(1, (os.cpu_count() or 1) // 4)}"
        print(f"torch: /usr/bin/python3, torch {v}, libblas.so.3 -> {blas}, {th} thread(s) per process at world 4")
    else:
        print("torch: /usr/bin/python3 cannot import torch (apt-get install python3-torch): no PyTorch columns")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("new")
    ap.add_argument("old", nargs="?")
    ap.add_argument("--hello", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int)
    a = ap.parse_args()
    if a.reps is not None and a.reps < 1:
        ap.error("--reps must be >= 1")
    gcds = {"new": os.path.realpath(a.new)}
    if a.old:
        gcds["old"] = os.path.realpath(a.old)
    worlds = [1, 2, 4] if a.quick else [1, 2, 4, 8, 16, 32]
    batches = [256] if a.quick else [256, 1024]
    launch_reps = a.reps or (3 if a.quick else 5)
    big_reps = a.reps or (1 if a.quick else 3)
    for name, g in gcds.items():   # a binary that cannot do a small clean run is not worth timing
        p = subprocess.run([g, "run", "--world", "1", "--probe", "simplenet", "--mode", "on", "--json", "/dev/null"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if p.returncode != 0:
            print(f"bench: {name} ({g}) fails `run --world 1 --json /dev/null`: exit {p.returncode}: {p.stderr.strip()[-300:]}",
                  file=sys.stderr)
            return 3
    torch_ok = subprocess.run(["/usr/bin/python3", "-c", "import torch"], stderr=subprocess.DEVNULL).returncode == 0
    t_start = time.monotonic()
    machine(gcds, torch_ok)
    tmp = tempfile.mkdtemp(prefix="gcd-bench.")
    os.chdir(tmp)   # reports a binary writes by default land here, and go with it

    # ---- 1. launch
    print(f"\nlaunch: MPI_Init/Finalize hello vs `run --no-json` (default probes, all modes); median s of {launch_reps}; "
          "hello: launched as new launches (its mpirun options and environment), plain: mpirun's defaults")
    head = f"{'world':>5} {'plain s':>9} {'hello s':>9}" + "".join(f" {n + ' s':>9} {n + '/hello':>10}" for n in gcds)
    print(head)
    for w in worlds:
        hello, henv = tool_launch(gcds["new"], w, a.hello, tmp)
        cmds = {"plain": ["mpirun", "-np", str(w), "--oversubscribe", *ROOT, a.hello], "hello": hello}
        cmds.update({n: [g, "run", "--world", str(w), "--no-json"] for n, g in gcds.items()})
        r = paired(cmds, launch_reps, tmp, {"hello": henv})
        if w == worlds[0]:
            print(f"      (hello: {' '.join(hello[:-1])} HELLO; " + ", ".join(
                f"{k}={v}" for k, v in sorted(henv.items()) if k.startswith(("HWLOC_", "OMPI_MCA_")) and os.environ.get(k) != v) + ")")
        print(f"{w:5} {fmt_s(r['plain']):>9} {fmt_s(r['hello']):>9}" + "".join(f" {fmt_s(r[n]):>9} {ratio(r[n], r['hello']):>10}" for n in gcds),
              flush=True)

    # ---- 2. contrastive vs PyTorch
    print(f"\ncontrastive Di=512 Dt=256 E=128, world 4: `run --no-json` vs PyTorch (bench_torch.py); median s of {big_reps}; "
          "torch/gcd > 1: gradcheck-dist faster")
    t_cols = [f"{n} s" for n in gcds] + (["torch s"] + [f"torch/{n}" for n in gcds] + ["torch compute s"] if torch_ok else [])
    print(f"{'':17}" + "".join(f" {c:>15}" for c in t_cols), flush=True)
    rows = []
    for b in batches:
        for modes in ("on", "all"):
            label = f"B={b} {'mode on' if modes == 'on' else 'all modes'}"
            base = ["run", "--world", "4", "--probe", "contrastive", "--batch", str(b), *DIMS]
            if modes == "on":
                base += ["--mode", "on"]
            cmds = {n: [g, *base, "--no-json"] for n, g in gcds.items()}
            if torch_ok:
                cmds["torch"] = ["/usr/bin/python3", os.path.join(HERE, "bench_torch.py"), "--world", "4",
                                 "--batch", str(b), *DIMS, "--modes", modes]
            r = paired(cmds, big_reps, tmp)
            cells = [fmt_s(r[n]) for n in gcds]
            if torch_ok:
                comp = [float(m.group(1)) for out in r["torch"][3] for m in re.finditer(r"torch_compute_s (\S+)", out)]
                cells += [fmt_s(r["torch"])] + [ratio(r["torch"], r[n]) for n in gcds]
                cells += [f"{statistics.median(comp):.3f}" if comp and not r["torch"][2] else "n/a"]
            print(f"{label:17}" + "".join(f" {c:>15}" for c in cells), flush=True)
            for n, g in gcds.items():
                for opt, key in (([], "json"), (["--summary-only"], "summary")):
                    path = os.path.join(tmp, f"{key}.json")
                    wall, _, rc, _ = timed([g, *base, *opt, "--json", path], tmp)
                    r[f"{n} {key}"] = f"rc={rc}" if rc else f"{size(os.path.getsize(path))} ({wall:.1f} s)"
                    os.remove(path) if os.path.exists(path) else None
            rows.append((label, r))

    print("\npeak MiB: resident memory of the largest process; report: written with default options / --summary-only, "
          "size (wall s of that one run)")
    m_cols = [f"{n} peak MiB" for n in gcds] + (["torch peak MiB"] if torch_ok else [])
    print(f"{'':17}" + "".join(f" {c:>15}" for c in m_cols) + "".join(f" {n + ' report':>20} {n + ' summary-only':>20}" for n in gcds))
    for label, r in rows:
        cells = [f"{r[n][1]:.0f}" for n in gcds] + ([f"{r['torch'][1]:.0f}"] if torch_ok else [])
        print(f"{label:17}" + "".join(f" {c:>15}" for c in cells) + "".join(f" {r[n + ' json']:>20} {r[n + ' summary']:>20}" for n in gcds))

    # ---- 3. check with and without its report vs memcpy
    for n, g in gcds.items():
        print(f"\ncheck ({n}): tests/bench/check_bench.sh", flush=True)
        p = subprocess.run(["bash", os.path.join(HERE, "check_bench.sh"), g], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True,
                           env=dict(os.environ, GCD_BENCH_BYTES="64M" if a.quick else "256M", GCD_BENCH_DTYPES="F32"))
        print("\n".join(ln for ln in p.stdout.strip().splitlines() if not ln.startswith("check_bench: F32: check exited 0")), flush=True)
        if p.returncode:
            failed.append(f"check_bench.sh {g}: exit {p.returncode}")

    # ---- 4. the Python dump writer vs save_file vs a raw write
    py = next((x for x in (os.environ.get("GCD_BENCH_DUMP_PYTHON"), os.path.join(HERE, "..", "..", ".venv", "bin", "python"), "/usr/bin/python3")
               if x and os.access(x, os.X_OK)), None)
    print("", flush=True)
    p = subprocess.run([py, os.path.join(HERE, "bench_dump.py"), "--reps", "3",
                        *(["--layers", "2", "--width", "4096"] if a.quick else [])],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(p.stdout.strip(), flush=True)
    if p.returncode:
        failed.append(f"bench_dump.py ({py}): exit {p.returncode}")

    print(f"\nload average {open('/proc/loadavg').read().split()[0]} (1 min) at end; this bench took {time.monotonic() - t_start:.0f} s")
    os.chdir("/")
    subprocess.run(["rm", "-rf", tmp])
    for f in failed:
        print(f"bench: {f}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
