
/* Minimal stand-in for <cuda_runtime.h>: just what the export header uses. */
#pragma once
#include <stddef.h>
#include <stdint.h>
typedef int cudaError_t;
#define cudaSuccess 0
typedef struct CUlib_st *cudaLibrary_t;
typedef struct CUstream_st *cudaStream_t;
#ifdef __cplusplus
extern "C" {
#endif
const char *cudaGetErrorName(cudaError_t);
const char *cudaGetErrorString(cudaError_t);
cudaError_t cudaGetDeviceCount(int *);
cudaError_t cudaLibraryUnload(cudaLibrary_t);
#ifdef __cplusplus
}
#endif
