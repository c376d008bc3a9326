#include "kernels/cuda/cublas_api.h"

#include <dlfcn.h>

#include <string>

#include "absl/strings/str_format.h"

namespace lazykv::cuda {
namespace {

void* Open(const std::string& base) {
  const std::string versioned = absl::StrFormat("%s.so.%d", base, CUBLAS_VER_MAJOR);
  void* handle = dlopen(versioned.c_str(), RTLD_NOW | RTLD_LOCAL);
  return handle != nullptr ? handle : dlopen((base + ".so").c_str(), RTLD_NOW | RTLD_LOCAL);
}

absl::StatusOr<CublasApi> Load() {
  void* lt = Open("libcublasLt");
  if (lt == nullptr) return absl::FailedPreconditionError(absl::StrFormat("cannot load cuBLASLt: %s", dlerror()));
  void* blas = Open("libcublas");
  if (blas == nullptr) return absl::FailedPreconditionError(absl::StrFormat("cannot load cuBLAS: %s", dlerror()));
  CublasApi api{};
  std::string missing;
  auto get = [&](void* lib, auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    if (fn == nullptr) missing += std::string(" ") + name;
  };
  get(lt, api.LtCreate, "cublasLtCreate");
  get(lt, api.LtDestroy, "cublasLtDestroy");
  get(lt, api.LtMatmulDescCreate, "cublasLtMatmulDescCreate");
  get(lt, api.LtMatmulDescDestroy, "cublasLtMatmulDescDestroy");
  get(lt, api.LtMatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
  get(lt, api.LtMatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
  get(lt, api.LtMatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy");
  get(lt, api.LtMatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
  get(lt, api.LtMatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
  get(lt, api.LtMatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
  get(lt, api.LtMatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
  get(lt, api.LtMatmul, "cublasLtMatmul");
  get(blas, api.Create, "cublasCreate_v2");
  get(blas, api.Destroy, "cublasDestroy_v2");
  get(blas, api.SetStream, "cublasSetStream_v2");
  get(blas, api.SetWorkspace, "cublasSetWorkspace_v2");
  get(blas, api.GemmEx, "cublasGemmEx");
  if (!missing.empty()) return absl::FailedPreconditionError("cuBLAS lacks" + missing);
  return api;
}

}  // namespace

absl::StatusOr<const CublasApi*> Cublas() {
  static const absl::StatusOr<CublasApi> api = Load();  // thread-safe, once
  if (!api.ok()) return api.status();
  return &*api;
}

}  // namespace lazykv::cuda
