#include "worker/backend/cuda_backend.h"

#include "kernels/cuda/materialize.h"
#include "kernels/cuda/rope_style.h"
#include "spdlog/spdlog.h"
#include "worker/backend/cuda_backend_internal.h"

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
  if (event_ != nullptr) cudaEventDestroy(event_);
  if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status CudaBackend::Init() {
  RETURN_IF_ERROR(Cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream"));
  RETURN_IF_ERROR(Cuda(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking), "copy stream"));
  RETURN_IF_ERROR(Cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "event"));
  ASSIGN_OR_RETURN(gemm_, cuda::Gemm::Create(stream_));
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
  kv.rope_style = cuda::KernelRopeStyle(c_.rope.style);
  return kv;
}

absl::Status CudaBackend::CopyBlocksRotated(std::span<const BlockCopy> copies) {
  RETURN_IF_ERROR(ValidateBlockCopies(copies, block_size_, num_blocks_));
  std::vector<int32_t> src, dst, counts, deltas;
  for (const BlockCopy& copy : copies) {
    src.push_back(copy.src_block);
    dst.push_back(copy.dst_block);
    counts.push_back(copy.num_tokens);
    deltas.push_back(copy.delta);
  }
  if (copies.empty()) return absl::OkStatus();
  MetaPack pack;
  const size_t o_src = pack.Add(src), o_dst = pack.Add(dst), o_counts = pack.Add(counts), o_deltas = pack.Add(deltas);
  RETURN_IF_ERROR(pack.Upload(meta_host_, meta_, stream_));
  auto meta = [&](size_t offset) { return meta_.as<int32_t>(offset * sizeof(int32_t)); };
  cuda::MaterializeParams m;
  m.src_blocks = meta(o_src);
  m.dst_blocks = meta(o_dst);
  m.num_tokens = meta(o_counts);
  m.deltas = meta(o_deltas);
  m.num_copies = static_cast<int>(copies.size());
  for (int l = 0; l < c_.n_layers; ++l) {
    m.kv = LayerKv(l);
    RETURN_IF_ERROR(Cuda(cuda::LaunchMaterialize(m, stream_), "materialize"));
  }
  return Cuda(cudaStreamSynchronize(stream_), "materialize");
}

absl::StatusOr<cuda::KvTransferParams> CudaBackend::TransferParams(const ChunkLayout& layout,
                                                                   std::span<const KvBlockRef> blocks) {
  std::vector<int32_t> ids, counts, offsets;
  int32_t offset = 0;
  for (const KvBlockRef& ref : blocks) {
    ids.push_back(ref.block);
    counts.push_back(ref.num_tokens);
    offsets.push_back(offset);
    offset += ref.num_tokens;
  }
  MetaPack pack;
  const size_t o_ids = pack.Add(ids), o_counts = pack.Add(counts), o_offsets = pack.Add(offsets);
  RETURN_IF_ERROR(pack.Upload(meta_host_, meta_, stream_));
  RETURN_IF_ERROR(staging_.Reserve(std::max<size_t>(16, layout.payload_bytes())));
  cuda::KvTransferParams p;
  p.payload = staging_.as<char>();
  p.kv = LayerKv(0);  // all layers, from layer 0 on
  p.kv.block_ids = meta_.as<int32_t>(o_ids * sizeof(int32_t));
  p.kv.block_tokens = meta_.as<int32_t>(o_counts * sizeof(int32_t));
  p.token_offsets = meta_.as<int32_t>(o_offsets * sizeof(int32_t));
  p.num_blocks_in_chunk = static_cast<int>(blocks.size());
  p.chunk_tokens = static_cast<int>(layout.num_tokens);
  p.pool_blocks = num_blocks_;
  return p;
}

