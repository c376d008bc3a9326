// The CUDA backend's forward pass: embedding, the layers (cuBLASLt GEMMs, the attention
// kernels, fused norms), then the output layer over every row that wants logits as one
// classifier GEMM (the 1 GiB classifier of an 8B model streamed once per step, not once
// per sequence). The layers are one template over the element type of the weights, GEMM
// inputs and pool (bf16, or fp32 in the backend's fp32 mode).
#include <type_traits>

#include "kernels/cuda/generic_attention.h"
#include "kernels/cuda/lazy_decode_attention.h"
#include "worker/backend/cuda_backend_internal.h"

namespace lazykv::cuda_backend {

absl::Status CudaBackend::ReserveActivations(int rows) {
  if (rows <= activation_rows_) return absl::OkStatus();
  const size_t r = rows, dim = c_.dim, q = c_.q_dim(), kv = c_.kv_dim(), hidden = c_.hidden_dim;
  const size_t m = cuda::ElementBytes(element_);
  RETURN_IF_ERROR(x_.Reserve(r * dim * sizeof(float)));
  RETURN_IF_ERROR(y_.Reserve(r * dim * sizeof(float)));
  RETURN_IF_ERROR(xb_.Reserve(r * dim * m));
  RETURN_IF_ERROR(qkv_.Reserve(r * (q + 2 * kv) * sizeof(float)));
  RETURN_IF_ERROR(q_.Reserve(r * q * sizeof(float)));
  RETURN_IF_ERROR(attn_.Reserve(r * q * sizeof(float)));
  if (element_ == cuda::Element::kBf16) RETURN_IF_ERROR(attn_in_.Reserve(r * q * m));  // fp32 reads attn_
  RETURN_IF_ERROR(gu_.Reserve(r * 2 * hidden * sizeof(float)));
  RETURN_IF_ERROR(h_.Reserve(r * hidden * m));
  activation_rows_ = rows;
  return absl::OkStatus();
}

// The tensor-core kernels where they apply (a bf16 pool, head dims 64 and 128; decode when
// every step has one token, prefill for power-of-two blocks of at least 16), the generic
// kernel else.
absl::Status CudaBackend::Attention(cuda::PrefillAttentionParams& p, int rows, bool all_single,
                                    const int32_t* positions, int max_entries) {
  const bool fast_dim = p.kv.element == cuda::Element::kBf16 && (p.kv.head_dim == 64 || p.kv.head_dim == 128);
  const bool pow2_block = p.kv.block_size >= 16 && (p.kv.block_size & (p.kv.block_size - 1)) == 0;
  if (fast_dim && all_single) {
    cuda::DecodeAttentionParams d = cuda::DecodeParamsFrom(p, positions, max_entries);
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

absl::Status CudaBackend::RunModel(std::span<const SequenceStep> steps, std::vector<LogitsRows>* wanted) {
  wanted->clear();
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
      // Only the last n slots are new: start at the first of them (decode at a long context
      // would otherwise walk every cached slot on the host, every step).
      for (int64_t slot = std::max<int64_t>(0, first - logical); slot < ref.num_tokens; ++slot) {
        slot_blocks.push_back(ref.block);
        slot_index.push_back(static_cast<int32_t>(slot));
        rope_pos.push_back(static_cast<int32_t>(logical + slot - ref.delta));
      }
      logical += ref.num_tokens;
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
  // The rows that want logits (a contiguous run of each such step's rows), in step order.
  std::vector<int32_t> out_rows;
  for (size_t a = 0; a < active.size(); ++a) {
    const SequenceStep& step = steps[active[a]];
    if (step.logits == LogitsWanted::kNone) continue;
    const int count = step.logits == LogitsWanted::kLast ? 1 : query_offsets[a + 1] - query_offsets[a];
    wanted->push_back(LogitsRows{.step = active[a], .first = static_cast<int>(out_rows.size()), .count = count});
    for (int r = query_offsets[a + 1] - count; r < query_offsets[a + 1]; ++r) out_rows.push_back(r);
  }

  MetaPack pack;
  const size_t o_tokens = pack.Add(tokens), o_sb = pack.Add(slot_blocks), o_si = pack.Add(slot_index),
               o_rp = pack.Add(rope_pos), o_ids = pack.Add(ids), o_counts = pack.Add(counts),
               o_deltas = pack.Add(deltas), o_starts = pack.Add(starts), o_to = pack.Add(table_offsets),
               o_qo = pack.Add(query_offsets), o_pos0 = pack.Add(pos0), o_last = pack.Add(last_pos),
               o_out = pack.Add(out_rows);
  RETURN_IF_ERROR(pack.Upload(meta_host_, meta_, stream_));
  auto meta = [&](size_t offset) { return meta_.as<int32_t>(offset * sizeof(int32_t)); };

  PassPlan plan;
  plan.rows = rows;
  plan.all_single = all_single;
  plan.max_entries = max_entries;
  plan.tokens = meta(o_tokens);
  plan.last_pos = meta(o_last);
  plan.out_rows = meta(o_out);
  plan.n_out = static_cast<int>(out_rows.size());
  cuda::PrefillAttentionParams& ap = plan.attention;
  ap.q = q_.as<float>();
  ap.kv = LayerKv(0);  // RunLayers points the pools at each layer
  ap.kv.block_ids = meta(o_ids);
  ap.kv.block_tokens = meta(o_counts);
  ap.kv.block_deltas = meta(o_deltas);
  ap.kv.block_starts = meta(o_starts);
  ap.kv.table_offsets = meta(o_to);
  ap.query_offsets = meta(o_qo);
  ap.query_pos0 = meta(o_pos0);
  ap.out = attn_.as<float>();
  ap.num_seqs = static_cast<int>(active.size());
  ap.n_heads = c_.n_heads;
  ap.max_queries_per_seq = max_queries;
  cuda::KvWriteParams& kw = plan.kv_write;
  kw.qkv = qkv_.as<float>();
  kw.q_out = q_.as<float>();
  kw.kv = LayerKv(0);
  kw.slot_blocks = meta(o_sb);
  kw.slot_index = meta(o_si);
  kw.rope_positions = meta(o_rp);
  kw.rows = rows;
  kw.n_heads = c_.n_heads;
  return element_ == cuda::Element::kFp32 ? RunLayers<float>(plan) : RunLayers<bf16>(plan);
}

template <typename T>
absl::Status CudaBackend::RunLayers(PassPlan& plan) {
  const int rows = plan.rows, dim = c_.dim, q_dim = c_.q_dim(), kv_dim = c_.kv_dim(), hidden = c_.hidden_dim;
  float* x = x_.as<float>();
  float* y = y_.as<float>();
  T* xb = xb_.as<T>();
  auto matrix = [](const void* w) { return static_cast<const T*>(w); };
  RETURN_IF_ERROR(
      Cuda(cuda::LaunchEmbeddingGather(matrix(w_->embedding()), plan.tokens, rows, dim, x, stream_), "embed"));
  cuda::PrefillAttentionParams& ap = plan.attention;
  cuda::KvWriteParams& kw = plan.kv_write;
  for (int l = 0; l < c_.n_layers; ++l) {
    const DeviceLayer& lw = w_->layer(l);
    RETURN_IF_ERROR(
        Cuda(cuda::LaunchResidualRmsNorm(x, l == 0 ? nullptr : y, lw.attn_norm, rows, dim, c_.norm_eps, xb, stream_),
             "attention norm"));
    RETURN_IF_ERROR(gemm_->Run(xb, rows, dim, matrix(lw.wqkv), q_dim + 2 * kv_dim, qkv_.as<float>()));
    kw.kv.k_pool = ap.kv.k_pool = KPool(l);
    kw.kv.v_pool = ap.kv.v_pool = VPool(l);
    RETURN_IF_ERROR(Cuda(cuda::LaunchKvWrite(kw, stream_), "KV write"));
    RETURN_IF_ERROR(Attention(ap, rows, plan.all_single, plan.last_pos, plan.max_entries));
    const T* attention_out;
    if constexpr (std::is_same_v<T, float>) {
      attention_out = attn_.as<float>();
    } else {
      RETURN_IF_ERROR(
          Cuda(cuda::LaunchToBf16(attn_.as<float>(), static_cast<size_t>(rows) * q_dim, attn_in_.as<T>(), stream_),
               "attention output"));
      attention_out = attn_in_.as<T>();
    }
    RETURN_IF_ERROR(gemm_->Run(attention_out, rows, q_dim, matrix(lw.wo), dim, y));
    RETURN_IF_ERROR(
        Cuda(cuda::LaunchResidualRmsNorm(x, y, lw.ffn_norm, rows, dim, c_.norm_eps, xb, stream_), "ffn norm"));
    RETURN_IF_ERROR(gemm_->Run(xb, rows, dim, matrix(lw.w_gate_up), 2 * hidden, gu_.as<float>()));
    RETURN_IF_ERROR(Cuda(cuda::LaunchSwiGlu(gu_.as<float>(), rows, hidden, h_.as<T>(), stream_), "SwiGLU"));
    RETURN_IF_ERROR(gemm_->Run(h_.as<T>(), rows, hidden, matrix(lw.w_down), dim, y));
  }

  if (plan.n_out == 0) return absl::OkStatus();
  // The output layer: the final norm, then the wanted rows gathered into one matrix (unless
  // they are every row already) for one classifier GEMM.
  const int n_out = plan.n_out;
  RETURN_IF_ERROR(
      Cuda(cuda::LaunchResidualRmsNorm(x, y, w_->final_norm(), rows, dim, c_.norm_eps, xb, stream_), "final norm"));
  const T* classifier_in = xb;
  if (n_out != rows) {
    RETURN_IF_ERROR(out_rows_.Reserve(static_cast<size_t>(n_out) * dim * sizeof(T)));
    RETURN_IF_ERROR(
        Cuda(cuda::LaunchGatherRows(xb, plan.out_rows, n_out, dim, out_rows_.as<T>(), stream_), "output rows"));
    classifier_in = out_rows_.as<T>();
  }
  RETURN_IF_ERROR(logits_.Reserve(static_cast<size_t>(n_out) * c_.vocab_size * sizeof(float)));
  return gemm_->Run(classifier_in, n_out, dim, matrix(w_->output_matrix()), c_.vocab_size, logits_.as<float>());
}

}  // namespace lazykv::cuda_backend
