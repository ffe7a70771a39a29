// A PMPI interposer for the tests (LD_PRELOAD): rank GCD_FAULT_RANK's (default 0) call number
// GCD_FAULT_ALLGATHER of MPI_Allgather or MPI_Iallgather (together counted) fails with MPI_ERR_OTHER,
// so the runtime-failure path of the real program can be exercised without a test hook inside it.
// GCD_FAULT_STOP (below) stops a rank at the entry of one call instead.
#include <mpi.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

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

// GCD_FAULT_STOP=Init|Bcast|Finalize: rank GCD_FAULT_RANK (default 0) stops itself (SIGSTOP) as it enters
// that call, as a rank stopped by a debugger or the OOM-thrashing kernel would: its peers must not hang.
static void stop_at(const char *call, int rank) {
    const char *what = getenv("GCD_FAULT_STOP"), *who = getenv("GCD_FAULT_RANK");
    if (what && !strcmp(what, call) && rank == (who ? atoi(who) : 0)) raise(SIGSTOP);
}

static int world_rank(void) {
    int rank = -1, up = 0;
    MPI_Initialized(&up);
    if (up) PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    else if (getenv("OMPI_COMM_WORLD_RANK")) rank = atoi(getenv("OMPI_COMM_WORLD_RANK"));
    return rank;
}

int MPI_Init(int *argc, char ***argv) {
    stop_at("Init", world_rank());
    return PMPI_Init(argc, argv);
}

int MPI_Bcast(void *buf, int n, MPI_Datatype type, int root, MPI_Comm comm) {
    stop_at("Bcast", world_rank());
    return PMPI_Bcast(buf, n, type, root, comm);
}

int MPI_Ibcast(void *buf, int n, MPI_Datatype type, int root, MPI_Comm comm, MPI_Request *req) {
    stop_at("Bcast", world_rank());
    return PMPI_Ibcast(buf, n, type, root, comm, req);
}

int MPI_Finalize(void) {
    stop_at("Finalize", world_rank());
    return PMPI_Finalize();
}
