/* c_launcher_common.h: what the example programs share — CUDA error reporting, bf16 decoding and main. */
#ifndef C_LAUNCHER_COMMON_H
#define C_LAUNCHER_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cutegen_kernels.h"

/* Report a failed driver call (with cutegen's own explanation when it has one); returns 2. */
static int fail_cuda(const char* program, const char* what, CUresult r) {
  const char* name = NULL;
  if (cuGetErrorName(r, &name) != CUDA_SUCCESS) name = NULL;
  fprintf(stderr, "%s: %s failed with %s (%d)\n", program, what, name ? name : "an unknown error", (int)r);
  if (cutegen_last_error()[0]) fprintf(stderr, "  %s\n", cutegen_last_error());
  return 2;
}

/* In a function with `int status` and a `done:` label; PROGRAM names the program in messages. */
#define CHECK(call)                                     \
  do {                                                  \
    CUresult check_r_ = (call);                         \
    if (check_r_ != CUDA_SUCCESS) {                     \
      status = fail_cuda(PROGRAM, #call, check_r_);     \
      goto done;                                        \
    }                                                   \
  } while (0)

static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Agreement of a bf16 result with an exact reference: only the bf16 rounding of D is allowed. */
typedef struct {
  int bad, unwritten;
  double max_abs, max_rel;
} bf16_check;

static void bf16_check_element(bf16_check* c, double got, double ref) {
  double err = fabs(got - ref), tol = fabs(ref) / 128.0 + 1e-6; /* bf16 rounding is at most |ref| / 256 */
  if (isnan(got)) { /* the NaN poison, never overwritten: the inputs are finite, so no result is NaN */
    c->bad++;
    c->unwritten++;
    return;
  }
  if (!(err <= tol)) c->bad++;
  if (err > c->max_abs) c->max_abs = err;
  if (fabs(ref) > 0 && err / fabs(ref) > c->max_rel) c->max_rel = err / fabs(ref);
}

/* Print the kernel, its launch and the check; returns 0 (pass) or 1 (a wrong result). */
static int bf16_check_report(const bf16_check* c, const cutegen_kernel_info* info, const cutegen_launch_plan* plan,
                             int M, int N, int K, int rows, const char* reference) {
  printf("kernel   %s\n", info->name);
  printf("problem  M=%d N=%d K=%d  grid (%u, %u, %u)  block (%u, %u, %u)  cluster (%u, %u, %u)  smem %u\n", M, N, K,
         plan->grid[0], plan->grid[1], plan->grid[2], info->block[0], info->block[1], info->block[2], info->cluster[0],
         info->cluster[1], info->cluster[2], info->smem_bytes);
  printf("checked  %d rows x %d columns against %s\n", rows, N, reference);
  printf("max abs error %.6g, max rel error %.6g (over the written elements), %d mismatches (%d unwritten): %s\n\n",
         c->max_abs, c->max_rel, c->bad, c->unwritten, c->bad ? "FAIL" : "PASS");
  return c->bad ? 1 : 0;
}

/* One problem on one kernel: 0 pass, 1 wrong result, 2 error. */
typedef int (*run_kernel_fn)(const char* export_dir, const cutegen_kernel_info* info, CUstream stream, int M, int N,
                             int K);
/* 0 when the program can run this problem, else prints why and returns 2. */
typedef int (*check_problem_fn)(int M, int N, int K);

/* The programs' main: `PROGRAM EXPORT_DIR [KERNEL|all] [M N K]` over the exported kernels of `op`
 * (default 1000 1536 2048; the first kernel unless KERNEL or "all" is given). Exit status: 0 every
 * result matches; 1 one does not; 2 a usage, setup or CUDA error. */
static int launcher_main(int argc, char** argv, const char* op, const cutegen_kernel_info* const* kernels,
                         int num_kernels, check_problem_fn check_problem, run_kernel_fn run) {
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
  if (check_problem && check_problem(M, N, K) != 0) return 2;
  if (num_kernels == 0) {
    fprintf(stderr, "%s: the export at %s has no %s kernel\n", PROGRAM, export_dir, op);
    return 2;
  }
  if (which && strcmp(which, "all") != 0) {
    const cutegen_kernel_info* info = cutegen_find_kernel(which);
    if (info == NULL || strcmp(info->op, op) != 0) {
      fprintf(stderr, "%s: %s is not a %s kernel of this export; it has:\n", PROGRAM, which, op);
      for (i = 0; i < num_kernels; i++) fprintf(stderr, "  %s\n", kernels[i]->name);
      return 2;
    }
  }

  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

  for (i = 0; i < num_kernels; i++) {
    const cutegen_kernel_info* info = kernels[i];
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

#endif
