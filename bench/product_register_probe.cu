// Probe (issue 25): do a cached step's 16-row weight products stream faster with W loaded
// straight into the tensor cores' registers than staged through shared memory?
// bench/results/product_chain_2026-11-29.md found the backend's staged kernel capped by its
// staging at ~85% of a plain read, the products themselves costing ~1%.
//
// Here W is pre-shuffled (PackFragments) so that, for a warp's 16 rows of W and 16 columns of K,
// lane l's 16 bytes are exactly its A fragment of mma.m16n8k16 (a0..a3), and consecutive K steps
// of the warp's rows follow each other: each warp streams one contiguous run of W with 16-byte
// loads covering 512 bytes a warp instruction, kDepth steps in flight in registers, no shared
// memory for W and no barrier in the loop. X (bf16, 16 rows) for the CTA's part of K is copied to
// shared memory once (rows padded: no bank conflicts); the parts of K add into y with atomics.
// Each product is a dependent launch whose first loads of W are issued before its wait, as the
// backend's kernels do. Timed in alternated pairs against the backend's launches
// (LaunchSkinnyMmaGemm, bf16 X) and a plain read of the same weights, and checked product by
// product against the backend's kernel.
//
//   product_register_probe [--layers N] [--reps N] [--only qkv|output|gate_up|down] [--depth 4|8]
//                          [--rounds N] [--slabs 1|2|4]
// (--rounds: parts of K for up to N rounds of 32 warps an SM; --slabs: slabs of 16 rows a warp)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench/cuda_bench_util.h"
#include "bench/product_chain_weights.cuh"
#include "common/flag_parser.h"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/mma_sync.cuh"
#include "kernels/cuda/skinny_mma_gemm.h"

namespace lazykv::bench {
namespace {

using bf16 = __nv_bfloat16;
using product_chain::MakeProductLayout;
using product_chain::ProductLayout;
using product_chain::Shape;
constexpr int kRows = 16;
constexpr int kWarps = 4;

// W [out][in] (out and in multiples of 16) as [slab of 16 rows][K step of 16 columns][lane] of
// 16 bytes: lane (g, t) = (l / 4, l % 4) holds rows g and g + 8 at columns 2t, 2t + 1 (a0, a1) and
// 2t + 8, 2t + 9 (a2, a3), mma.m16n8k16's A fragment.
__global__ void PackFragments(const bf16* __restrict__ w, int in, int out, uint4* __restrict__ packed) {
  const int steps = in / 16;
  const size_t total = static_cast<size_t>(out / 16) * steps * 32;
  for (size_t q = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; q < total;
       q += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int lane = static_cast<int>(q % 32), g = lane / 4, t = lane % 4;
    const size_t step = q / 32;
    const int slab = static_cast<int>(step / steps), j = static_cast<int>(step % steps);
    const size_t r0 = static_cast<size_t>(slab) * 16 + g, c0 = static_cast<size_t>(j) * 16 + 2 * t;
    const bf16* lo = w + r0 * in + c0;        // row g
    const bf16* hi = w + (r0 + 8) * in + c0;  // row g + 8
    uint32_t a[4];
    a[0] = *reinterpret_cast<const uint32_t*>(lo);
    a[1] = *reinterpret_cast<const uint32_t*>(hi);
    a[2] = *reinterpret_cast<const uint32_t*>(lo + 8);
    a[3] = *reinterpret_cast<const uint32_t*>(hi + 8);
    packed[q] = make_uint4(a[0], a[1], a[2], a[3]);
  }
}

// y[16][out] += X[16][in] W^T over K part blockIdx.y of gridDim.y; warp w of CTA b takes slab
// b * kWarps + w. Dynamic shared memory: X's part, 16 rows of kp + 8 bf16.
// kDepth: K steps of 16 columns in flight a lane (16 bytes each) for each of the warp's kSlabs
// slabs of 16 rows of W (kSlabs independent chains of products sharing X's fragments).
template <int kDepth, int kSlabs>
__global__ void __launch_bounds__(kWarps * 32)
    RegisterProductKernel(const bf16* __restrict__ x, int in, const uint4* __restrict__ packed, int out,
                          float* __restrict__ y) {
  extern __shared__ __align__(16) bf16 xs[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int steps = in / 16, parts = gridDim.y;
  const int j0 = static_cast<int>(static_cast<long long>(blockIdx.y) * steps / parts);
  const int j1 = static_cast<int>(static_cast<long long>(blockIdx.y + 1) * steps / parts);
  const int n = j1 - j0, kp = n * 16, stride = kp + 8;
  const int slab0 = (blockIdx.x * kWarps + warp) * kSlabs;
  const bool active = slab0 < out / 16;  // out a multiple of 16 x kSlabs (checked by the host)
  const uint4* a_ptr = packed + (static_cast<size_t>(active ? slab0 : 0) * steps + j0) * 32 + lane;
  const size_t slab_stride = static_cast<size_t>(steps) * 32;  // uint4s from one slab to the next

  // W is no kernel's output: its first steps are in flight before the wait for X's writer.
  uint4 ring[kSlabs][kDepth];
#pragma unroll
  for (int sl = 0; sl < kSlabs; ++sl) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      ring[sl][d] = active && d < n ? __ldcs(a_ptr + sl * slab_stride + d * 32) : make_uint4(0, 0, 0, 0);
    }
  }
  cuda::WaitForPriorGrid();
  for (int i = threadIdx.x; i < kRows * (kp / 8); i += blockDim.x) {
    const int r = i / (kp / 8), c = i % (kp / 8);
    *reinterpret_cast<uint4*>(xs + r * stride + c * 8) =
        *reinterpret_cast<const uint4*>(x + static_cast<size_t>(r) * in + j0 * 16 + c * 8);
  }
  __syncthreads();
  if (!active) return;

