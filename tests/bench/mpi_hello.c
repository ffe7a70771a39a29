// mpi_hello: the floor under `gradcheck-dist run`'s time. MPI_Init, one barrier, MPI_Finalize: what
// any MPI job pays to start and stop at a given world, launched the way the tool launches its ranks.
// usage: mpirun --oversubscribe --mca pml ob1 -np W mpi_hello       build: mpicc -O2 -o mpi_hello mpi_hello.c
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv) {
    if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
        fprintf(stderr, "mpi_hello: MPI_Init failed\n");
        return 3;
    }
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Barrier(MPI_COMM_WORLD);   // every rank is up, as after the tool's first collective
    if (rank == 0) printf("mpi_hello: world %d\n", world);
    MPI_Finalize();
    return 0;
}
