/* c_launcher_fp8: run an exported cutegen FP8 block-scaled GEMM from plain C through the CUDA driver
 * API, and check it.
 *
 *   c_launcher_fp8 EXPORT_DIR [KERNEL|all] [M N K]
 *
 * EXPORT_DIR  a folder made by `cutegen export` holding at least one fp8_gemm_nt kernel
 * KERNEL      a kernel name of that export; "all" runs every fp8_gemm_nt kernel (default: the first)
 * M N K       the problem (default 1000 1536 2048; N a multiple of 8, K a multiple of 16)
 *
 * D[M, N] (bf16) = (A[M, K] e4m3 · sfa) @ (B[N, K] e4m3 · sfb)^T with DeepSeek-V3's scales: sfa fp32
 * per 1x128 of A, stored MN-major with the column stride align(M, 4) (TMA-aligned); sfb fp32 per
 * 128x128 block of B, row-major [ceil(N/128), ceil(K/128)]. A and B hold multiples of 1/8 in [-1, 1] and
 * the scales are powers of two, so every product, block sum and promotion is exact in fp32: the
 * CPU reference (double, on 16 rows spread over M, all N columns) is exact and the kernel's only
 * error is the final rounding to bf16.
 *
 * Exit status: 0 every result matches; 1 a result does not; 2 a usage, setup or CUDA error.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cutegen_kernels.h"

#define PROGRAM "c_launcher_fp8"
#include "c_launcher_common.h"

#define SCALE_BLOCK 128

/* e4m3 encoding of k/8 for k in [-8, 8]: every such value is a normal e4m3 number (or zero). */
static uint8_t e4m3_of_eighths(int k) {
  uint8_t sign = k < 0 ? 0x80 : 0;
  int mag = k < 0 ? -k : k, exp = 0;
  if (mag == 0) return sign;
  while ((mag >> exp) > 1) exp++;                          /* mag = 1.f * 2^exp */
  int mantissa = ((mag << 3) >> exp) & 7;                   /* three fraction bits */
  return (uint8_t)(sign | (uint8_t)((exp - 3 + 7) << 3) | (uint8_t)mantissa); /* value 2^(exp-3) */
}

static int next_eighths(uint64_t* s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (int)((*s >> 33) % 17u) - 8;
}

/* Power-of-two scales in [1/4, 4] (sfa) and [1/2, 2] (sfb), varying over rows, blocks and K. */
static float sfa_value(int m, int kb) { return ldexpf(1.0f, (m * 7 + kb * 3) % 5 - 2); }
static float sfb_value(int nb, int kb) { return ldexpf(1.0f, (nb + 2 * kb) % 3 - 1); }

