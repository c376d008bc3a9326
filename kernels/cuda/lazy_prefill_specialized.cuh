// The lazy prefill kernel with a producer warpgroup (FlashAttention-3's warp specialization).
// Included only by lazy_prefill_attention.cu.
//
// One CTA: 128 queries of one head, three warpgroups.
//  - The producer (warpgroup 0, few registers) walks the block table and copies each KV tile
//    into one of two stages (cp.async). It also makes R(p) q in fp32 in shared memory, once
//    per CTA.
//  - Two consumers (warpgroups 1 and 2, 64 query rows each, the registers the producer gave
//    up) run the products and the online softmax. At the first tile of a delta d each thread
//    rotates, by R(-d), exactly the query values its own wgmma fragments read, into the
//    consumer's half of the bf16 query tile: the query is rotated once per delta, never the
//    keys, and no warpgroup waits for another's rotation. Their scores take turns on the
//    tensor cores (named barriers): a consumer rotates while it waits for its turn, and one
//    consumer's softmax runs while the other's products do.
// mbarriers hand over the stages (full: each producer thread's copies land and its stores of
// the tile's column positions and StageInfo are released; empty: the consumers' 256 threads)
// and R(p) q, once (query_ready).
#pragma once

#include <cfloat>
#include <cstdint>

