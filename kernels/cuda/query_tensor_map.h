// A tensor map (TMA descriptor) over a lazy prefill launch's query rows, for the persistent
// kernel's rotation warps: q seen as [total_queries][n_heads][head_dim] fp32 and read in boxes of
// head_dim x pack heads x 128 / pack queries, a work tile's raw rows in the row-major order of
// RawQueryIndex (lazy_prefill_tiles.cuh). One copy-engine request a work tile where 128 threads'
// cp.async copies had taken ~6800 cycles to issue (bench/results/prefill_query_2026-11-29.md).
// And one over its bf16 output rows (PrefillAttentionParams::out_bf16), which the kernel's
// consumers store as boxes from shared memory. And one over each KV pool, by which both prefill
// kernels' copy warps read a KV tile whose blocks are consecutive in the pool.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "kernels/cuda/lazy_prefill_attention.h"

namespace lazykv::cuda {

// Whether the launch's queries can be read through a tensor map: q 16-byte aligned, its row
// count known (p.total_queries > 0), head dim at most 256. Host only, no CUDA call.
bool QueryTensorMapSupported(const PrefillAttentionParams& p);

// The map of p's queries for tiles of `pack` heads (a power of two that divides n_heads, at
// most 128). cudaErrorInvalidValue where QueryTensorMapSupported is false, the driver has no
// encoder (any driver for sm_90 has) or refuses the map. Host only; thread-safe (no state but
// the driver's entry point, found once).
cudaError_t MakeQueryTensorMap(const PrefillAttentionParams& p, int pack, CUtensorMap* map);

// The map of p's bf16 output rows (p.out_bf16: [total_queries][n_heads][head_dim], 16-byte
// aligned) for the persistent kernel's stores: boxes of 64 columns x pack heads x 64 / pack
// queries (a consumer's 64 rows, one 128-byte column block of them) with a 128-byte swizzle, the
// layout of a query buffer's half (wgmma::SwizzledOffset). cudaErrorInvalidValue where out_bf16
// is null or misaligned, total_queries unknown, or the driver refuses the map. Host only;
// thread-safe.
cudaError_t MakeOutputTensorMap(const PrefillAttentionParams& p, int pack, CUtensorMap* map);

// A map over one KV pool (p.kv.k_pool or p.kv.v_pool: [pool_slots][n_kv_heads][head_dim] bf16)
// in boxes of 64 columns x 1 KV head x 128 slots with a 128-byte swizzle: a KV tile's 64-column
// block in the ring's layout (wgmma::SwizzledOffset<128>). cudaErrorInvalidValue where the pool
// is not bf16, misaligned, its slot count unknown (p.kv.pool_slots) or past INT32_MAX, the head
// dim not 64 or 128, or the driver refuses the map. Host only; thread-safe.
cudaError_t MakeKvPoolTensorMap(const PrefillAttentionParams& p, const void* pool, CUtensorMap* map);

}  // namespace lazykv::cuda