  float acc[kSlabs][2][4] = {};
  const uint32_t* x0 = reinterpret_cast<const uint32_t*>(xs + g * stride + 2 * t);        // X row g
  const uint32_t* x1 = reinterpret_cast<const uint32_t*>(xs + (g + 8) * stride + 2 * t);  // X row g + 8
  for (int j = 0; j < n; j += kDepth) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      if (j + d < n) {
        const int k = (j + d) * 8;  // in 32-bit words: 16 columns a step
        const uint32_t b00 = x0[k], b01 = x0[k + 4], b10 = x1[k], b11 = x1[k + 4];
#pragma unroll
        for (int sl = 0; sl < kSlabs; ++sl) {
          const uint4 v = ring[sl][d];
          if (j + d + kDepth < n) ring[sl][d] = __ldcs(a_ptr + sl * slab_stride + (j + d + kDepth) * 32);
          const uint32_t a[4] = {v.x, v.y, v.z, v.w};
          cuda::mma::Mma(acc[sl][0], a, b00, b01);
          cuda::mma::Mma(acc[sl][1], a, b10, b11);
        }
      }
    }
  }
  // c0, c1: W row g, X rows 2t, 2t + 1 (+ 8 for the second n-tile); c2, c3: W row g + 8.
#pragma unroll
  for (int sl = 0; sl < kSlabs; ++sl) {
    const int m = (slab0 + sl) * 16 + g;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int r = 8 * nt + 2 * t;
      atomicAdd(y + static_cast<size_t>(r) * out + m, acc[sl][nt][0]);
      atomicAdd(y + static_cast<size_t>(r + 1) * out + m, acc[sl][nt][1]);
      atomicAdd(y + static_cast<size_t>(r) * out + m + 8, acc[sl][nt][2]);
      atomicAdd(y + static_cast<size_t>(r + 1) * out + m + 8, acc[sl][nt][3]);
    }
  }
}

