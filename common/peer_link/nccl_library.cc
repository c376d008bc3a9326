#include "common/peer_link/nccl_library.h"

#include <dlfcn.h>
#include <stdlib.h>

#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"

namespace lazykv {
namespace {

absl::StatusOr<NcclApi> Load() {
  // A two-rank point-to-point link never needs NVLink multicast (NVLS, for collectives over
  // NVSwitch), and the machines we run on require it off. The user's own setting wins.
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);

  std::vector<std::string> names;
  if (const char* env = getenv("LAZYKV_NCCL_LIBRARY"); env != nullptr && *env != '\0') names.push_back(env);
  names.push_back("libnccl.so.2");
  names.push_back("libnccl.so");
  void* lib = nullptr;
  std::vector<std::string> errors;
  std::string loaded_as;
  for (const std::string& name : names) {
    lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) {
      loaded_as = name;
      break;
    }
    const char* error = dlerror();
    errors.push_back(error != nullptr ? std::string(error) : name + ": not found");
  }
  if (lib == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot load the NCCL library (set LAZYKV_NCCL_LIBRARY to its path): ", absl::StrJoin(errors, "; ")));
  }
  NcclApi api{};
  api.loaded_as = loaded_as;
  std::string missing;
  auto get = [&](auto& fn, const char* name, bool required = true) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    if (fn == nullptr && required) missing += std::string(" ") + name;
  };
  get(api.GetVersion, "ncclGetVersion");
  get(api.GetUniqueId, "ncclGetUniqueId");
  get(api.CommInitRankConfig, "ncclCommInitRankConfig");  // with CommFinalize: NCCL 2.14 and later
  get(api.CommAbort, "ncclCommAbort");
  get(api.CommDestroy, "ncclCommDestroy");
  get(api.CommFinalize, "ncclCommFinalize");
  get(api.CommGetAsyncError, "ncclCommGetAsyncError");
  get(api.GetErrorString, "ncclGetErrorString");
  get(api.GetLastError, "ncclGetLastError", /*required=*/false);
  get(api.GroupStart, "ncclGroupStart");
  get(api.GroupEnd, "ncclGroupEnd");
  get(api.Send, "ncclSend");
  get(api.Recv, "ncclRecv");
  if (!missing.empty()) {
    // Keep the library mapped: a half-loaded library is not worth the risk of unloading.
    return absl::FailedPreconditionError(
        absl::StrCat("the NCCL library ", loaded_as, " lacks", missing, " (NCCL 2.14 or later is needed)"));
  }
  if (api.GetVersion(&api.version) != ncclSuccess) {
    return absl::FailedPreconditionError(absl::StrCat("ncclGetVersion failed in ", loaded_as));
  }
  spdlog::debug("loaded NCCL {} from {}", api.version, loaded_as);
  return api;
}

}  // namespace

std::string NcclApi::Describe(const char* call, ncclResult_t result) const {
  std::string text = absl::StrCat(call, ": ", GetErrorString(result));
  const char* last = GetLastError != nullptr ? GetLastError(nullptr) : nullptr;
  if (last != nullptr && *last != '\0') absl::StrAppend(&text, " (last NCCL error: ", last, ")");
  return text;
}

absl::StatusOr<const NcclApi*> Nccl() {
  static const absl::StatusOr<NcclApi> api = Load();  // thread-safe, once
  if (!api.ok()) return api.status();
  return &*api;
}

}  // namespace lazykv
