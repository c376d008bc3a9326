// Chunk-shared decode attention (kernels/cuda/shared_decode_attention.h) against the per-sequence
// lazy decode kernel (LaunchLazyDecodeAttention), one layer, in the same run on the same inputs.
// Shape: Llama-3-8B attention (32 query heads, 8 KV heads, head dim 128), bf16 KV in blocks of 16
// (random normal values). Batch: each sequence holds `docs` distinct documents of 512 tokens drawn
// from Zipf(s) over a catalogue of `catalogue` documents, each at its own delta (its logical
// start), then 72..88 own tokens; the query is the last own token.
//
// Reported per configuration: the plan (items, members, residual entries), the host planner's
// time (median of 50 plans; it runs once per step for all layers), KV bytes per step (per-sequence:
// every sequence's whole KV; shared: each work item's blocks once plus the residual entries), the
// kernels' time (medians of alternated single launches after warm-up, cudaEvents; and graph replays
// of 10 launches, as an engine would run them), the effective bandwidth (bytes / time), and the
// largest relative difference between the two outputs. The first three configurations also
// time alternatives (graph replays): entries and members per work item, solo items, residual
// splits and the shared kernel's variants (SharedKernelVariantName).
//
// usage: shared_decode_bench [BATCH DOCS CATALOGUE ZIPF_S]   (no arguments: the default table)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <set>
#include <vector>

#include "bench/cuda_bench_util.h"
#include "common/model_config.h"
#include "kernels/cuda/lazy_decode_attention.h"
#include "kernels/cuda/rope_style.h"
#include "kernels/cuda/shared_decode_attention.h"
#include "kernels/cuda/shared_decode_plan.h"

