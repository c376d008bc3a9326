#include "worker/cuda_backend.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/generic_attention.h"
#include "kernels/cuda/lazy_decode_attention.h"
#include "kernels/cuda/lazy_prefill_attention.h"
#include "kernels/cuda/materialize.h"
#include "kernels/cuda/model_ops.h"
#include "spdlog/spdlog.h"
#include "worker/cuda_weights.h"

namespace lazykv {
namespace {

using bf16 = __nv_bfloat16;

absl::Status Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  const auto code = e == cudaErrorMemoryAllocation ? absl::StatusCode::kResourceExhausted : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrFormat("%s: %s", what, cudaGetErrorString(e)));
}

// A device (or pinned host) allocation that grows to the largest size asked of it.
template <bool kPinnedHost>
class Buffer {
 public:
  ~Buffer() { Free(); }
  absl::Status Reserve(size_t bytes) {
    if (bytes <= capacity_) return absl::OkStatus();
    Free();
    const size_t grown = std::max(bytes, capacity_ + capacity_ / 2);
    RETURN_IF_ERROR(Cuda(kPinnedHost ? cudaMallocHost(&ptr_, grown) : cudaMalloc(&ptr_, grown),
                         kPinnedHost ? "pinned staging" : "device buffer"));
    capacity_ = grown;
    return absl::OkStatus();
  }
  template <typename T>
  T* as(size_t byte_offset = 0) const {
    return reinterpret_cast<T*>(static_cast<char*>(ptr_) + byte_offset);
  }

 private:
  void Free() {
    if (ptr_ != nullptr) kPinnedHost ? cudaFreeHost(ptr_) : cudaFree(ptr_);
    ptr_ = nullptr;
    capacity_ = 0;
  }
  void* ptr_ = nullptr;
  size_t capacity_ = 0;
};
using DeviceBuffer = Buffer<false>;
using PinnedBuffer = Buffer<true>;

// Int32 arrays packed into one pinned buffer and uploaded with one copy.
class MetaPack {
 public:
  size_t Add(const std::vector<int32_t>& v) {
    const size_t at = data_.size();
    data_.insert(data_.end(), v.begin(), v.end());
    data_.resize((data_.size() + 3) / 4 * 4);  // 16-byte aligned arrays
    return at;
  }
  absl::Status Upload(PinnedBuffer& host, DeviceBuffer& device, cudaStream_t stream) {
    const size_t bytes = std::max<size_t>(1, data_.size()) * sizeof(int32_t);
    RETURN_IF_ERROR(host.Reserve(bytes));
    RETURN_IF_ERROR(device.Reserve(bytes));
    std::memcpy(host.as<int32_t>(), data_.data(), data_.size() * sizeof(int32_t));
    return Cuda(cudaMemcpyAsync(device.as<int32_t>(), host.as<int32_t>(), bytes, cudaMemcpyHostToDevice, stream),
                "metadata upload");
  }

 private:
  std::vector<int32_t> data_;
};

class CudaBackend : public Backend {
 public:
  CudaBackend(std::unique_ptr<DeviceWeights> weights, int block_size, int num_blocks)
      : w_(std::move(weights)), c_(w_->config()), block_size_(block_size), num_blocks_(num_blocks) {}

  ~CudaBackend() override {
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    for (void* p : {static_cast<void*>(k_pool_), static_cast<void*>(v_pool_), static_cast<void*>(inv_freq_)}) {
      if (p != nullptr) cudaFree(p);
    }
    gemm_.reset();
    if (event_ != nullptr) cudaEventDestroy(event_);
    if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status Init() {
    RETURN_IF_ERROR(Cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream"));
    RETURN_IF_ERROR(Cuda(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking), "copy stream"));
    RETURN_IF_ERROR(Cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "event"));
    ASSIGN_OR_RETURN(gemm_, cuda::Gemm::Create(stream_));
    const size_t pool_bytes = PoolElems() * c_.n_layers * sizeof(bf16);
    RETURN_IF_ERROR(Cuda(cudaMalloc(&k_pool_, pool_bytes), "KV pool (K)"));
    RETURN_IF_ERROR(Cuda(cudaMalloc(&v_pool_, pool_bytes), "KV pool (V)"));
    const std::vector<double> inv = RopeInverseFrequencies(c_.rope, c_.head_dim);
    RETURN_IF_ERROR(Cuda(cudaMalloc(&inv_freq_, inv.size() * sizeof(double)), "RoPE table"));
    RETURN_IF_ERROR(Cuda(cudaMemcpy(inv_freq_, inv.data(), inv.size() * sizeof(double), cudaMemcpyHostToDevice),
                         "RoPE table"));
    spdlog::info("CUDA backend: {:.2f} GiB of bf16 weights, KV pool {:.2f} GiB ({} blocks of {} tokens)",
                 w_->bytes() / 1073741824.0, 2.0 * pool_bytes / 1073741824.0, num_blocks_, block_size_);
    return absl::OkStatus();
  }

