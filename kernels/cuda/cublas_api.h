// cuBLAS and cuBLASLt, opened with dlopen on first use instead of linked: their static TLS
// (about 110 KiB) would otherwise join every thread of every program that links the worker
// library, and threads created with small stacks then fail (civetweb's, behind the
// /metrics endpoint, did). Loaded this way, only a process that runs a GEMM maps them, and
// their TLS is dynamic.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

#include "absl/status/statusor.h"

namespace lazykv::cuda {

struct CublasApi {
  decltype(&cublasLtCreate) LtCreate;
  decltype(&cublasLtDestroy) LtDestroy;
  decltype(&cublasLtMatmulDescCreate) LtMatmulDescCreate;
  decltype(&cublasLtMatmulDescDestroy) LtMatmulDescDestroy;
  decltype(&cublasLtMatmulDescSetAttribute) LtMatmulDescSetAttribute;
  decltype(&cublasLtMatrixLayoutCreate) LtMatrixLayoutCreate;
  decltype(&cublasLtMatrixLayoutDestroy) LtMatrixLayoutDestroy;
  decltype(&cublasLtMatmulPreferenceCreate) LtMatmulPreferenceCreate;
  decltype(&cublasLtMatmulPreferenceDestroy) LtMatmulPreferenceDestroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) LtMatmulPreferenceSetAttribute;
  decltype(&cublasLtMatmulAlgoGetHeuristic) LtMatmulAlgoGetHeuristic;
  decltype(&cublasLtMatmul) LtMatmul;
  decltype(&cublasCreate_v2) Create;
  decltype(&cublasDestroy_v2) Destroy;
  decltype(&cublasSetStream_v2) SetStream;
  decltype(&cublasSetWorkspace_v2) SetWorkspace;
  // cublasGemmEx is overloaded in C++: the C signature, spelled out.
  cublasStatus_t (*GemmEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                           const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                           cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
};

// The loaded API (loaded once per process), or why it could not be.
absl::StatusOr<const CublasApi*> Cublas();

}  // namespace lazykv::cuda