int Main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  int layers = 32, reps = 20, depth = 8, max_rounds = 2, slabs_a_warp = 1;
  std::string only;
  FlagParser parser(
      "product_register_probe [--layers N] [--reps N] [--only qkv|output|gate_up|down] [--depth 4|8] "
      "[--rounds N] [--slabs 1|2|4]");
  parser.AddInt("--layers", &layers);
  parser.AddInt("--reps", &reps);
  parser.AddString("--only", &only);
  parser.AddInt("--depth", &depth);
  parser.AddInt("--rounds", &max_rounds);
  parser.AddInt("--slabs", &slabs_a_warp);
  CheckOk(parser.Parse(argc, argv), "flags");
  ProductLayout layout;
  if (layers < 1 || reps < 3 || !MakeProductLayout(only, layers, kRows, &layout) || (depth != 4 && depth != 8) ||
      max_rounds < 1 || (slabs_a_warp != 1 && slabs_a_warp != 2 && slabs_a_warp != 4)) {
    std::fprintf(stderr,
                 "--layers >= 1, --reps >= 3, --only qkv|output|gate_up|down, --depth 4|8, --rounds >= 1, "
                 "--slabs 1|2|4\n");
    return 2;
  }
  const std::vector<Shape>& shapes = layout.shapes;
  for (const Shape& s : shapes) {
    if (s.out % (16 * slabs_a_warp) != 0 || s.in % 16 != 0) {
      std::fprintf(stderr, "%s: out must be a multiple of 16 x --slabs and in of 16\n", s.name);
      return 2;
    }
  }
  const int per_layer = layout.per_layer, count = layout.count;
  auto shape = [&](int i) -> const Shape& { return layout.shape(i); };
  const int sms = cuda::MultiprocessorCount();
  const std::vector<size_t>&w_offset = layout.w_offset, &y_offset = layout.y_offset;
  const size_t w_elems = layout.w_elems, y_elems = layout.y_elems, max_out = layout.max_out, max_in = layout.max_in;
  bf16 *w, *x;
  uint4* packed;
  float *y_launched, *y_register;
  CHECK_CUDA(cudaMalloc(&w, w_elems * sizeof(bf16)));
  CHECK_CUDA(cudaMalloc(&packed, w_elems * sizeof(bf16)));
  CHECK_CUDA(cudaMalloc(&x, kRows * max_in * sizeof(bf16)));
  CHECK_CUDA(cudaMalloc(&y_launched, y_elems * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&y_register, y_elems * sizeof(float)));
  for (int i = 0; i < count; ++i) {
    product_chain::FillUniform<<<1024, 256>>>(w + w_offset[i], static_cast<size_t>(shape(i).in) * shape(i).out,
                                              std::sqrt(3.0f / shape(i).in), 7919u * i);
    PackFragments<<<1024, 256>>>(w + w_offset[i], shape(i).in, shape(i).out,
                                 packed + w_offset[i] * sizeof(bf16) / sizeof(uint4));
  }
  {
    std::mt19937 rng(42);
    std::normal_distribution<float> normal;
    std::vector<bf16> xh(kRows * max_in);
    for (bf16& v : xh) v = __float2bfloat16(normal(rng));
    CHECK_CUDA(cudaMemcpy(x, xh.data(), xh.size() * sizeof(bf16), cudaMemcpyHostToDevice));
  }
  // Parts of K: enough warps for about two rounds of 32 an SM, a power of two, at least 8 steps a
  // part (bench/results/product_chain_2026-11-29.md).
  std::vector<int> parts(per_layer);
  for (int s = 0; s < per_layer; ++s) {
    const int slabs = shapes[s].out / 16, steps = shapes[s].in / 16;
    int p = 1;
    while (p * 2 * slabs / slabs_a_warp <= max_rounds * 32 * sms && steps / (p * 2) >= 8) p *= 2;
    parts[s] = p;
  }

  cuda::SkinnyMmaScratch scratch;
  scratch.workspace_bytes = 16ull * kRows * max_out * sizeof(float);
  scratch.counter_slots = static_cast<int>(max_out / 64);
  CHECK_CUDA(cudaMalloc(&scratch.workspace, scratch.workspace_bytes));
  CHECK_CUDA(cudaMalloc(&scratch.counters, scratch.counter_slots * sizeof(int32_t)));
  CHECK_CUDA(cudaMemset(scratch.counters, 0, scratch.counter_slots * sizeof(int32_t)));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  using Kernel = void (*)(const bf16*, int, const uint4*, int, float*);
  const Kernel kernels[2][3] = {
      {RegisterProductKernel<4, 1>, RegisterProductKernel<4, 2>, RegisterProductKernel<4, 4>},
      {RegisterProductKernel<8, 1>, RegisterProductKernel<8, 2>, RegisterProductKernel<8, 4>}};
  const Kernel kernel = kernels[depth == 8][slabs_a_warp == 1 ? 0 : slabs_a_warp == 2 ? 1 : 2];
  // X's part of K in shared memory: the longest part's columns, rows padded by 8.
  auto x_bytes = [&](int i) {
    const int kp = shape(i).in / 16 / parts[i % per_layer] * 16 + 16;
    return kRows * (kp + 8) * sizeof(bf16);
  };
  size_t max_x_bytes = 0;
  for (int s = 0; s < per_layer; ++s) max_x_bytes = std::max(max_x_bytes, x_bytes(s));
  CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(max_x_bytes)));

  auto launched = [&] {
    for (int i = 0; i < count; ++i) {
      CHECK_CUDA(cuda::LaunchSkinnyMmaGemm(x, kRows, shape(i).in, w + w_offset[i], shape(i).out,
                                           y_launched + y_offset[i], 0.0f, scratch, stream));
    }
  };
  auto zero = [&] { CHECK_CUDA(cudaMemsetAsync(y_register, 0, y_elems * sizeof(float), stream)); };
  auto registered = [&] {
    zero();
    for (int i = 0; i < count; ++i) {
      const Shape& s = shape(i);
      const dim3 grid((s.out / 16 / slabs_a_warp + kWarps - 1) / kWarps, parts[i % per_layer]);
      CHECK_CUDA(cuda::LaunchDependent(kernel, grid, dim3(kWarps * 32), x_bytes(i), stream, x, s.in,
                                       packed + w_offset[i] * sizeof(bf16) / sizeof(uint4), s.out,
                                       y_register + y_offset[i]));
    }
  };
  unsigned* sink;
  CHECK_CUDA(cudaMalloc(&sink, sizeof(unsigned)));
  auto read = [&] {
    product_chain::ReadWeights<<<sms * 8, 512, 0, stream>>>(reinterpret_cast<const uint4*>(w),
                                                            w_elems * sizeof(bf16) / 16, sink);
  };
  CHECK_CUDA(cudaDeviceSynchronize());

  // Check every product against the backend's kernel; y starts as NaNs for the launches.
  CHECK_CUDA(cudaMemsetAsync(y_launched, 0xFF, y_elems * sizeof(float), stream));
  launched();
  registered();
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<float> want(y_elems), got(y_elems);
  CHECK_CUDA(cudaMemcpy(want.data(), y_launched, y_elems * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(got.data(), y_register, y_elems * sizeof(float), cudaMemcpyDeviceToHost));
  int bad = 0;
  double worst = 0.0;
  for (int i = 0; i < count; ++i) {
    const product_chain::ProductError e = product_chain::CompareProduct(
        want.data() + y_offset[i], got.data() + y_offset[i], static_cast<size_t>(kRows) * shape(i).out);
    worst = std::max(worst, e.relative);
    bad += e.bad;
  }
  std::printf("check: %d products, worst max|diff| / max|y| %.2e, %d out of bounds (1e-4, or y vanished)\n", count,
              worst, bad);
  if (bad > 0) return 1;

  const double gbytes = w_elems * sizeof(bf16) / 1e9;
  std::printf("%d layers, %d products (%s) of %d rows, %.2f GB of weights; parts of K", layers, count,
              only.empty() ? "all four" : only.c_str(), kRows, gbytes);
  for (int p : parts) std::printf(" %d", p);
  std::printf(", %d warps a CTA of %d slabs of W each, %d steps in flight a lane a slab\n", kWarps, slabs_a_warp,
              depth);
  const auto [t_launched, t_register] = AlternatedMedianMs(launched, registered, reps, stream);
  const auto [t_read, t_zero] = AlternatedMedianMs(read, zero, reps, stream);
  auto line = [&](const char* what, float ms) { std::printf("  %-34s %7.3f ms  %6.3f TB/s\n", what, ms, gbytes / ms); };
  line("read (floor)", t_read);
  line("launched (staged, the backend's)", t_launched);
  line("registers (with y's memset)", t_register);
  std::printf("  y's memset alone %.3f ms; registers / launched %.3fx (%.3fx without the memset)\n", t_zero,
              t_launched / t_register, t_launched / (t_register - t_zero));
  return 0;
}

}  // namespace
}  // namespace lazykv::bench

int main(int argc, char** argv) { return lazykv::bench::Main(argc, argv); }
