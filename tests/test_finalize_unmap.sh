#!/usr/bin/env bash
# A rank unloads no Open MPI component in MPI_Finalize (comm_mpi.c's dlclose): Open MPI 4.1's progress
# thread could still run one's code there (SIGSEGV after the reports, about 1 run in 300 under load).
# ld.so's LD_DEBUG=files says "destroying link map" for each library it unmaps, by pid: the rank is the
# process that loaded the ob1 PML; mpirun, another program, still unloads its own.
set -eu
bin=$(readlink -f "$1")
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cd "$(dirname "$log")"
LD_DEBUG=files "$bin" run --world 1 --no-json > /dev/null 2> "$log"
rank=$(grep "mca_pml_ob1.so" "$log" | grep -m1 "needed by\|dynamically loaded\|calling init" | awk '{print $1}' | tr -d ':')
[ -n "$rank" ] || { echo "FAIL: no process loaded mca_pml_ob1.so (LD_DEBUG output changed?)"; exit 1; }
n=$(grep "^ *$rank:" "$log" | grep -c "destroying link map" || true)
[ "$n" = 0 ] || { echo "FAIL: the rank (pid $rank) unmapped $n libraries during MPI_Finalize"; grep "^ *$rank:" "$log" | grep "destroying link map" | head -5; exit 1; }
echo "ok: rank pid $rank unmapped nothing"
