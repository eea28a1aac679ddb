/* A recording stand-in for the CUDA driver library (libcuda), for CPU-only tests.
 *
 * Defines every driver function the exported C launchers and examples/c_launcher use. Each call
 * writes one JSON line (to $CUTEGEN_STUB_LOG, else stdout) with its arguments, so a test can
 * compare what the C launcher passes with what cutegen's Python runtime computes. Nothing runs on a
 * GPU: "device memory" is host memory, launches only record.
 *
 * Configuration (environment):
 *   CUTEGEN_STUB_CC                 compute capability as major*10+minor (default 90)
 *   CUTEGEN_STUB_SMS                multiprocessor count (default 132)
 *   CUTEGEN_STUB_SMEM_OPTIN         shared memory opt-in per block (default 232448)
 *   CUTEGEN_STUB_MAX_ACTIVE_CLUSTERS  answer of cuOccupancyMaxActiveClusters (default 66; < 0: fail)
 *   CUTEGEN_STUB_PARAMS             "offset:size,..." as cuFuncGetParamInfo reports them;
 *                                   unset: CUDA_ERROR_NOT_SUPPORTED
 *   CUTEGEN_STUB_NO_CONTEXT=1       cuCtxGetCurrent answers no context
 *   CUTEGEN_STUB_NO_DEVICE=1        cuInit fails with CUDA_ERROR_NO_DEVICE
 *   CUTEGEN_STUB_LOAD_FAIL=1        cuModuleLoadData fails with CUDA_ERROR_NO_BINARY_FOR_GPU
 */
#define _POSIX_C_SOURCE 200112L
#include <cuda.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static FILE* stub_out(void) {
  static FILE* f = NULL;
  if (f == NULL) {
    const char* path = getenv("CUTEGEN_STUB_LOG");
    f = path ? fopen(path, "a") : NULL;
    if (f == NULL) f = stdout;
  }
  return f;
}

static long env_long(const char* name, long fallback) {
  const char* v = getenv(name);
  return (v && *v) ? strtol(v, NULL, 0) : fallback;
}

static void hex(FILE* f, const void* p, size_t n) {
  const unsigned char* b = (const unsigned char*)p;
  size_t i;
  fputc('"', f);
  for (i = 0; i < n; i++) fprintf(f, "%02x", b[i]);
  fputc('"', f);
}

static void u64s(FILE* f, const cuuint64_t* v, unsigned n) {
  unsigned i;
  fputc('[', f);
  for (i = 0; i < n; i++) fprintf(f, "%s%llu", i ? "," : "", (unsigned long long)v[i]);
  fputc(']', f);
}

static void u32s(FILE* f, const cuuint32_t* v, unsigned n) {
  unsigned i;
  fputc('[', f);
  for (i = 0; i < n; i++) fprintf(f, "%s%u", i ? "," : "", (unsigned)v[i]);
  fputc(']', f);
}

/* ---- parameter layout ---- */
static int n_params = -1;
static size_t param_offsets[256], param_sizes[256];

static void load_params(void) {
  const char* spec;
  if (n_params >= 0) return;
  n_params = 0;
  spec = getenv("CUTEGEN_STUB_PARAMS");
  if (spec == NULL) {
    n_params = -2;
    return;
  }
  while (*spec && n_params < 256) {
    char* end;
    param_offsets[n_params] = (size_t)strtoul(spec, &end, 0);
    if (*end != ':') break;
    param_sizes[n_params] = (size_t)strtoul(end + 1, &end, 0);
    n_params++;
    spec = end;
    if (*spec == ',') spec++;
  }
}

static int ctx_token, module_token, function_token, stream_token;
static CUcontext current = (CUcontext)&ctx_token;
static unsigned tma_calls = 0;

/* ---- initialisation, devices, contexts ---- */
CUresult cuInit(unsigned int flags) {
  fprintf(stub_out(), "{\"call\":\"cuInit\",\"flags\":%u}\n", flags);
  return env_long("CUTEGEN_STUB_NO_DEVICE", 0) ? CUDA_ERROR_NO_DEVICE : CUDA_SUCCESS;
}
CUresult cuDeviceGetCount(int* count) {
  *count = 1;
  return CUDA_SUCCESS;
}
CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  *device = ordinal;
  return ordinal == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}
CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  (void)dev;
  snprintf(name, (size_t)len, "cutegen stub GPU");
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attrib, CUdevice dev) {
  long cc = env_long("CUTEGEN_STUB_CC", 90);
  (void)dev;
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *value = (int)(cc / 10); break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *value = (int)(cc % 10); break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = (int)env_long("CUTEGEN_STUB_SMS", 132); break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
      *value = (int)env_long("CUTEGEN_STUB_SMEM_OPTIN", 232448);
      break;
    default: *value = 0; break;
  }
  fprintf(stub_out(), "{\"call\":\"cuDeviceGetAttribute\",\"attrib\":%d,\"value\":%d}\n", (int)attrib, *value);
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  (void)dev;
  *pctx = (CUcontext)&ctx_token;
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  (void)dev;
  return CUDA_SUCCESS;
}
CUresult cuCtxSetCurrent(CUcontext ctx) {
  current = ctx;
  return CUDA_SUCCESS;
}
CUresult cuCtxGetCurrent(CUcontext* pctx) {
  *pctx = env_long("CUTEGEN_STUB_NO_CONTEXT", 0) ? NULL : current;
  return CUDA_SUCCESS;
}
CUresult cuCtxGetDevice(CUdevice* device) {
  *device = 0;
  return CUDA_SUCCESS;
}
CUresult cuCtxSynchronize(void) { return CUDA_SUCCESS; }

/* ---- errors ---- */
CUresult cuGetErrorName(CUresult error, const char** pStr) {
  static char buf[64];
  switch (error) {
    case CUDA_SUCCESS: *pStr = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_INVALID_VALUE: *pStr = "CUDA_ERROR_INVALID_VALUE"; break;
    case CUDA_ERROR_NO_DEVICE: *pStr = "CUDA_ERROR_NO_DEVICE"; break;
    case CUDA_ERROR_NO_BINARY_FOR_GPU: *pStr = "CUDA_ERROR_NO_BINARY_FOR_GPU"; break;
    default:
      snprintf(buf, sizeof buf, "CUDA_ERROR_%d", (int)error);
      *pStr = buf;
      break;
  }
  return CUDA_SUCCESS;
}
CUresult cuGetErrorString(CUresult error, const char** pStr) { return cuGetErrorName(error, pStr); }

/* ---- modules and functions ---- */
CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  FILE* f = stub_out();
  fprintf(f, "{\"call\":\"cuModuleLoadData\",\"head\":");
  hex(f, image, 4);
  fprintf(f, "}\n");
  if (env_long("CUTEGEN_STUB_LOAD_FAIL", 0)) return CUDA_ERROR_NO_BINARY_FOR_GPU;
  *module = (CUmodule)&module_token;
  return CUDA_SUCCESS;
}
CUresult cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) {
  fprintf(stub_out(), "{\"call\":\"cuModuleGetFunction\",\"module_ok\":%d,\"name\":\"%s\"}\n",
          hmod == (CUmodule)&module_token, name);
  *hfunc = (CUfunction)&function_token;
  return CUDA_SUCCESS;
}
CUresult cuModuleUnload(CUmodule hmod) {
  fprintf(stub_out(), "{\"call\":\"cuModuleUnload\",\"module_ok\":%d}\n", hmod == (CUmodule)&module_token);
  return CUDA_SUCCESS;
}
CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value) {
  fprintf(stub_out(), "{\"call\":\"cuFuncSetAttribute\",\"function_ok\":%d,\"attrib\":%d,\"value\":%d}\n",
          hfunc == (CUfunction)&function_token, (int)attrib, value);
  return CUDA_SUCCESS;
}
CUresult cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t* paramOffset, size_t* paramSize) {
  (void)func;
  load_params();
  if (n_params == -2) return CUDA_ERROR_NOT_SUPPORTED;
  if (paramIndex >= (size_t)n_params) return CUDA_ERROR_INVALID_VALUE;
  *paramOffset = param_offsets[paramIndex];
  *paramSize = param_sizes[paramIndex];
  return CUDA_SUCCESS;
}

