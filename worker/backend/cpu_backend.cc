#include "worker/backend/cpu_backend.h"

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/chunk_values.h"
#include "common/status_macros.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/dense_ops.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/rope.h"

namespace lazykv {
namespace {

// The CUDA backend's weights: every matrix in bf16, the norm weights in fp32.
void RoundMatricesToBf16(ModelWeights& w) {
  ForEachTensor(w, [](const std::string& name, std::vector<float>& t, size_t) {
    if (!absl::EndsWith(name, "norm")) cpu::RoundToBf16(t.data(), t.size());
  });
}

// A payload in host memory: what the CPU backend captures and stages.
class HostPayload final : public ExportedChunk, public StagedChunk {
 public:
  explicit HostPayload(std::string bytes) : bytes_(std::move(bytes)) {}
  uint64_t payload_bytes() const override { return bytes_.size(); }
  absl::Status CopyTo(const MutablePieces& out) override {
    uint64_t total = 0;
    for (std::span<char> piece : out) total += piece.size();
    if (total != bytes_.size()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("CopyTo: %d bytes of room for a %d-byte payload", total, bytes_.size()));
    }
    WriteToPieces(out, 0, bytes_);
    return absl::OkStatus();
  }
  std::string_view bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

class CpuBackend : public Backend {
 public:
  CpuBackend(ModelWeights weights, int block_size, int num_blocks, CpuBackendOptions options)
      : w_(std::move(weights)),
        c_(w_.config),
        bf16_(options.numerics == CpuNumerics::kBf16LikeCuda),
        rope_(c_.rope, c_.head_dim),
        block_size_(block_size),
        num_blocks_(num_blocks),
        layer_floats_(static_cast<size_t>(num_blocks) * block_size * c_.kv_dim()),
        k_pool_(layer_floats_ * c_.n_layers),
        v_pool_(layer_floats_ * c_.n_layers) {
    if (bf16_) RoundMatricesToBf16(w_);
  }

  const ModelConfig& config() const override { return c_; }
  std::string kv_dtype() const override { return bf16_ ? "bf16" : "fp32"; }
  Hash128 model_fingerprint() const override { return MakeModelFingerprint(w_.content_hash, kv_dtype()); }
  int block_size() const override { return block_size_; }
  int num_blocks() const override { return num_blocks_; }
  uint64_t kv_bytes_per_block() const override { return CpuKvBytesPerBlock(c_, block_size_); }

  absl::Status Forward(std::span<const SequenceStep> steps, std::vector<std::vector<float>>* logits) override {
    logits->assign(steps.size(), {});
    for (size_t i = 0; i < steps.size(); ++i) {
      RETURN_IF_ERROR(ValidateStep(steps[i], c_, block_size_, num_blocks_));
      ForwardOne(steps[i], &(*logits)[i]);
    }
    return absl::OkStatus();
  }

  absl::Status CopyBlocksRotated(std::span<const BlockCopy> copies) override {
    RETURN_IF_ERROR(ValidateBlockCopies(copies, block_size_, num_blocks_));
    for (int layer = 0; layer < c_.n_layers; ++layer) {
      const cpu::KvLayerView kv = LayerView(layer);
      for (const BlockCopy& copy : copies) {
        cpu::CopyBlockRotated(kv, copy.src_block, copy.dst_block, copy.first_slot, copy.num_tokens, copy.delta, rope_);
        Round(kv.k + kv.slot_offset(copy.dst_block, copy.first_slot),
              static_cast<size_t>(copy.num_tokens - copy.first_slot) * c_.kv_dim());
      }
    }
    return absl::OkStatus();
  }

  // The CPU is its own device: a capture copies the pool's slots into a payload now, and
  // staging copies the payload into one buffer (on the pipeline's thread).
  absl::StatusOr<std::unique_ptr<ExportedChunk>> CaptureChunk(std::span<const KvBlockRef> blocks) override {
    const ChunkLayout layout = LayoutOf(blocks);
    std::string payload(layout.payload_bytes(), '\0');
    RETURN_IF_ERROR(ValidateChunkBlocks(layout, payload.size(), blocks, block_size_, num_blocks_));
    ForEachBlockRun(layout, blocks, [&](size_t offset, float* slots, size_t n) {
      char* out = payload.data() + offset;
      if (!bf16_) {
        std::memcpy(out, slots, n * sizeof(float));
        return;
      }
      for (size_t i = 0; i < n; ++i) {  // exact: the pool holds bf16 values
        const uint16_t bits = cpu::FloatToBf16Bits(slots[i]);
        std::memcpy(out + i * sizeof(bits), &bits, sizeof(bits));
      }
    });
    return std::unique_ptr<ExportedChunk>(new HostPayload(std::move(payload)));
  }

