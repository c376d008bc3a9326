// Probe for a step-wide kernel (issue 25): of what separates a cached question's step from one
// pass over the weights, how much do the kernel boundaries between its weight products cost, and
// what else holds the products' stream? Results: bench/results/product_chain_2026-11-29.md. The
// kernels are in product_chain_kernels.cuh and product_chain_ws.cuh, the weights' helpers in
// product_chain_weights.cuh; this file runs, checks and times them.
//
// The 16-row products of every layer of the Llama-3-8B shape (QKV 4096 -> 6144, output 4096 ->
// 4096, gate/up 4096 -> 28672, down 14336 -> 4096) run, alternated in pairs in one process:
//   launched    one launch a product, as the backend launches them (LaunchSkinnyMmaGemm, or
//               LaunchSkinnyMmaGemmRoundingX for fp32 X; dependent launches, the backend's split);
//   persistent  one cooperative kernel for all of them: the same staged tensor-core product
//               (skinny_mma_stages.cuh), each CTA taking an equal share of every product's
//               (tile of 64 rows of W, stage of 64 columns of K) pairs (stream-K), adding its
//               partial sums into y with atomics, a grid barrier between products, and the
//               first stages of the next product's W issued before the barrier (variants: after
//               it; W packed as contiguous 8 KB blocks in the stages' layout; the same blocks
//               K-stage-major with a CTA per (tile, part of K), a "wavefront"; W by TMA boxes;
//               rings of 5 stages at 4 CTAs an SM; W by TMA through rings of 8, 11 or 20 stages
//               in dynamic shared memory, at 1-2 CTAs an SM; a warp-specialized pipeline
//               (product_chain_ws.cuh); and two timing probes whose sums
//               are wrong: X loaded only in a share's first stages, and copies without products);
//   read        a plain read of the same weights: the floor.
// Each persistent variant (but the two timing probes, unless --check-probe, when they must fail) is
// checked product by product against the launched kernel on the same X, y filled with NaNs
// before each checked run.
//
// --x fp32: each product's X is the last product's y (a chain, rounded to bf16 as loaded);
// --x bf16: every product reads one fixed X (the backend's QKV, gate/up and down read bf16 X;
// the output projection fp32). Not the backend's step: no attention, norms or SwiGLU between the
// products, atomics make the persistent sums' order vary from run to run, and the persistent
// kernel zeroes the next product's y while it runs (16 rows, 0.6% of the bytes it reads).
//
//   product_chain_probe [--layers N] [--reps N] [--x fp32|bf16] [--only qkv|output|gate_up|down]
//                       [--ctas-per-sm N] [--check-probe]
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "bench/cuda_bench_util.h"
#include "bench/product_chain_kernels.cuh"
#include "bench/product_chain_weights.cuh"
#include "bench/product_chain_ws.cuh"
#include "common/flag_parser.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/skinny_mma_gemm.h"

