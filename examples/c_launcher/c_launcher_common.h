/* c_launcher_common.h: what the example programs share — CUDA error reporting and bf16 decoding. */
#ifndef C_LAUNCHER_COMMON_H
#define C_LAUNCHER_COMMON_H

#include <stdint.h>
#include <stdio.h>
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

#endif
