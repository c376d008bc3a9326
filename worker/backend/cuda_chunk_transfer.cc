// The CUDA backend's chunk transfer (backend.h, DESIGN.md section 5): captures and
// imports that the scheduling thread only enqueues, and copies between host and device
// that run on the chunk pipeline's threads, each on a stream of its own.
//
// Device staging comes from the stream-ordered allocator (cudaMallocAsync) under one byte
// budget (TransferBudget). Block metadata goes up from pageable vectors, which
// cudaMemcpyAsync has copied out by the time it returns, so nothing the scheduling
// thread reuses (the pinned meta buffer of the forward pass) is read later by a transfer.
#include "worker/backend/cuda_backend_internal.h"
#include "worker/backend/cuda_copy_pieces.h"

namespace lazykv::cuda_backend {
namespace {

// A pooled stream for the calling thread (a pipeline or publisher thread), given back on
// destruction.
class ThreadStream {
 public:
  static absl::StatusOr<ThreadStream> Create(std::shared_ptr<StreamPool> pool) {
    ASSIGN_OR_RETURN(cudaStream_t stream, pool->Acquire());
    return ThreadStream(std::move(pool), stream);
  }
  ThreadStream(ThreadStream&& other) noexcept
      : pool_(std::move(other.pool_)), stream_(std::exchange(other.stream_, nullptr)) {}
  ~ThreadStream() {
    if (stream_ != nullptr) pool_->Release(stream_);
  }
  cudaStream_t get() const { return stream_; }

 private:
  ThreadStream(std::shared_ptr<StreamPool> pool, cudaStream_t stream) : pool_(std::move(pool)), stream_(stream) {}
  std::shared_ptr<StreamPool> pool_;
  cudaStream_t stream_ = nullptr;
};

uint64_t PiecesBytes(const MutablePieces& pieces) {
  uint64_t total = 0;
  for (std::span<char> piece : pieces) total += piece.size();
  return total;
}

// A chunk gathered into device staging on the compute stream; copied out later.
class CudaExportedChunk final : public ExportedChunk {
 public:
  // Owns `budget_bytes` of the budget (the payload and its metadata) until the staging is freed.
  CudaExportedChunk(std::shared_ptr<TransferBudget> budget, std::shared_ptr<StreamPool> streams, void* staging,
                    uint64_t bytes, uint64_t budget_bytes, cudaEvent_t gathered)
      : budget_(std::move(budget)),
        streams_(std::move(streams)),
        staging_(staging),
        bytes_(bytes),
        budget_bytes_(budget_bytes),
        gathered_(gathered) {}
  ~CudaExportedChunk() override {
    if (staging_ != nullptr) {
      // Freed after the gather, wherever this runs.
      if (auto stream = ThreadStream::Create(streams_); stream.ok()) {
        cudaStreamWaitEvent(stream->get(), gathered_, 0);
        cudaFreeAsync(staging_, stream->get());
      }
      budget_->Release(budget_bytes_);
    }
    cudaEventDestroy(gathered_);
  }
  uint64_t payload_bytes() const override { return bytes_; }

  absl::Status CopyTo(const MutablePieces& out) override {
    if (staging_ == nullptr) return absl::FailedPreconditionError("CopyTo: the chunk was copied out already");
    if (PiecesBytes(out) != bytes_) {
      return absl::InvalidArgumentError(
          absl::StrFormat("CopyTo: %d bytes of room for a %d-byte payload", PiecesBytes(out), bytes_));
    }
    ASSIGN_OR_RETURN(ThreadStream stream, ThreadStream::Create(streams_));
    RETURN_IF_ERROR(Cuda(cudaStreamWaitEvent(stream.get(), gathered_, 0), "wait for the gather"));
    RETURN_IF_ERROR(EnqueueCopyOut(out, stream.get()));
    const absl::Status copied = Cuda(cudaStreamSynchronize(stream.get()), "chunk export copy");
    cudaFreeAsync(staging_, stream.get());
    staging_ = nullptr;
    budget_->Release(budget_bytes_);
    return copied;
  }