/* Run one kernel on one problem; 0 pass, 1 wrong result, 2 error. */
static int run(const char* export_dir, const cutegen_kernel_info* info, CUstream stream, int M, int N, int K) {
  cutegen_kernel k;
  cutegen_launch_plan plan;
  CUdeviceptr a = 0, b = 0, sfa = 0, sfb = 0, d = 0;
  int8_t *qa = NULL, *qb = NULL; /* the k/8 numerators, for the reference */
  uint8_t *ha = NULL, *hb = NULL;
  float *hsfa = NULL, *hsfb = NULL;
  uint16_t* hd = NULL;
  const int KB = (K + SCALE_BLOCK - 1) / SCALE_BLOCK, NB = (N + SCALE_BLOCK - 1) / SCALE_BLOCK, MA = (M + 3) / 4 * 4;
  size_t sa = (size_t)M * K, sb = (size_t)N * K, sd = (size_t)M * N, i;
  size_t ssfa = (size_t)MA * KB, ssfb = (size_t)NB * KB;
  int status = 2, rows = M < 16 ? M : 16, r, n, kk, loaded = 0, m, kb;
  bf16_check check = {0, 0, 0.0, 0.0};
  uint64_t seed_a = 0x1234567ull, seed_b = 0x89abcdefull;

  CHECK(cutegen_kernel_load(&k, info, export_dir));
  loaded = 1;
  qa = malloc(sa ? sa : 1);
  qb = malloc(sb ? sb : 1);
  ha = malloc(sa ? sa : 1);
  hb = malloc(sb ? sb : 1);
  hsfa = calloc(ssfa ? ssfa : 1, sizeof(float));
  hsfb = malloc((ssfb ? ssfb : 1) * sizeof(float));
  hd = malloc((sd ? sd : 1) * 2);
  if (!qa || !qb || !ha || !hb || !hsfa || !hsfb || !hd) {
    fprintf(stderr, "c_launcher_fp8: out of host memory\n");
    goto done;
  }
  for (i = 0; i < sa; i++) qa[i] = (int8_t)next_eighths(&seed_a), ha[i] = e4m3_of_eighths(qa[i]);
  for (i = 0; i < sb; i++) qb[i] = (int8_t)next_eighths(&seed_b), hb[i] = e4m3_of_eighths(qb[i]);
  for (kb = 0; kb < KB; kb++)
    for (m = 0; m < M; m++) hsfa[(size_t)kb * MA + m] = sfa_value(m, kb); /* MN-major, column stride MA */
  for (n = 0; n < NB; n++)
    for (kb = 0; kb < KB; kb++) hsfb[(size_t)n * KB + kb] = sfb_value(n, kb);

  CHECK(cuMemAlloc(&a, sa ? sa : 1));
  CHECK(cuMemAlloc(&b, sb ? sb : 1));
  CHECK(cuMemAlloc(&sfa, (ssfa ? ssfa : 1) * sizeof(float)));
  CHECK(cuMemAlloc(&sfb, (ssfb ? ssfb : 1) * sizeof(float)));
  CHECK(cuMemAlloc(&d, (sd ? sd : 1) * 2));
  /* Everything on the launch stream: it is non-blocking, so copies or a memset on the legacy
     default stream would not be ordered before the kernel (a late memset overwrites its output). */
  CHECK(cuMemcpyHtoDAsync(a, ha, sa, stream));
  CHECK(cuMemcpyHtoDAsync(b, hb, sb, stream));
  CHECK(cuMemcpyHtoDAsync(sfa, hsfa, ssfa * sizeof(float), stream));
  CHECK(cuMemcpyHtoDAsync(sfb, hsfb, ssfb * sizeof(float), stream));
  CHECK(cuMemsetD8Async(d, 0xff, sd * 2, stream)); /* NaN: an element the kernel does not write fails the check */

  /* Leading dimensions in elements: A and B K, sfa's K-block stride MA, sfb's row KB, D N. */
  CHECK(cutegen_fp8_gemm_nt_prepare(&k, a, K, b, K, sfa, MA, sfb, KB, d, N, M, N, K, KB, NB, &plan));
  CHECK(cutegen_launch(&k, &plan, stream));
  CHECK(cuMemcpyDtoHAsync(hd, d, sd * 2, stream));
  CHECK(cuStreamSynchronize(stream));

  for (r = 0; r < rows; r++) {
    int row = rows > 1 ? (int)((int64_t)r * (M - 1) / (rows - 1)) : 0;
    for (n = 0; n < N; n++) {
      double ref = 0.0, got = from_bf16(hd[(size_t)row * N + n]);
      for (kb = 0; kb < KB; kb++) {
        double block = 0.0;
        for (kk = kb * SCALE_BLOCK; kk < K && kk < (kb + 1) * SCALE_BLOCK; kk++)
          block += (double)qa[(size_t)row * K + kk] * (double)qb[(size_t)n * K + kk] / 64.0;
        ref += block * sfa_value(row, kb) * sfb_value(n / SCALE_BLOCK, kb);
      }
      bf16_check_element(&check, got, ref);
    }
  }
  status = bf16_check_report(&check, info, &plan, M, N, K, rows, "an exact CPU reference");

done:
  if (a) cuMemFree(a);
  if (b) cuMemFree(b);
  if (sfa) cuMemFree(sfa);
  if (sfb) cuMemFree(sfb);
  if (d) cuMemFree(d);
  free(qa);
  free(qb);
  free(ha);
  free(hb);
  free(hsfa);
  free(hsfb);
  free(hd);
  if (loaded) cutegen_kernel_unload(&k);
  return status;
}

static int check_problem(int M, int N, int K) {
  if (M < 1 || N < 8 || N % 8 != 0 || K < 16 || K % 16 != 0) {
    fprintf(stderr, "c_launcher_fp8: need M >= 1, N a multiple of 8, K a multiple of 16; got M=%d N=%d K=%d\n",
            M, N, K);
    return 2;
  }
  return 0;
}

int main(int argc, char** argv) {
  return launcher_main(argc, argv, "fp8_gemm_nt", cutegen_fp8_gemm_nt_kernels, CUTEGEN_FP8_GEMM_NT_NUM_KERNELS,
                       check_problem, run);
}
