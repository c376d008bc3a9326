#include "bench/kernel_trace.h"

#include <cuda_runtime.h>
#include <cupti.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace lazykv::bench {
namespace {

// The CUPTI entry points used, resolved from the library once.
struct Cupti {
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
};

const Cupti* LoadCupti() {
  static const Cupti* loaded = []() -> const Cupti* {
    void* lib = nullptr;
    if (const char* path = std::getenv("LAZYKV_CUPTI"); path != nullptr && *path != '\0') {
      lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
    if (lib == nullptr) lib = dlopen("libcupti.so.13", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return nullptr;
    auto* c = new Cupti;
    c->register_callbacks =
        reinterpret_cast<decltype(c->register_callbacks)>(dlsym(lib, "cuptiActivityRegisterCallbacks"));
    c->enable = reinterpret_cast<decltype(c->enable)>(dlsym(lib, "cuptiActivityEnable"));
    c->disable = reinterpret_cast<decltype(c->disable)>(dlsym(lib, "cuptiActivityDisable"));
    c->flush_all = reinterpret_cast<decltype(c->flush_all)>(dlsym(lib, "cuptiActivityFlushAll"));
    c->next_record = reinterpret_cast<decltype(c->next_record)>(dlsym(lib, "cuptiActivityGetNextRecord"));
    if (!c->register_callbacks || !c->enable || !c->disable || !c->flush_all || !c->next_record) return nullptr;
    return c;
  }();
  return loaded;
}

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET};
constexpr size_t kBufferBytes = 8 << 20;

// Filled by CUPTI's completion callback, which runs on CUPTI's own thread.
std::mutex g_mu;
std::vector<TraceRecord>* g_records = nullptr;  // under g_mu

// The kernel's demangled name, shortened (trace_summary.h).
std::string ShortName(const char* mangled) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && demangled != nullptr ? demangled : mangled;
  std::free(demangled);
  return ShortKernelName(name);
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  const Cupti* c = LoadCupti();
  std::vector<TraceRecord> got;
  CUpti_Activity* record = nullptr;
  while (c != nullptr && c->next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
    // A forced flush may hand over records still incomplete (no end yet): left out.
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      if (k->name != nullptr && k->end >= k->start && k->start != 0) {
        got.push_back({ShortName(k->name), k->start, k->end});
      }
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      if (m->end >= m->start && m->start != 0) got.push_back({"memcpy", m->start, m->end});
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
      if (m->end >= m->start && m->start != 0) got.push_back({"memset", m->start, m->end});
    }
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_records != nullptr) g_records->insert(g_records->end(), got.begin(), got.end());
}

}  // namespace

absl::StatusOr<std::unique_ptr<KernelTrace>> KernelTrace::Start() {
  const Cupti* c = LoadCupti();
  if (c == nullptr) return absl::UnavailableError("CUPTI not found (set LAZYKV_CUPTI to libcupti.so's path)");
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_records != nullptr) return absl::FailedPreconditionError("a kernel trace is already running");
    g_records = new std::vector<TraceRecord>;
  }
  // On a failure, what was enabled is disabled again and the slot freed for a later Start.
  const auto fail = [c](absl::Status status) {
    for (CUpti_ActivityKind kind : kKinds) c->disable(kind);
    std::lock_guard<std::mutex> lock(g_mu);
    delete g_records;
    g_records = nullptr;
    return status;
  };
  if (c->register_callbacks(BufferRequested, BufferCompleted) != CUPTI_SUCCESS) {
    return fail(absl::InternalError("cuptiActivityRegisterCallbacks failed"));
  }
  for (CUpti_ActivityKind kind : kKinds) {
    if (c->enable(kind) != CUPTI_SUCCESS) return fail(absl::InternalError(absl::StrCat("cuptiActivityEnable ", kind)));
  }
  auto trace = std::unique_ptr<KernelTrace>(new KernelTrace);
  trace->running_ = true;
  return trace;
}

std::vector<TraceRecord> KernelTrace::Stop() {
  if (!running_) return {};
  running_ = false;
  const Cupti* c = LoadCupti();
  cudaDeviceSynchronize();
  for (CUpti_ActivityKind kind : kKinds) c->disable(kind);
  c->flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::vector<TraceRecord> out;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    out = std::move(*g_records);
    delete g_records;
    g_records = nullptr;
  }
  std::sort(out.begin(), out.end(), [](const TraceRecord& a, const TraceRecord& b) { return a.start_ns < b.start_ns; });
  return out;
}

KernelTrace::~KernelTrace() { Stop(); }

}  // namespace lazykv::bench