static void config_json(FILE* f, const CUlaunchConfig* c) {
  unsigned i;
  fprintf(f, "\"grid\":[%u,%u,%u],\"block\":[%u,%u,%u],\"smem\":%u,\"stream\":%llu,\"attrs\":[", c->gridDimX,
          c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ, c->sharedMemBytes,
          (unsigned long long)(uintptr_t)c->hStream);
  for (i = 0; i < c->numAttrs; i++) {
    const CUlaunchAttribute* a = &c->attrs[i];
    fprintf(f, "%s{\"id\":%d", i ? "," : "", (int)a->id);
    if (a->id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
      fprintf(f, ",\"cluster\":[%u,%u,%u]", a->value.clusterDim.x, a->value.clusterDim.y, a->value.clusterDim.z);
    else if (a->id == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
      fprintf(f, ",\"pdl\":%d", (int)a->value.programmaticStreamSerializationAllowed);
    else if (a->id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE)
      fprintf(f, ",\"cooperative\":%d", (int)a->value.cooperative);
    fputc('}', f);
  }
  fputc(']', f);
}

CUresult cuOccupancyMaxActiveClusters(int* numClusters, CUfunction func, const CUlaunchConfig* config) {
  FILE* f = stub_out();
  long answer = env_long("CUTEGEN_STUB_MAX_ACTIVE_CLUSTERS", 66);
  fprintf(f, "{\"call\":\"cuOccupancyMaxActiveClusters\",\"function_ok\":%d,", func == (CUfunction)&function_token);
  config_json(f, config);
  fprintf(f, "}\n");
  if (answer < 0) return CUDA_ERROR_INVALID_VALUE;
  *numClusters = (int)answer;
  return CUDA_SUCCESS;
}

CUresult cuTensorMapEncodeTiled(CUtensorMap* tensorMap, CUtensorMapDataType tensorDataType, cuuint32_t tensorRank,
                                void* globalAddress, const cuuint64_t* globalDim, const cuuint64_t* globalStrides,
                                const cuuint32_t* boxDim, const cuuint32_t* elementStrides,
                                CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill) {
  FILE* f = stub_out();
  unsigned char* bytes = (unsigned char*)tensorMap;
  size_t i;
  /* A recognisable descriptor: the call number and the byte index. */
  for (i = 0; i < sizeof(CUtensorMap); i++) bytes[i] = (unsigned char)(tma_calls * 16u + i);
  fprintf(f, "{\"call\":\"cuTensorMapEncodeTiled\",\"n\":%u,\"dtype\":%d,\"rank\":%u,\"address\":%llu,\"dims\":", tma_calls,
          (int)tensorDataType, (unsigned)tensorRank, (unsigned long long)(uintptr_t)globalAddress);
  u64s(f, globalDim, tensorRank);
  fprintf(f, ",\"strides\":");
  u64s(f, globalStrides, tensorRank - 1);
  fprintf(f, ",\"box\":");
  u32s(f, boxDim, tensorRank);
  fprintf(f, ",\"element_strides\":");
  u32s(f, elementStrides, tensorRank);
  fprintf(f, ",\"interleave\":%d,\"swizzle\":%d,\"l2\":%d,\"oob\":%d,\"map\":", (int)interleave, (int)swizzle,
          (int)l2Promotion, (int)oobFill);
  hex(f, tensorMap, sizeof(CUtensorMap));
  fprintf(f, "}\n");
  tma_calls++;
  return CUDA_SUCCESS;
}

CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** kernelParams, void** extra) {
  FILE* out = stub_out();
  int i;
  load_params();
  fprintf(out, "{\"call\":\"cuLaunchKernelEx\",\"function_ok\":%d,\"extra_null\":%d,", f == (CUfunction)&function_token,
          extra == NULL);
  config_json(out, config);
  fprintf(out, ",\"params\":[");
  for (i = 0; i < n_params && kernelParams != NULL; i++) {
    if (i) fputc(',', out);
    hex(out, kernelParams[i], param_sizes[i]);
  }
  fprintf(out, "],\"deltas\":[");
  for (i = 0; i < n_params && kernelParams != NULL; i++)
    fprintf(out, "%s%lld", i ? "," : "", (long long)((char*)kernelParams[i] - (char*)kernelParams[0]));
  fprintf(out, "]}\n");
  return CUDA_SUCCESS;
}

/* ---- memory and streams (host memory stands in for device memory) ---- */
CUresult cuMemAlloc(CUdeviceptr* dptr, size_t bytesize) {
  void* p = NULL;
  if (posix_memalign(&p, 256, bytesize ? bytesize : 1) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *dptr = (CUdeviceptr)(uintptr_t)p;
  return CUDA_SUCCESS;
}
CUresult cuMemFree(CUdeviceptr dptr) {
  free((void*)(uintptr_t)dptr);
  return CUDA_SUCCESS;
}
CUresult cuMemcpyHtoD(CUdeviceptr dst, const void* src, size_t n) {
  memcpy((void*)(uintptr_t)dst, src, n);
  return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoH(void* dst, CUdeviceptr src, size_t n) {
  memcpy(dst, (const void*)(uintptr_t)src, n);
  return CUDA_SUCCESS;
}
CUresult cuMemsetD8(CUdeviceptr dst, unsigned char uc, size_t n) {
  memset((void*)(uintptr_t)dst, uc, n);
  return CUDA_SUCCESS;
}
CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t n, CUstream hStream) {
  (void)hStream;
  return cuMemcpyHtoD(dst, src, n);
}
CUresult cuMemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t n, CUstream hStream) {
  (void)hStream;
  return cuMemcpyDtoH(dst, src, n);
}
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char uc, size_t n, CUstream hStream) {
  (void)hStream;
  return cuMemsetD8(dst, uc, n);
}
CUresult cuStreamCreate(CUstream* phStream, unsigned int flags) {
  (void)flags;
  *phStream = (CUstream)&stream_token;
  return CUDA_SUCCESS;
}
CUresult cuStreamDestroy(CUstream hStream) {
  (void)hStream;
  return CUDA_SUCCESS;
}
CUresult cuStreamSynchronize(CUstream hStream) {
  (void)hStream;
  return CUDA_SUCCESS;
}
