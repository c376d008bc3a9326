// The paged KV and the queries of cuda_prefill_bench's launches: sequences of documents at
// random deltas, then the request's own tokens, in blocks; the queries are each sequence's last
// tokens. Device memory; not thread-safe.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cuda/lazy_prefill_attention.h"

namespace lazykv::bench {

// One sequence: `docs` documents of the batch's doc_tokens at random deltas, then `own` tokens
// of the request (delta 0).
struct SeqLayout {
  int docs, own;
};

// The pools (random bf16) and the block table of a batch, on the device.
struct PagedBatch {
  void *k = nullptr, *v = nullptr;
  int32_t *ids = nullptr, *tokens = nullptr, *starts = nullptr, *offsets = nullptr, *deltas = nullptr;
  int32_t* zero_deltas = nullptr;  // every delta 0: the same attention with one rotation per tile
  size_t pool_bytes = 0;           // of K, and of V
};

PagedBatch MakePagedBatch(const std::vector<SeqLayout>& seqs, int doc_tokens, int block, int kv_heads, int hd,
                          std::mt19937& rng);
// `batch` sequences of the same layout.
PagedBatch MakePagedBatch(int batch, int docs, int doc_tokens, int own, int block, int kv_heads, int hd,
                          std::mt19937& rng);
void FreePagedBatch(PagedBatch& b);

// Llama-3-8B's attention shape (rotate-half RoPE) over batch b: sequence s's last n_q[s] tokens
// of lens[s] are its queries, raw q random; q, out and the query tables allocated here
// (FreeQueries), no workspace. max_keys is the longest sequence.
cuda::PrefillAttentionParams QueryParams(const PagedBatch& b, const std::vector<int>& lens, const std::vector<int>& n_q,
                                         const double* inv_freq, int heads, int kv_heads, int hd, int block,
                                         uint64_t seed);
// `batch` sequences of `len` tokens, each with its last n_q tokens the queries.
cuda::PrefillAttentionParams QueryParams(const PagedBatch& b, int batch, int len, int n_q, const double* inv_freq,
                                         int heads, int kv_heads, int hd, int block, uint64_t seed);
void FreeQueries(cuda::PrefillAttentionParams& p);

}  // namespace lazykv::bench