 private:
  // The staging's bytes into `out` on `stream`: by the piece copy kernel into scattered
  // pinned pages (its segment table in stream-ordered memory freed after it), else by the
  // copy engines.
  absl::Status EnqueueCopyOut(const MutablePieces& out, cudaStream_t stream) {
    std::vector<std::string_view> pieces;
    pieces.reserve(out.size());
    for (std::span<char> piece : out) pieces.emplace_back(piece.data(), piece.size());
    if (std::optional<KernelCopyPlan> plan = PlanKernelCopy(pieces, staging_, /*to_contiguous=*/false)) {
      void* table = nullptr;
      RETURN_IF_ERROR(
          Cuda(cudaMallocAsync(&table, plan->segments.size() * sizeof(cuda::CopySegment), stream), "export plan"));
      const absl::Status copied = EnqueueKernelCopy(*plan, static_cast<cuda::CopySegment*>(table), cuda::Element::kBf16,
                                                    /*first_bad=*/nullptr, stream);
      cudaFreeAsync(table, stream);
      return copied;
    }
    return CopyPiecesContiguous(pieces, staging_, /*to_contiguous=*/false, stream, "chunk export copy");
  }

  std::shared_ptr<TransferBudget> budget_;
  std::shared_ptr<StreamPool> streams_;
  void* staging_;
  uint64_t bytes_;
  uint64_t budget_bytes_;
  cudaEvent_t gathered_;
};

// A payload in device memory, waiting for ImportStaged.
class CudaStagedChunk final : public StagedChunk {
 public:
  CudaStagedChunk(std::shared_ptr<TransferBudget> budget, cudaStream_t free_on, void* device_bytes, uint64_t bytes,
                  uint64_t meta_offset, uint64_t meta_bytes)
      : budget_(std::move(budget)),
        free_on_(free_on),
        device_bytes_(device_bytes),
        bytes_(bytes),
        meta_offset_(meta_offset),
        meta_bytes_(meta_bytes) {}
  ~CudaStagedChunk() override {
    if (device_bytes_ != nullptr) cudaFreeAsync(device_bytes_, free_on_);
    budget_->Release(bytes_);
  }
  uint64_t payload_bytes() const override { return bytes_; }
  void* bytes() const { return device_bytes_; }
  // Room for `n` ints of import metadata after the payload (null when too small).
  int32_t* meta(size_t n) const {
    return n * sizeof(int32_t) <= meta_bytes_
               ? reinterpret_cast<int32_t*>(static_cast<char*>(device_bytes_) + meta_offset_)
               : nullptr;
  }
  // ImportStaged freed the bytes, ordered after its scatter.
  void Consumed() { device_bytes_ = nullptr; }

 private:
  std::shared_ptr<TransferBudget> budget_;
  cudaStream_t free_on_;  // the backend's compute stream (the staged bytes are complete)
  void* device_bytes_;
  uint64_t bytes_;
  uint64_t meta_offset_, meta_bytes_;
};

// Metadata for one transfer: block ids, token counts and payload offsets.
std::vector<int32_t> TransferMeta(std::span<const KvBlockRef> blocks) {
  std::vector<int32_t> meta;
  int32_t offset = 0;
  for (const KvBlockRef& ref : blocks) meta.push_back(ref.block);
  for (const KvBlockRef& ref : blocks) meta.push_back(ref.num_tokens);
  for (const KvBlockRef& ref : blocks) {
    meta.push_back(offset);
    offset += ref.num_tokens;
  }
  return meta;
}

}  // namespace

StreamPool::~StreamPool() {
  MutexLock lock(&mu_);
  for (cudaStream_t stream : free_) cudaStreamDestroy(stream);
}

absl::StatusOr<cudaStream_t> StreamPool::Acquire() {
  RETURN_IF_ERROR(Cuda(cudaSetDevice(device_), "set device"));
  {
    MutexLock lock(&mu_);
    if (!free_.empty()) {
      cudaStream_t stream = free_.back();
      free_.pop_back();
      return stream;
    }
  }
  cudaStream_t stream = nullptr;
  RETURN_IF_ERROR(Cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "transfer stream"));
  return stream;
}

void StreamPool::Release(cudaStream_t stream) {
  MutexLock lock(&mu_);
  free_.push_back(stream);
}

bool TransferBudget::TryTake(uint64_t bytes) {
  MutexLock lock(&mu_);
  if (used_ + bytes > limit_) return false;
  used_ += bytes;
  return true;
}