// Device -> host: one gather of every layer into the staging payload, one copy back.
absl::Status CudaBackend::ExportChunk(std::span<const KvBlockRef> blocks, std::string* payload) {
  int tokens = 0;
  for (const KvBlockRef& ref : blocks) tokens += ref.num_tokens;
  const ChunkLayout layout = MakeChunkLayout(c_, ChunkDtype(), tokens, 0);
  payload->resize(layout.payload_bytes());
  RETURN_IF_ERROR(ValidateChunkBlocks(layout, payload->size(), blocks, block_size_, num_blocks_));
  ASSIGN_OR_RETURN(cuda::KvTransferParams p, TransferParams(layout, blocks));
  p.first_layer = 0;
  p.num_layers = c_.n_layers;
  p.to_pool = false;
  RETURN_IF_ERROR(Cuda(cuda::LaunchKvTransfer(p, stream_), "chunk gather"));
  RETURN_IF_ERROR(payload_host_.Reserve(std::max<size_t>(16, payload->size())));
  RETURN_IF_ERROR(
      Cuda(cudaMemcpyAsync(payload_host_.as<char>(), p.payload, payload->size(), cudaMemcpyDeviceToHost, stream_),
           "chunk export copy"));
  RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream_), "chunk export"));
  std::memcpy(payload->data(), payload_host_.as<char>(), payload->size());
  return absl::OkStatus();
}

// Host -> device, layer by layer: each layer's K and V planes (contiguous in the payload)
// go up on the copy stream while the previous layer is scattered into its blocks, so the
// scatter hides behind the copy. A payload in pageable memory is first staged in pinned
// memory (the driver would stage it anyway, at a lower rate).
absl::Status CudaBackend::ImportChunk(std::string_view payload, std::span<const KvBlockRef> blocks) {
  int tokens = 0;
  for (const KvBlockRef& ref : blocks) tokens += ref.num_tokens;
  const ChunkLayout layout = MakeChunkLayout(c_, ChunkDtype(), tokens, 0);
  RETURN_IF_ERROR(ValidateChunkBlocks(layout, payload.size(), blocks, block_size_, num_blocks_));
  ASSIGN_OR_RETURN(cuda::KvTransferParams p, TransferParams(layout, blocks));
  const char* source = payload.data();
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, source) != cudaSuccess || attributes.type != cudaMemoryTypeHost) {
    cudaGetLastError();  // clear a non-sticky error from the query
    RETURN_IF_ERROR(payload_host_.Reserve(std::max<size_t>(16, payload.size())));
    std::memcpy(payload_host_.as<char>(), payload.data(), payload.size());
    source = payload_host_.as<char>();
  }
  // The copy stream only reads `source` and writes the staging payload; each scatter on
  // stream_ waits for its layer's copy (one event, re-recorded: a wait takes the latest).
  const size_t layer_bytes = 2 * layout.plane_bytes();
  p.num_layers = 1;
  p.to_pool = true;
  for (int l = 0; l < c_.n_layers; ++l) {
    const size_t offset = layout.plane_offset(l, 0);
    RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(static_cast<char*>(p.payload) + offset, source + offset, layer_bytes,
                                         cudaMemcpyHostToDevice, copy_stream_),
                         "chunk import copy"));
    RETURN_IF_ERROR(Cuda(cudaEventRecord(event_, copy_stream_), "event"));
    RETURN_IF_ERROR(Cuda(cudaStreamWaitEvent(stream_, event_, 0), "event wait"));
    p.first_layer = l;
    RETURN_IF_ERROR(Cuda(cuda::LaunchKvTransfer(p, stream_), "chunk scatter"));
  }
  return Cuda(cudaStreamSynchronize(stream_), "chunk import");
}

}  // namespace cuda_backend

namespace {

using cuda_backend::CudaBackend;

absl::StatusOr<std::unique_ptr<Backend>> Finish(std::unique_ptr<DeviceWeights> weights, int block_size,
                                                int num_blocks) {
  auto backend = std::make_unique<CudaBackend>(std::move(weights), block_size, num_blocks);
  RETURN_IF_ERROR(backend->Init());
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
  return Finish(std::move(device_weights), block_size, num_blocks);
}

absl::StatusOr<std::unique_ptr<Backend>> CreateSyntheticCudaBackend(const ModelConfig& config, uint64_t seed,
                                                                    int block_size, int num_blocks,
                                                                    CudaBackendOptions options) {
  RETURN_IF_ERROR(CheckPoolShape(block_size, num_blocks));
  ASSIGN_OR_RETURN(auto device_weights, DeviceWeights::Synthetic(config, seed, ElementOf(options.precision)));
  return Finish(std::move(device_weights), block_size, num_blocks);
}

}  // namespace lazykv
