// The lazy prefill kernel with a producer warpgroup (FlashAttention-3's warp specialization).
// Included only by lazy_prefill_attention.cu.
//
// One CTA: 128 queries of one head, three warpgroups.
//  - The producer (warpgroup 0, few registers) walks the block table, copies each KV tile
//    into one of two stages (cp.async), and keeps the query: R(p) q in fp32 in shared memory
//    (once per CTA), and for the first tile of each new delta d, R(-d) of it rounded once to
//    bf16 into the query tile, one consumer's half at a time.
//  - Two consumers (warpgroups 1 and 2, 64 query rows each, the registers the producer gave
//    up) only run the products and the online softmax: they never copy, never rotate and
//    never wait at a CTA-wide barrier. Their scores take turns on the tensor cores (named
//    barriers), so one consumer's softmax runs while the other's products do.
// mbarriers hand over the stages (full: the producer's 128 threads' copies arrive as they
// land; empty: the consumers' 256 threads) and each consumer's half of the query tile (empty:
// that consumer's scores of the last tile of a delta are done; full: the producer rewrote the
// half). A consumer gives its half back right after those scores, and the producer rotates it
// while that consumer runs its softmax and P V, so the rotation hides behind them.
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
  int needs_mask;
  int first_of_delta;  // the first tile of a delta: wait for the query half
  int last;            // no tile follows
  int next_new_delta;  // the next tile has another delta: give the query half back after the scores
};

template <int HD>
struct SpecSmemLayout {
  static constexpr int kRawQBytes = kBM * HD * 4;
  static constexpr int kQBytes = kBM * HD * 2;
  static constexpr int kKvBytes = kBN * HD * 2;
  static constexpr int kRawQ = 0;                       // fp32 [kBM][HD]: R(p) q
  static constexpr int kQ = kRawQ + kRawQBytes;         // bf16, R(p - d) q, swizzled
  static constexpr int kK = kQ + kQBytes;               // 2 stages
  static constexpr int kV = kK + 2 * kKvBytes;          // 2 stages
  static constexpr int kColPos = kV + 2 * kKvBytes;     // int [2][kBN]
  static constexpr int kStage = kColPos + 2 * kBN * 4;  // StageInfo [2]
  static constexpr int kDesc = kStage + 2 * static_cast<int>(sizeof(StageInfo));  // TileDesc [kDescSlots]
  static constexpr int kBars = (kDesc + kDescSlots * static_cast<int>(sizeof(TileDesc)) + 7) / 8 * 8;
  static constexpr int kBytes = kBars + 8 * 8;        // SpecBarriers
  static constexpr int kAllocBytes = kBytes + 1024;  // room to align the dynamic base
  static_assert(kAllocBytes <= 227 * 1024, "over the shared memory of one CTA on Hopper");
};

struct SpecBarriers {
  uint64_t kv_full[2], kv_empty[2];
  uint64_t q_full[2], q_empty[2];  // per consumer half of the query tile
};

// Named barriers: 1 among the producer's warps; 2 + c, consumer c's turn to issue its scores.
__device__ __forceinline__ void ProducerSync() { asm volatile("bar.sync 1, 128;\n" ::: "memory"); }
__device__ __forceinline__ void TurnSync(int c) { asm volatile("bar.sync %0, 256;\n" ::"r"(2 + c) : "memory"); }
__device__ __forceinline__ void TurnArrive(int c) { asm volatile("bar.arrive %0, 256;\n" ::"r"(2 + c) : "memory"); }

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
  int delta_runs = 0, prev_delta = 0;
  for (int j = 0;; ++j) {
    const TileDesc& d = desc[j % kDescSlots];
    const TileDesc& dn = desc[(j + 1) % kDescSlots];
    const int stage = j & 1;
    const bool last = !dn.valid;
    const bool first_of_delta = j == 0 || d.delta != prev_delta;
    prev_delta = d.delta;
    if (j >= 2) mbarrier::Wait(&bars->kv_empty[stage], ((j >> 1) - 1) & 1);
    if (t == 0) info[stage] = StageInfo{d.needs_mask, first_of_delta ? 1 : 0, last ? 1 : 0,
                                        !last && dn.delta != d.delta ? 1 : 0};
    LoadTile<HD, 128>(p, d, log2bs, w.kvh, k_smem + stage * L::kKvBytes, v_smem + stage * L::kKvBytes,
                      col_pos + stage * kBN, t);
    mbarrier::ArriveOnCopies(&bars->kv_full[stage]);  // also releases info and col_pos
    if (j == 0) {
      CpAsyncWait<0>();
      ProducerSync();  // every thread's raw query rows have landed
      RotateRowsByPosition<HD, 128, kBM>(p, raw_q, 0, w.pos_lo, t);
    }
    if (first_of_delta) {
      // Each consumer's half once that consumer's scores with the delta before are done.
      for (int h = 0; h < 2; ++h) {
        if (delta_runs > 0) mbarrier::Wait(&bars->q_empty[h], (delta_runs - 1) & 1);
        WriteRowsForDelta<HD, 128, 64>(p, raw_q, 64 * h, d.delta, t, smem + L::kQ);
        wgmma::FenceProxyAsync();  // the rows, seen by the consumer's wgmma (async proxy)
        mbarrier::Arrive(&bars->q_full[h]);
      }
      ++delta_runs;
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
  const uint32_t q_smem = SmemAddr(smem + L::kQ) + c * 64 * 128;
  const uint32_t k_smem = SmemAddr(smem + L::kK), v_smem = SmemAddr(smem + L::kV);

  float o[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int row_pos[2] = {w.pos_lo + my_row0, w.pos_lo + my_row0 + 8};
  int q_phase = 0;
  for (int j = 0;; ++j) {
    const int stage = j & 1;
    mbarrier::Wait(&bars->kv_full[stage], (j >> 1) & 1);
    wgmma::FenceProxyAsync();  // the stage's cp.async copies, read next by wgmma (async proxy)
    const StageInfo in = info[stage];
    if (in.first_of_delta) {
      mbarrier::Wait(&bars->q_full[c], q_phase);
      q_phase ^= 1;
    }
    float s[kBN / 2];
    if (c == 1 || j > 0) TurnSync(c);
    IssueScores<HD>(s, q_smem, k_smem + stage * L::kKvBytes);
    wgmma::Wait<0>();
    wgmma::PinRegisters(s);
    if (in.next_new_delta) mbarrier::Arrive(&bars->q_empty[c]);  // the producer rewrites this half now
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
      mbarrier::Init(&bars->kv_full[b], 128);
      mbarrier::Init(&bars->kv_empty[b], 256);
      mbarrier::Init(&bars->q_full[b], 128);
      mbarrier::Init(&bars->q_empty[b], 128);
    }
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
