#include "worker/setup/model_setup.h"

#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"
#include "worker/backend/cpu_backend.h"
#include "worker/model/synthetic_model.h"
#ifdef LAZYKV_WITH_CUDA
#include "worker/backend/cuda_backend.h"
#endif
#include "cache_server/pinned_memory.h"
#include "worker/model/model_loader.h"
#include "worker/tier/embedded_chunk_tier.h"
#include "worker/tier/remote_chunk_tier.h"

namespace lazykv {
namespace {

absl::StatusOr<std::unique_ptr<Tokenizer>> ChooseTokenizer(const ModelSetupOptions& options, int vocab_size) {
  namespace fs = std::filesystem;
  if (!options.tokenizer.empty()) return LoadTokenizer(options.tokenizer);
  if (options.model.starts_with("synthetic:")) return MakeByteTokenizer(vocab_size);
  std::error_code ec;
  const fs::path model(options.model);
  const fs::path dir = fs::is_directory(model, ec) ? model : model.parent_path();
  for (const char* name : {"tokenizer.json", "tokenizer.model", "tokenizer.bin"}) {
    if (fs::exists(dir / name, ec)) return LoadTokenizer((dir / name).string());
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("no tokenizer for %s: pass --tokenizer PATH (Hugging Face tokenizer.json, llama2.c tokenizer.bin "
                      "or SentencePiece .model)",
                      options.model));
}

}  // namespace

absl::StatusOr<Device> ParseDevice(std::string_view name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  if (name == "auto") return Device::kAuto;
  return absl::InvalidArgumentError(absl::StrFormat("unknown device '%s'; expected cpu, cuda or auto", name));
}

absl::StatusOr<SharedDecode> ParseSharedDecode(std::string_view name) {
  if (name == "auto") return SharedDecode::kAuto;
  if (name == "always") return SharedDecode::kAlways;
  if (name == "off") return SharedDecode::kOff;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown --shared-decode '", std::string(name), "' (auto, always or off)"));
}

absl::StatusOr<ModelDtype> ParseModelDtype(std::string_view name) {
  if (name == "auto") return ModelDtype::kAuto;
  if (name == "bf16" || name == "bfloat16") return ModelDtype::kBf16;
  if (name == "fp32" || name == "float32") return ModelDtype::kFp32;
  return absl::InvalidArgumentError(absl::StrFormat("unknown --dtype '%s'; expected bf16, fp32 or auto", name));
}

std::string DefaultCacheDir() {
  if (const char* dir = std::getenv("LAZYKV_CACHE_DIR"); dir != nullptr && *dir != '\0') return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return (std::filesystem::path(xdg) / "lazykv").string();
  }
  const char* home = std::getenv("HOME");
  return (std::filesystem::path(home != nullptr ? home : "/tmp") / ".cache" / "lazykv").string();
}

namespace {

// A cache server's arena mapped by this worker is page-locked as the server's own is
// (cache_server/pinned_memory.h: with CUDA and a device; otherwise nothing).
HostPinner ShmPinner() {
  return HostPinner{.pin = [](const void* base, size_t bytes) { return cache::PinHostMemoryReadOnly(base, bytes); },
                    .unpin = [](const void* base) { cache::UnpinHostMemory(const_cast<void*>(base)); }};
}

}  // namespace

absl::StatusOr<std::shared_ptr<ChunkTier>> SetUpCacheTier(const CacheTierSetup& setup) {
  if (!setup.enabled) return nullptr;
  std::unique_ptr<ChunkTier> tier;
  if (!setup.servers.empty()) {
    ASSIGN_OR_RETURN(auto servers, ParseServerList(setup.servers));
    if (setup.min_call_deadline_ms <= 0) return absl::InvalidArgumentError("--cache-min-deadline-ms must be positive");
    if (setup.lookup_lease_ms < 0 || setup.lookup_lease_ms > 600000) {
      return absl::InvalidArgumentError("--cache-lookup-lease-ms must be within [0, 600000]");
    }
    for (const std::string& server : servers) {
      if (absl::Status s = CheckClientSecurity(server, setup.security); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("--cache-", s.message()));
      }
    }
    const std::chrono::milliseconds floor(setup.min_call_deadline_ms);
    ASSIGN_OR_RETURN(tier, RemoteChunkTier::Create(RemoteTierOptions{
                               .servers = servers,
                               .holder = setup.holder,
                               .security = setup.security,
                               .initial_call_deadline = 5 * floor,
                               .min_call_deadline = floor,
                               .transport = setup.transport,
                               .shm_pinner = ShmPinner(),
                               .gpu_device = setup.gpu_device,
                               .lookup_lease_hold = std::chrono::milliseconds(setup.lookup_lease_ms)}));
  } else {
    cache::TieredStoreOptions store;
    store.host_capacity_bytes = setup.host_bytes;
    store.disk_capacity_bytes = setup.disk_bytes;
    store.data_dir = setup.dir.empty() ? DefaultCacheDir() : setup.dir;
    auto embedded = EmbeddedChunkTier::Open(store);
    if (!embedded.ok()) {
      return absl::Status(embedded.status().code(),
                          absl::StrFormat("embedded cache tier: %s (--cache-dir, --cache-servers, or --no-cache-tier)",
                                          std::string(embedded.status().message())));
    }
    tier = *std::move(embedded);
  }
  spdlog::info("{}", tier->Describe());
  return std::shared_ptr<ChunkTier>(std::move(tier));
}