#include "kernels/cuda/lazy_prefill_attention.h"
#include "kernels/cuda/lazy_prefill_cta.cuh"
#include "kernels/cuda/lazy_prefill_math.cuh"
#include "kernels/cuda/lazy_prefill_query.cuh"
#include "kernels/cuda/lazy_prefill_tiles.cuh"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace lazykv::cuda {
namespace {

constexpr int kSpecThreads = 3 * 128;
// Registers per thread after the split (setmaxnreg; multiples of 8). The launch gives each
// thread 65536 / 384 = 168, and a warpgroup's increase is served only from what the CTA's
// other warps gave back: growing past that pool blocks forever.
constexpr int kLaunchRegs = 65536 / kSpecThreads / 8 * 8;  // 168
constexpr int kProducerRegs = 88;  // less spills
constexpr int kConsumerRegs = 208;
static_assert(kProducerRegs * 128 + kConsumerRegs * 256 <= kLaunchRegs * kSpecThreads, "over the CTA's registers");

// What the consumers need of a stage beyond its keys and values.
struct StageInfo {
  int delta;
  int needs_mask;
  int first_of_delta;  // the first tile of a delta: rotate the query rows
  int last;            // no tile follows
};

template <int HD>
struct SpecSmemLayout {
  static constexpr int kRawQBytes = kBM * HD * 4;
  static constexpr int kKvBytes = kBN * HD * 2;
  static constexpr int kQBytes = kBM * HD * 2;
  static constexpr int kRawQ = 0;                       // fp32 [kBM][HD]: R(p) q (RawQueryIndex)
  static constexpr int kQ = kRawQ + kRawQBytes;         // bf16, R(p - d) q, swizzled
  static constexpr int kK = kQ + kQBytes;               // 2 stages
  static constexpr int kV = kK + 2 * kKvBytes;          // 2 stages
  static constexpr int kColPos = kV + 2 * kKvBytes;     // int [2][kBN]
  static constexpr int kStage = kColPos + 2 * kBN * 4;  // StageInfo [2]
  static constexpr int kDesc = kStage + 2 * static_cast<int>(sizeof(StageInfo));  // TileDesc [kDescSlots]
  static constexpr int kBars = (kDesc + kDescSlots * static_cast<int>(sizeof(TileDesc)) + 7) / 8 * 8;
  static constexpr int kBytes = kBars + 5 * 8;        // SpecBarriers
  static constexpr int kAllocBytes = kBytes + 1024;  // room to align the dynamic base
  static_assert(kAllocBytes <= 227 * 1024, "over the shared memory of one CTA on Hopper");
};

struct SpecBarriers {
  uint64_t kv_full[2], kv_empty[2];
  uint64_t query_ready;
};

// Named barriers: 1 among the producer's warps; 2 + c, consumer c's turn to issue its scores;
// 4 + c, among consumer c's warps; 6, among both consumers' warps.
__device__ __forceinline__ void ProducerSync() { asm volatile("bar.sync 1, 128;\n" ::: "memory"); }
__device__ __forceinline__ void TurnSync(int c) { asm volatile("bar.sync %0, 256;\n" ::"r"(2 + c) : "memory"); }
__device__ __forceinline__ void TurnArrive(int c) { asm volatile("bar.arrive %0, 256;\n" ::"r"(2 + c) : "memory"); }
__device__ __forceinline__ void ConsumerSync(int c) { asm volatile("bar.sync %0, 128;\n" ::"r"(4 + c) : "memory"); }
__device__ __forceinline__ void ConsumersSync() { asm volatile("bar.sync 6, 256;\n" ::: "memory"); }

template <int kRegs>
__device__ __forceinline__ void ShrinkRegisters() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void GrowRegisters() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// The producer warpgroup: tile j goes to stage j & 1, and its copies arrive on the stage's
// full barrier as they land, so the producer goes on at once. desc[0] and desc[1] are made
// before the split; warp 0 makes desc[j + 2] during iteration j.
template <int HD>
__device__ void RunProducer(const PrefillAttentionParams& p, const CtaWork& w, int e_hi, int log2bs,
                            unsigned char* smem) {
  using L = SpecSmemLayout<HD>;
  const int t = threadIdx.x;  // 0 .. 127
  TileDesc* desc = reinterpret_cast<TileDesc*>(smem + L::kDesc);
  StageInfo* info = reinterpret_cast<StageInfo*>(smem + L::kStage);
  int* col_pos = reinterpret_cast<int*>(smem + L::kColPos);
  SpecBarriers* bars = reinterpret_cast<SpecBarriers*>(smem + L::kBars);
  float* raw_q = reinterpret_cast<float*>(smem + L::kRawQ);
  const uint32_t k_smem = SmemAddr(smem + L::kK), v_smem = SmemAddr(smem + L::kV);
  LoadRawQuery<HD, 128>(w.q_tile, w.row_stride, w.rows, SmemAddr(raw_q), t);
  CpAsyncCommit();
  int prev_delta = 0;
  for (int j = 0;; ++j) {
    const TileDesc& d = desc[j % kDescSlots];
    const TileDesc& dn = desc[(j + 1) % kDescSlots];
    const int stage = j & 1;
    const bool last = !dn.valid;
    const bool first_of_delta = j == 0 || d.delta != prev_delta;
    prev_delta = d.delta;
    if (j >= 2) mbarrier::Wait(&bars->kv_empty[stage], ((j >> 1) - 1) & 1);
    if (t == 0) info[stage] = StageInfo{d.delta, d.needs_mask, first_of_delta ? 1 : 0, last ? 1 : 0};
    LoadTile<HD, 128>(p, d, log2bs, w.kvh, k_smem + stage * L::kKvBytes, v_smem + stage * L::kKvBytes,
                      col_pos + stage * kBN, t);
    mbarrier::ArriveOnCopies(&bars->kv_full[stage]);
    mbarrier::Arrive(&bars->kv_full[stage]);  // releases this thread's stores of info and col_pos
    if (j == 0) {
      CpAsyncWait<0>();  // the raw query's group (the tile's copies are not in a group)
      ProducerSync();    // every thread's raw query rows have landed
      RotateRowsByPosition<HD, 128, kBM>(p, raw_q, 0, w.pos_lo, t);
      mbarrier::Arrive(&bars->query_ready);
    }
    if (last) return;
    if (t < 32) NextTile(p, dn, e_hi, w.entries_per_tile, w.pos_lo, w.pos_hi, &desc[(j + 2) % kDescSlots]);
    ProducerSync();  // desc[j + 2] is written; every producer warp is done with desc[j]
  }
}

// Consumer c (0 or 1): query rows 64 c .. 64 c + 63.
template <int HD>
__device__ void RunConsumer(const PrefillAttentionParams& p, const CtaWork& w, float scale_log2,
                            unsigned char* smem) {
  using L = SpecSmemLayout<HD>;
  const int c = threadIdx.x / 128 - 1;
  const int my_row0 = c * 64 + ((threadIdx.x % 128) / 32) * kRowsPerWarp + (threadIdx.x % 32) / 4;
  const StageInfo* info = reinterpret_cast<const StageInfo*>(smem + L::kStage);
  const int* col_pos = reinterpret_cast<const int*>(smem + L::kColPos);
  SpecBarriers* bars = reinterpret_cast<SpecBarriers*>(smem + L::kBars);
  const uint32_t q_tile = SmemAddr(smem + L::kQ);
  const uint32_t q_smem = q_tile + c * 64 * 128;  // this consumer's half
  const uint32_t k_smem = SmemAddr(smem + L::kK), v_smem = SmemAddr(smem + L::kV);

  float o[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int row_pos[2] = {w.pos_lo + my_row0, w.pos_lo + my_row0 + 8};
  // R(p) q is complete: re-lay it for the rotations (LoadQuerySlots), in place once every
  // consumer thread has read its values; each thread then reads back only its own slots.
  mbarrier::Wait(&bars->query_ready, 0);
  float4* raw_slots = reinterpret_cast<float4*>(smem + L::kRawQ);
  const int slot_thread = threadIdx.x - 128;
  {
    float4 slot[HD / 8];
    LoadQuerySlots<HD>(reinterpret_cast<const float*>(raw_slots), p.rope_style == 0, my_row0, threadIdx.x % 4,
                       slot);
    ConsumersSync();
#pragma unroll
    for (int i = 0; i < HD / 8; ++i) raw_slots[i * kConsumerThreads + slot_thread] = slot[i];
  }
  const float4* my_slots = raw_slots + slot_thread;
  for (int j = 0;; ++j) {
    const int stage = j & 1;
    mbarrier::Wait(&bars->kv_full[stage], (j >> 1) & 1);
    wgmma::FenceProxyAsync();  // the stage's cp.async copies, read next by wgmma (async proxy)
    const StageInfo in = info[stage];
    if (in.first_of_delta) {  // this consumer's scores with the delta before are done (waited)
      WriteFragmentsForDelta<HD>(p, my_slots, in.delta, my_row0, q_tile);
      wgmma::FenceProxyAsync();  // the rows, read next by wgmma (async proxy)
      ConsumerSync(c);           // every warp's rows are written
    }
    float s[kBN / 2];
    if (c == 1 || j > 0) TurnSync(c);
    IssueScores<HD>(s, q_smem, k_smem + stage * L::kKvBytes);
    wgmma::Wait<0>();
    wgmma::PinRegisters(s);
    if (c == 0 || !in.last) TurnArrive(1 - c);  // consumer 0 takes no turn after its last tile

    uint32_t pa[kBN / 16][4];
    SoftmaxTile<HD>(s, o, m, l, pa, col_pos + stage * kBN, in.needs_mask, row_pos, scale_log2);
    IssueValues<HD>(o, pa, v_smem + stage * L::kKvBytes);
    wgmma::Wait<0>();
    wgmma::PinRegisters(o);
    mbarrier::Arrive(&bars->kv_empty[stage]);
    if (in.last) break;
  }
  WriteRows<HD>(p, w, o, m, l, my_row0);
}

template <int HD>
__global__ void __launch_bounds__(kSpecThreads, 1) LazyPrefillSpecializedKernel(const PrefillAttentionParams p,
                                                                                int log2bs, float scale_log2,
                                                                                int splits) {
  using L = SpecSmemLayout<HD>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  const CtaWork w = MakeCtaWork<HD>(p, log2bs, splits);
  if (!w.active) return;
  TileDesc* desc = reinterpret_cast<TileDesc*>(smem + L::kDesc);
  int e_hi = 0;
  if (threadIdx.x < 32) e_hi = MakeFirstTiles(p, w, desc);  // producer warp 0 walks the block table
  if (threadIdx.x == 0) {
    SpecBarriers* bars = reinterpret_cast<SpecBarriers*>(smem + L::kBars);
    for (int b = 0; b < 2; ++b) {
      mbarrier::Init(&bars->kv_full[b], 2 * 128);  // each producer thread: its copies, its stores
      mbarrier::Init(&bars->kv_empty[b], 256);
    }
    mbarrier::Init(&bars->query_ready, 128);
  }
  __syncthreads();
  if (!desc[0].valid) {
    WriteEmptyRows<HD>(p, w, threadIdx.x, kSpecThreads);
    return;
  }
  if (threadIdx.x < 128) {
    ShrinkRegisters<kProducerRegs>();
    RunProducer<HD>(p, w, e_hi, log2bs, smem);
  } else {
    GrowRegisters<kConsumerRegs>();
    RunConsumer<HD>(p, w, scale_log2, smem);
  }
}

}  // namespace
}  // namespace lazykv::cuda