  absl::StatusOr<std::unique_ptr<StagedChunk>> StageChunk(const ChunkBytes& payload, const StageOptions& options) override {
    if (payload.on_device()) return absl::FailedPreconditionError("chunk staging: the CPU backend cannot read GPU memory");
    if (options.check_finite) {
      if (absl::Status s = CheckPayloadFinite(bf16_ ? KvDtype::kBf16 : KvDtype::kFp32, payload.pieces()); !s.ok()) {
        return absl::PermissionDeniedError(absl::StrCat("chunk refused: ", s.message()));
      }
    }
    return std::unique_ptr<StagedChunk>(new HostPayload(payload.ToString()));
  }

  absl::Status ImportStaged(std::unique_ptr<StagedChunk> staged, std::span<const KvBlockRef> blocks) override {
    auto* host = dynamic_cast<HostPayload*>(staged.get());
    if (host == nullptr) return absl::InvalidArgumentError("ImportStaged: a payload staged by another backend");
    const std::string_view payload = host->bytes();
    const ChunkLayout layout = LayoutOf(blocks);
    RETURN_IF_ERROR(ValidateChunkBlocks(layout, payload.size(), blocks, block_size_, num_blocks_));
    ForEachBlockRun(layout, blocks, [&](size_t offset, float* slots, size_t n) {
      const char* in = payload.data() + offset;
      if (!bf16_) {
        std::memcpy(slots, in, n * sizeof(float));
        return;
      }
      for (size_t i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, in + i * sizeof(bits), sizeof(bits));
        slots[i] = cpu::Bf16BitsToFloat(bits);
      }
    });
    return absl::OkStatus();
  }

 private:
  ChunkLayout LayoutOf(std::span<const KvBlockRef> blocks) const {
    int tokens = 0;
    for (const KvBlockRef& ref : blocks) tokens += ref.num_tokens;
    return MakeChunkLayout(c_, bf16_ ? KvDtype::kBf16 : KvDtype::kFp32, tokens, 0);
  }

  // Calls fn(payload offset, first slot, number of values) for each block's rows of each K
  // and V plane: one contiguous run per block per plane.
  template <typename Fn>
  void ForEachBlockRun(const ChunkLayout& layout, std::span<const KvBlockRef> blocks, Fn fn) {
    for (int layer = 0; layer < c_.n_layers; ++layer) {
      const cpu::KvLayerView kv = LayerView(layer);
      for (int kind = 0; kind < 2; ++kind) {
        size_t offset = layout.plane_offset(layer, kind);
        for (const KvBlockRef& ref : blocks) {
          fn(offset, (kind == 0 ? kv.k : kv.v) + kv.slot_offset(ref.block, 0),
             static_cast<size_t>(ref.num_tokens) * c_.kv_dim());
          offset += ref.num_tokens * layout.row_bytes();
        }
      }
    }
  }

  // Rounds to bf16 in the GPU-like numerics (a no-op in fp32).
  void Round(float* values, size_t n) const {
    if (bf16_) cpu::RoundToBf16(values, n);
  }

  cpu::KvLayerView LayerView(int layer) {
    return cpu::KvLayerView{k_pool_.data() + layer * layer_floats_,
                            v_pool_.data() + layer * layer_floats_,
                            num_blocks_,
                            block_size_,
                            c_.n_kv_heads,
                            c_.head_dim};
  }

