/*
 * noblas: the part of CBLAS and OpenBLAS that ops.c calls, for a build without OpenBLAS (-DGCD_BLAS=OFF,
 * or none found): row-major dgemm as plain loops in one thread (blas_loops.c). Each element's sum runs
 * over k in order, as OpenBLAS keeps one order per element; the bits differ from OpenBLAS's kernels.
 */
#pragma once

enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112 };

void cblas_dgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K,
                 double alpha, const double *A, int lda, const double *B, int ldb, double beta, double *C, int ldc);
char *openblas_get_config(void);
void openblas_set_num_threads(int n);   // recorded, and returned by the next call (the loops use one thread)
int openblas_get_num_threads(void);
