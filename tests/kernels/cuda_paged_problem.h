// A random lazy paged-attention problem for the GPU attention kernel tests (decode,
// prefill, generic): block tables of several sequences (documents at their deltas, then
// each sequence's own tokens at delta 0, cut into blocks with the last one partly
// filled), a bf16 K/V pool with its exact fp32 twin, raw queries, the CPU reference
// output (cpu::LazyPagedAttention), the device copies and each kernel's parameters over
// them. Each test builds the tables its way and keeps its own checks.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "common/model_config.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/lazy_decode_attention.h"
#include "kernels/cuda/lazy_prefill_attention.h"
#include "kernels/cuda/rope_style.h"
#include "kernels/kv_block_ref.h"
#include "tests/kernels/cuda_test_util.h"

namespace lazykv::testing {

// The tests' RoPE per style: llama2.c's (theta 1e4) or Llama-3's (theta 5e5, scaled).
inline RopeConfig TestRope(RopeStyle style) {
  RopeConfig rope;
  rope.style = style;
  rope.theta = style == RopeStyle::kInterleaved ? 10000.0 : 500000.0;
  rope.llama3_scaling = style == RopeStyle::kRotateHalf;
  return rope;
}

// The problem's arrays on the device (owned by a DeviceArena).
struct DevicePagedProblem {
  const float* q = nullptr;
  __nv_bfloat16* k_pool = nullptr;
  __nv_bfloat16* v_pool = nullptr;
  const int32_t* block_ids = nullptr;
  const int32_t* block_tokens = nullptr;
  const int32_t* block_deltas = nullptr;
  const int32_t* block_starts = nullptr;
  const int32_t* table_offsets = nullptr;
  const int32_t* query_offsets = nullptr;
  const int32_t* query_pos0 = nullptr;
  const double* inv_freq = nullptr;
  float* out = nullptr;  // [total_queries][q_width], uninitialized
};

struct PagedProblem {
  PagedProblem(int n_heads, int n_kv_heads, int head_dim, int block_size, RopeStyle style)
      : n_heads(n_heads), n_kv_heads(n_kv_heads), head_dim(head_dim), block_size(block_size), style(style) {}

  // Appends `len` tokens at rotation delta `delta` to the sequence being built.
  void AddSegment(int len, int32_t delta) {
    if (tables.size() == query_pos0.size()) tables.emplace_back();
    for (int done = 0; done < len; done += block_size) {
      const int fill = std::min(block_size, len - done);
      tables.back().push_back(KvBlockRef{num_blocks, fill, delta});
      block_ids.push_back(num_blocks++);
      block_tokens.push_back(fill);
      block_deltas.push_back(delta);
      block_starts.push_back(length_);
      length_ += fill;
    }
  }
  // The logical length of the sequence being built.
  int32_t length() const { return length_; }
  // Ends the sequence being built: its last `queries` tokens are the new queries.
  void EndSequence(int queries) {
    if (tables.size() == query_pos0.size()) tables.emplace_back();
    table_offsets.push_back(static_cast<int32_t>(block_ids.size()));
    query_offsets.push_back(query_offsets.back() + queries);
    query_pos0.push_back(length_ - queries);
    max_queries = std::max(max_queries, queries);
    max_entries = std::max<int>(max_entries, tables.back().size());
    max_length = std::max(max_length, length_);
    length_ = 0;
  }

