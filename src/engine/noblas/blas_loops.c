// noblas: row-major dgemm as plain loops (see cblas.h): C = alpha op(A) op(B) + beta C.
#include "cblas.h"

#include <stdlib.h>

// ----------------------------------------------------------------------------

void cblas_dgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K,
                 double alpha, const double *A, int lda, const double *B, int ldb, double beta, double *C, int ldc) {
    if (order != CblasRowMajor) abort();   // ops.c is row-major throughout
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int k = 0; k < K; k++) {
                double a = ta == CblasNoTrans ? A[(size_t)i * lda + k] : A[(size_t)k * lda + i];
                double b = tb == CblasNoTrans ? B[(size_t)k * ldb + j] : B[(size_t)j * ldb + k];
                s += a * b;
            }
            double *c = &C[(size_t)i * ldc + j];
            *c = beta == 0 ? alpha * s : alpha * s + beta * *c;   // beta 0: what C held is ignored (NaN too)
        }
}

char *openblas_get_config(void) {
    static char words[] = "none (plain loops, one thread: built without OpenBLAS)";
    return words;
}

static int threads = 1;   // process-wide, as OpenBLAS's own setting that this stands in for
void openblas_set_num_threads(int n) { threads = n; }
int openblas_get_num_threads(void) { return threads; }
