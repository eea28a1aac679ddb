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
  int status = 2, rows = M < 16 ? M : 16, r, n, kk, bad = 0, loaded = 0;
  double max_abs = 0.0, max_rel = 0.0;

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
  CHECK(cuMemcpyHtoD(a, ha, sa * 2));
  CHECK(cuMemcpyHtoD(b, hb, sb * 2));
  CHECK(cuMemsetD8(d, 0xff, sd * 2)); /* NaN: an element the kernel does not write fails the check */

  /* Row-major A[M, K], B[N, K], D[M, N]: leading dimensions K, K, N (in elements). */
  CHECK(cutegen_bf16_gemm_nt_prepare(&k, a, K, b, K, d, N, M, N, K, &plan));
  CHECK(cutegen_launch(&k, &plan, stream));
  CHECK(cuStreamSynchronize(stream));
  CHECK(cuMemcpyDtoH(hd, d, sd * 2));

  for (r = 0; r < rows; r++) {
    int row = rows > 1 ? (int)((int64_t)r * (M - 1) / (rows - 1)) : 0;
    for (n = 0; n < N; n++) {
      float ref = 0.0f, got = from_bf16(hd[(size_t)row * N + n]);
      double err, tol;
      for (kk = 0; kk < K; kk++) ref += from_bf16(ha[(size_t)row * K + kk]) * from_bf16(hb[(size_t)n * K + kk]);
      err = fabs((double)got - (double)ref);
      tol = fabs((double)ref) / 128.0 + 1e-6; /* bf16 rounding is at most |ref| / 256 */
      if (!(err <= tol)) bad++;
      if (!(err <= max_abs)) max_abs = err; /* NaN-propagating max */
      if (fabs(ref) > 0 && !(err / fabs(ref) <= max_rel)) max_rel = err / fabs(ref);
    }
  }
  printf("kernel   %s\n", info->name);
  printf("problem  M=%d N=%d K=%d  grid (%u, %u, %u)  block (%u, %u, %u)  cluster (%u, %u, %u)  smem %u\n", M, N, K,
         plan.grid[0], plan.grid[1], plan.grid[2], info->block[0], info->block[1], info->block[2], info->cluster[0],
         info->cluster[1], info->cluster[2], info->smem_bytes);
  printf("checked  %d rows x %d columns against an exact fp32 CPU reference\n", rows, N);
  printf("max abs error %.6g, max rel error %.6g, %d mismatches: %s\n\n", max_abs, max_rel, bad,
         bad ? "FAIL" : "PASS");
  status = bad ? 1 : 0;

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
  const char* export_dir;
  const char* which = NULL;
  int M = 1000, N = 1536, K = 2048, arg = 2, status = 0, i, ran = 0;
  CUdevice dev;
  CUcontext ctx = NULL;
  CUstream stream = NULL;

  if (argc < 2 || argc > 6) {
    fprintf(stderr, "usage: %s EXPORT_DIR [KERNEL|all] [M N K]\n", argv[0]);
    return 2;
  }
  export_dir = argv[1];
  if (argc == 3 || argc == 6) which = argv[arg++];
  if (argc - arg == 3) {
    M = atoi(argv[arg]);
    N = atoi(argv[arg + 1]);
    K = atoi(argv[arg + 2]);
  } else if (argc != arg) {
    fprintf(stderr, "usage: %s EXPORT_DIR [KERNEL|all] [M N K]\n", argv[0]);
    return 2;
  }
  if (which && strcmp(which, "all") != 0) {
    const cutegen_kernel_info* info = cutegen_find_kernel(which);
    if (info == NULL || strcmp(info->op, "bf16_gemm_nt") != 0) {
      fprintf(stderr, "c_launcher: %s is not a bf16_gemm_nt kernel of this export; it has:\n", which);
      for (i = 0; i < CUTEGEN_BF16_GEMM_NT_NUM_KERNELS; i++) fprintf(stderr, "  %s\n", cutegen_bf16_gemm_nt_kernels[i]->name);
      return 2;
    }
  }

  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

  for (i = 0; i < CUTEGEN_BF16_GEMM_NT_NUM_KERNELS; i++) {
    const cutegen_kernel_info* info = cutegen_bf16_gemm_nt_kernels[i];
    int s;
    if (which == NULL ? i > 0 : (strcmp(which, "all") != 0 && strcmp(which, info->name) != 0)) continue;
    s = run(export_dir, info, stream, M, N, K);
    ran++;
    if (s > status) status = s;
  }
  printf("%d kernel(s) run: %s\n", ran, status == 0 ? "PASS" : status == 1 ? "FAIL" : "ERROR");

done:
  if (stream) cuStreamDestroy(stream);
  if (ctx) cuDevicePrimaryCtxRelease(dev);
  return status;
}
