#!/usr/bin/env bash
# gradcheck-dist under a real Slurm (a single node started by cluster.sh, ended by pid): every way a user
# starts it there either runs one job of the right world or is refused with a way that works.
#   srun --mpi=pmix             one job of world N, right verdicts
#   salloc + run --world N      right; more ranks than the allocation holds: exit 2 unless --oversubscribe
#   sbatch, --json and --junit  right, files whole
#   scancel of a long job       the words and the files agree: "cancelled by signal 15", said once
#   srun without PMI            N tasks that are not one MPI job: exit 2, saying how to start one
#   srun --mpi=pmi2             exit 3, saying to use --mpi=pmix (this Open MPI has no PMI-2)
#   two nodes (salloc -N 2)     the multi-node launch path (orted through srun), over TCP
# Slurm that cannot start is a failure, never a skip.
# usage: test_slurm.sh GRADCHECK_DIST PYTHON
G=$1 PY=${2:-python3}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cluster.sh"
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
work=$(mktemp -d "${TMPDIR:-/tmp}/gcd-slurm.XXXXXX")
chmod 0755 "$work"
# the daemons, the jobs and Open MPI's session directories (ompi.vm.*, which the PMIx server may still be
# removing when a step has ended) keep their temporaries in $work, removed with it
mkdir -m 1777 "$work/t" && export TMPDIR=$work/t
mark="--seed $((600000 + $$))"   # this test's long job, told apart from another copy of this test running
trap 'slurm_stop; pkill -KILL -f -- "$mark" 2>/dev/null; rm -rf "$work"' EXIT
slurm_start "$work/slurm"
cd "$work" || exit 1
t0=$SECONDS
report_is() {   # FILE RESULT WORLD
    "$PY" - "$@" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["result"] == sys.argv[2], (d["result"], d.get("error"))
assert d["environment"]["world"] == int(sys.argv[3]), d["environment"]["world"]
PY
}
xml_ok() { "$PY" -c 'import sys, xml.dom.minidom as m; m.parse(sys.argv[1])' "$1"; }

# ---- srun --mpi=pmix: the tasks are the ranks (4 tasks on this node's CPUs: -O)
srun -O -n 4 --mpi=pmix "$G" run --json pmix.json --junit pmix.xml >pmix.txt 2>&1
rc=$?
[ $rc = 0 ] || fail "srun -n 4 --mpi=pmix: exit $rc: $(tail -5 pmix.txt)"
report_is pmix.json pass 4 || fail "srun --mpi=pmix: pmix.json is not a pass report of world 4"
xml_ok pmix.xml || fail "srun --mpi=pmix: pmix.xml is not XML"
[ "$(grep -c '^result: ' pmix.txt)" = 1 ] || fail "srun --mpi=pmix: one table expected: $(grep '^result: ' pmix.txt)"

# ---- salloc + run --world 4: the launcher starts mpirun inside the allocation
salloc -O -n 4 "$G" run --world 4 --json salloc.json >salloc.txt 2>&1
rc=$?
[ $rc = 0 ] && report_is salloc.json pass 4 || fail "salloc -n 4 run --world 4: exit $rc: $(tail -5 salloc.txt)"
# more ranks than the allocation holds: refused, unless asked for
salloc -n 2 "$G" run --world 4 --no-json >over.txt 2>&1
rc=$?
[ $rc = 2 ] || fail "salloc -n 2 run --world 4: exit $rc, expected 2: $(tail -5 over.txt)"
grep -q -- "--oversubscribe" over.txt && grep -q "2 tasks" over.txt || fail "salloc -n 2 run --world 4: the refusal must say what the allocation holds and name --oversubscribe: $(cat over.txt)"
salloc -n 2 "$G" run --world 4 --oversubscribe --probe simplenet --no-json >over2.txt 2>&1
rc=$?
[ $rc = 0 ] || fail "salloc -n 2 run --world 4 --oversubscribe: exit $rc: $(tail -5 over2.txt)"

# ---- sbatch with --json and --junit
cat >batch.sh <<SH
#!/bin/bash
#SBATCH -n 4 -O
"$G" run --world 4 --json batch.json --junit batch.xml
SH
sbatch --wait -o batch.out batch.sh >/dev/null
rc=$?
[ $rc = 0 ] || fail "sbatch: exit $rc: $(tail -5 batch.out)"
report_is batch.json pass 4 && xml_ok batch.xml || fail "sbatch: batch.json/batch.xml not a whole pass report of world 4"

