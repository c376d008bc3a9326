// Builds what every entry point needs from command-line choices: the model, its
// tokenizer, a backend and an engine.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/security/transport_security.h"
#include "worker/backend/cuda_backend.h"
#include "worker/engine/engine.h"
#include "worker/tier/fetch_transport.h"
#include "worker/tokenizer/tokenizer.h"

namespace lazykv {

// The cache tier behind the engine's local pool: cache servers when `servers` is set,
// else the same store embedded in this process (host RAM + RocksDB under `dir`).
struct CacheTierSetup {
  bool enabled = true;
  std::string servers;            // HOST:PORT,...
  int min_call_deadline_ms = 20;  // floor of a cache server call's deadline; 5x before any sample
  int lookup_lease_ms = 2000;     // RemoteTierOptions::lookup_lease_hold; 0: lookups lease nothing
  std::string dir;                // embedded disk tier; empty: DefaultCacheDir()
  uint64_t host_bytes = 256ull << 20;
  uint64_t disk_bytes = 2ull << 30;
  std::string holder;                                // this process's name in lease logs
  ClientSecurityOptions security;                    // TLS and token towards the cache servers
  FetchTransport transport = FetchTransport::kAuto;  // shm for servers on this host, else gRPC
  // The worker's GPU, for a same-host server's GPU tier (RemoteTierOptions::gpu_device);
  // SetUpEngine sets it on a GPU when chunks are not signed. -1: none.
  int gpu_device = -1;
};

// $LAZYKV_CACHE_DIR, else $XDG_CACHE_HOME/lazykv, else ~/.cache/lazykv.
std::string DefaultCacheDir();

// Null when !setup.enabled.
absl::StatusOr<std::shared_ptr<ChunkTier>> SetUpCacheTier(const CacheTierSetup& setup);

// Where the model runs: the CPU backend, the CUDA backend, or CUDA when this build has it
// and a GPU is present.
enum class Device { kCpu, kCuda, kAuto };
absl::StatusOr<Device> ParseDevice(std::string_view name);  // "cpu", "cuda", "auto"

// The precision the model runs in. kAuto: bf16 on the GPU (the serving precision), fp32 on
// the CPU. kBf16 on the CPU is its GPU-like numerics (CpuNumerics::kBf16LikeCuda); kFp32
// on the GPU is CudaPrecision::kFp32. The KV dtype, and so the chunk keys, follow it.
enum class ModelDtype { kAuto, kBf16, kFp32 };
absl::StatusOr<ModelDtype> ParseModelDtype(std::string_view name);      // "auto", "bf16", "fp32"
absl::StatusOr<SharedDecode> ParseSharedDecode(std::string_view name);  // "auto", "always", "off"

struct ModelSetupOptions {
  std::string model;      // path, HF directory, or synthetic:NAME[:SEED]
  std::string tokenizer;  // empty: next to the model, or bytes for synthetic models
  Device device = Device::kAuto;
  ModelDtype dtype = ModelDtype::kAuto;
  SharedDecode shared_decode = SharedDecode::kAuto;  // the CUDA backend's chunk-shared decode attention
  int block_size = 16;
  uint64_t kv_pool_bytes = 256ull << 20;
  EngineOptions engine;
  CacheTierSetup cache_tier;
};

struct LoadedEngine {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Tokenizer> tokenizer;
  bool on_gpu = false;  // the CUDA backend runs it
};

// The backend alone (SetUpEngine's first step); its config() is the model's architecture.
absl::StatusOr<std::unique_ptr<Backend>> SetUpBackend(const ModelSetupOptions& options);

absl::StatusOr<LoadedEngine> SetUpEngine(const ModelSetupOptions& options);

}  // namespace lazykv