namespace {

using lazykv::bench::AlternatedMedianMs;
using lazykv::bench::FillRandomBf16;
using lazykv::bench::GraphMedianMs;
using lazykv::bench::MedianMs;
using lazykv::bench::Upload;

constexpr int kHeads = 32, kKvHeads = 8, kHd = 128, kBlock = 16, kDocTokens = 512;
constexpr double kTokenBytes = 2.0 * kKvHeads * kHd * 2;  // K and V, bf16, all KV heads

struct Config {
  int batch, docs, catalogue;
  double zipf_s;
  bool sweep = false;  // also time other planner options and residual splits
};

// A plan uploaded over `base` (its output redirected to `out`); Free() releases what it uploaded.
lazykv::cuda::SharedDecodeParams UploadPlan(const lazykv::cuda::SharedDecodePlan& plan,
                                            const lazykv::cuda::DecodeAttentionParams& base, float* out,
                                            int residual_splits, int kernel_variant) {
  lazykv::cuda::SharedDecodeParams p;
  p.base = base;
  p.base.out = out;
  p.items = Upload(plan.items);
  p.members = Upload(plan.members);
  p.shared_parts = Upload(plan.shared_parts);
  p.num_items = static_cast<int>(plan.items.size());
  p.max_shared_parts = plan.max_shared_parts;
  p.res_block_ids = Upload(plan.res_block_ids);
  p.res_block_tokens = Upload(plan.res_block_tokens);
  p.res_block_deltas = Upload(plan.res_block_deltas);
  p.res_block_starts = Upload(plan.res_block_starts);
  p.res_offsets = Upload(plan.res_offsets);
  p.max_residual_entries = plan.max_residual_entries;
  p.residual_splits = residual_splits;
  p.kernel_variant = kernel_variant;
  CHECK_CUDA(cudaMalloc(&p.workspace, lazykv::cuda::SharedDecodeWorkspaceBytes(p) + 4));
  return p;
}

void Free(const lazykv::cuda::SharedDecodeParams& p) {
  for (const void* ptr :
       {(const void*)p.items, (const void*)p.members, (const void*)p.shared_parts, (const void*)p.res_block_ids,
        (const void*)p.res_block_tokens, (const void*)p.res_block_deltas, (const void*)p.res_block_starts,
        (const void*)p.res_offsets, (const void*)p.workspace}) {
    cudaFree(const_cast<void*>(ptr));
  }
}

// max |a - b| / max |a| over two device outputs of n floats.
double MaxRelDiff(const float* a_dev, const float* b_dev, size_t n) {
  std::vector<float> a(n), b(n);
  CHECK_CUDA(cudaMemcpy(a.data(), a_dev, n * 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(b.data(), b_dev, n * 4, cudaMemcpyDeviceToHost));
  double max_diff = 0.0, max_ref = 0.0;
  for (size_t i = 0; i < n; ++i) {
    max_diff = std::max(max_diff, std::abs(static_cast<double>(a[i]) - b[i]));
    max_ref = std::max(max_ref, std::abs(static_cast<double>(a[i])));
  }
  return max_diff / std::max(max_ref, 1e-30);
}

void RunConfig(const Config& c, const double* inv_freq, std::mt19937& rng) {
  using namespace lazykv;
  const int doc_blocks = kDocTokens / kBlock;
  // Pool: the blocks of each document in use (allocated at its first use), and each sequence's own.
  std::vector<double> weights(c.catalogue);
  for (int d = 0; d < c.catalogue; ++d) weights[d] = 1.0 / std::pow(d + 1.0, c.zipf_s);
  std::discrete_distribution<int> pick(weights.begin(), weights.end());
  int32_t next_block = 0;
  std::vector<int32_t> doc_first_block(c.catalogue, -1);
  std::vector<int32_t> ids, tokens, deltas, starts, offsets = {0}, positions;
  int64_t total_tokens = 0;
  std::set<int> used_docs;
  for (int s = 0; s < c.batch; ++s) {
    std::set<int> chosen;
    std::vector<int> order;
    while (static_cast<int>(order.size()) < std::min(c.docs, c.catalogue)) {
      const int d = pick(rng);
      if (chosen.insert(d).second) order.push_back(d);
    }
    int32_t length = 0;
    for (int d : order) {
      used_docs.insert(d);
      if (doc_first_block[d] < 0) {
        doc_first_block[d] = next_block;
        next_block += doc_blocks;
      }
      for (int b = 0; b < doc_blocks; ++b) {
        ids.push_back(doc_first_block[d] + b);
        tokens.push_back(kBlock);
        deltas.push_back(length - b * kBlock);  // one delta per use: the document's logical start
        starts.push_back(length);
        length += kBlock;
      }
    }
    const int own = 72 + static_cast<int>(rng() % 17);
    for (int done = 0; done < own; done += kBlock) {
      ids.push_back(next_block++);
      tokens.push_back(std::min(kBlock, own - done));
      deltas.push_back(0);
      starts.push_back(length);
      length += tokens.back();
    }
    offsets.push_back(static_cast<int32_t>(ids.size()));
    positions.push_back(length - 1);
    total_tokens += length;
  }
  int max_entries = 0;
  for (int s = 0; s < c.batch; ++s) max_entries = std::max(max_entries, offsets[s + 1] - offsets[s]);

  // The plan, timed on the host.
  const cuda::SharedDecodeTables tables{ids.data(),     tokens.data(),    deltas.data(), starts.data(),
                                        offsets.data(), positions.data(), c.batch};
  const cuda::SharedDecodePlanOptions options = cuda::SharedDecodeOptionsFor(kHeads, kKvHeads, kBlock);
  cuda::SharedDecodePlan plan;
  std::vector<double> plan_us;
  for (int i = 0; i < 50; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    plan = cuda::PlanSharedDecode(tables, options);
    plan_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(plan_us.begin(), plan_us.begin() + 25, plan_us.end());
  int64_t residual_tokens = 0;
  for (int32_t t : plan.res_block_tokens) residual_tokens += t;

  const size_t pool_elems = static_cast<size_t>(next_block) * kBlock * kKvHeads * kHd;
  void *k, *v;
  CHECK_CUDA(cudaMalloc(&k, pool_elems * 2));
  CHECK_CUDA(cudaMalloc(&v, pool_elems * 2));
  FillRandomBf16(k, pool_elems, rng);
  FillRandomBf16(v, pool_elems, rng);
  std::vector<float> q(static_cast<size_t>(c.batch) * kHeads * kHd);
  std::normal_distribution<float> dist;
  for (float& x : q) x = dist(rng);

  cuda::DecodeAttentionParams base;
  base.q = Upload(q);
  base.kv.k_pool = k;
  base.kv.v_pool = v;
  base.kv.block_ids = Upload(ids);
  base.kv.block_tokens = Upload(tokens);
  base.kv.block_deltas = Upload(deltas);
  base.kv.block_starts = Upload(starts);
  base.kv.table_offsets = Upload(offsets);
  base.kv.inv_freq = inv_freq;
  base.kv.n_kv_heads = kKvHeads;
  base.kv.head_dim = kHd;
  base.kv.block_size = kBlock;
  base.kv.rope_style = cuda::RopeStyle::kRotateHalf;
  base.positions = Upload(positions);
  base.num_seqs = c.batch;
  base.n_heads = kHeads;
  base.max_entries_per_seq = max_entries;
  const int splits = cuda::ChooseDecodeSplits(base);
  CHECK_CUDA(cudaMalloc(&base.workspace, cuda::DecodeWorkspaceBytes(base, splits) + 4));
  CHECK_CUDA(cudaMalloc(&base.out, q.size() * sizeof(float)));

  float* shared_out;
  CHECK_CUDA(cudaMalloc(&shared_out, q.size() * sizeof(float)));
  const cuda::SharedDecodeParams p = UploadPlan(plan, base, shared_out, 0, 0);

  // Both outputs once, compared.
  CHECK_CUDA(cuda::LaunchLazyDecodeAttention(base, nullptr));
  CHECK_CUDA(cuda::LaunchSharedDecodeAttention(p, nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  const double rel_diff = MaxRelDiff(base.out, shared_out, q.size());

  const auto [per_seq_ms, shared_ms] = AlternatedMedianMs([&] { cuda::LaunchLazyDecodeAttention(base, nullptr); },
                                                          [&] { cuda::LaunchSharedDecodeAttention(p, nullptr); }, 100);
  const float per_seq_graph = GraphMedianMs([&](cudaStream_t s) { cuda::LaunchLazyDecodeAttention(base, s); }, 30);
  const float shared_graph = GraphMedianMs([&](cudaStream_t s) { cuda::LaunchSharedDecodeAttention(p, s); }, 30);
  CHECK_CUDA(cudaGetLastError());

  const double per_seq_bytes = total_tokens * kTokenBytes;
  const double shared_bytes = (plan.item_tokens + residual_tokens) * kTokenBytes;
  std::printf("\n== batch %d, %d documents of %d tokens per sequence, Zipf(%.2f) over %d (%zu distinct used)\n",
              c.batch, c.docs, kDocTokens, c.zipf_s, c.catalogue, used_docs.size());
  std::printf(
      "plan: %zu items (%d runs), %zu members, max %d shared parts/seq, residual %lld tokens (max %d "
      "entries/seq); host planner %.1f us (median of 50)\n",
      plan.items.size(), plan.num_runs, plan.members.size(), plan.max_shared_parts,
      static_cast<long long>(residual_tokens), plan.max_residual_entries, plan_us[25]);
  std::printf("context tokens %lld; shared references %lld tokens (%.1f%%); per-sequence splits %d\n",
              static_cast<long long>(total_tokens), static_cast<long long>(plan.shared_token_refs),
              100.0 * plan.shared_token_refs / total_tokens, splits);
  std::printf("%-12s %10s %10s %12s %12s %14s\n", "path", "event_us", "graph_us", "KV_MB/step", "GB/s(event)",
              "GB/s(graph)");
  std::printf("%-12s %10.1f %10.1f %12.1f %12.0f %14.0f\n", "per-sequence", per_seq_ms * 1e3, per_seq_graph * 1e3,
              per_seq_bytes / 1e6, per_seq_bytes / per_seq_ms / 1e6, per_seq_bytes / per_seq_graph / 1e6);
  std::printf("%-12s %10.1f %10.1f %12.1f %12.0f %14.0f\n", "shared", shared_ms * 1e3, shared_graph * 1e3,
              shared_bytes / 1e6, shared_bytes / shared_ms / 1e6, shared_bytes / shared_graph / 1e6);
  std::printf("speedup: %.2fx (event), %.2fx (graph); max |shared - per-sequence| / max |per-sequence| = %.2e\n",
              per_seq_ms / shared_ms, per_seq_graph / shared_graph, rel_diff);
  // The residual kernel beside the shared one: a second stream, forked and joined (the backend's
  // way); the sweep below times each row that way too.
  cudaStream_t side = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  {
    CHECK_CUDA(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    CHECK_CUDA(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CHECK_CUDA(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    cuda::SharedDecodeParams beside = p;
    beside.residual_stream = side;
    beside.fork = fork;
    beside.join = join;
    CHECK_CUDA(cudaMemset(shared_out, 0xff, q.size() * sizeof(float)));
    CHECK_CUDA(cuda::LaunchSharedDecodeAttention(beside, nullptr));
    CHECK_CUDA(cudaDeviceSynchronize());
    const double beside_diff = MaxRelDiff(base.out, shared_out, q.size());
    const auto [per_seq_again_ms, beside_ms] =
        AlternatedMedianMs([&] { cuda::LaunchLazyDecodeAttention(base, nullptr); },
                           [&] { cuda::LaunchSharedDecodeAttention(beside, nullptr); }, 100);
    const float beside_graph =
        GraphMedianMs([&](cudaStream_t st) { cuda::LaunchSharedDecodeAttention(beside, st); }, 30);
    CHECK_CUDA(cudaGetLastError());
    std::printf("%-12s %10.1f %10.1f %12.1f %12.0f %14.0f\n", "shared+side", beside_ms * 1e3, beside_graph * 1e3,
                shared_bytes / 1e6, shared_bytes / beside_ms / 1e6, shared_bytes / beside_graph / 1e6);
    std::printf("residual kernel beside the shared one: speedup %.2fx (event), %.2fx (graph); max rel diff %.2e\n",
                per_seq_again_ms / beside_ms, per_seq_graph / beside_graph, beside_diff);
  }
  std::fflush(stdout);

  if (c.sweep) {  // planner options (entries, members per item, solo), residual splits, kernel variants
    std::printf("%-62s %6s %10s %10s %12s %10s %12s %10s\n", "entries,members,solo,res splits,kernel variant", "items",
                "graph_us", "speedup", "KV_MB/step", "rel_diff", "beside_us", "speedup");
    std::vector<std::array<int, 5>> variants;  // entries, members, residual splits, kernel variant, solo
    for (int solo = 0; solo < 2; ++solo) {
      for (int entries : {16, 32}) {
        for (int v = 0; v < cuda::kSharedKernelVariants; ++v) variants.push_back({entries, 16, 0, v, solo});
      }
    }
    variants.push_back({8, 16, 0, 0, 0});
    variants.push_back({64, 16, 0, 0, 0});
    variants.push_back({16, 8, 0, 0, 0});
    variants.push_back({16, 16, 4, 0, 0});
    variants.push_back({16, 16, 4, cuda::kSharedKernelExact, 0});
    for (const auto& var : variants) {
      cuda::SharedDecodePlanOptions o = options;
      o.max_entries_per_item = var[0];
      o.max_members = var[1];
      o.solo_items = var[4] != 0;
      const cuda::SharedDecodePlan vplan = cuda::PlanSharedDecode(tables, o);
      const cuda::SharedDecodeParams vp = UploadPlan(vplan, base, shared_out, var[2], var[3]);
      CHECK_CUDA(cudaMemset(shared_out, 0xff, q.size() * sizeof(float)));
      CHECK_CUDA(cuda::LaunchSharedDecodeAttention(vp, nullptr));
      CHECK_CUDA(cudaDeviceSynchronize());
      const double diff = MaxRelDiff(base.out, shared_out, q.size());
      const float ms = GraphMedianMs([&](cudaStream_t st) { cuda::LaunchSharedDecodeAttention(vp, st); }, 30);
      cuda::SharedDecodeParams vb = vp;
      vb.residual_stream = side;
      vb.fork = fork;
      vb.join = join;
      const float beside_ms = GraphMedianMs([&](cudaStream_t st) { cuda::LaunchSharedDecodeAttention(vb, st); }, 30);
      int64_t vres_tokens = 0;
      for (int32_t t : vplan.res_block_tokens) vres_tokens += t;
      const double bytes = (vplan.item_tokens + vres_tokens) * kTokenBytes;
      char name[96];
      std::snprintf(name, sizeof(name), "%d,%d,%s,%d(=%d),%d (%s)", var[0], var[1], var[4] ? "solo" : "-", var[2],
                    cuda::SharedResidualSplits(vp), var[3], cuda::SharedKernelVariantName(var[3]));
      std::printf("%-62s %6zu %10.1f %9.2fx %12.1f %10.2e %12.1f %9.2fx\n", name, vplan.items.size(), ms * 1e3,
                  per_seq_graph / ms, bytes / 1e6, diff, beside_ms * 1e3, per_seq_graph / beside_ms);
      Free(vp);
    }
    std::fflush(stdout);
  }
  cudaEventDestroy(fork);
  cudaEventDestroy(join);
  cudaStreamDestroy(side);

  for (const void* ptr : {(const void*)base.q, (const void*)base.kv.block_ids, (const void*)base.kv.block_tokens,
                          (const void*)base.kv.block_deltas, (const void*)base.kv.block_starts,
                          (const void*)base.kv.table_offsets, (const void*)base.positions, (const void*)base.workspace,
                          (const void*)base.out, (const void*)shared_out, (const void*)k, (const void*)v}) {
    cudaFree(const_cast<void*>(ptr));
  }
  Free(p);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace lazykv;
  RopeConfig rope;
  rope.style = RopeStyle::kRotateHalf;
  rope.theta = 500000;
  rope.llama3_scaling = true;
  double* inv_freq = Upload(RopeInverseFrequencies(rope, kHd));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  std::mt19937 rng(1);
  std::vector<Config> configs;
  if (argc == 5) {
    configs.push_back({std::atoi(argv[1]), std::atoi(argv[2]), std::atoi(argv[3]), std::atof(argv[4])});
  } else if (argc == 1) {
    configs = {{64, 8, 100, 1.1, true},  // the acceptance shape (issue 25)
               {32, 8, 100, 1.1, true},
               {128, 8, 100, 1.1, true},
               {64, 8, 1000, 1.1},
               {64, 8, 100000, 0.0}};  // next to no sharing: the shared path's overhead
  } else {
    std::fprintf(stderr, "usage: shared_decode_bench [BATCH DOCS CATALOGUE ZIPF_S]\n");
    return 2;
  }
  for (const Config& c : configs) RunConfig(c, inv_freq, rng);
  return 0;
}
