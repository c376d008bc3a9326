#include "worker/backend/cuda_backend.h"

#include "kernels/cuda/materialize.h"
#include "kernels/cuda/rope_style.h"
#include "spdlog/spdlog.h"
#include "worker/backend/cuda_backend_internal.h"
#include "worker/backend/cuda_copy_pieces.h"

namespace lazykv {
namespace cuda_backend {

uint64_t KvBytesPerBlock(const ModelConfig& config, int block_size, cuda::Element element) {
  return 2ull * config.n_layers * block_size * config.kv_dim() * cuda::ElementBytes(element);
}

CudaBackend::~CudaBackend() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  for (void* p : {static_cast<void*>(k_pool_), static_cast<void*>(v_pool_), static_cast<void*>(inv_freq_)}) {
    if (p != nullptr) cudaFree(p);
  }
  gemm_.reset();
  if (residual_fork_ != nullptr) cudaEventDestroy(residual_fork_);
  if (residual_join_ != nullptr) cudaEventDestroy(residual_join_);
  if (residual_stream_ != nullptr) cudaStreamDestroy(residual_stream_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status CudaBackend::Init(cuda::GemmOptions gemm_options) {
  RETURN_IF_ERROR(Cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream"));
  RETURN_IF_ERROR(Cuda(cudaStreamCreateWithFlags(&residual_stream_, cudaStreamNonBlocking), "residual stream"));
  RETURN_IF_ERROR(Cuda(cudaEventCreateWithFlags(&residual_fork_, cudaEventDisableTiming), "fork event"));
  RETURN_IF_ERROR(Cuda(cudaEventCreateWithFlags(&residual_join_, cudaEventDisableTiming), "join event"));
  RETURN_IF_ERROR(Cuda(cudaGetDevice(&device_), "device"));
  streams_ = std::make_shared<StreamPool>(device_);
  // Transfer staging comes from the stream-ordered allocator; by default it hands freed
  // memory back to the driver at every synchronize, so each 64 MiB chunk would map fresh
  // pages. Keep up to the staging budget pooled.
  cudaMemPool_t mem_pool = nullptr;
  RETURN_IF_ERROR(Cuda(cudaDeviceGetDefaultMemPool(&mem_pool, device_), "memory pool"));
  uint64_t keep = budget_->limit();
  RETURN_IF_ERROR(Cuda(cudaMemPoolSetAttribute(mem_pool, cudaMemPoolAttrReleaseThreshold, &keep), "memory pool"));
  ASSIGN_OR_RETURN(gemm_, cuda::Gemm::Create(stream_, gemm_options));
  const size_t pool_bytes = LayerPoolBytes() * c_.n_layers;
  RETURN_IF_ERROR(Cuda(cudaMalloc(&k_pool_, pool_bytes), "KV pool (K)"));
  RETURN_IF_ERROR(Cuda(cudaMalloc(&v_pool_, pool_bytes), "KV pool (V)"));
  const std::vector<double> inv = RopeInverseFrequencies(c_.rope, c_.head_dim);
  RETURN_IF_ERROR(Cuda(cudaMalloc(&inv_freq_, inv.size() * sizeof(double)), "RoPE table"));
  RETURN_IF_ERROR(
      Cuda(cudaMemcpy(inv_freq_, inv.data(), inv.size() * sizeof(double), cudaMemcpyHostToDevice), "RoPE table"));
  spdlog::info("CUDA backend: {:.2f} GiB of {} weights, KV pool {:.2f} GiB ({} blocks of {} tokens)",
               w_->bytes() / 1073741824.0, cuda::ElementName(element_), 2.0 * pool_bytes / 1073741824.0, num_blocks_,
               block_size_);
  return absl::OkStatus();
}

uint64_t CudaBackend::kv_bytes_per_block() const { return KvBytesPerBlock(c_, block_size_, element_); }

cuda::PagedKv CudaBackend::LayerKv(int layer) const {
  cuda::PagedKv kv;
  kv.k_pool = KPool(layer);
  kv.v_pool = VPool(layer);
  kv.element = element_;
  kv.inv_freq = inv_freq_;
  kv.n_kv_heads = c_.n_kv_heads;
  kv.head_dim = c_.head_dim;
  kv.block_size = block_size_;
  kv.pool_slots = static_cast<long long>(num_blocks_) * block_size_;
  kv.rope_style = cuda::KernelRopeStyle(c_.rope.style);
  return kv;
}

absl::Status CudaBackend::CopyBlocksRotated(std::span<const BlockCopy> copies) {
  RETURN_IF_ERROR(ValidateBlockCopies(copies, block_size_, num_blocks_));
  if (copies.empty()) return absl::OkStatus();
  // Five lists of n: sources, destinations, token counts, deltas, first slots. They go up from pageable
  // memory, read during the call: nothing on the host is reused under an upload in flight,
  // so the copy needs no synchronize (the forward pass that follows on stream_ sees it in order).
  const size_t n = copies.size();
  std::vector<int32_t> lists(5 * n);
  for (size_t i = 0; i < n; ++i) {
    lists[i] = copies[i].src_block;
    lists[n + i] = copies[i].dst_block;
    lists[2 * n + i] = copies[i].num_tokens;
    lists[3 * n + i] = copies[i].delta;
    lists[4 * n + i] = copies[i].first_slot;
  }
  RETURN_IF_ERROR(meta_.Reserve(lists.size() * sizeof(int32_t)));  // grows it (synchronizing) only when too small
  RETURN_IF_ERROR(UploadDuringCall(meta_.as<int32_t>(0), lists.data(), lists.size() * sizeof(int32_t), stream_));
  cuda::MaterializeParams m;
  m.kv = LayerKv(0);
  m.src_blocks = meta_.as<int32_t>(0);
  m.dst_blocks = m.src_blocks + n;
  m.num_tokens = m.src_blocks + 2 * n;
  m.deltas = m.src_blocks + 3 * n;
  m.first_slots = m.src_blocks + 4 * n;
  m.num_copies = static_cast<int>(n);
  m.num_layers = c_.n_layers;
  m.pool_blocks = num_blocks_;
  return Cuda(cuda::LaunchMaterialize(m, stream_), "materialize");
}

}  // namespace cuda_backend

namespace {

using cuda_backend::CudaBackend;

absl::StatusOr<std::unique_ptr<Backend>> Finish(std::unique_ptr<DeviceWeights> weights, int block_size, int num_blocks,
                                                const CudaBackendOptions& options) {
  auto backend = std::make_unique<CudaBackend>(std::move(weights), block_size, num_blocks, options);
  RETURN_IF_ERROR(backend->Init(cuda::GemmOptions{.skinny_kernel = options.skinny_gemm}));
  return std::unique_ptr<Backend>(std::move(backend));
}

cuda::Element ElementOf(CudaPrecision precision) {
  return precision == CudaPrecision::kFp32 ? cuda::Element::kFp32 : cuda::Element::kBf16;
}

absl::Status CheckPoolShape(int block_size, int num_blocks) {
  RETURN_IF_ERROR(ValidatePoolShape(block_size, num_blocks));
  if (!CudaDeviceAvailable()) return absl::FailedPreconditionError("the CUDA backend needs a GPU; none was found");
  return absl::OkStatus();
}

}  // namespace

SharedDecodeStats CudaSharedDecodeStats(const Backend& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  return cuda != nullptr ? cuda->shared_decode_stats() : SharedDecodeStats{};
}

PrefillLaunchStats CudaPrefillLaunchStats(const Backend& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  return cuda != nullptr ? cuda->prefill_launch_stats() : PrefillLaunchStats{};
}

GemmPlanStats CudaGemmPlanStats(const Backend& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  return cuda != nullptr ? cuda->gemm_plan_stats() : GemmPlanStats{};
}

bool CudaDeviceAvailable() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

uint64_t CudaKvBytesPerBlock(const ModelConfig& config, int block_size, CudaPrecision precision) {
  return cuda_backend::KvBytesPerBlock(config, block_size, ElementOf(precision));
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const ModelWeights& weights, int block_size, int num_blocks,
                                                           CudaBackendOptions options) {
  RETURN_IF_ERROR(CheckPoolShape(block_size, num_blocks));
  RETURN_IF_ERROR(weights.config.Validate());
  ASSIGN_OR_RETURN(auto device_weights, DeviceWeights::Upload(weights, ElementOf(options.precision)));
  return Finish(std::move(device_weights), block_size, num_blocks, options);
}

absl::StatusOr<std::unique_ptr<Backend>> CreateSyntheticCudaBackend(const ModelConfig& config, uint64_t seed,
                                                                    int block_size, int num_blocks,
                                                                    CudaBackendOptions options) {
  RETURN_IF_ERROR(CheckPoolShape(block_size, num_blocks));
  ASSIGN_OR_RETURN(auto device_weights, DeviceWeights::Synthetic(config, seed, ElementOf(options.precision)));
  return Finish(std::move(device_weights), block_size, num_blocks, options);
}

}  // namespace lazykv