bool TransferBudget::TakeBy(uint64_t bytes, std::chrono::steady_clock::time_point deadline) {
  MutexLock lock(&mu_);
  while (used_ + bytes > limit_) {
    if (bytes > limit_ || std::chrono::steady_clock::now() >= deadline) return false;
    released_.WaitUntil(&mu_, deadline);
  }
  used_ += bytes;
  return true;
}

void TransferBudget::Release(uint64_t bytes) {
  MutexLock lock(&mu_);
  used_ -= std::min(used_, bytes);
  released_.SignalAll();
}

uint64_t TransferBudget::used() const {
  MutexLock lock(&mu_);
  return used_;
}

// Enqueues the transfer kernel between `payload` (device) and `blocks` on stream_, with
// its metadata in `meta` (device, 3 * blocks.size() ints).
absl::Status CudaBackend::EnqueueTransfer(const ChunkLayout& layout, std::span<const KvBlockRef> blocks, void* payload,
                                          int32_t* meta, bool to_pool) {
  const std::vector<int32_t> host_meta = TransferMeta(blocks);
  RETURN_IF_ERROR(UploadDuringCall(meta, host_meta.data(), host_meta.size() * sizeof(int32_t), stream_));
  cuda::KvTransferParams p;
  p.payload = payload;
  p.kv = LayerKv(0);  // all layers, from layer 0 on
  p.kv.block_ids = meta;
  p.kv.block_tokens = meta + blocks.size();
  p.token_offsets = meta + 2 * blocks.size();
  p.num_blocks_in_chunk = static_cast<int>(blocks.size());
  p.chunk_tokens = static_cast<int>(layout.num_tokens);
  p.pool_blocks = num_blocks_;
  p.first_layer = 0;
  p.num_layers = c_.n_layers;
  p.to_pool = to_pool;
  return Cuda(cuda::LaunchKvTransfer(p, stream_), to_pool ? "chunk scatter" : "chunk gather");
}

absl::StatusOr<std::unique_ptr<ExportedChunk>> CudaBackend::CaptureChunk(std::span<const KvBlockRef> blocks) {
  int tokens = 0;
  for (const KvBlockRef& ref : blocks) tokens += ref.num_tokens;
  const ChunkLayout layout = MakeChunkLayout(c_, ChunkDtype(), tokens, 0);
  const uint64_t bytes = layout.payload_bytes();
  RETURN_IF_ERROR(ValidateChunkBlocks(layout, bytes, blocks, block_size_, num_blocks_));
  const uint64_t meta_bytes = 3 * blocks.size() * sizeof(int32_t);
  const uint64_t staged = (bytes + 255) / 256 * 256 + meta_bytes;
  if (!budget_->TryTake(staged)) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("chunk capture: %d bytes of transfer staging in use of %d", budget_->used(), budget_->limit()));
  }
  void* staging = nullptr;
  if (absl::Status s = Cuda(cudaMallocAsync(&staging, staged, stream_), "capture staging"); !s.ok()) {
    budget_->Release(staged);
    return s;
  }
  cudaEvent_t gathered = nullptr;
  absl::Status status = Cuda(cudaEventCreateWithFlags(&gathered, cudaEventDisableTiming), "capture event");
  if (status.ok()) {
    int32_t* meta = reinterpret_cast<int32_t*>(static_cast<char*>(staging) + (bytes + 255) / 256 * 256);
    status = EnqueueTransfer(layout, blocks, staging, meta, /*to_pool=*/false);
  }
  if (status.ok()) status = Cuda(cudaEventRecord(gathered, stream_), "capture event");
  if (!status.ok()) {
    cudaFreeAsync(staging, stream_);
    if (gathered != nullptr) cudaEventDestroy(gathered);
    budget_->Release(staged);
    return status;
  }
  return std::unique_ptr<ExportedChunk>(
      std::make_unique<CudaExportedChunk>(budget_, streams_, staging, bytes, staged, gathered));
}