  void ForwardOne(const SequenceStep& step, std::vector<float>* logits) {
    const int n = static_cast<int>(step.tokens.size());
    if (n == 0) return;
    const int dim = c_.dim, q_dim = c_.q_dim(), kv_dim = c_.kv_dim(), hidden = c_.hidden_dim;

    // Where the new tokens go: the last n slots of the block table.
    struct Slot {
      int32_t block, slot, position, delta;
    };
    std::vector<Slot> slots(n);
    std::vector<int32_t> positions(n);
    {
      int64_t total = 0;
      for (const KvBlockRef& ref : step.context) total += ref.num_tokens;
      const int64_t first = total - n;
      int64_t logical = 0;
      for (const KvBlockRef& ref : step.context) {
        for (int32_t s = 0; s < ref.num_tokens; ++s, ++logical) {
          if (logical >= first) {
            const int i = static_cast<int>(logical - first);
            slots[i] = Slot{ref.block, s, static_cast<int32_t>(logical), ref.delta};
            positions[i] = static_cast<int32_t>(logical);
          }
        }
      }
    }

    std::vector<float> x(static_cast<size_t>(n) * dim), xb(x.size()), attn_out(static_cast<size_t>(n) * q_dim);
    std::vector<float> q(static_cast<size_t>(n) * q_dim), k(static_cast<size_t>(n) * kv_dim), v(k.size());
    std::vector<float> gate(static_cast<size_t>(n) * hidden), up(gate.size());
    for (int i = 0; i < n; ++i) {
      std::memcpy(&x[static_cast<size_t>(i) * dim], &w_.embedding[static_cast<size_t>(step.tokens[i]) * dim],
                  dim * sizeof(float));
    }
    for (int l = 0; l < c_.n_layers; ++l) {
      const LayerWeights& lw = w_.layers[l];
      const cpu::KvLayerView kv = LayerView(l);
      cpu::RmsNorm(x.data(), lw.attn_norm.data(), n, dim, c_.norm_eps, xb.data());
      Round(xb.data(), xb.size());
      cpu::MatmulTransposed(xb.data(), n, dim, lw.wq.data(), q_dim, q.data());
      cpu::MatmulTransposed(xb.data(), n, dim, lw.wk.data(), kv_dim, k.data());
      cpu::MatmulTransposed(xb.data(), n, dim, lw.wv.data(), kv_dim, v.data());
      for (int i = 0; i < n; ++i) {
        // Keys are stored rotated at the position their block's delta implies.
        float* k_row = &k[static_cast<size_t>(i) * kv_dim];
        rope_.RotateHeads(k_row, c_.n_kv_heads, slots[i].position - slots[i].delta);
        Round(k_row, kv_dim);
        Round(&v[static_cast<size_t>(i) * kv_dim], kv_dim);
        std::memcpy(kv.k + kv.slot_offset(slots[i].block, slots[i].slot), k_row, kv_dim * sizeof(float));
        std::memcpy(kv.v + kv.slot_offset(slots[i].block, slots[i].slot), &v[static_cast<size_t>(i) * kv_dim],
                    kv_dim * sizeof(float));
      }
      cpu::LazyPagedAttention(q.data(), positions.data(), n, c_.n_heads, step.context, kv, rope_, attn_out.data());
      Round(attn_out.data(), attn_out.size());
      cpu::MatmulTransposed(attn_out.data(), n, q_dim, lw.wo.data(), dim, xb.data());
      cpu::AddInPlace(x.data(), xb.data(), x.size());

      cpu::RmsNorm(x.data(), lw.ffn_norm.data(), n, dim, c_.norm_eps, xb.data());
      Round(xb.data(), xb.size());
      cpu::MatmulTransposed(xb.data(), n, dim, lw.w_gate.data(), hidden, gate.data());
      cpu::MatmulTransposed(xb.data(), n, dim, lw.w_up.data(), hidden, up.data());
      cpu::SwiGlu(gate.data(), up.data(), gate.size());
      Round(gate.data(), gate.size());
      cpu::MatmulTransposed(gate.data(), n, hidden, lw.w_down.data(), dim, xb.data());
      cpu::AddInPlace(x.data(), xb.data(), x.size());
    }
    if (step.logits == LogitsWanted::kNone) return;
    const int first_row = step.logits == LogitsWanted::kLast ? n - 1 : 0;
    const int rows = n - first_row;
    cpu::RmsNorm(&x[static_cast<size_t>(first_row) * dim], w_.final_norm.data(), rows, dim, c_.norm_eps, xb.data());
    Round(xb.data(), static_cast<size_t>(rows) * dim);
    logits->resize(static_cast<size_t>(rows) * c_.vocab_size);
    cpu::MatmulTransposed(xb.data(), rows, dim, w_.output_matrix().data(), c_.vocab_size, logits->data());
  }

  ModelWeights w_;
  const ModelConfig& c_;
  bool bf16_;  // CpuNumerics::kBf16LikeCuda
  cpu::RopeTable rope_;
  int block_size_;
  int num_blocks_;
  size_t layer_floats_;
  std::vector<float> k_pool_;
  std::vector<float> v_pool_;
};

}  // namespace

uint64_t CpuKvBytesPerBlock(const ModelConfig& config, int block_size) {
  return 2ull * config.n_layers * block_size * config.kv_dim() * sizeof(float);
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(ModelWeights weights, int block_size, int num_blocks,
                                                          CpuBackendOptions options) {
  RETURN_IF_ERROR(ValidatePoolShape(block_size, num_blocks));
  RETURN_IF_ERROR(weights.config.Validate());
  return std::unique_ptr<Backend>(new CpuBackend(std::move(weights), block_size, num_blocks, options));
}

}  // namespace lazykv