  const ModelConfig& config() const override { return c_; }
  std::string kv_dtype() const override { return "bf16"; }
  Hash128 model_fingerprint() const override { return MakeModelFingerprint(w_->content_hash(), kv_dtype()); }
  int block_size() const override { return block_size_; }
  int num_blocks() const override { return num_blocks_; }
  uint64_t kv_bytes_per_block() const override { return CudaKvBytesPerBlock(c_, block_size_); }

  absl::Status Forward(std::span<const SequenceStep> steps, std::vector<std::vector<float>>* logits) override;
  absl::Status CopyBlocksRotated(std::span<const BlockCopy> copies) override;
  absl::Status ExportChunk(std::span<const KvBlockRef> blocks, std::string* payload) override;
  absl::Status ImportChunk(std::string_view payload, std::span<const KvBlockRef> blocks) override;

 private:
  size_t PoolElems() const { return static_cast<size_t>(num_blocks_) * block_size_ * c_.kv_dim(); }
  bf16* KPool(int layer) const { return k_pool_ + layer * PoolElems(); }
  bf16* VPool(int layer) const { return v_pool_ + layer * PoolElems(); }
  int RopeStyleIndex() const { return c_.rope.style == RopeStyle::kInterleaved ? 0 : 1; }
  absl::Status ReserveActivations(int rows);
  absl::Status Attention(cuda::PrefillAttentionParams& p, int rows, bool all_single, const int32_t* positions,
                         int max_entries);
  // Chunk payload <-> blocks: the block ids, token counts and offsets on the device.
  absl::StatusOr<cuda::KvTransferParams> TransferParams(const ChunkLayout& layout, std::span<const KvBlockRef> blocks);

  std::unique_ptr<DeviceWeights> w_;
  const ModelConfig& c_;
  int block_size_;
  int num_blocks_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t copy_stream_ = nullptr;  // host -> device copies that overlap the scatter
  cudaEvent_t event_ = nullptr;
  std::unique_ptr<cuda::Gemm> gemm_;
  bf16* k_pool_ = nullptr;
  bf16* v_pool_ = nullptr;
  double* inv_freq_ = nullptr;
  int activation_rows_ = 0;
  DeviceBuffer x_, y_, xb_, qkv_, q_, attn_, attn_bf_, gu_, h_, logits_, attn_ws_, meta_, staging_;
  PinnedBuffer meta_host_, logits_host_, payload_host_;
};

absl::Status CudaBackend::ReserveActivations(int rows) {
  if (rows <= activation_rows_) return absl::OkStatus();
  const size_t r = rows, dim = c_.dim, q = c_.q_dim(), kv = c_.kv_dim(), hidden = c_.hidden_dim;
  RETURN_IF_ERROR(x_.Reserve(r * dim * sizeof(float)));
  RETURN_IF_ERROR(y_.Reserve(r * dim * sizeof(float)));
  RETURN_IF_ERROR(xb_.Reserve(r * dim * sizeof(bf16)));
  RETURN_IF_ERROR(qkv_.Reserve(r * (q + 2 * kv) * sizeof(float)));
  RETURN_IF_ERROR(q_.Reserve(r * q * sizeof(float)));
  RETURN_IF_ERROR(attn_.Reserve(r * q * sizeof(float)));
  RETURN_IF_ERROR(attn_bf_.Reserve(r * q * sizeof(bf16)));
  RETURN_IF_ERROR(gu_.Reserve(r * 2 * hidden * sizeof(float)));
  RETURN_IF_ERROR(h_.Reserve(r * hidden * sizeof(bf16)));
  activation_rows_ = rows;
  return absl::OkStatus();
}