absl::StatusOr<std::unique_ptr<StagedChunk>> CudaBackend::StageChunk(const ChunkBytes& payload,
                                                                     const StageOptions& options) {
  const uint64_t bytes = payload.size();
  const bool check_finite = options.check_finite;
  if (!(options.wait_for_room_until ? budget_->TakeBy(bytes, *options.wait_for_room_until) : budget_->TryTake(bytes))) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("chunk staging: %d bytes of transfer staging in use of %d", budget_->used(), budget_->limit()));
  }
  auto stream = ThreadStream::Create(streams_);
  void* device_bytes = nullptr;
  absl::Status allocated = stream.status();
  // Room after the payload for ImportStaged's block metadata (at most one block per token),
  // so the import allocates nothing.
  const uint64_t token_bytes = 2ull * c_.n_layers * c_.kv_dim() * cuda::ElementBytes(element_);
  const uint64_t meta_offset = (bytes + 255) / 256 * 256;
  const uint64_t meta_bytes = 3 * sizeof(int32_t) * (bytes / token_bytes + 1);
  // And after that, the value check's answer, then the piece copy's segment table.
  const uint64_t check_offset = (meta_offset + meta_bytes + 7) / 8 * 8;
  const uint64_t table_offset = (check_offset + sizeof(unsigned long long) + 31) / 32 * 32;
  const size_t table_room = KernelCopySegmentsBound(payload.pieces());
  if (allocated.ok()) {
    allocated =
        Cuda(cudaMallocAsync(&device_bytes, table_offset + table_room * sizeof(cuda::CopySegment), stream->get()),
             "staging");
  }
  if (!allocated.ok()) {
    budget_->Release(bytes);
    return allocated;
  }
  // From here the chunk owns the bytes and the budget (its destructor gives both back).
  auto chunk = std::make_unique<CudaStagedChunk>(budget_, stream_, device_bytes, bytes, meta_offset, meta_bytes);
  auto staged = [&]() -> absl::StatusOr<std::unique_ptr<StagedChunk>> {
    auto* answer = reinterpret_cast<unsigned long long*>(static_cast<char*>(device_bytes) + check_offset);
    // Scattered pinned pieces (the cache tier's host pages) are read in place by the piece
    // copy kernel, which checks the values on the way; others (pageable, a few long runs,
    // device memory of a CUDA IPC mapping) go by the copy engines and are checked after.
    auto* table = reinterpret_cast<cuda::CopySegment*>(static_cast<char*>(device_bytes) + table_offset);
    // The chunk's bytes must be complete before the compute stream may free or read them:
    // each path waits for the stream.
    unsigned long long first_bad = ~0ull;
    if (check_finite) {
      ASSIGN_OR_RETURN(first_bad, GatherCheckedAndWait(payload.pieces(), device_bytes, bytes, element_, answer, table,
                                                       table_room, stream->get(), "chunk import copy"));
    } else {
      RETURN_IF_ERROR(EnqueueGather(payload.pieces(), device_bytes, bytes, element_, nullptr, table, table_room,
                                    stream->get(), "chunk import copy"));
      RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream->get()), "chunk import copy"));
    }
    if (first_bad != ~0ull) {
      return absl::PermissionDeniedError(
          absl::StrFormat("chunk refused: chunk payload holds a non-finite value at byte %d", first_bad));
    }
    return std::unique_ptr<StagedChunk>(std::move(chunk));
  }();
  if (!staged.ok()) cudaStreamSynchronize(stream->get());  // before the chunk's destructor frees the bytes
  return staged;
}

absl::Status CudaBackend::ImportStaged(std::unique_ptr<StagedChunk> staged, std::span<const KvBlockRef> blocks) {
  auto* chunk = dynamic_cast<CudaStagedChunk*>(staged.get());
  if (chunk == nullptr) return absl::InvalidArgumentError("ImportStaged: a payload staged by another backend");
  int tokens = 0;
  for (const KvBlockRef& ref : blocks) tokens += ref.num_tokens;
  const ChunkLayout layout = MakeChunkLayout(c_, ChunkDtype(), tokens, 0);
  RETURN_IF_ERROR(ValidateChunkBlocks(layout, chunk->payload_bytes(), blocks, block_size_, num_blocks_));
  int32_t* meta = chunk->meta(3 * blocks.size());
  if (meta == nullptr) return absl::InvalidArgumentError("ImportStaged: more blocks than the chunk has tokens");
  const absl::Status status = EnqueueTransfer(layout, blocks, chunk->bytes(), meta, /*to_pool=*/true);
  cudaFreeAsync(chunk->bytes(), stream_);  // after the scatter, in stream order
  chunk->Consumed();
  return status;
}

}  // namespace lazykv::cuda_backend
