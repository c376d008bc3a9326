// The CUDA backend's choice of chunk-shared decode attention per decode step
// (kernels/cuda/shared_decode_attention.h): plan the step's shared block runs once for all
// layers, and run the shared kernels only when they save enough of the KV reads to pay for
// their extra launches and the merge.
#include "kernels/cuda/shared_decode_plan.h"
#include "worker/backend/cuda_backend_internal.h"

namespace lazykv::cuda_backend {

std::optional<CudaBackend::SharedPlanOffsets> CudaBackend::PlanSharedDecode(const cuda::SharedDecodeTables& tables,
                                                                            int64_t total_tokens, MetaPack& pack) {
  if (shared_decode_ == SharedDecode::kOff || !DecodeKernelApplies() || c_.group_size() > 8) {
    return std::nullopt;  // the per-sequence tensor-core kernel does not apply either
  }
  // One sequence shares blocks only with itself (a document given twice: rare), and planning
  // costs a batch-1 step host time before its first launch: kAuto leaves it to the
  // per-sequence kernel.
  if (shared_decode_ == SharedDecode::kAuto && tables.num_seqs < 2) return std::nullopt;
  SharedPlanOffsets out;
  out.plan = cuda::PlanSharedDecode(tables, cuda::SharedDecodeOptionsFor(c_.n_heads, c_.n_kv_heads, block_size_));
  const cuda::SharedDecodePlan& plan = out.plan;
  if (plan.items.empty()) return std::nullopt;
  // Tokens each layer's attention no longer reads: every reference of a shared run but one.
  const int64_t saved = plan.shared_token_refs - plan.item_tokens;
  if (shared_decode_ == SharedDecode::kAuto && saved * 5 < total_tokens) return std::nullopt;
  ++shared_stats_.steps;
  shared_stats_.tokens_saved += static_cast<uint64_t>(std::max<int64_t>(saved, 0));
  out.items = pack.AddStructs(plan.items);
  out.members = pack.AddStructs(plan.members);
  out.parts = pack.Add(plan.shared_parts);
  out.ids = pack.Add(plan.res_block_ids);
  out.tokens = pack.Add(plan.res_block_tokens);
  out.deltas = pack.Add(plan.res_block_deltas);
  out.starts = pack.Add(plan.res_block_starts);
  out.offsets = pack.Add(plan.res_offsets);
  return out;
}

}  // namespace lazykv::cuda_backend
