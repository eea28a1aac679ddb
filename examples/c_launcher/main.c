/* c_launcher: run an exported cutegen BF16 GEMM from plain C through the CUDA driver API, and check it.
 *
 *   c_launcher EXPORT_DIR [KERNEL|all] [M N K]
 *
 * EXPORT_DIR  a folder made by `cutegen export` holding at least one bf16_gemm_nt kernel
 * KERNEL      a kernel name of that export; "all" runs every bf16_gemm_nt kernel (default: the first)
 * M N K       the problem, D[M, N] = A[M, K] @ B[N, K]^T (default 1000 1536 2048; N and K multiples of 8)
 *
 * A and B are filled with a deterministic pseudo-random pattern of multiples of 1/8 in [-1, 1], so
 * every product and every partial sum is exact in fp32: the CPU reference (fp32, on 16 rows spread
 * over M, all N columns) is exact, and the kernel's only error is the final rounding to bf16.
 *
 * Exit status: 0 every result matches; 1 a result does not; 2 a usage, setup or CUDA error.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cutegen_kernels.h"

#define PROGRAM "c_launcher"
#include "c_launcher_common.h"

static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0; /* NaN */
  u += 0x7fffu + ((u >> 16) & 1u);                   /* round to nearest even */
  return (uint16_t)(u >> 16);
}

/* Multiples of 1/8 in [-1, 1]: exact in bf16. */
static void fill(uint16_t* x, size_t n, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  size_t i;
  for (i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = to_bf16((float)((int)((s >> 33) % 17u) - 8) / 8.0f);
  }
}

/* Run one kernel on one problem; 0 pass, 1 wrong result, 2 error. */
static int run(const char* export_dir, const cutegen_kernel_info* info, CUstream stream, int M, int N, int K) {
  cutegen_kernel k;
  cutegen_launch_plan plan;
  CUdeviceptr a = 0, b = 0, d = 0;
  uint16_t *ha = NULL, *hb = NULL, *hd = NULL;
  size_t sa = (size_t)M * K, sb = (size_t)N * K, sd = (size_t)M * N;
  int status = 2, rows = M < 16 ? M : 16, r, n, kk, loaded = 0;
  bf16_check check = {0, 0, 0.0, 0.0};

  CHECK(cutegen_kernel_load(&k, info, export_dir));
  loaded = 1;
  ha = malloc((sa ? sa : 1) * 2);
  hb = malloc((sb ? sb : 1) * 2);
  hd = malloc((sd ? sd : 1) * 2);
  if (!ha || !hb || !hd) {
    fprintf(stderr, "c_launcher: out of host memory\n");
    goto done;
  }
  fill(ha, sa, 1);
  fill(hb, sb, 2);
  CHECK(cuMemAlloc(&a, (sa ? sa : 1) * 2));
  CHECK(cuMemAlloc(&b, (sb ? sb : 1) * 2));
  CHECK(cuMemAlloc(&d, (sd ? sd : 1) * 2));
  /* Everything on the launch stream: it is non-blocking, so copies or a memset on the legacy
     default stream would not be ordered before the kernel (a late memset overwrites its output). */
  CHECK(cuMemcpyHtoDAsync(a, ha, sa * 2, stream));
  CHECK(cuMemcpyHtoDAsync(b, hb, sb * 2, stream));
  CHECK(cuMemsetD8Async(d, 0xff, sd * 2, stream)); /* NaN: an element the kernel does not write fails the check */

  /* Row-major A[M, K], B[N, K], D[M, N]: leading dimensions K, K, N (in elements). */
  CHECK(cutegen_bf16_gemm_nt_prepare(&k, a, K, b, K, d, N, M, N, K, &plan));
  CHECK(cutegen_launch(&k, &plan, stream));
  CHECK(cuMemcpyDtoHAsync(hd, d, sd * 2, stream));
  CHECK(cuStreamSynchronize(stream));

  for (r = 0; r < rows; r++) {
    int row = rows > 1 ? (int)((int64_t)r * (M - 1) / (rows - 1)) : 0;
    for (n = 0; n < N; n++) {
      float ref = 0.0f, got = from_bf16(hd[(size_t)row * N + n]);
      for (kk = 0; kk < K; kk++) ref += from_bf16(ha[(size_t)row * K + kk]) * from_bf16(hb[(size_t)n * K + kk]);
      bf16_check_element(&check, got, ref);
    }
  }
  status = bf16_check_report(&check, info, &plan, M, N, K, rows, "an exact fp32 CPU reference");

done:
  if (a) cuMemFree(a);
  if (b) cuMemFree(b);
  if (d) cuMemFree(d);
  free(ha);
  free(hb);
  free(hd);
  if (loaded) cutegen_kernel_unload(&k);
  return status;
}

int main(int argc, char** argv) {
  return launcher_main(argc, argv, "bf16_gemm_nt", cutegen_bf16_gemm_nt_kernels, CUTEGEN_BF16_GEMM_NT_NUM_KERNELS, NULL,
                       run);
}
