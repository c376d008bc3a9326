#include "bench/prefill_paged_batch.h"

#include <algorithm>

#include "bench/cuda_bench_util.h"
#include "bench/prefill_bench_device.h"

namespace lazykv::bench {

PagedBatch MakePagedBatch(const std::vector<SeqLayout>& seqs, int doc_tokens, int block, int kv_heads, int hd,
                          std::mt19937& rng) {
  PagedBatch b;
  std::vector<int32_t> ids, tokens, starts, deltas, offsets = {0};
  int next_block = 0;
  for (const SeqLayout& s : seqs) {
    int pos = 0;
    const auto add = [&](int n, int32_t delta) {
      for (int done = 0; done < n; done += block) {
        ids.push_back(next_block++);
        tokens.push_back(std::min(block, n - done));
        starts.push_back(pos + done);
        deltas.push_back(delta);
      }
      pos += n;
    };
    for (int d = 0; d < s.docs; ++d) add(doc_tokens, 1 + static_cast<int32_t>(rng() % 100000));
    add(s.own, 0);
    offsets.push_back(static_cast<int32_t>(ids.size()));
  }
  const size_t elems = static_cast<size_t>(next_block) * block * kv_heads * hd;
  const uint64_t seed = seqs.size();
  b.pool_bytes = elems * 2;
  CHECK_CUDA(cudaMalloc(&b.k, b.pool_bytes));
  CHECK_CUDA(cudaMalloc(&b.v, b.pool_bytes));
  CHECK_CUDA(FillRandomBf16(b.k, elems, 5 + seed));
  CHECK_CUDA(FillRandomBf16(b.v, elems, 6 + seed));
  b.ids = Upload(ids);
  b.tokens = Upload(tokens);
  b.starts = Upload(starts);
  b.offsets = Upload(offsets);
  b.deltas = Upload(deltas);
  b.zero_deltas = Upload(std::vector<int32_t>(deltas.size(), 0));
  return b;
}

PagedBatch MakePagedBatch(int batch, int docs, int doc_tokens, int own, int block, int kv_heads, int hd,
                          std::mt19937& rng) {
  return MakePagedBatch(std::vector<SeqLayout>(batch, SeqLayout{docs, own}), doc_tokens, block, kv_heads, hd, rng);
}

void FreePagedBatch(PagedBatch& b) {
  for (void* ptr : {b.k, b.v, (void*)b.ids, (void*)b.tokens, (void*)b.starts, (void*)b.offsets, (void*)b.deltas,
                    (void*)b.zero_deltas}) {
    CHECK_CUDA(cudaFree(ptr));
  }
}

cuda::PrefillAttentionParams QueryParams(const PagedBatch& b, const std::vector<int>& lens, const std::vector<int>& n_q,
                                         const double* inv_freq, int heads, int kv_heads, int hd, int block,
                                         uint64_t seed) {
  std::vector<int32_t> q_offsets = {0}, q_pos0;
  for (size_t s = 0; s < lens.size(); ++s) {
    q_offsets.push_back(q_offsets.back() + n_q[s]);
    q_pos0.push_back(lens[s] - n_q[s]);
  }
  const size_t q_elems = static_cast<size_t>(q_offsets.back()) * heads * hd;
  float *q, *out;
  CHECK_CUDA(cudaMalloc(&q, q_elems * 4));
  CHECK_CUDA(cudaMalloc(&out, q_elems * 4));
  CHECK_CUDA(FillRandomF32(q, q_elems, seed));
  cuda::PrefillAttentionParams p;
  p.q = q;
  p.out = out;
  p.kv.k_pool = b.k;
  p.kv.v_pool = b.v;
  p.kv.block_ids = b.ids;
  p.kv.block_tokens = b.tokens;
  p.kv.block_starts = b.starts;
  p.kv.table_offsets = b.offsets;
  p.kv.block_deltas = b.deltas;
  p.kv.inv_freq = inv_freq;
  p.kv.n_kv_heads = kv_heads;
  p.kv.head_dim = hd;
  p.kv.block_size = block;
  p.kv.pool_slots = static_cast<long long>(b.pool_bytes / (2 * static_cast<size_t>(kv_heads) * hd));
  p.kv.rope_style = cuda::RopeStyle::kRotateHalf;
  p.query_offsets = Upload(q_offsets);
  p.query_pos0 = Upload(q_pos0);
  p.num_seqs = static_cast<int>(lens.size());
  p.n_heads = heads;
  p.max_queries_per_seq = *std::max_element(n_q.begin(), n_q.end());
  p.max_keys = *std::max_element(lens.begin(), lens.end());  // every query sees at most its sequence
  p.total_queries = q_offsets.back();
  return p;
}

cuda::PrefillAttentionParams QueryParams(const PagedBatch& b, int batch, int len, int n_q, const double* inv_freq,
                                         int heads, int kv_heads, int hd, int block, uint64_t seed) {
  return QueryParams(b, std::vector<int>(batch, len), std::vector<int>(batch, n_q), inv_freq, heads, kv_heads, hd,
                     block, seed);
}

void FreeQueries(cuda::PrefillAttentionParams& p) {
  for (const void* ptr : {(const void*)p.q, (const void*)p.out, (const void*)p.workspace, (const void*)p.query_offsets,
                          (const void*)p.query_pos0}) {
    if (ptr != nullptr) CHECK_CUDA(cudaFree(const_cast<void*>(ptr)));
  }
}

}  // namespace lazykv::bench
