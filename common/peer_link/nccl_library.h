// NCCL, opened with dlopen on first use instead of linked: the library ships with PyTorch's
// wheels (site-packages/nvidia/nccl/lib) on the machines we run on, not with the toolkit,
// and a build must still run where it is absent (PeerLinkAvailable("nccl") then says so).
// Only the types come from nccl.h; every call goes through the table below.
//
// Where it is looked for, in order: $LAZYKV_NCCL_LIBRARY (a path or a soname), then
// libnccl.so.2, then libnccl.so, by the dynamic loader's usual search (LD_LIBRARY_PATH ...).
// Before loading, NCCL_NVLS_ENABLE defaults to 0 (see nccl_library.cc).
#pragma once

#include <nccl.h>

#include <string>

#include "absl/status/statusor.h"

namespace lazykv {

struct NcclApi {
  decltype(&ncclGetVersion) GetVersion;
  decltype(&ncclGetUniqueId) GetUniqueId;
  decltype(&ncclCommInitRankConfig) CommInitRankConfig;
  decltype(&ncclCommAbort) CommAbort;
  decltype(&ncclCommDestroy) CommDestroy;
  decltype(&ncclCommFinalize) CommFinalize;
  decltype(&ncclCommGetAsyncError) CommGetAsyncError;
  decltype(&ncclGetErrorString) GetErrorString;
  decltype(&ncclGetLastError) GetLastError;  // null in libraries that lack it (before 2.13)
  decltype(&ncclGroupStart) GroupStart;
  decltype(&ncclGroupEnd) GroupEnd;
  decltype(&ncclSend) Send;
  decltype(&ncclRecv) Recv;
  int version = 0;        // ncclGetVersion's code, e.g. 22809 for 2.28.9
  std::string loaded_as;  // the name dlopen succeeded with

  // "ncclGroupEnd: unhandled system error (last error: ...)" for `call` failing with `result`.
  std::string Describe(const char* call, ncclResult_t result) const;
};

// The loaded API (loaded once per process; thread-safe), or FAILED_PRECONDITION saying why
// it could not be (dlerror()'s text for each name tried, or the symbols missing).
absl::StatusOr<const NcclApi*> Nccl();

}  // namespace lazykv