// The tensor-core kernels where they apply (head dims 64 and 128; decode when every step
// has one token, prefill for power-of-two blocks of at least 16), the generic kernel else.
absl::Status CudaBackend::Attention(cuda::PrefillAttentionParams& p, int rows, bool all_single,
                                    const int32_t* positions, int max_entries) {
  const bool fast_dim = p.head_dim == 64 || p.head_dim == 128;
  const bool pow2_block = p.block_size >= 16 && (p.block_size & (p.block_size - 1)) == 0;
  if (fast_dim && all_single) {
    cuda::DecodeAttentionParams d;
    d.q = p.q;
    d.k_pool = p.k_pool;
    d.v_pool = p.v_pool;
    d.block_ids = p.block_ids;
    d.block_tokens = p.block_tokens;
    d.block_deltas = p.block_deltas;
    d.block_starts = p.block_starts;
    d.table_offsets = p.table_offsets;
    d.positions = positions;
    d.inv_freq = p.inv_freq;
    d.out = p.out;
    d.num_seqs = p.num_seqs;
    d.n_heads = p.n_heads;
    d.n_kv_heads = p.n_kv_heads;
    d.head_dim = p.head_dim;
    d.block_size = p.block_size;
    d.rope_style = p.rope_style;
    d.max_entries_per_seq = max_entries;
    RETURN_IF_ERROR(attn_ws_.Reserve(std::max<size_t>(16, cuda::DecodeWorkspaceBytes(d, cuda::ChooseDecodeSplits(d)))));
    d.workspace = attn_ws_.as<float>();
    return Cuda(cuda::LaunchLazyDecodeAttention(d, stream_), "decode attention");
  }
  if (fast_dim && pow2_block) {
    RETURN_IF_ERROR(
        attn_ws_.Reserve(std::max<size_t>(16, cuda::PrefillWorkspaceBytes(p, cuda::ChoosePrefillSplits(p)))));
    p.workspace = attn_ws_.as<float>();
    return Cuda(cuda::LaunchLazyPrefillAttention(p, stream_), "prefill attention");
  }
  return Cuda(cuda::LaunchGenericPagedAttention(p, rows, stream_), "generic attention");
}