namespace {

// The pool's block count from its byte budget.
absl::StatusOr<int> PoolBlocks(const ModelSetupOptions& options, uint64_t block_bytes) {
  if (options.block_size <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat("--block-size %d must be positive", options.block_size));
  }
  const uint64_t num_blocks = options.kv_pool_bytes / block_bytes;
  if (num_blocks < 2 || num_blocks > (1u << 30)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--kv-pool of %d bytes gives %d blocks of %d bytes; need at least 2", options.kv_pool_bytes,
                        num_blocks, block_bytes));
  }
  return static_cast<int>(num_blocks);
}

absl::StatusOr<bool> UseCuda(Device device) {
#ifdef LAZYKV_WITH_CUDA
  if (device == Device::kAuto) return CudaDeviceAvailable();
  return device == Device::kCuda;
#else
  if (device == Device::kCuda) return absl::FailedPreconditionError("this build has no CUDA backend (--device cpu)");
  return false;
#endif
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> SetUpBackend(const ModelSetupOptions& options) {
  ASSIGN_OR_RETURN([[maybe_unused]] const bool cuda, UseCuda(options.device));  // unused without CUDA
#ifdef LAZYKV_WITH_CUDA
  if (cuda) {
    const CudaBackendOptions cuda_options{
        .precision = options.dtype == ModelDtype::kFp32 ? CudaPrecision::kFp32 : CudaPrecision::kBf16,
        .shared_decode = options.shared_decode};
    if (options.model.starts_with("synthetic:")) {
      // Drawn on the GPU: no host copy of (say) Llama-3-8B's weights.
      ASSIGN_OR_RETURN(const SyntheticSpec spec, ParseSyntheticSpec(options.model));
      ASSIGN_OR_RETURN(const int blocks, PoolBlocks(options, CudaKvBytesPerBlock(spec.config, options.block_size,
                                                                                 cuda_options.precision)));
      return CreateSyntheticCudaBackend(spec.config, spec.seed, options.block_size, blocks, cuda_options);
    }
    ASSIGN_OR_RETURN(ModelWeights weights, LoadModel(options.model));
    ASSIGN_OR_RETURN(const int blocks, PoolBlocks(options, CudaKvBytesPerBlock(weights.config, options.block_size,
                                                                               cuda_options.precision)));
    return CreateCudaBackend(weights, options.block_size, blocks, cuda_options);
  }
#endif
  ASSIGN_OR_RETURN(ModelWeights weights, LoadModel(options.model));
  ASSIGN_OR_RETURN(const int blocks, PoolBlocks(options, CpuKvBytesPerBlock(weights.config, options.block_size)));
  const CpuBackendOptions cpu_options{.numerics = options.dtype == ModelDtype::kBf16 ? CpuNumerics::kBf16LikeCuda
                                                                                     : CpuNumerics::kFp32};
  return CreateCpuBackend(std::move(weights), options.block_size, blocks, cpu_options);
}

absl::StatusOr<LoadedEngine> SetUpEngine(const ModelSetupOptions& options) {
  ASSIGN_OR_RETURN(const bool on_gpu, UseCuda(options.device));
  ASSIGN_OR_RETURN(auto backend, SetUpBackend(options));
  const ModelConfig config = backend->config();
  ASSIGN_OR_RETURN(auto tokenizer, ChooseTokenizer(options, config.vocab_size));
  if (tokenizer->vocab_size() > config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrFormat("tokenizer has %d tokens but model %s has a vocabulary of %d",
                                                      tokenizer->vocab_size(), options.model, config.vocab_size));
  }
  const int num_blocks = backend->num_blocks();
  const std::string kv_dtype = backend->kv_dtype();
  EngineOptions engine_options = options.engine;
  if (engine_options.tier == nullptr) {
    CacheTierSetup tier_setup = options.cache_tier;
    // Device-to-device fetches from a same-host GPU tier leave the payload on the GPU, where
    // a signed fleet's MAC cannot be checked: then chunks come through host memory.
    if (on_gpu && engine_options.pipeline.mac == nullptr && tier_setup.gpu_device < 0) tier_setup.gpu_device = 0;
    ASSIGN_OR_RETURN(engine_options.tier, SetUpCacheTier(tier_setup));
  }
  ASSIGN_OR_RETURN(auto engine, Engine::Create(std::move(backend), std::move(engine_options)));
  spdlog::info("model {}: dim {}, {} layers, {} heads ({} kv), vocab {}; KV pool {} blocks of {} tokens ({})",
               config.name, config.dim, config.n_layers, config.n_heads, config.n_kv_heads, config.vocab_size,
               num_blocks, options.block_size, kv_dtype);
  return LoadedEngine{std::move(engine), std::move(tokenizer), on_gpu};
}

}  // namespace lazykv