  // Moves a random half of the entries to other pool blocks (a random permutation of those
  // blocks), so that tiles of full blocks are at consecutive pool blocks or not, as in a pool
  // after churn. The reference and the kernels read the same (entry -> block) map; call it
  // before Draw.
  void ScatterBlocks(std::mt19937_64& rng) {
    std::vector<int32_t> moved;
    for (int32_t b = 0; b < num_blocks; ++b) {
      if (rng() % 2 == 0) moved.push_back(b);
    }
    std::vector<int32_t> to = moved;
    std::shuffle(to.begin(), to.end(), rng);
    std::vector<int32_t> perm(num_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    for (size_t i = 0; i < moved.size(); ++i) perm[moved[i]] = to[i];
    for (int32_t& id : block_ids) id = perm[id];
    for (std::vector<KvBlockRef>& t : tables) {
      for (KvBlockRef& ref : t) ref.block = perm[ref.block];
    }
  }

  // K and V for every block (bf16 and their fp32 twins), and the raw queries.
  void Draw(std::mt19937_64& rng) {
    const size_t pool = static_cast<size_t>(num_blocks) * block_size * n_kv_heads * head_dim;
    RandomBf16(rng, pool, k_bf, k_fp);
    RandomBf16(rng, pool, v_bf, v_fp);
    std::normal_distribution<float> dist;
    q.resize(static_cast<size_t>(total_queries()) * q_width());
    for (float& x : q) x = dist(rng);
  }

  // Multiplies the keys of pool blocks [first_block, end_block) by `factor` (after Draw), the
  // bf16 pool and its fp32 twin alike (exact for a power of two).
  void ScaleKeys(int first_block, int end_block, float factor) {
    const size_t block_elems = static_cast<size_t>(block_size) * n_kv_heads * head_dim;
    for (size_t i = first_block * block_elems; i < end_block * block_elems; ++i) {
      k_fp[i] *= factor;
      k_bf[i] = __float2bfloat16(k_fp[i]);
    }
  }

  int num_seqs() const { return static_cast<int>(query_pos0.size()); }
  int total_queries() const { return query_offsets.back(); }
  size_t q_width() const { return static_cast<size_t>(n_heads) * head_dim; }
  cpu::KvLayerView kv_view() { return {k_fp.data(), v_fp.data(), num_blocks, block_size, n_kv_heads, head_dim}; }

  // The CPU reference output, [total_queries][q_width], queries spread over threads.
  std::vector<float> Reference() {
    const cpu::RopeTable table(TestRope(style), head_dim);
    const cpu::KvLayerView kv = kv_view();
    std::vector<float> expected(q.size());
    std::vector<int32_t> positions(total_queries());
    std::vector<int> seq_of(total_queries());
    for (int s = 0; s < num_seqs(); ++s) {
      for (int i = query_offsets[s]; i < query_offsets[s + 1]; ++i) {
        positions[i] = query_pos0[s] + (i - query_offsets[s]);
        seq_of[i] = s;
      }
    }
    const int workers = static_cast<int>(std::max(1u, std::min(32u, std::thread::hardware_concurrency())));
    std::vector<std::thread> threads;
    for (int w = 0; w < workers; ++w) {
      threads.emplace_back([&, w] {
        for (int i = w; i < total_queries(); i += workers) {
          cpu::LazyPagedAttention(q.data() + i * q_width(), &positions[i], 1, n_heads, tables[seq_of[i]], kv, table,
                                  expected.data() + i * q_width());
        }
      });
    }
    for (std::thread& t : threads) t.join();
    return expected;
  }

  // Sequence s's rows of a [total_queries][q_width] array.
  std::vector<float> Rows(const std::vector<float>& all, int s) const {
    const auto first = all.begin() + query_offsets[s] * q_width();
    return std::vector<float>(first, first + (query_offsets[s + 1] - query_offsets[s]) * q_width());
  }

  DevicePagedProblem Upload(DeviceArena& arena) const {
    DevicePagedProblem d;
    d.q = arena.Copy(q);
    d.k_pool = arena.Copy(k_bf);
    d.v_pool = arena.Copy(v_bf);
    d.block_ids = arena.Copy(block_ids);
    d.block_tokens = arena.Copy(block_tokens);
    d.block_deltas = arena.Copy(block_deltas);
    d.block_starts = arena.Copy(block_starts);
    d.table_offsets = arena.Copy(table_offsets);
    d.query_offsets = arena.Copy(query_offsets);
    d.query_pos0 = arena.Copy(query_pos0);
    d.inv_freq = arena.Copy(RopeInverseFrequencies(TestRope(style), head_dim));
    d.out = arena.Alloc<float>(q.size());
    return d;
  }

  // The bf16 pool of the device copies with its geometry and RoPE (no block table).
  cuda::PagedKv PoolKv(const DevicePagedProblem& d) const {
    cuda::PagedKv kv;
    kv.k_pool = d.k_pool;
    kv.v_pool = d.v_pool;
    kv.inv_freq = d.inv_freq;
    kv.n_kv_heads = n_kv_heads;
    kv.head_dim = head_dim;
    kv.block_size = block_size;
    kv.pool_slots = static_cast<long long>(num_blocks) * block_size;
    kv.rope_style = cuda::KernelRopeStyle(style);
    return kv;
  }

  // The prefill and generic kernels' parameters over the device copies.
  cuda::PrefillAttentionParams PrefillParams(const DevicePagedProblem& d) const {
    cuda::PrefillAttentionParams p;
    p.q = d.q;
    p.kv = PoolKv(d);
    p.kv.block_ids = d.block_ids;
    p.kv.block_tokens = d.block_tokens;
    p.kv.block_deltas = d.block_deltas;
    p.kv.block_starts = d.block_starts;
    p.kv.table_offsets = d.table_offsets;
    p.query_offsets = d.query_offsets;
    p.query_pos0 = d.query_pos0;
    p.out = d.out;
    p.num_seqs = num_seqs();
    p.n_heads = n_heads;
    p.max_queries_per_seq = max_queries;
    p.max_keys = max_length;  // a query sees at most its sequence
    p.total_queries = total_queries();
    return p;
  }

  // The decode kernel's parameters (every sequence has one query, at its last position).
  cuda::DecodeAttentionParams DecodeParams(const DevicePagedProblem& d) const {
    return cuda::DecodeParamsFrom(PrefillParams(d), d.query_pos0, max_entries);
  }

  int n_heads, n_kv_heads, head_dim, block_size;
  RopeStyle style;
  // The kernels' flat block table: per entry its block, valid tokens, delta and first
  // logical position; sequence s owns entries [table_offsets[s], table_offsets[s + 1]).
  std::vector<int32_t> block_ids, block_tokens, block_deltas, block_starts, table_offsets = {0};
  // Sequence s's queries: rows [query_offsets[s], query_offsets[s + 1]), from query_pos0[s].
  std::vector<int32_t> query_offsets = {0}, query_pos0;
  std::vector<std::vector<KvBlockRef>> tables;  // the CPU reference's block tables
  int32_t num_blocks = 0;
  int max_queries = 0, max_entries = 0;
  int32_t max_length = 0;  // the longest sequence
  std::vector<__nv_bfloat16> k_bf, v_bf;
  std::vector<float> k_fp, v_fp, q;

 private:
  int32_t length_ = 0;
};

}  // namespace lazykv::testing