namespace lazykv::bench {
namespace {

using bf16 = __nv_bfloat16;
using cuda::skinny_mma::kThreads;
using product_chain::EncodeWeightMap;
using product_chain::FillUniform;
using product_chain::kNTiles;
using product_chain::kRows;
using product_chain::kWsThreads;
using product_chain::MakeProductLayout;
using product_chain::PackWeights;
using product_chain::Product;
using product_chain::ProductChainKernel;
using product_chain::ProductLayout;
using product_chain::ReadWeights;
using product_chain::Shape;
using product_chain::WarpSpecializedChainKernel;
using product_chain::WLoad;

int Main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  int layers = 32, reps = 20, ctas_per_sm = 4;
  std::string x_type = "fp32", only;
  FlagParser parser(
      "product_chain_probe [--layers N] [--reps N] [--x fp32|bf16] [--only qkv|output|gate_up|down]\n"
      "                    [--ctas-per-sm N] [--check-probe]\n"
      "  --x fp32: each product's X is the last one's y (rounded as loaded); bf16: a fixed input each\n"
      "  --only: that product of every layer only\n"
      "  --check-probe: also check the timing probes, whose wrong sums must fail (exit 1)");
  parser.AddInt("--layers", &layers);
  parser.AddInt("--reps", &reps);
  parser.AddString("--x", &x_type);
  parser.AddString("--only", &only);
  parser.AddInt("--ctas-per-sm", &ctas_per_sm);
  bool check_probe = false;  // the timing probes checked too: their wrong sums must fail the check
  parser.AddSwitch("--check-probe", &check_probe);
  CheckOk(parser.Parse(argc, argv), "flags");
  const bool bf16_x = x_type == "bf16";
  ProductLayout layout;
  if (layers < 1 || reps < 3 || !MakeProductLayout(only, layers, kRows, &layout) || (!bf16_x && x_type != "fp32") ||
      ctas_per_sm < 1) {
    std::fprintf(stderr,
                 "--layers >= 1, --reps >= 3, --x fp32|bf16, --only qkv|output|gate_up|down, --ctas-per-sm >= 1\n");
    return 2;
  }
  const std::vector<Shape>& shapes = layout.shapes;
  const int per_layer = layout.per_layer, count = layout.count;
  auto shape = [&](int i) -> const Shape& { return layout.shape(i); };
  const std::vector<size_t>&w_offset = layout.w_offset, &y_offset = layout.y_offset;
  const size_t w_elems = layout.w_elems, y_elems = layout.y_elems, max_out = layout.max_out, max_in = layout.max_in;
  bf16 *w, *x_bf16;
  float *x0, *y_persistent, *y_launched, *y_check;
  CHECK_CUDA(cudaMalloc(&w, w_elems * sizeof(bf16)));
  CHECK_CUDA(cudaMalloc(&x0, kRows * max_in * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&x_bf16, kRows * max_in * sizeof(bf16)));
  CHECK_CUDA(cudaMalloc(&y_persistent, y_elems * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&y_launched, y_elems * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&y_check, kRows * max_out * sizeof(float)));
  for (int i = 0; i < count; ++i) {
    FillUniform<<<1024, 256>>>(w + w_offset[i], static_cast<size_t>(shape(i).in) * shape(i).out,
                               std::sqrt(3.0f / shape(i).in), 7919u * i);
  }
  {
    std::mt19937 rng(42);
    std::normal_distribution<float> normal;
    std::vector<float> x(kRows * max_in);
    for (float& v : x) v = normal(rng);
    std::vector<bf16> xb(x.size());
    for (size_t k = 0; k < x.size(); ++k) xb[k] = __float2bfloat16(x[k]);
    CHECK_CUDA(cudaMemcpy(x0, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(x_bf16, xb.data(), xb.size() * sizeof(bf16), cudaMemcpyHostToDevice));
  }
  // fp32: product i reads the first kRows * in values of product i - 1's y as its X (a chain, so
  // in <= the last out, as in the model); bf16: every product reads x_bf16.
  auto x_of = [&](int i, float* ys) -> const void* {
    if (bf16_x) return x_bf16;
    return i == 0 ? x0 : ys + y_offset[i - 1];
  };
  for (int i = 1; i < count && !bf16_x; ++i) {
    if (shape(i).in > shape(i - 1).out) {
      std::fprintf(stderr, "--x fp32 chains products: --only %s needs --x bf16\n", only.c_str());
      return 2;
    }
  }
  // The packed copy of every product's W (in is a multiple of 64 for these shapes).
  std::vector<size_t> packed_offset(count);
  size_t packed_elems = 0;
  for (int i = 0; i < count; ++i) {
    packed_offset[i] = packed_elems;
    packed_elems += static_cast<size_t>((shape(i).out + 63) / 64) * 64 * shape(i).in;
  }
  bf16 *w_packed, *w_packed_k;
  CHECK_CUDA(cudaMalloc(&w_packed, packed_elems * sizeof(bf16)));
  CHECK_CUDA(cudaMalloc(&w_packed_k, packed_elems * sizeof(bf16)));
  for (int i = 0; i < count; ++i) {
    PackWeights<<<1024, 256>>>(reinterpret_cast<const uint4*>(w + w_offset[i]), shape(i).in, shape(i).out,
                               reinterpret_cast<uint4*>(w_packed + packed_offset[i]), false);
    PackWeights<<<1024, 256>>>(reinterpret_cast<const uint4*>(w + w_offset[i]), shape(i).in, shape(i).out,
                               reinterpret_cast<uint4*>(w_packed_k + packed_offset[i]), true);
  }
  std::vector<Product> persistent(count);  // value-initialized: the tensor maps zero until encoded
  for (int i = 0; i < count; ++i) {
    Product& p = persistent[i];
    p.w = w + w_offset[i];
    p.x = x_of(i, y_persistent);
    p.y = y_persistent + y_offset[i];
    p.in = shape(i).in;
    p.out = shape(i).out;
    p.w_packed = w_packed + packed_offset[i];
    p.w_packed_k = w_packed_k + packed_offset[i];
    if (!EncodeWeightMap(persistent[i].w, shape(i).in, shape(i).out, &persistent[i].w_map) ||
        (bf16_x && !EncodeWeightMap(x_bf16, shape(i).in, kRows, &persistent[i].x_map, kRows))) {
      std::fprintf(stderr, "cuTensorMapEncodeTiled failed or is missing\n");
      return 1;
    }
  }
  Product* products = Upload(persistent);

  cuda::SkinnyMmaScratch scratch;
  scratch.workspace_bytes = 16ull * kRows * max_out * sizeof(float);
  scratch.counter_slots = static_cast<int>(max_out / 64);
  CHECK_CUDA(cudaMalloc(&scratch.workspace, scratch.workspace_bytes));
  CHECK_CUDA(cudaMalloc(&scratch.counters, scratch.counter_slots * sizeof(int32_t)));
  CHECK_CUDA(cudaMemset(scratch.counters, 0, scratch.counter_slots * sizeof(int32_t)));
  std::vector<int> splits(per_layer);
  for (int s = 0; s < per_layer; ++s) {
    splits[s] = cuda::SkinnyMmaSplits(kRows, shapes[s].in, shapes[s].out, scratch, shapes[s].cap);
  }
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto launch_one = [&](int i, const void* x, float* y) {
    const Shape& s = shape(i);
    if (bf16_x) {
      return cuda::LaunchSkinnyMmaGemm(static_cast<const bf16*>(x), kRows, s.in, w + w_offset[i], s.out, y, 0.0f,
                                       scratch, stream, splits[i % per_layer]);
    }
    return cuda::LaunchSkinnyMmaGemmRoundingX(static_cast<const float*>(x), kRows, s.in, w + w_offset[i], s.out, y,
                                              0.0f, scratch, stream, splits[i % per_layer]);
  };
  auto launched = [&] {
    for (int i = 0; i < count; ++i) CHECK_CUDA(launch_one(i, x_of(i, y_launched), y_launched + y_offset[i]));
  };

  // Indices in `variants` (bf16 X only from kTmaKernel on); the variants from kPairedFirst on are
  // each timed against their `baseline`.
  constexpr int kTmaKernel = 3, kPairedFirst = 4;
  struct Variant {
    const char* name;
    void* kernel;
    size_t dynamic_smem;        // 0: the kernel's static stages
    int baseline = kTmaKernel;  // the variant a deeper ring is timed against
    bool checked = true;        // false: a timing probe whose sums are wrong
    int threads = kThreads;
    bool needs_a_cta_a_tile = false;  // the wavefront gives each CTA one (tile, part of K)
    int ctas = 0;
  };
  auto kernel_of = [&](auto w_load, auto x_once) -> void* {
    constexpr WLoad kW = decltype(w_load)::value;
    constexpr bool kXOnce = decltype(x_once)::value;
    return bf16_x ? reinterpret_cast<void*>(ProductChainKernel<bf16, kW, kXOnce>)
                  : reinterpret_cast<void*>(ProductChainKernel<float, kW, kXOnce>);
  };
  using std::integral_constant;
  // [W as it is, packed W, packed W with X loaded only in the first stages of each share (a
  // timing probe of what X's loads cost: its sums are wrong, so it is not checked); for bf16 X
  // also W by TMA (with fp32 X its mbarriers would take static shared memory past 48 KB), rings
  // of 5 stages (4 CTAs an SM: a third more of W in flight) loaded each way, the copies without
  // the products (a probe), the wavefront, the warp-specialized pipeline, the copies alone
  // through a 20-stage TMA ring (a probe), and W by TMA through rings of 8, 11 and 20 stages
  // (fewer CTAs an SM)].
  std::vector<Variant> variants = {
      {"W as it is", kernel_of(integral_constant<WLoad, WLoad::kCpAsync>{}, std::false_type{}), 0},
      {"packed W", kernel_of(integral_constant<WLoad, WLoad::kPacked>{}, std::false_type{}), 0},
      {"packed W, X once (probe)", kernel_of(integral_constant<WLoad, WLoad::kPacked>{}, std::true_type{}), 0,
       kTmaKernel, false}};
  if (bf16_x) {
    variants.push_back({"W by TMA", reinterpret_cast<void*>(ProductChainKernel<bf16, WLoad::kTma>), 0});
    variants.push_back({"W as it is, 5 stages",
                        reinterpret_cast<void*>(ProductChainKernel<bf16, WLoad::kCpAsync, false, 5>),
                        sizeof(cuda::skinny_mma::Stages<kNTiles, bf16, 5>), 0});
    variants.push_back({"packed W, 5 stages",
                        reinterpret_cast<void*>(ProductChainKernel<bf16, WLoad::kPacked, false, 5>),
                        sizeof(cuda::skinny_mma::Stages<kNTiles, bf16, 5>), 1});
    variants.push_back({"W by TMA, 5 stages", reinterpret_cast<void*>(ProductChainKernel<bf16, WLoad::kTma, false, 5>),
                        sizeof(cuda::skinny_mma::Stages<kNTiles, bf16, 5>)});
    variants.push_back({"packed W, wavefront (K-major)",
                        reinterpret_cast<void*>(ProductChainKernel<bf16, WLoad::kWavefront>), 0, 1, true, kThreads,
                        true});
    variants.push_back({"packed W, copies only (probe)",
                        reinterpret_cast<void*>(ProductChainKernel<bf16, WLoad::kPacked, false, 0, true>), 0, 1,
                        false});
    variants.push_back({"warp-specialized, W and X by TMA", reinterpret_cast<void*>(WarpSpecializedChainKernel), 0,
                        kTmaKernel, true, kWsThreads});
    variants.push_back({"W by TMA, 20 stages, copies only (probe)",
                        reinterpret_cast<void*>(ProductChainKernel<bf16, WLoad::kTma, false, 20, true>),
                        sizeof(cuda::skinny_mma::Stages<kNTiles, bf16, 20>), kTmaKernel, false});
    variants.push_back({"W by TMA, 8 stages", reinterpret_cast<void*>(ProductChainKernel<bf16, WLoad::kTma, false, 8>),
                        sizeof(cuda::skinny_mma::Stages<kNTiles, bf16, 8>)});
    variants.push_back({"W by TMA, 11 stages",
                        reinterpret_cast<void*>(ProductChainKernel<bf16, WLoad::kTma, false, 11>),
                        sizeof(cuda::skinny_mma::Stages<kNTiles, bf16, 11>)});
    variants.push_back({"W by TMA, 20 stages",
                        reinterpret_cast<void*>(ProductChainKernel<bf16, WLoad::kTma, false, 20>),
                        sizeof(cuda::skinny_mma::Stages<kNTiles, bf16, 20>)});
  }
  int max_tiles = 0;
  for (const Shape& s : shapes) max_tiles = std::max(max_tiles, (s.out + 63) / 64);
  for (Variant& v : variants) {
    if (v.dynamic_smem > 0) {
      CHECK_CUDA(cudaFuncSetAttribute(v.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(v.dynamic_smem)));
    }
    int per_sm = 0;
    CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, v.kernel, v.threads, v.dynamic_smem));
    v.ctas = std::min(per_sm, ctas_per_sm) * cuda::MultiprocessorCount();
  }
  const int ctas = variants[0].ctas;
  unsigned long long* barrier;
  CHECK_CUDA(cudaMalloc(&barrier, sizeof(unsigned long long)));
  CHECK_CUDA(cudaMemset(barrier, 0, sizeof(unsigned long long)));
  unsigned long long barrier_base = 0;
  auto persistent_run = [&](int variant, bool prefetch = true) {
    const Variant& v = variants[variant];
    int n = count;
    void* args[] = {&products, &n, &barrier, &barrier_base, &prefetch};
    CHECK_CUDA(cudaLaunchCooperativeKernel(v.kernel, dim3(v.ctas), dim3(v.threads), args, v.dynamic_smem, stream));
    barrier_base += static_cast<unsigned long long>(v.ctas) * count;  // the first barrier and one a later product
  };