absl::Status CudaBackend::Forward(std::span<const SequenceStep> steps, std::vector<std::vector<float>>* logits) {
  logits->assign(steps.size(), {});
  for (const SequenceStep& step : steps) RETURN_IF_ERROR(ValidateStep(step, c_, block_size_, num_blocks_));
  // Host metadata: per new token its id, slot and key position; per sequence its table.
  std::vector<int32_t> tokens, slot_blocks, slot_index, rope_pos;
  std::vector<int32_t> ids, counts, deltas, starts, table_offsets = {0}, query_offsets = {0}, pos0, last_pos;
  std::vector<size_t> active;  // steps with tokens, in order
  int max_entries = 0, max_queries = 0;
  bool all_single = true;
  for (size_t s = 0; s < steps.size(); ++s) {
    const SequenceStep& step = steps[s];
    const int n = static_cast<int>(step.tokens.size());
    if (n == 0) continue;
    active.push_back(s);
    all_single = all_single && n == 1;
    int64_t total = 0;
    for (const KvBlockRef& ref : step.context) total += ref.num_tokens;
    const int64_t first = total - n;
    int64_t logical = 0;
    for (const KvBlockRef& ref : step.context) {
      ids.push_back(ref.block);
      counts.push_back(ref.num_tokens);
      deltas.push_back(ref.delta);
      starts.push_back(static_cast<int32_t>(logical));
      for (int32_t slot = 0; slot < ref.num_tokens; ++slot, ++logical) {
        if (logical >= first) {
          slot_blocks.push_back(ref.block);
          slot_index.push_back(slot);
          rope_pos.push_back(static_cast<int32_t>(logical - ref.delta));
        }
      }
    }
    tokens.insert(tokens.end(), step.tokens.begin(), step.tokens.end());
    table_offsets.push_back(static_cast<int32_t>(ids.size()));
    query_offsets.push_back(static_cast<int32_t>(tokens.size()));
    pos0.push_back(static_cast<int32_t>(first));
    last_pos.push_back(static_cast<int32_t>(total - 1));
    max_entries = std::max<int>(max_entries, step.context.size());
    max_queries = std::max(max_queries, n);
  }
  const int rows = static_cast<int>(tokens.size());
  if (rows == 0) return absl::OkStatus();
  RETURN_IF_ERROR(ReserveActivations(rows));

  MetaPack pack;
  const size_t o_tokens = pack.Add(tokens), o_sb = pack.Add(slot_blocks), o_si = pack.Add(slot_index),
               o_rp = pack.Add(rope_pos), o_ids = pack.Add(ids), o_counts = pack.Add(counts),
               o_deltas = pack.Add(deltas), o_starts = pack.Add(starts), o_to = pack.Add(table_offsets),
               o_qo = pack.Add(query_offsets), o_pos0 = pack.Add(pos0), o_last = pack.Add(last_pos);
  RETURN_IF_ERROR(pack.Upload(meta_host_, meta_, stream_));
  auto meta = [&](size_t offset) { return meta_.as<int32_t>(offset * sizeof(int32_t)); };

  const int dim = c_.dim, q_dim = c_.q_dim(), kv_dim = c_.kv_dim(), hidden = c_.hidden_dim;
  float* x = x_.as<float>();
  float* y = y_.as<float>();
  bf16* xb = xb_.as<bf16>();
  RETURN_IF_ERROR(Cuda(cuda::LaunchEmbeddingGather(w_->embedding(), meta(o_tokens), rows, dim, x, stream_), "embed"));
  cuda::PrefillAttentionParams ap;
  ap.q = q_.as<float>();
  ap.block_ids = meta(o_ids);
  ap.block_tokens = meta(o_counts);
  ap.block_deltas = meta(o_deltas);
  ap.block_starts = meta(o_starts);
  ap.table_offsets = meta(o_to);
  ap.query_offsets = meta(o_qo);
  ap.query_pos0 = meta(o_pos0);
  ap.inv_freq = inv_freq_;
  ap.out = attn_.as<float>();
  ap.num_seqs = static_cast<int>(active.size());
  ap.n_heads = c_.n_heads;
  ap.n_kv_heads = c_.n_kv_heads;
  ap.head_dim = c_.head_dim;
  ap.block_size = block_size_;
  ap.rope_style = RopeStyleIndex();
  ap.max_queries_per_seq = max_queries;
  cuda::KvWriteParams kw;
  kw.qkv = qkv_.as<float>();
  kw.q_out = q_.as<float>();
  kw.slot_blocks = meta(o_sb);
  kw.slot_index = meta(o_si);
  kw.rope_positions = meta(o_rp);
  kw.inv_freq = inv_freq_;
  kw.rows = rows;
  kw.n_heads = c_.n_heads;
  kw.n_kv_heads = c_.n_kv_heads;
  kw.head_dim = c_.head_dim;
  kw.block_size = block_size_;
  kw.rope_style = RopeStyleIndex();

  for (int l = 0; l < c_.n_layers; ++l) {
    const DeviceLayer& lw = w_->layer(l);
    RETURN_IF_ERROR(Cuda(cuda::LaunchResidualRmsNorm(x, l == 0 ? nullptr : y, lw.attn_norm, rows, dim, c_.norm_eps,
                                                     xb, stream_),
                         "attention norm"));
    RETURN_IF_ERROR(gemm_->Run(xb, rows, dim, lw.wqkv, q_dim + 2 * kv_dim, qkv_.as<float>()));
    kw.k_pool = KPool(l);
    kw.v_pool = VPool(l);
    RETURN_IF_ERROR(Cuda(cuda::LaunchKvWrite(kw, stream_), "KV write"));
    ap.k_pool = KPool(l);
    ap.v_pool = VPool(l);
    RETURN_IF_ERROR(Attention(ap, rows, all_single, meta(o_last), max_entries));
    RETURN_IF_ERROR(Cuda(cuda::LaunchToBf16(attn_.as<float>(), static_cast<size_t>(rows) * q_dim, attn_bf_.as<bf16>(),
                                            stream_),
                         "attention output"));
    RETURN_IF_ERROR(gemm_->Run(attn_bf_.as<bf16>(), rows, q_dim, lw.wo, dim, y));
    RETURN_IF_ERROR(
        Cuda(cuda::LaunchResidualRmsNorm(x, y, lw.ffn_norm, rows, dim, c_.norm_eps, xb, stream_), "ffn norm"));
    RETURN_IF_ERROR(gemm_->Run(xb, rows, dim, lw.w_gate_up, 2 * hidden, gu_.as<float>()));
    RETURN_IF_ERROR(Cuda(cuda::LaunchSwiGlu(gu_.as<float>(), rows, hidden, h_.as<bf16>(), stream_), "SwiGLU"));
    RETURN_IF_ERROR(gemm_->Run(h_.as<bf16>(), rows, hidden, lw.w_down, dim, y));
  }

  // Logits for the rows each step wants (a contiguous run of its rows), copied back once.
  struct Want {
    size_t step;
    int first_row, count;
  };
  std::vector<Want> wants;
  int total_wanted = 0;
  for (size_t a = 0; a < active.size(); ++a) {
    const SequenceStep& step = steps[active[a]];
    const int n = query_offsets[a + 1] - query_offsets[a];
    if (step.logits == LogitsWanted::kNone) continue;
    const int count = step.logits == LogitsWanted::kLast ? 1 : n;
    wants.push_back(Want{active[a], query_offsets[a + 1] - count, count});
    total_wanted += count;
  }
  if (!wants.empty()) {
    RETURN_IF_ERROR(Cuda(cuda::LaunchResidualRmsNorm(x, y, w_->final_norm(), rows, dim, c_.norm_eps, xb, stream_),
                         "final norm"));
    const size_t vocab = c_.vocab_size;
    const size_t bytes = static_cast<size_t>(total_wanted) * vocab * sizeof(float);
    RETURN_IF_ERROR(logits_.Reserve(bytes));
    RETURN_IF_ERROR(logits_host_.Reserve(bytes));
    int done = 0;
    for (const Want& want : wants) {
      RETURN_IF_ERROR(gemm_->Run(xb + static_cast<size_t>(want.first_row) * dim, want.count, dim, w_->output_matrix(),
                                 c_.vocab_size, logits_.as<float>() + done * vocab));
      done += want.count;
    }
    RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(logits_host_.as<float>(), logits_.as<float>(), bytes, cudaMemcpyDeviceToHost,
                                         stream_),
                         "logits copy"));
  }
  RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream_), "forward"));
  size_t done = 0;
  for (const Want& want : wants) {
    const float* src = logits_host_.as<float>() + done * c_.vocab_size;
    (*logits)[want.step].assign(src, src + static_cast<size_t>(want.count) * c_.vocab_size);
    done += want.count;
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyBlocksRotated(std::span<const BlockCopy> copies) {
  std::vector<int32_t> src, dst, counts, deltas;
  for (const BlockCopy& copy : copies) {
    for (int32_t b : {copy.src_block, copy.dst_block}) {
      if (b < 0 || b >= num_blocks_) {
        return absl::InvalidArgumentError(absl::StrFormat("block id %d outside the pool of %d", b, num_blocks_));
      }
    }
    if (copy.num_tokens < 0 || copy.num_tokens > block_size_) {
      return absl::InvalidArgumentError(absl::StrFormat("copy of %d tokens; block size is %d", copy.num_tokens,
                                                        block_size_));
    }
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
  m.inv_freq = inv_freq_;
  m.num_copies = static_cast<int>(copies.size());
  m.n_kv_heads = c_.n_kv_heads;
  m.head_dim = c_.head_dim;
  m.block_size = block_size_;
  m.rope_style = RopeStyleIndex();
  for (int l = 0; l < c_.n_layers; ++l) {
    m.k_pool = KPool(l);
    m.v_pool = VPool(l);
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
  p.payload = staging_.as<bf16>();
  p.k_pool = k_pool_;
  p.v_pool = v_pool_;
  p.block_ids = meta_.as<int32_t>(o_ids * sizeof(int32_t));
  p.block_tokens = meta_.as<int32_t>(o_counts * sizeof(int32_t));
  p.token_offsets = meta_.as<int32_t>(o_offsets * sizeof(int32_t));
  p.num_blocks_in_chunk = static_cast<int>(blocks.size());
  p.chunk_tokens = static_cast<int>(layout.num_tokens);
  p.kv_dim = c_.kv_dim();
  p.block_size = block_size_;
  p.pool_blocks = num_blocks_;
  return p;
}

// Device -> host: one gather of every layer into the staging payload, one copy back.
absl::Status CudaBackend::ExportChunk(std::span<const KvBlockRef> blocks, std::string* payload) {
  int tokens = 0;
  for (const KvBlockRef& ref : blocks) tokens += ref.num_tokens;
  const ChunkLayout layout = MakeChunkLayout(c_, KvDtype::kBf16, tokens, 0);
  payload->resize(layout.payload_bytes());
  RETURN_IF_ERROR(ValidateChunkBlocks(layout, payload->size(), blocks, block_size_, num_blocks_));
  ASSIGN_OR_RETURN(cuda::KvTransferParams p, TransferParams(layout, blocks));
  p.first_layer = 0;
  p.num_layers = c_.n_layers;
  p.to_pool = false;
  RETURN_IF_ERROR(Cuda(cuda::LaunchKvTransfer(p, stream_), "chunk gather"));
  RETURN_IF_ERROR(payload_host_.Reserve(std::max<size_t>(16, payload->size())));
  RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(payload_host_.as<char>(), p.payload, payload->size(), cudaMemcpyDeviceToHost,
                                       stream_),
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
  const ChunkLayout layout = MakeChunkLayout(c_, KvDtype::kBf16, tokens, 0);
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
    RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(p.payload + offset / sizeof(bf16), source + offset, layer_bytes,
                                         cudaMemcpyHostToDevice, copy_stream_),
                         "chunk import copy"));
    RETURN_IF_ERROR(Cuda(cudaEventRecord(event_, copy_stream_), "event"));
    RETURN_IF_ERROR(Cuda(cudaStreamWaitEvent(stream_, event_, 0), "event wait"));
    p.first_layer = l;
    RETURN_IF_ERROR(Cuda(cuda::LaunchKvTransfer(p, stream_), "chunk scatter"));
  }
  return Cuda(cudaStreamSynchronize(stream_), "chunk import");
}

