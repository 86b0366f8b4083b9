/* The BLAS calls of one Newton-Schulz run of distmuon's syrk path (quintic, 5 steps) on an
 * s x l matrix, timed, against whichever libblas.so.3 the dynamic loader finds: OpenBLAS with
 * any OPENBLAS_CORETYPE, BLIS (LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/blis-pthread), ...
 * bench/compare_blas.sh builds and runs it. Per step: A = X X^T (ssyrk), A2 = A A (sgemm),
 * B = b A + c A2, X = a X + B X (sgemm), as distmuon's NS does (minus its triangle mirroring).
 * Prints one line: the library's own name for its kernels where it has one, then GFLOP/s by the
 * plain-GEMM count distmuon demo uses (steps (4 s^2 l + 2 s^3)), median of the runs.
 * Usage: blas_backends [s l runs] */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { kRowMajor = 101, kNoTrans = 111, kTrans = 112, kUpper = 121 };
void cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float* a,
                 int lda, const float* b, int ldb, float beta, float* c, int ldc);
void cblas_ssyrk(int order, int uplo, int trans, int n, int k, float alpha, const float* a, int lda,
                 float beta, float* c, int ldc);

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void* x, const void* y) {
  const double a = *(const double*)x, b = *(const double*)y;
  return (a > b) - (a < b);
}

int main(int argc, char** argv) {
  const int s = argc > 1 ? atoi(argv[1]) : 1024, l = argc > 2 ? atoi(argv[2]) : 4096;
  const int runs = argc > 3 ? atoi(argv[3]) : 3, steps = 5;
  const float qa = 3.4445f, qb = -4.7750f, qc = 2.0315f; /* quintic coefficients */
  float* x = malloc(sizeof(float) * (size_t)s * l);
  float* x0 = malloc(sizeof(float) * (size_t)s * l);
  float* a = malloc(sizeof(float) * (size_t)s * s);
  float* b = malloc(sizeof(float) * (size_t)s * s);
  double* times = malloc(sizeof(double) * (size_t)(runs + 1));
  if (!x || !x0 || !a || !b || !times || s < 1 || l < 1 || runs < 1) return 2;
  unsigned long long r = 1;
  for (size_t i = 0; i < (size_t)s * l; ++i) {
    r = r * 6364136223846793005ULL + 1442695040888963407ULL;
    x0[i] = (float)((double)(r >> 40) / (double)(1ULL << 24) - 0.5) / 64.0f;
  }
  for (int run = 0; run <= runs; ++run) { /* run 0 warms up */
    for (size_t i = 0; i < (size_t)s * l; ++i)
      x[i] = x0[i];
    const double t0 = now();
    for (int step = 0; step < steps; ++step) {
      cblas_ssyrk(kRowMajor, kUpper, kNoTrans, s, l, 1.0f, x, l, 0.0f, a, s);
      for (int i = 0; i < s; ++i)
        for (int j = 0; j < i; ++j)
          a[i * s + j] = a[j * s + i];
      cblas_sgemm(kRowMajor, kNoTrans, kNoTrans, s, s, s, qc, a, s, a, s, 0.0f, b, s);
      for (size_t i = 0; i < (size_t)s * s; ++i)
        b[i] += qb * a[i];
      cblas_sgemm(kRowMajor, kNoTrans, kNoTrans, s, l, s, 1.0f, b, s, x, l, qa, x, l);
    }
    if (run > 0) times[run - 1] = now() - t0;
  }
  qsort(times, (size_t)runs, sizeof(double), cmp);
  const double flops = steps * (4.0 * s * s * l + 2.0 * (double)s * s * s);
  const char* (*corename)(void) =
      (const char* (*)(void))dlsym(RTLD_DEFAULT, "openblas_get_corename");
  printf("%s %.1f\n", corename ? corename() : "-", flops / times[runs / 2] * 1e-9);
  return 0;
}
