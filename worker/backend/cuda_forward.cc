// The CUDA backend's forward pass: embedding, the layers (cuBLASLt GEMMs, the attention
// kernels, fused norms), then the output layer over every row that wants logits as one
// classifier GEMM (the 1 GiB classifier of an 8B model streamed once per step, not once
// per sequence). The layers are one template over the element type of the weights, GEMM
// inputs and pool (bf16, or fp32 in the backend's fp32 mode).
#include <algorithm>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/env_switch.h"
#include "kernels/cuda/generic_attention.h"
#include "kernels/cuda/lazy_decode_attention.h"
#include "kernels/cuda/skinny_gemm.h"
#include "kernels/cuda/skinny_mma_gemm.h"
#include "worker/backend/cuda_backend_internal.h"
#include "worker/backend/step_order.h"

namespace lazykv::cuda_backend {

namespace {

// LAZYKV_FUSED_KV_WRITE=0: the KV write kernel runs in every step, for comparisons.
bool FusedKvWriteEnabled() {
  static const bool enabled = EnvSwitchOn("LAZYKV_FUSED_KV_WRITE");
  return enabled;
}

// LAZYKV_SHARED_RESIDUAL_BESIDE=0: the chunk-shared decode's residual kernel on the step's
// stream after the shared kernel, for comparisons.
bool ResidualBesideEnabled() {
  static const bool enabled = EnvSwitchOn("LAZYKV_SHARED_RESIDUAL_BESIDE");
  return enabled;
}

// LAZYKV_SHARED_DECODE_EXACT=1: the chunk-shared decode's query and probabilities reach the
// tensor cores as bf16 hi + lo pairs (~1e-5 of the per-sequence kernel) instead of once-rounded
// bf16 (within one bf16 step), at 2 CTAs an SM instead of 3, for comparisons.
bool SharedDecodeExact() {
  static const bool exact = EnvSwitchSet("LAZYKV_SHARED_DECODE_EXACT");
  return exact;
}

// LAZYKV_LAST_SPLIT_MERGE=0: the decode kernel's splits merged by the combine kernel (not
// by the last split), for comparisons.
bool LastSplitMergeEnabled() {
  static const bool enabled = EnvSwitchOn("LAZYKV_LAST_SPLIT_MERGE");
  return enabled;
}

// LAZYKV_PREFILL_TWO_LAUNCHES=0: a step's prefill sequences in one launch of the prefill kernel
// whatever their query counts (PrefillStepOrder), for comparisons.
bool PrefillTwoLaunchesEnabled() {
  static const bool enabled = EnvSwitchOn("LAZYKV_PREFILL_TWO_LAUNCHES");
  return enabled;
}

// LAZYKV_PREFILL_OUT_BF16=0: the prefill kernel's output in fp32 only, converted for the
// output GEMM with the decoding rows', for comparisons.
bool PrefillOutBf16Enabled() {
  static const bool enabled = EnvSwitchOn("LAZYKV_PREFILL_OUT_BF16");
  return enabled;
}

// LAZYKV_DECODE_SPLITS=N: the decode kernel's split count forced (not chosen from the SM
// count and the context), for measurements of the step at other counts.
int ForcedDecodeSplits() {
  static const int splits = EnvCount("LAZYKV_DECODE_SPLITS");
  return splits;
}

// LAZYKV_PREFILL_SPLITS=N: the prefill kernel's split count forced (at most its 16), for
// measurements of a short question over a long cached context at other counts (the split
// workspace grows with it: N partial states of every query row and head).
int ForcedPrefillSplits() {
  static const int splits = EnvCount("LAZYKV_PREFILL_SPLITS");
  return splits;
}

}  // namespace

absl::Status CudaBackend::ReserveSplitCounters(int slots) {
  if (slots <= split_counter_slots_) return absl::OkStatus();
  const size_t bytes = static_cast<size_t>(slots) * sizeof(int32_t);
  split_counter_slots_ = 0;                         // until the counters below are zeroed
  RETURN_IF_ERROR(split_counters_.Reserve(bytes));  // a new allocation: the old one's zeros are gone
  RETURN_IF_ERROR(Cuda(cudaMemsetAsync(split_counters_.as<int32_t>(), 0, bytes, stream_), "split counters"));
  split_counter_slots_ = slots;
  return absl::OkStatus();
}

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

bool CudaBackend::DecodeKernelApplies() const {
  return element_ == cuda::Element::kBf16 && (c_.head_dim == 64 || c_.head_dim == 128);
}

bool CudaBackend::PrefillKernelApplies() const {
  return DecodeKernelApplies() && block_size_ >= 16 && (block_size_ & (block_size_ - 1)) == 0;
}

// A bf16 pass of `rows` rows: a step of a few rows runs the skinny GEMM's fused kernels (small),
// one of 5-16 rows the tensor-core skinny kernel's (mma; Gemm::SkinnyMmaRows); neither in fp32.
CudaBackend::SkinnyStep CudaBackend::SkinnyStepFor(int rows) const {
  SkinnyStep step;
  if (element_ != cuda::Element::kBf16) return step;
  step.small = gemm_->options().skinny_kernel && rows <= cuda::kSkinnyGemmFasterRows;
  step.mma = !step.small && gemm_->SkinnyMmaRows(rows);
  return step;
}

// The output GEMM reads the attention output rounded to bf16 from attn_in_ (cuBLASLt), not fp32
// from attn_ (a skinny kernel's fused rounding).
bool CudaBackend::OutputGemmReadsBf16(int rows) const {
  const SkinnyStep step = SkinnyStepFor(rows);
  return element_ == cuda::Element::kBf16 && !step.small && !step.mma;
}

// The prefill kernels' work starts (PrefillAttentionParams::work_starts): made by a small
// kernel before them, so that the persistent kernel's copy warps do not walk each work tile's
// table at its boundary (1.05-1.09x at 1k-2k keys, bench/results/prefill_order_2026-11-28.md)
// and a one-tile CTA (a question's split) does not search its entry range before its first
// copies. The buffer is the same for every layer: the step's first layer makes the starts and
// the later layers read them (work_starts_made, set by RunLayers). The bytes a launch's part of
// it takes (reserved for any prefill launch), 0 with LAZYKV_PREFILL_WORK_STARTS=0 (the kernels
// walk), for comparisons.
namespace {
size_t WorkStartsBytes(const cuda::PrefillAttentionParams& p) {
  static const bool enabled = EnvSwitchOn("LAZYKV_PREFILL_WORK_STARTS");
  constexpr size_t kAlign = 256;
  return enabled ? (cuda::PrefillWorkStartsBytes(p) + kAlign - 1) / kAlign * kAlign : 0;
}
}  // namespace

// The tensor-core kernels where they apply (a bf16 pool, head dims 64 and 128; decode for
// one-token sequences, prefill for power-of-two blocks of at least 16), the generic kernel
// else. A mixed step (decoding sequences first, then prefill pieces) runs both: a decode
// row in the prefill kernel would take a whole 128-query tile over its context.
absl::Status CudaBackend::Attention(PassPlan& plan) {
  cuda::PrefillAttentionParams& p = plan.attention;
  if (plan.decode_seqs > 0) {
    cuda::DecodeAttentionParams d = cuda::DecodeParamsFrom(p, plan.last_pos, plan.decode_max_entries);
    d.num_seqs = plan.decode_seqs;
    d.num_splits = ForcedDecodeSplits();
    if (plan.shared_decode) {  // this layer's pools, the step's plan
      cuda::SharedDecodeParams& s = plan.shared;
      s.base = d;
      RETURN_IF_ERROR(attn_ws_.Reserve(std::max<size_t>(16, cuda::SharedDecodeWorkspaceBytes(s))));
      s.workspace = attn_ws_.as<float>();
      s.kernel_variant = SharedDecodeExact() ? cuda::kSharedKernelExact : 0;
      if (ResidualBesideEnabled()) {  // the residual kernel beside the shared one
        s.residual_stream = residual_stream_;
        s.fork = residual_fork_;
        s.join = residual_join_;
      }
      RETURN_IF_ERROR(Cuda(cuda::LaunchSharedDecodeAttention(s, stream_), "shared decode attention"));
    } else {
      RETURN_IF_ERROR(
          attn_ws_.Reserve(std::max<size_t>(16, cuda::DecodeWorkspaceBytes(d, cuda::ChooseDecodeSplits(d)))));
      d.workspace = attn_ws_.as<float>();
      if (LastSplitMergeEnabled()) {  // no combine kernel after it
        RETURN_IF_ERROR(ReserveSplitCounters(d.num_seqs * d.kv.n_kv_heads));
        d.split_counters = split_counters_.as<int32_t>();
      }
      if (plan.decode_writes_kv) {  // the kernel writes the new keys and values (no KV write ran)
        const cuda::KvWriteParams& kw = plan.kv_write;
        d.new_tokens = {.qkv = kw.qkv,
                        .slot_blocks = kw.slot_blocks,
                        .slot_index = kw.slot_index,
                        .rope_positions = kw.rope_positions};
      }
      RETURN_IF_ERROR(Cuda(cuda::LaunchLazyDecodeAttention(d, stream_), "decode attention"));
    }
    if (plan.decode_seqs == p.num_seqs) return absl::OkStatus();
  } else if (!PrefillKernelApplies()) {
    return Cuda(cuda::LaunchGenericPagedAttention(p, plan.rows, stream_), "generic attention");
  }
  // The prefill launches: the pieces after the decoding sequences (one, or PrefillStepOrder's two
  // groups), else `p` over every sequence. They share one workspace in stream order (each
  // launch's kernels wait for the grid before them before they write), and each has its own
  // part of the work starts, at the same offset in every layer; both are reserved before the
  // first prefill launch, so that neither moves between the two launches.
  const std::span<cuda::PrefillAttentionParams> launches = plan.PrefillLaunches();
  size_t ws_bytes = 16, starts_bytes = 0;
  for (cuda::PrefillAttentionParams& r : launches) {
    r.kv.k_pool = p.kv.k_pool;  // this layer's pools
    r.kv.v_pool = p.kv.v_pool;
    ws_bytes = std::max(ws_bytes, cuda::PrefillWorkspaceBytes(r, cuda::ChoosePrefillSplits(r)));
    starts_bytes += WorkStartsBytes(r);
  }
  RETURN_IF_ERROR(attn_ws_.Reserve(ws_bytes));
  if (starts_bytes > 0) RETURN_IF_ERROR(work_starts_.Reserve(starts_bytes));
  size_t starts_offset = 0;
  for (cuda::PrefillAttentionParams& r : launches) {
    r.workspace = attn_ws_.as<float>();
    const size_t bytes = WorkStartsBytes(r);
    r.work_starts = bytes > 0 ? work_starts_.as<char>() + starts_offset : nullptr;
    starts_offset += bytes;
    RETURN_IF_ERROR(Cuda(cuda::LaunchLazyPrefillAttention(r, stream_), "prefill attention"));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::RunModel(std::span<const SequenceStep> steps, std::vector<LogitsRows>* wanted) {
  wanted->clear();
  for (const SequenceStep& step : steps) RETURN_IF_ERROR(ValidateStep(step, c_, block_size_, num_blocks_));
  // Host metadata: per new token its id, slot and key position; per sequence its table.
  std::vector<int32_t> tokens, slot_blocks, slot_index, rope_pos, query_pos;
  std::vector<int32_t> ids, counts, deltas, starts, table_offsets = {0}, query_offsets = {0}, pos0, last_pos;
  std::vector<size_t> active;  // steps with tokens, in order
  int max_queries = 0;
  bool all_single = true;
  // The leading run of one-token steps (the engine puts its decoding sequences first); in a
  // decode step, every step.
  size_t lead = 0;
  int lead_max_entries = 0;
  int64_t max_keys = 0;  // the most keys a query sees (the prefill launcher's hint)
  size_t split_seq = 0;  // where PrefillStepOrder's longer group starts in `active` (0: not split)
  // The few-query sequences (at most cuda::kPrefillPackMaxQueries, whose launch packs a KV
  // group's heads into a tile) go after the decoding ones and before the longer ones, so that
  // each group can be its own prefill launch (PassPlan::pieces): a launch takes one heads-per-tile
  // choice, and beside a document's 512 queries a question's 16 rows took a whole 128-row tile
  // per head; two launches took 1.9-2.7x less attention time
  // (bench/results/prefill_schedule_2026-11-29.md). Packing takes heads in powers of two: a
  // group of odd size never packs.
  const bool split =
      PrefillKernelApplies() && pack_prefill_heads_ && c_.group_size() % 2 == 0 && PrefillTwoLaunchesEnabled();
  const size_t few_max = split ? static_cast<size_t>(cuda::kPrefillPackMaxQueries) : 0;
  for (const size_t s : PrefillStepOrder(steps, few_max, &split_seq)) {
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
        query_pos.push_back(static_cast<int32_t>(logical + slot));
      }
      logical += ref.num_tokens;
    }
    tokens.insert(tokens.end(), step.tokens.begin(), step.tokens.end());
    table_offsets.push_back(static_cast<int32_t>(ids.size()));
    query_offsets.push_back(static_cast<int32_t>(tokens.size()));
    pos0.push_back(static_cast<int32_t>(first));
    last_pos.push_back(static_cast<int32_t>(total - 1));
    max_queries = std::max(max_queries, n);
    max_keys = std::max(max_keys, total);
    if (n == 1 && lead + 1 == active.size()) {
      ++lead;
      lead_max_entries = std::max<int>(lead_max_entries, step.context.size());
    }
  }
  const int rows = static_cast<int>(tokens.size());
  if (rows == 0) return absl::OkStatus();
  RETURN_IF_ERROR(ReserveActivations(rows));
  // The rows that want logits (a contiguous run of each such step's rows), in row order.
  std::vector<int32_t> out_rows;
  for (size_t a = 0; a < active.size(); ++a) {
    const SequenceStep& step = steps[active[a]];
    if (step.logits == LogitsWanted::kNone) continue;
    const int count = step.logits == LogitsWanted::kLast ? 1 : query_offsets[a + 1] - query_offsets[a];
    wanted->push_back(LogitsRows{.step = active[a], .first = static_cast<int>(out_rows.size()), .count = count});
    for (int r = query_offsets[a + 1] - count; r < query_offsets[a + 1]; ++r) out_rows.push_back(r);
  }

  // Sequences [0, decode_seqs) run the decode kernel: all of them in a decode step, the
  // leading run in a mixed step (when both tensor-core kernels apply), none else.
  const size_t decode_seqs = all_single && DecodeKernelApplies()                            ? active.size()
                             : lead > 0 && decode_in_mixed_steps_ && PrefillKernelApplies() ? lead
                                                                                            : 0;
  MetaPack pack;
  std::optional<SharedPlanOffsets> shared;
  if (decode_seqs > 0) {
    int64_t total_tokens = 0;
    for (int32_t e = 0; e < table_offsets[decode_seqs]; ++e) total_tokens += counts[e];
    shared = PlanSharedDecode(cuda::SharedDecodeTables{.block_ids = ids.data(),
                                                       .block_tokens = counts.data(),
                                                       .block_deltas = deltas.data(),
                                                       .block_starts = starts.data(),
                                                       .table_offsets = table_offsets.data(),
                                                       .positions = last_pos.data(),
                                                       .num_seqs = static_cast<int>(decode_seqs)},
                              total_tokens, pack);
  }
  // The prefill pieces (PassPlan::pieces), [first, end) in `active`: the sequences after the
  // decoding ones, in two where PrefillStepOrder split them and both groups are prefill rows; none
  // where one launch runs every sequence. Their query offsets count from their own first row.
  std::vector<std::pair<size_t, size_t>> piece_ranges;
  if (split_seq > decode_seqs && split_seq < active.size()) {
    piece_ranges = {{decode_seqs, split_seq}, {split_seq, active.size()}};
  } else if (decode_seqs > 0 && decode_seqs < active.size()) {
    piece_ranges = {{decode_seqs, active.size()}};
  }
  std::vector<size_t> o_piece_qo;
  for (const auto& [first, end] : piece_ranges) {
    std::vector<int32_t> offsets;
    for (size_t a = first; a <= end; ++a) offsets.push_back(query_offsets[a] - query_offsets[first]);
    o_piece_qo.push_back(pack.Add(offsets));
  }
  const size_t o_tokens = pack.Add(tokens), o_sb = pack.Add(slot_blocks), o_si = pack.Add(slot_index),
               o_rp = pack.Add(rope_pos), o_ids = pack.Add(ids), o_counts = pack.Add(counts),
               o_deltas = pack.Add(deltas), o_starts = pack.Add(starts), o_to = pack.Add(table_offsets),
               o_qo = pack.Add(query_offsets), o_pos0 = pack.Add(pos0), o_last = pack.Add(last_pos),
               o_out = pack.Add(out_rows), o_qp = pack.Add(query_pos);
  step_timing_.MarkFirstLaunch(stream_);
  RETURN_IF_ERROR(pack.Upload(meta_host_, meta_, stream_));
  auto meta = [&](size_t offset) { return meta_.as<int32_t>(offset * sizeof(int32_t)); };

  PassPlan plan;
  plan.rows = rows;
  plan.decode_seqs = static_cast<int>(decode_seqs);
  plan.decode_max_entries = lead_max_entries;
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
  ap.max_keys = static_cast<int>(std::min<int64_t>(max_keys, INT32_MAX));
  ap.total_queries = rows;
  ap.pack_heads = pack_prefill_heads_ ? 0 : 1;  // for the step (the rows after decoding ones too)
  ap.persistent_min_work_tiles = prefill_persistent_min_work_tiles_;
  ap.num_splits = ForcedPrefillSplits();
  plan.num_pieces = static_cast<int>(piece_ranges.size());
  for (size_t i = 0; i < piece_ranges.size(); ++i) {
    const auto [first, end] = piece_ranges[i];
    cuda::PrefillAttentionParams& r = plan.pieces[i];
    r = ap;
    const size_t row_offset = static_cast<size_t>(query_offsets[first]) * c_.q_dim();
    r.q = ap.q + row_offset;
    r.out = ap.out + row_offset;
    r.query_offsets = meta(o_piece_qo[i]);
    r.query_pos0 = ap.query_pos0 + first;
    r.kv.table_offsets = ap.kv.table_offsets + first;  // entries index the whole table
    r.num_seqs = static_cast<int>(end - first);
    int piece_max_queries = 0;
    int64_t piece_max_keys = 0;
    for (size_t a = first; a < end; ++a) {
      piece_max_queries = std::max(piece_max_queries, query_offsets[a + 1] - query_offsets[a]);
      piece_max_keys = std::max<int64_t>(piece_max_keys, last_pos[a] + 1);
    }
    r.max_queries_per_seq = piece_max_queries;
    r.max_keys = static_cast<int>(std::min<int64_t>(piece_max_keys, INT32_MAX));
    r.total_queries = query_offsets[end] - query_offsets[first];
  }
  // The prefill kernel's launches (none where every sequence decodes or the generic kernel runs).
  const std::span<cuda::PrefillAttentionParams> launches = decode_seqs < active.size() && PrefillKernelApplies()
                                                               ? plan.PrefillLaunches()
                                                               : std::span<cuda::PrefillAttentionParams>();
  // Where the output GEMM reads bf16 X from attn_in_ (cuBLASLt's: not a fused skinny kernel), a
  // launch whose kernel writes bf16 (the persistent or the one-tile kernel, unsplit:
  // cuda::PrefillWritesBf16) writes its rows' output there (LaunchToBf16's rounding, bit for bit:
  // PrefillAttentionParams::out_bf16): 1.3-1.4x the attention and its conversion at 1k keys
  // (bench/results/prefill_epilogue_2026-11-29.md). Each launch is asked with the bf16 output
  // wanted (a long prefill takes the persistent kernel only then). The rows before the first such
  // launch are converted after the attention in one kernel (converted_rows); a later launch that
  // does not write bf16 keeps out_bf16 and its launcher converts its rows.
  // The KV write rotates the query at its positions (q_rotated) for the rows from the first launch
  // that gains from it (the persistent kernel's; every prefill launch with RotatedQuery::kAlways),
  // so that the kernel rotates it only by each delta; the decoding rows' stays raw (the decode
  // kernels rotate it themselves), as does every row for the generic kernel.
  const bool want_bf16 = OutputGemmReadsBf16(rows) && PrefillOutBf16Enabled();
  bool bf16_written = false;
  int rotated_from = -1, persistent_launches = 0;
  for (cuda::PrefillAttentionParams& launch : launches) {
    const int row0 = static_cast<int>((launch.out - ap.out) / c_.q_dim());  // its first row
    if (want_bf16) launch.out_bf16 = attn_in_.as<bf16>() + static_cast<size_t>(row0) * c_.q_dim();
    if (launch.out_bf16 != nullptr && !bf16_written && cuda::PrefillWritesBf16(launch)) {
      bf16_written = true;
      plan.converted_rows = row0;
    }
    if (!bf16_written) launch.out_bf16 = nullptr;
    const bool persistent = cuda::PrefillTakesPersistentKernel(launch);  // with out_bf16 as launched
    persistent_launches += persistent ? 1 : 0;
    const bool rotate =
        rotated_query_ == RotatedQuery::kAlways || (rotated_query_ == RotatedQuery::kWherePersistent && persistent);
    if (rotate && rotated_from < 0) rotated_from = row0;
    launch.q_rotated = rotated_from >= 0;
  }
  prefill_stats_.persistent_launches += persistent_launches;
  if (plan.num_pieces == 2) {
    ++prefill_stats_.two_launch_steps;
    prefill_stats_.mixed_kernel_steps += persistent_launches == 1 ? 1 : 0;
  }
  // Pure decode steps without chunk sharing fuse the KV write into the decode kernel where
  // each new token is the last token of its sequence's last entry (as the engine lays
  // tables out); LAZYKV_FUSED_KV_WRITE=0 keeps the KV write kernel, for comparisons.
  plan.decode_writes_kv = decode_seqs == active.size() && !shared && FusedKvWriteEnabled();
  for (size_t a = 0; plan.decode_writes_kv && a < active.size(); ++a) {
    const int32_t last = table_offsets[a + 1] - 1;
    plan.decode_writes_kv =
        last >= table_offsets[a] && slot_blocks[a] == ids[last] && slot_index[a] == counts[last] - 1;
  }
  if (shared) {
    cuda::SharedDecodeParams& s = plan.shared;
    plan.shared_decode = true;
    s.items = reinterpret_cast<const cuda::SharedWorkItem*>(meta(shared->items));
    s.members = reinterpret_cast<const cuda::SharedMember*>(meta(shared->members));
    s.shared_parts = meta(shared->parts);
    s.num_items = static_cast<int>(shared->plan.items.size());
    s.max_shared_parts = shared->plan.max_shared_parts;
    s.res_block_ids = meta(shared->ids);
    s.res_block_tokens = meta(shared->tokens);
    s.res_block_deltas = meta(shared->deltas);
    s.res_block_starts = meta(shared->starts);
    s.res_offsets = meta(shared->offsets);
    s.max_residual_entries = shared->plan.max_residual_entries;
  }
  cuda::KvWriteParams& kw = plan.kv_write;
  kw.qkv = qkv_.as<float>();
  kw.q_out = q_.as<float>();
  kw.kv = LayerKv(0);
  kw.slot_blocks = meta(o_sb);
  kw.slot_index = meta(o_si);
  kw.rope_positions = meta(o_rp);
  kw.rows = rows;
  kw.n_heads = c_.n_heads;
  if (rotated_from >= 0) {
    kw.q_positions = meta(o_qp);
    kw.rotated_q_from = rotated_from;
  }
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
  // A step of a few rows in bf16 runs the skinny GEMM's fused kernels (skinny_gemm.h; unless
  // the GEMM's options turn the skinny kernel off): the attention output rounded to bf16 in
  // the output GEMM's loads, SwiGLU in the gate/up GEMM's epilogue (both bit for bit the
  // unfused kernels' results), and the two norms of a layer in the loads of the GEMMs after
  // them (LAZYKV_NORM_IN_GEMM=0 keeps the norm kernels, for comparisons in one binary).
  // A step of 5-16 rows in bf16 whose GEMMs run the tensor-core skinny kernel (Gemm's
  // SkinnyMmaRows) runs its two exact fusions too: SwiGLU in the gate/up GEMM's epilogue, and the
  // rounding of the attention output as the output GEMM builds its fragments.
  const SkinnyStep skinny = SkinnyStepFor(rows);
  const bool small_step = skinny.small, mma_step = skinny.mma;
  // The residual stream is x. A sublayer's output either waits in y for the next norm kernel
  // to add it (y_pending), or, where the GEMMs after the norms norm x themselves, is added to x
  // by the sublayer's last GEMM (beta 1 in the skinny kernel: the same fp32 sum as the norm
  // kernel's). Decided once for the pass: every layer's GEMMs must take it.
  static const bool norm_in_gemm = EnvSwitchOn("LAZYKV_NORM_IN_GEMM");
  bool norms_in_gemm = false;
  if constexpr (std::is_same_v<T, bf16>) {
    norms_in_gemm = small_step && norm_in_gemm;
    for (int l = 0; norms_in_gemm && l < c_.n_layers; ++l) {
      const DeviceLayer& lw = w_->layer(l);
      norms_in_gemm = cuda::SkinnyGemmApplies(attn_.as<float>(), rows, q_dim, matrix(lw.wo)) &&
                      cuda::SkinnyGemmApplies(h_.as<T>(), rows, hidden, matrix(lw.w_down)) &&
                      cuda::SkinnyNormApplies(x, lw.attn_norm, rows, dim, matrix(lw.wqkv)) &&
                      cuda::SkinnyNormApplies(x, lw.ffn_norm, rows, dim, matrix(lw.w_gate_up));
    }
  }
  float* sublayer_out = norms_in_gemm ? x : y;
  const float sublayer_beta = norms_in_gemm ? 1.0f : 0.0f;
  bool y_pending = false;
  for (int l = 0; l < c_.n_layers; ++l) {
    const DeviceLayer& lw = w_->layer(l);
    const bool fused_output =
        (small_step && cuda::SkinnyGemmApplies(attn_.as<float>(), rows, q_dim, static_cast<const bf16*>(lw.wo))) ||
        (mma_step && cuda::SkinnyMmaGemmApplies(attn_.as<float>(), rows, q_dim, static_cast<const bf16*>(lw.wo)));
    const bool fused_swiglu =
        !norms_in_gemm &&
        ((small_step && cuda::SkinnyGemmApplies(xb, rows, dim, static_cast<const bf16*>(lw.w_gate_up))) ||
         (mma_step && cuda::SkinnyMmaGemmApplies(xb, rows, dim, static_cast<const bf16*>(lw.w_gate_up))));
    if (norms_in_gemm) {
      if constexpr (std::is_same_v<T, bf16>) {
        RETURN_IF_ERROR(Cuda(cuda::LaunchSkinnyGemmNormingX(x, lw.attn_norm, c_.norm_eps, rows, dim, matrix(lw.wqkv),
                                                            q_dim + 2 * kv_dim, qkv_.as<float>(), stream_),
                             "attention norm and QKV GEMM"));
      }
    } else {
      RETURN_IF_ERROR(Cuda(
          cuda::LaunchResidualRmsNorm(x, y_pending ? y : nullptr, lw.attn_norm, rows, dim, c_.norm_eps, xb, stream_),
          "attention norm"));
      RETURN_IF_ERROR(gemm_->Run(xb, rows, dim, matrix(lw.wqkv), q_dim + 2 * kv_dim, qkv_.as<float>()));
    }
    // The prefill kernels' work starts depend on the step's tables, not the layer: the first
    // layer's launch makes them for all. A later layer's one-tile kernel reads them before its
    // wait for the kernel before it (the header's contract): the layer's GEMMs between let their
    // successors start only as they end (no early trigger), after their own waits, so the starts
    // kernel has completed long before.
    ap.work_starts_made = l > 0;
    for (cuda::PrefillAttentionParams& piece : plan.pieces) piece.work_starts_made = l > 0;
    kw.kv.k_pool = ap.kv.k_pool = KPool(l);
    kw.kv.v_pool = ap.kv.v_pool = VPool(l);
    if (!plan.decode_writes_kv) RETURN_IF_ERROR(Cuda(cuda::LaunchKvWrite(kw, stream_), "KV write"));
    RETURN_IF_ERROR(Attention(plan));
    if constexpr (std::is_same_v<T, float>) {
      RETURN_IF_ERROR(gemm_->Run(attn_.as<float>(), rows, q_dim, matrix(lw.wo), dim, y));
    } else if (fused_output) {  // the bf16 rounding in the GEMM's loads
      RETURN_IF_ERROR(
          Cuda(mma_step ? cuda::LaunchSkinnyMmaGemmRoundingX(attn_.as<float>(), rows, q_dim, matrix(lw.wo), dim,
                                                             sublayer_out, sublayer_beta, gemm_->mma_scratch(), stream_)
                        : cuda::LaunchSkinnyGemmRoundingX(attn_.as<float>(), rows, q_dim, matrix(lw.wo), dim,
                                                          sublayer_out, sublayer_beta, stream_),
               "attention output GEMM"));
    } else {
      if (const int converted = std::min(rows, plan.converted_rows); converted > 0) {  // not written in bf16
        RETURN_IF_ERROR(Cuda(
            cuda::LaunchToBf16(attn_.as<float>(), static_cast<size_t>(converted) * q_dim, attn_in_.as<T>(), stream_),
            "attention output"));
      }
      RETURN_IF_ERROR(gemm_->Run(attn_in_.as<T>(), rows, q_dim, matrix(lw.wo), dim, y));
    }
    if (norms_in_gemm) {
      if constexpr (std::is_same_v<T, bf16>) {
        RETURN_IF_ERROR(Cuda(cuda::LaunchSkinnyGateUpSwiGluNormingX(x, lw.ffn_norm, c_.norm_eps, rows, dim,
                                                                    matrix(lw.w_gate_up), hidden, h_.as<T>(), stream_),
                             "ffn norm, gate/up GEMM and SwiGLU"));
      }
    } else {
      RETURN_IF_ERROR(
          Cuda(cuda::LaunchResidualRmsNorm(x, y, lw.ffn_norm, rows, dim, c_.norm_eps, xb, stream_), "ffn norm"));
      if (fused_swiglu) {  // SwiGLU in the GEMM's epilogue
        if constexpr (std::is_same_v<T, bf16>) {
          RETURN_IF_ERROR(Cuda(mma_step ? cuda::LaunchSkinnyMmaGateUpSwiGlu(xb, rows, dim, matrix(lw.w_gate_up), hidden,
                                                                            h_.as<T>(), gemm_->mma_scratch(), stream_)
                                        : cuda::LaunchSkinnyGateUpSwiGlu(xb, rows, dim, matrix(lw.w_gate_up), hidden,
                                                                         h_.as<T>(), stream_),
                               "gate/up GEMM and SwiGLU"));
        }
      } else {
        RETURN_IF_ERROR(gemm_->Run(xb, rows, dim, matrix(lw.w_gate_up), 2 * hidden, gu_.as<float>()));
        RETURN_IF_ERROR(Cuda(cuda::LaunchSwiGlu(gu_.as<float>(), rows, hidden, h_.as<T>(), stream_), "SwiGLU"));
      }
    }
    RETURN_IF_ERROR(gemm_->Run(h_.as<T>(), rows, hidden, matrix(lw.w_down), dim, sublayer_out, sublayer_beta));
    y_pending = !norms_in_gemm;  // the next norm kernel (if any) adds y
  }

  if (plan.n_out == 0) return absl::OkStatus();
  // The output layer: the final norm, then the wanted rows gathered into one matrix (unless
  // they are every row already) for one classifier GEMM.
  const int n_out = plan.n_out;
  RETURN_IF_ERROR(Cuda(
      cuda::LaunchResidualRmsNorm(x, y_pending ? y : nullptr, w_->final_norm(), rows, dim, c_.norm_eps, xb, stream_),
      "final norm"));
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