absl::StatusOr<std::unique_ptr<Backend>> Finish(std::unique_ptr<DeviceWeights> weights, int block_size,
                                                int num_blocks) {
  auto backend = std::make_unique<CudaBackend>(std::move(weights), block_size, num_blocks);
  RETURN_IF_ERROR(backend->Init());
  return std::unique_ptr<Backend>(std::move(backend));
}

absl::Status CheckPoolShape(int block_size, int num_blocks) {
  if (block_size <= 0 || block_size > 4096) {
    return absl::InvalidArgumentError(absl::StrFormat("block_size %d out of range [1, 4096]", block_size));
  }
  if (num_blocks <= 0) return absl::InvalidArgumentError(absl::StrFormat("num_blocks %d must be positive", num_blocks));
  if (!CudaDeviceAvailable()) return absl::FailedPreconditionError("the CUDA backend needs a GPU; none was found");
  return absl::OkStatus();
}

}  // namespace

bool CudaDeviceAvailable() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

uint64_t CudaKvBytesPerBlock(const ModelConfig& config, int block_size) {
  return 2ull * config.n_layers * block_size * config.kv_dim() * sizeof(bf16);
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const ModelWeights& weights, int block_size,
                                                           int num_blocks) {
  RETURN_IF_ERROR(CheckPoolShape(block_size, num_blocks));
  RETURN_IF_ERROR(weights.config.Validate());
  ASSIGN_OR_RETURN(auto device_weights, DeviceWeights::Upload(weights));
  return Finish(std::move(device_weights), block_size, num_blocks);
}

absl::StatusOr<std::unique_ptr<Backend>> CreateSyntheticCudaBackend(const ModelConfig& config, uint64_t seed,
                                                                    int block_size, int num_blocks) {
  RETURN_IF_ERROR(CheckPoolShape(block_size, num_blocks));
  ASSIGN_OR_RETURN(auto device_weights, DeviceWeights::Synthetic(config, seed));
  return Finish(std::move(device_weights), block_size, num_blocks);
}

}  // namespace lazykv