  unsigned* sink;
  CHECK_CUDA(cudaMalloc(&sink, sizeof(unsigned)));
  auto read = [&] {
    ReadWeights<<<cuda::MultiprocessorCount() * 8, 512, 0, stream>>>(reinterpret_cast<const uint4*>(w),
                                                                     w_elems * sizeof(bf16) / 16, sink);
  };
  CHECK_CUDA(cudaDeviceSynchronize());

  // Check: every checked variant (and the first without the early W), product by product,
  // against the launched kernel on the same X. y is filled with NaNs before each run, so a
  // product a variant leaves unwritten fails.
  struct Checked {
    int variant;
    bool prefetch;
  };
  std::vector<Checked> to_check;
  for (int v = 0; v < static_cast<int>(variants.size()); ++v) {
    if (variants[v].needs_a_cta_a_tile && variants[v].ctas < max_tiles) {
      std::printf("(%s left out: %d CTAs for %d tiles)\n", variants[v].name, variants[v].ctas, max_tiles);
      continue;
    }
    if (variants[v].checked || check_probe) to_check.push_back({v, true});
  }
  to_check.push_back({0, false});
  // The launched kernel's y for product i on the persistent run's X: with bf16 X the same for
  // every variant, so made once; with fp32 X (the last product's y) made again each run.
  std::vector<std::vector<float>> references(count);
  auto reference = [&](int i) -> const std::vector<float>& {
    if (bf16_x && !references[i].empty()) return references[i];
    references[i].resize(static_cast<size_t>(kRows) * shape(i).out);
    CHECK_CUDA(launch_one(i, persistent[i].x, y_check));
    CHECK_CUDA(cudaMemcpyAsync(references[i].data(), y_check, references[i].size() * sizeof(float),
                               cudaMemcpyDeviceToHost, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    return references[i];
  };
  for (const Checked& c : to_check) {
    CHECK_CUDA(cudaMemsetAsync(y_persistent, 0xFF, y_elems * sizeof(float), stream));
    persistent_run(c.variant, c.prefetch);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    double worst = 0.0;
    int bad = 0;
    std::vector<float> got;
    for (int i = 0; i < count; ++i) {
      const std::vector<float>& want = reference(i);
      got.resize(want.size());
      CHECK_CUDA(cudaMemcpy(got.data(), persistent[i].y, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
      const product_chain::ProductError e = product_chain::CompareProduct(want.data(), got.data(), want.size());
      worst = std::max(worst, e.relative);
      bad += e.bad;
    }
    std::printf(
        "check (%s, %d CTAs): %d products, worst max|diff| / max|y| %.2e, %d out of bounds (1e-4, or y "
        "vanished)\n",
        c.prefetch ? variants[c.variant].name : "W as it is, no prefetch", variants[c.variant].ctas, count, worst, bad);
    if (bad > 0) return 1;
  }

  const double gbytes = w_elems * sizeof(bf16) / 1e9;
  std::printf("%d layers, %d products (%s) of %d rows, %s X, %.2f GB of weights, %d CTAs (%d an SM), launched splits",
              layers, count, only.empty() ? "all four" : only.c_str(), kRows, x_type.c_str(), gbytes, ctas,
              ctas / cuda::MultiprocessorCount());
  for (int s : splits) std::printf(" %d", s);
  std::printf("\n");
  const auto [t_launched, t_persistent] = AlternatedMedianMs(
      launched, [&] { persistent_run(0); }, reps, stream);
  const auto [t_persistent2, t_packed] =
      AlternatedMedianMs([&] { persistent_run(0); }, [&] { persistent_run(1); }, reps, stream);
  const auto [t_launched2, t_packed2] = AlternatedMedianMs(
      launched, [&] { persistent_run(1); }, reps, stream);
  const auto [t_read, t_no_prefetch] = AlternatedMedianMs(
      read, [&] { persistent_run(0, false); }, reps, stream);
  const auto [t_packed3, t_x_once] =
      AlternatedMedianMs([&] { persistent_run(1); }, [&] { persistent_run(2); }, reps, stream);
  float t_packed4 = 0, t_tma = 0, t_launched3 = 0, t_tma2 = 0;
  if (bf16_x) {
    std::tie(t_packed4, t_tma) =
        AlternatedMedianMs([&] { persistent_run(1); }, [&] { persistent_run(kTmaKernel); }, reps, stream);
    std::tie(t_launched3, t_tma2) = AlternatedMedianMs(
        launched, [&] { persistent_run(kTmaKernel); }, reps, stream);
  }
  auto line = [&](const char* what, float ms) { std::printf("  %-30s %7.3f ms  %6.3f TB/s\n", what, ms, gbytes / ms); };
  line("read (floor)", t_read);
  line("launched", t_launched);
  line("launched (again)", t_launched2);
  line("persistent", t_persistent);
  line("persistent (again)", t_persistent2);
  line("persistent, no prefetch", t_no_prefetch);
  line("persistent, packed W", t_packed);
  line("persistent, packed W (again)", t_packed2);
  line("persistent, packed W (third)", t_packed3);
  line("  the same, X loaded once (probe)", t_x_once);
  std::printf(
      "persistent / launched %.3fx, packed / persistent %.3fx, packed / launched %.3fx; launched over the "
      "floor %.3f ms\n",
      t_launched / t_persistent, t_persistent2 / t_packed, t_launched2 / t_packed2, t_launched - t_read);
  if (bf16_x) {
    line("persistent, packed W (fourth)", t_packed4);
    line("persistent, W by TMA", t_tma);
    line("launched (third)", t_launched3);
    line("persistent, W by TMA (again)", t_tma2);
    std::printf("W by TMA / packed %.3fx, W by TMA / launched %.3fx\n", t_packed4 / t_tma, t_launched3 / t_tma2);
    for (int variant = kPairedFirst; variant < static_cast<int>(variants.size()); ++variant) {
      if (variants[variant].needs_a_cta_a_tile && variants[variant].ctas < max_tiles) continue;
      const auto [t_base, t_deep] = AlternatedMedianMs([&] { persistent_run(variants[variant].baseline); },
                                                       [&] { persistent_run(variant); }, reps, stream);
      char what[64], base[64];
      std::snprintf(what, sizeof(what), "%s (%d an SM)", variants[variant].name,
                    variants[variant].ctas / cuda::MultiprocessorCount());
      std::snprintf(base, sizeof(base), "persistent, %s (paired)", variants[variants[variant].baseline].name);
      line(base, t_base);
      line(what, t_deep);
    }
  }
  return 0;
}

}  // namespace
}  // namespace lazykv::bench

int main(int argc, char** argv) { return lazykv::bench::Main(argc, argv); }