# ---- scancel of a long batch job: every process gone, and the words and the files agree
cat >cancel.sh <<SH
#!/bin/bash
#SBATCH -n 2
"$G" run --world 2 --probe contrastive --mode on --batch 32 --steps 50000 $mark --json cancel.json --junit cancel.xml
SH
job=$(sbatch --parsable -o cancel.out cancel.sh)
rank_up() { for p in $(pgrep -f -- "$mark"); do tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && return 0; done; return 1; }
for i in $(seq 100); do rank_up && break; sleep 0.2; done
rank_up || fail "scancel: the batch job's ranks never started: $(cat cancel.out)"
sleep 2
scancel "$job"
for i in $(seq 100); do [ -z "$(squeue -h -j "$job" 2>/dev/null)" ] && [ -z "$(pgrep -f -- "$mark")" ] && break; sleep 0.2; done
[ -z "$(pgrep -f -- "$mark")" ] || fail "scancel: processes left: $(pgrep -af -- "$mark")"
sleep 0.5   # slurmstepd's last lines
n=$(grep -c "cancelled by signal 15" cancel.out)
[ "$n" = 1 ] || fail "scancel: 'cancelled by signal 15' must be said once, said $n times: $(cat cancel.out)"
! grep -Eq "another rank died|was killed by signal|no verdict and no report" cancel.out || fail "scancel: a guess about a dead rank, or words against the files: $(cat cancel.out)"
if [ -e cancel.json ]; then
    "$PY" -c 'import json,sys; d=json.load(open("cancel.json")); assert d["result"] == "error" and d["exit_code"] == 3 and "cancelled by signal 15" in d["error"]["message"], d.get("error")' ||
        fail "scancel: cancel.json must say the job was cancelled: $(head -c 600 cancel.json)"
    grep -q "cancelled by signal 15" cancel.xml || fail "scancel: cancel.xml must say so too"
    grep -q "cancel.json" cancel.out || fail "scancel: the words must name the report left: $(cat cancel.out)"
else
    [ ! -e cancel.xml ] || fail "scancel: a JUnit file without its report"
    grep -q "no report" cancel.out || fail "scancel: no report left, and the words must say so: $(cat cancel.out)"
fi

# ---- srun without PMI: N tasks, each its own launcher, is refused before any job starts
srun -n 2 --mpi=none "$G" run --json none.json >none.txt 2>&1
rc=$?
[ $rc = 2 ] || fail "srun -n 2 --mpi=none: exit $rc, expected 2: $(tail -5 none.txt)"
grep -q -- "--mpi=pmix" none.txt && grep -q "salloc" none.txt || fail "srun --mpi=none: the refusal must say how to start one job: $(cat none.txt)"
[ ! -e none.json ] && [ ! -d reports ] || fail "srun --mpi=none: a report was left"
# ---- srun --mpi=pmi2: this Open MPI has no Slurm PMI-2 support
srun -n 2 --mpi=pmi2 "$G" run --no-json >pmi2.txt 2>&1
rc=$?
[ $rc = 3 ] || fail "srun -n 2 --mpi=pmi2: exit $rc, expected 3: $(tail -5 pmi2.txt)"
grep -q -- "--mpi=pmix" pmi2.txt || fail "srun --mpi=pmi2: must say to use --mpi=pmix: $(cat pmi2.txt)"

# ---- two nodes (a second slurmd, -N n2, on this host): mpirun without the one-node settings starts its
# daemon on the other node through srun. Both "nodes" share /dev/shm, where Open MPI's shared-memory
# transport crashes (a plain MPI hello too): TCP between them.
slurm_stop
SLURM_SECOND_NODE=1 slurm_start "$work/slurm2"
OMPI_MCA_btl=self,tcp salloc -N 2 -n 2 "$G" run --world 2 --probe simplenet --json two.json >two.txt 2>&1
rc=$?
[ $rc = 0 ] && report_is two.json pass 2 || fail "salloc -N 2 -n 2 run --world 2 (two nodes, TCP): exit $rc: $(tail -5 two.txt)"

echo "test_slurm: $((SECONDS - t0)) s with Slurm up"
[ $fails = 0 ] || { echo "$fails failure(s)" >&2; exit 1; }
echo "test_slurm: ok"
