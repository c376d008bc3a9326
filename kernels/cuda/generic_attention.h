// A simple lazy paged attention for any even head dim (up to 1024), any block size and any
// GQA group: the fallback where the tensor-core kernels (head dims 64 and 128) do not apply,
// e.g. stories260K's head dim 8. One CTA per (query, head) streams the query's visible keys
// with an online softmax; the query is rotated by R(p - delta) in fp32 whenever the block
// table's delta changes. fp32 arithmetic throughout, on a bf16 or an fp32 pool
// (p.kv.element): the CUDA backend's fp32 mode runs all its attention here. The CPU twin
// is cpu::LazyPagedAttention.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/lazy_prefill_attention.h"

namespace lazykv::cuda {

// Same parameters as the prefill kernel; workspace and num_splits are ignored.
cudaError_t LaunchGenericPagedAttention(const PrefillAttentionParams& p, int total_queries, cudaStream_t stream);

}  // namespace lazykv::cuda
