// A PMPI interposer for the tests (LD_PRELOAD): rank GCD_FAULT_RANK's (default 0) call number
// GCD_FAULT_ALLGATHER of MPI_Allgather or MPI_Iallgather (together counted) fails with MPI_ERR_OTHER,
// so the runtime-failure path of the real program can be exercised without a test hook inside it.
#include <mpi.h>
#include <stdlib.h>

static int calls;

int MPI_Allgather(const void *send, int scount, MPI_Datatype stype, void *recv, int rcount, MPI_Datatype rtype, MPI_Comm comm) {
    const char *nth = getenv("GCD_FAULT_ALLGATHER"), *who = getenv("GCD_FAULT_RANK");
    int rank;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (nth && rank == (who ? atoi(who) : 0) && ++calls == atoi(nth)) return MPI_ERR_OTHER;
    return PMPI_Allgather(send, scount, stype, recv, rcount, rtype, comm);
}

int MPI_Iallgather(const void *send, int scount, MPI_Datatype stype, void *recv, int rcount, MPI_Datatype rtype, MPI_Comm comm,
                   MPI_Request *req) {
    const char *nth = getenv("GCD_FAULT_ALLGATHER"), *who = getenv("GCD_FAULT_RANK");
    int rank;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (nth && rank == (who ? atoi(who) : 0) && ++calls == atoi(nth)) return MPI_ERR_OTHER;
    return PMPI_Iallgather(send, scount, stype, recv, rcount, rtype, comm, req);
}
