// The tensor-core skinny GEMM (kernels/cuda/skinny_mma_gemm.h) against a plain double-precision
// product of the same bf16 values, per element within fp32 accumulation's error: random shapes
// at every row count it takes (K from one vector, shorter than a stage, to Llama-3-8B's 14336
// and not a multiple of a stage; out not a multiple of a tile), each with the split it
// chooses and with a random forced split (uneven parts of K included), beta 0 over NaN and
// beta 1; counters left at zero; its fp32-X and SwiGLU fusions bit for bit the unfused kernels; back-to-back split
// launches on one stream; X and y read only after the kernel before it (dependent launches); cuBLASLt's workspace
// shared in stream order; the arguments it refuses; and Gemm running it at 5 to kSkinnyMmaFasterRows (16) rows where
// asked (no cuBLASLt plan).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/skinny_gemm.h"
#include "kernels/cuda/skinny_mma_gemm.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/gemm_reference.h"
#include "tests/kernels/slow_copy.h"
#include "tests/test_util.h"

namespace lazykv {
namespace {

using testing::DeviceArena;
using testing::ExpectClose;
using testing::ExpectGuardIntact;
using testing::ExpectSwiGluNear;
using testing::FreshSeed;
using testing::HaveGpu;
using testing::kGuard;
using testing::RandomBf16;
using testing::Reference;
using testing::ToHost;

// The tensor cores add each MMA's 16 products into the accumulator: per element one chain of
// K/16 fp32 additions (K/16/splits a part). A simulation of truncating accumulation over
// K = 14336 stays under 1e-6 of the products' magnitudes, so the skinny test's 5e-6 holds it
// and still catches a product left out (7e-5 of it on average at K = 14336).
constexpr double kRelative = 5e-6;

constexpr int kStageK = 64;  // the kernel's columns of K a stage (skinny_mma_gemm.cu)

// Scratch for up to kParts parts of kSkinnyMmaMaxRows rows of `out` outputs.
constexpr int kParts = 8;  // the most parts a launch chooses (kSkinnyMmaSplitCapAfterAttention)
struct Scratch {
  Scratch(DeviceArena& arena, int out) {
    s.workspace_bytes = static_cast<size_t>(kParts) * cuda::kSkinnyMmaMaxRows * out * sizeof(float);
    s.workspace = arena.Alloc<float>(s.workspace_bytes / sizeof(float));
    s.counter_slots = (out + cuda::kSkinnyMmaTileOut - 1) / cuda::kSkinnyMmaTileOut;
    s.counters = arena.Alloc<int32_t>(s.counter_slots);
    zeroed = cudaMemset(s.counters, 0, s.counter_slots * sizeof(int32_t)) == cudaSuccess;
  }
  void ExpectCountersZero() const {
    for (int32_t c : ToHost(s.counters, s.counter_slots)) ASSERT_EQ(c, 0) << "a counter left non-zero";
  }
  cuda::SkinnyMmaScratch s;
  bool zeroed = false;
};

float* NanFilled(DeviceArena& arena, size_t n) {
  float* y = arena.Alloc<float>(n + kGuard);
  const std::vector<float> nan(n, std::numeric_limits<float>::quiet_NaN());
  if (cudaMemcpy(y, nan.data(), n * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess) return nullptr;
  if (cudaMemset(y + n, 0xFF, kGuard * sizeof(float)) != cudaSuccess) return nullptr;
  return y;
}

TEST(CudaSkinnyMmaGemmTest, MatchesAPlainProductOnRandomShapes) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const int ins[] = {8, 64, 136, 1000, 4096, 14336};
  const int edges[] = {17, 32, 33, cuda::kSkinnyMmaMaxRows};  // where the tiles of X change
  for (int trial = 0; trial < 40; ++trial) {
    // 1-16 once each, the edges of the larger tile counts, then random row counts of 17-64.
    const int rows = trial < 16   ? 1 + trial
                     : trial < 20 ? edges[trial - 16]
                                  : 17 + static_cast<int>(rng() % (cuda::kSkinnyMmaMaxRows - 16));
    const int in = ins[rng() % 6];
    const int out = 1 + static_cast<int>(rng() % (in >= 4096 ? 700 : 3000));
    const int stages = (in + kStageK - 1) / kStageK;
    const int forced = 1 + static_cast<int>(rng() % std::min(kParts, stages));
    SCOPED_TRACE(::testing::Message() << rows << " x " << in << " x " << out << ", forced split " << forced);
    std::vector<__nv_bfloat16> xb, wb;
    std::vector<float> x, w;
    RandomBf16(rng, static_cast<size_t>(rows) * in, xb, x);
    RandomBf16(rng, static_cast<size_t>(out) * in, wb, w);
    std::vector<double> want, scale;
    Reference(x, rows, in, w, out, &want, &scale);
    DeviceArena arena;
    const __nv_bfloat16* xd = arena.Copy(xb);
    const __nv_bfloat16* wd = arena.Copy(wb);
    Scratch scratch(arena, out);
    ASSERT_TRUE(scratch.zeroed);
    ASSERT_TRUE(cuda::SkinnyMmaGemmApplies(xd, rows, in, wd));
    for (const int splits : {0, forced}) {
      SCOPED_TRACE(::testing::Message() << "splits " << splits << " (0: chosen, "
                                        << cuda::SkinnyMmaSplits(rows, in, out, scratch.s) << ")");
      // beta 0 over NaN: y is written, never read.
      float* y = NanFilled(arena, want.size());
      ASSERT_NE(y, nullptr);
      ASSERT_EQ(cuda::LaunchSkinnyMmaGemm(xd, rows, in, wd, out, y, 0.0f, scratch.s, nullptr, splits), cudaSuccess);
      ExpectClose(ToHost(y, want.size()), want, scale, kRelative);
      ExpectGuardIntact(y + want.size());
      // beta 1: y += x w^T.
      ASSERT_EQ(cuda::LaunchSkinnyMmaGemm(xd, rows, in, wd, out, y, 1.0f, scratch.s, nullptr, splits), cudaSuccess);
      std::vector<double> twice = want, twice_scale = scale;
      for (size_t i = 0; i < twice.size(); ++i) twice[i] *= 2, twice_scale[i] *= 2;
      ExpectClose(ToHost(y, want.size()), twice, twice_scale, kRelative);
      ExpectGuardIntact(y + want.size());
      scratch.ExpectCountersZero();
    }
  }
}

// A non-blocking stream for launches queued back to back, destroyed at the end of the test. It
// does not wait for the legacy stream's copies and memsets: a test synchronizes the device
// after making its buffers.
struct Stream {
  Stream() { ok = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess; }
  ~Stream() {
    if (ok) cudaStreamDestroy(s);
  }
  cudaStream_t s = nullptr;
  bool ok = false;
};

// Products of one W with fresh random X of the given row counts, each with its own NaN-filled
// output and its reference, made before any launch.
struct Products {
  Products(std::mt19937_64& rng, DeviceArena& arena, const std::vector<float>& w, int in, int out,
           const std::vector<int>& row_counts) {
    for (const int rows : row_counts) {
      std::vector<__nv_bfloat16> xb;
      std::vector<float> x;
      RandomBf16(rng, static_cast<size_t>(rows) * in, xb, x);
      want.emplace_back();
      scale.emplace_back();
      Reference(x, rows, in, w, out, &want.back(), &scale.back());
      xs.push_back(arena.Copy(xb));
      ys.push_back(NanFilled(arena, want.back().size()));
    }
  }
  void ExpectEach() const {
    for (size_t p = 0; p < ys.size(); ++p) {
      SCOPED_TRACE(::testing::Message() << "product " << p);
      ASSERT_NE(ys[p], nullptr);
      ExpectClose(ToHost(ys[p], want[p].size()), want[p], scale[p]);
    }
  }
  std::vector<std::vector<double>> want, scale;
  std::vector<const __nv_bfloat16*> xs;
  std::vector<float*> ys;
};

// Split launches queued back to back on one stream (every buffer made first, one
// synchronization at the end), each into its own output: a counter the launch before left
// non-zero would make a part think itself last too early (or never), and its output would be
// wrong. With dependent launches each one's CTAs start while the one before ends.
TEST(CudaSkinnyMmaGemmTest, BackToBackSplitLaunchesEachGetTheirOwnSums) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const int rows = 12, in = 2048 + 8 * static_cast<int>(rng() % 64), out = 200 + static_cast<int>(rng() % 300);
  DeviceArena arena;
  Scratch scratch(arena, out);
  ASSERT_TRUE(scratch.zeroed);
  std::vector<__nv_bfloat16> wb;
  std::vector<float> w;
  RandomBf16(rng, static_cast<size_t>(out) * in, wb, w);
  const __nv_bfloat16* wd = arena.Copy(wb);
  constexpr int kLaunches = 6;
  const Products products(rng, arena, w, in, out, std::vector<int>(kLaunches, rows));
  Stream stream;
  ASSERT_TRUE(stream.ok);
  CUDA_OK(cudaDeviceSynchronize());      // the copies above (the legacy stream's) have landed
  for (int l = 0; l < kLaunches; ++l) {  // 3 then 8 parts: the counts differ between neighbours too
    ASSERT_NE(products.ys[l], nullptr);
    ASSERT_EQ(cuda::LaunchSkinnyMmaGemm(products.xs[l], rows, in, wd, out, products.ys[l], 0.0f, scratch.s, stream.s,
                                        l % 2 == 0 ? 3 : kParts),
              cudaSuccess);
  }
  CUDA_OK(cudaStreamSynchronize(stream.s));
  products.ExpectEach();
  scratch.ExpectCountersZero();
}

// X and y written by the kernels just before it, which let it start early and write late
// (tests/kernels/slow_copy.h): the kernel reads them only after its wait for the kernel before
// it (its first stages of W may be in flight earlier). X and y held other values until then.
TEST(CudaSkinnyMmaGemmTest, ReadsWhatTheKernelBeforeItWrites) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (const int rows : {6, 13, 27, 50}) {
    for (const int splits : {1, 3}) {
      const int in = 1024 + 8 * static_cast<int>(rng() % 128), out = 100 + static_cast<int>(rng() % 400);
      SCOPED_TRACE(::testing::Message() << rows << " x " << in << " x " << out << ", splits " << splits);
      std::vector<__nv_bfloat16> xb, stale_xb, wb;
      std::vector<float> x, stale_x, w;
      RandomBf16(rng, static_cast<size_t>(rows) * in, xb, x);
      RandomBf16(rng, xb.size(), stale_xb, stale_x);
      RandomBf16(rng, static_cast<size_t>(out) * in, wb, w);
      std::vector<double> want, scale;
      Reference(x, rows, in, w, out, &want, &scale);
      std::vector<float> y0(want.size()), stale_y(want.size(), std::numeric_limits<float>::quiet_NaN());
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (size_t i = 0; i < y0.size(); ++i) {
        y0[i] = normal(rng);
        want[i] += y0[i];
        scale[i] += std::fabs(y0[i]);
      }
      DeviceArena arena;
      Scratch scratch(arena, out);
      ASSERT_TRUE(scratch.zeroed);
      const __nv_bfloat16* x_src = arena.Copy(xb);
      __nv_bfloat16* x_dst = arena.Copy(stale_xb);
      const float* y_src = arena.Copy(y0);
      float* y = arena.Copy(stale_y);
      const __nv_bfloat16* wd = arena.Copy(wb);
      Stream stream;
      ASSERT_TRUE(stream.ok);
      CUDA_OK(cudaDeviceSynchronize());  // the copies above (the legacy stream's) have landed
      constexpr unsigned kDelayNs = 50000;
      CUDA_OK(testing::LaunchSlowCopy(x_src, x_dst, xb.size() * sizeof(__nv_bfloat16), kDelayNs, stream.s));
      CUDA_OK(testing::LaunchSlowCopy(y_src, y, y0.size() * sizeof(float), kDelayNs, stream.s));
      CUDA_OK(cuda::LaunchSkinnyMmaGemm(x_dst, rows, in, wd, out, y, 1.0f, scratch.s, stream.s, splits));
      CUDA_OK(cudaStreamSynchronize(stream.s));
      ExpectClose(ToHost(y, want.size()), want, scale);
      scratch.ExpectCountersZero();
    }
  }
}

// Gemm's tensor-core products share cuBLASLt's workspace (their partial sums) in stream order:
// cuBLASLt products (80 rows, few output tiles: a split-K choice is likely) and split products
// of the kernel alternated on one stream without synchronization, each into its own output.
TEST(CudaSkinnyMmaGemmTest, SharesCublasLtsWorkspaceInStreamOrder) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const int in = 4096, out = 512;
  DeviceArena arena;
  std::vector<__nv_bfloat16> wb;
  std::vector<float> w;
  RandomBf16(rng, static_cast<size_t>(out) * in, wb, w);
  const __nv_bfloat16* wd = arena.Copy(wb);
  const std::vector<int> row_counts = {80, 12, 80, 12};  // 80: past the kernel's rows
  const Products products(rng, arena, w, in, out, row_counts);
  Stream stream;
  ASSERT_TRUE(stream.ok);
  auto gemm = cuda::Gemm::Create(stream.s, cuda::GemmOptions{.skinny_kernel = true, .skinny_mma_kernel = true});
  ASSERT_TRUE(gemm.ok());
  CUDA_OK(cudaDeviceSynchronize());  // its counters zeroed, the copies above landed
  for (size_t p = 0; p < row_counts.size(); ++p) {
    ASSERT_NE(products.ys[p], nullptr);
    ASSERT_TRUE((*gemm)->Run(products.xs[p], row_counts[p], in, wd, out, products.ys[p]).ok());
  }
  CUDA_OK(cudaStreamSynchronize(stream.s));
  EXPECT_EQ((*gemm)->plans(), 1u) << "80 rows by cuBLASLt, 12 by the kernel";
  products.ExpectEach();
}

// The fused kernels equal, bit for bit, the kernels they replace at the same split: fp32 X
// rounded as the fragments are built against LaunchToBf16 then the GEMM (beta 0 and 1), and
// SwiGLU in the epilogue against the GEMM of [gate; up] then LaunchSwiGlu; the latter also
// within rounding of a plain SwiGLU of the double-precision products.
TEST(CudaSkinnyMmaGemmTest, FusedKernelsEqualTheUnfusedOnes) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int trial = 0; trial < 20; ++trial) {
    const int rows = 1 + trial * 13 % cuda::kSkinnyMmaMaxRows;  // 1, 14, 27, 40, 53, 2, ...: each tile count
    const int in = 8 * (1 + static_cast<int>(rng() % 600));
    const int out = 1 + static_cast<int>(rng() % 900);  // also the SwiGLU's hidden: odd ones too
    const int stages = (in + kStageK - 1) / kStageK;
    const int splits = trial % 2 == 0 ? 0 : 1 + static_cast<int>(rng() % std::min(kParts, stages));
    SCOPED_TRACE(::testing::Message() << rows << " x " << in << " x " << out << ", splits " << splits);
    DeviceArena arena;
    Scratch scratch(arena, 2 * out);
    ASSERT_TRUE(scratch.zeroed);
    std::vector<float> x32(static_cast<size_t>(rows) * in);  // values bf16 cannot hold exactly
    for (float& v : x32) v = normal(rng);
    std::vector<__nv_bfloat16> xb, wb, gub;
    std::vector<float> xf, wf, guf;
    RandomBf16(rng, static_cast<size_t>(rows) * in, xb, xf);
    RandomBf16(rng, static_cast<size_t>(out) * in, wb, wf);
    RandomBf16(rng, static_cast<size_t>(2 * out) * in, gub, guf);
    const float* x32d = arena.Copy(x32);
    const __nv_bfloat16* xd = arena.Copy(xb);
    const __nv_bfloat16* wd = arena.Copy(wb);
    const __nv_bfloat16* gud = arena.Copy(gub);

    if (rows > cuda::kSkinnyMmaRoundingMaxRows) {  // fp32 X of more rows does not fit the shared memory
      EXPECT_EQ(cuda::LaunchSkinnyMmaGemmRoundingX(x32d, rows, in, wd, out, arena.Alloc<float>(rows * out), 0.0f,
                                                   scratch.s, nullptr),
                cudaErrorInvalidValue);
    } else {
      // X rounded as the fragments are built.
      __nv_bfloat16* x_rounded = arena.Alloc<__nv_bfloat16>(x32.size());
      float* y_unfused = NanFilled(arena, static_cast<size_t>(rows) * out);
      float* y_fused = NanFilled(arena, static_cast<size_t>(rows) * out);
      ASSERT_TRUE(y_unfused != nullptr && y_fused != nullptr);
      // Chosen (0), the fused launch's split has its own cap: the unfused one is given it.
      const int same_splits =
          splits != 0 ? splits
                      : cuda::SkinnyMmaSplits(rows, in, out, scratch.s, cuda::kSkinnyMmaSplitCapAfterAttention);
      CUDA_OK(cuda::LaunchToBf16(x32d, x32.size(), x_rounded, nullptr));
      CUDA_OK(
          cuda::LaunchSkinnyMmaGemm(x_rounded, rows, in, wd, out, y_unfused, 0.0f, scratch.s, nullptr, same_splits));
      CUDA_OK(cuda::LaunchSkinnyMmaGemmRoundingX(x32d, rows, in, wd, out, y_fused, 0.0f, scratch.s, nullptr, splits));
      const std::vector<float> a = ToHost(y_unfused, static_cast<size_t>(rows) * out);
      const std::vector<float> b = ToHost(y_fused, a.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "rounding in the fragments";
      ExpectGuardIntact(y_fused + a.size());
      CUDA_OK(
          cuda::LaunchSkinnyMmaGemm(x_rounded, rows, in, wd, out, y_unfused, 1.0f, scratch.s, nullptr, same_splits));
      CUDA_OK(cuda::LaunchSkinnyMmaGemmRoundingX(x32d, rows, in, wd, out, y_fused, 1.0f, scratch.s, nullptr, splits));
      const std::vector<float> a2 = ToHost(y_unfused, a.size());
      const std::vector<float> b2 = ToHost(y_fused, a.size());
      EXPECT_EQ(std::memcmp(a2.data(), b2.data(), a2.size() * sizeof(float)), 0) << "rounding in the fragments, beta 1";
      EXPECT_NE(std::memcmp(a.data(), a2.data(), a.size() * sizeof(float)), 0) << "beta 1 added nothing";
      // And the rounded product is the product of the rounded X, within error.
      std::vector<float> x_rounded_host(x32.size());
      for (size_t i = 0; i < x32.size(); ++i) x_rounded_host[i] = __bfloat162float(__float2bfloat16(x32[i]));
      std::vector<double> want, scale;
      Reference(x_rounded_host, rows, in, wf, out, &want, &scale);
      ExpectClose(b, want, scale);
    }

    // SwiGLU in the epilogue.
    float* gu = NanFilled(arena, static_cast<size_t>(rows) * 2 * out);
    __nv_bfloat16* h_unfused = arena.Alloc<__nv_bfloat16>(static_cast<size_t>(rows) * out);
    __nv_bfloat16* h_fused = arena.Alloc<__nv_bfloat16>(static_cast<size_t>(rows) * out + 2 * kGuard);
    ASSERT_TRUE(gu != nullptr && h_unfused != nullptr && h_fused != nullptr);
    CUDA_OK(cudaMemset(h_fused + static_cast<size_t>(rows) * out, 0xFF, kGuard * sizeof(uint32_t)));
    CUDA_OK(cuda::LaunchSkinnyMmaGemm(xd, rows, in, gud, 2 * out, gu, 0.0f, scratch.s, nullptr, splits));
    CUDA_OK(cuda::LaunchSwiGlu(gu, rows, out, h_unfused, nullptr));
    CUDA_OK(cuda::LaunchSkinnyMmaGateUpSwiGlu(xd, rows, in, gud, out, h_fused, scratch.s, nullptr, splits));
    const std::vector<__nv_bfloat16> hu = ToHost(h_unfused, static_cast<size_t>(rows) * out);
    const std::vector<__nv_bfloat16> hf = ToHost(h_fused, hu.size());
    EXPECT_EQ(std::memcmp(hu.data(), hf.data(), hu.size() * sizeof(__nv_bfloat16)), 0) << "SwiGLU in the epilogue";
    ExpectGuardIntact(h_fused + hu.size());
    std::vector<double> prod, prod_scale;
    Reference(xf, rows, in, guf, 2 * out, &prod, &prod_scale);
    ExpectSwiGluNear(hf, prod, prod_scale, rows, out);
    scratch.ExpectCountersZero();
  }
}

TEST(CudaSkinnyMmaGemmTest, RefusesWhatItCannotTake) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  std::mt19937_64 rng(FreshSeed());
  DeviceArena arena;
  const int in = 264, out = 300, rows = 9;
  std::vector<__nv_bfloat16> xb, wb;
  std::vector<float> x, w;
  RandomBf16(rng, static_cast<size_t>(cuda::kSkinnyMmaMaxRows + 1) * in + 8, xb, x);
  RandomBf16(rng, static_cast<size_t>(out) * in + 8, wb, w);
  const __nv_bfloat16* xd = arena.Copy(xb);
  const __nv_bfloat16* wd = arena.Copy(wb);
  float* y = arena.Alloc<float>(static_cast<size_t>(cuda::kSkinnyMmaMaxRows + 1) * out);
  Scratch scratch(arena, out);
  EXPECT_FALSE(cuda::SkinnyMmaGemmApplies(xd + 1, rows, in, wd)) << "x not 16-byte aligned";
  EXPECT_FALSE(cuda::SkinnyMmaGemmApplies(xd, rows, in, wd + 4)) << "w not 16-byte aligned";
  EXPECT_FALSE(cuda::SkinnyMmaGemmApplies(xd, rows, in - 4, wd)) << "K not a multiple of 8";
  EXPECT_FALSE(cuda::SkinnyMmaGemmApplies(xd, cuda::kSkinnyMmaMaxRows + 1, in, wd)) << "too many rows";
  EXPECT_FALSE(cuda::SkinnyMmaGemmApplies(xd, 0, in, wd));
  auto launch = [&](const __nv_bfloat16* xp, int r, int k, int o, float beta, const cuda::SkinnyMmaScratch& s,
                    int splits) { return cuda::LaunchSkinnyMmaGemm(xp, r, k, wd, o, y, beta, s, nullptr, splits); };
  EXPECT_EQ(launch(xd + 1, rows, in, out, 0.0f, scratch.s, 0), cudaErrorInvalidValue);
  EXPECT_EQ(launch(xd, rows, in, 0, 0.0f, scratch.s, 0), cudaErrorInvalidValue) << "no outputs";
  EXPECT_EQ(launch(xd, rows, in, out, 0.5f, scratch.s, 0), cudaErrorInvalidValue) << "beta neither 0 nor 1";
  EXPECT_EQ(launch(xd, rows, in, out, 0.0f, scratch.s, 6), cudaErrorInvalidValue) << "more parts than stages (5)";
  EXPECT_EQ(launch(xd, rows, in, out, 0.0f, cuda::SkinnyMmaScratch{}, 2), cudaErrorInvalidValue) << "no scratch";
  cuda::SkinnyMmaScratch small = scratch.s;
  small.workspace_bytes = static_cast<size_t>(2) * rows * out * sizeof(float) - 4;
  EXPECT_EQ(launch(xd, rows, in, out, 0.0f, small, 2), cudaErrorInvalidValue) << "partial sums do not fit";
  small = scratch.s;
  small.counter_slots -= 1;
  EXPECT_EQ(launch(xd, rows, in, out, 0.0f, small, 2), cudaErrorInvalidValue) << "too few counters";
  EXPECT_EQ(cuda::LaunchSkinnyMmaGemmRoundingX(reinterpret_cast<const float*>(xd) + 1, rows, in, wd, out, y, 0.0f,
                                               scratch.s, nullptr),
            cudaErrorInvalidValue)
      << "fp32 x not 16-byte aligned";
  EXPECT_EQ(
      cuda::LaunchSkinnyMmaGateUpSwiGlu(xd, rows, in, wd, 0, arena.Alloc<__nv_bfloat16>(rows), scratch.s, nullptr),
      cudaErrorInvalidValue)
      << "no hidden columns";
  EXPECT_EQ(cuda::LaunchSkinnyMmaGateUpSwiGlu(xd, rows, in, wd, out / 2, nullptr, scratch.s, nullptr),
            cudaErrorInvalidValue)
      << "no h";
  // Without scratch it chooses no split, and computes.
  EXPECT_EQ(cuda::SkinnyMmaSplits(rows, 4096, out, cuda::SkinnyMmaScratch{}), 1);
  // With it, a shape of 5 tiles and 64 stages takes as many parts as its cap allows (any GPU
  // of 10 SMs or more has the CTA slots), and the output projection's cap is the larger.
  static_assert(cuda::kSkinnyMmaSplitCapAfterAttention > cuda::kSkinnyMmaSplitCap);
  static_assert(cuda::kSkinnyMmaSplitCapAfterAttention <= kParts, "the test's scratch holds it");
  if (std::getenv("LAZYKV_SKINNY_MMA_SPLITS") == nullptr && std::getenv("LAZYKV_SKINNY_MMA_MAX_SPLITS") == nullptr) {
    EXPECT_EQ(cuda::SkinnyMmaSplits(rows, 4096, out, scratch.s), cuda::kSkinnyMmaSplitCap);
    EXPECT_EQ(cuda::SkinnyMmaSplits(rows, 4096, out, scratch.s, cuda::kSkinnyMmaSplitCapAfterAttention),
              cuda::kSkinnyMmaSplitCapAfterAttention);
    EXPECT_EQ(cuda::SkinnyMmaSplits(rows, 1024, out, scratch.s, cuda::kSkinnyMmaSplitCapAfterAttention), 4)
        << "16 stages: 4 a part at least";
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Gemm runs the kernel at 5 to kSkinnyMmaFasterRows rows with skinny_mma_kernel (no cuBLASLt
// plan), the CUDA-core skinny kernel below, and cuBLASLt above or without the option; all within
// error of the product.
TEST(CudaSkinnyMmaGemmTest, GemmRunsItWhereAsked) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (const int rows : {4, 5, 8, 9, 16, 17, 32, 33, 64}) {
    const int in = 8 * (1 + static_cast<int>(rng() % 600)), out = 1 + static_cast<int>(rng() % 2000);
    SCOPED_TRACE(::testing::Message() << rows << " x " << in << " x " << out);
    std::vector<__nv_bfloat16> xb, wb;
    std::vector<float> x, w;
    RandomBf16(rng, static_cast<size_t>(rows) * in, xb, x);
    RandomBf16(rng, static_cast<size_t>(out) * in, wb, w);
    std::vector<double> want, scale;
    Reference(x, rows, in, w, out, &want, &scale);
    DeviceArena arena;
    const __nv_bfloat16* xd = arena.Copy(xb);
    const __nv_bfloat16* wd = arena.Copy(wb);
    for (const bool mma : {true, false}) {
      auto gemm = cuda::Gemm::Create(nullptr, cuda::GemmOptions{.skinny_kernel = true, .skinny_mma_kernel = mma});
      ASSERT_TRUE(gemm.ok());
      float* y = NanFilled(arena, want.size());
      ASSERT_TRUE((*gemm)->Run(xd, rows, in, wd, out, y).ok());
      const bool skinny = rows <= cuda::kSkinnyGemmFasterRows || (mma && rows <= cuda::kSkinnyMmaFasterRows);
      EXPECT_EQ((*gemm)->plans(), skinny ? 0u : 1u) << "mma " << mma;
      ExpectClose(ToHost(y, want.size()), want, scale, kRelative);
      // beta 1 through Gemm too.
      ASSERT_TRUE((*gemm)->Run(xd, rows, in, wd, out, y, 1.0f).ok());
      std::vector<double> twice = want, twice_scale = scale;
      for (size_t i = 0; i < twice.size(); ++i) twice[i] *= 2, twice_scale[i] *= 2;
      ExpectClose(ToHost(y, want.size()), twice, twice_scale, kRelative);
    }
  }
}

}  // namespace
}  // namespace lazykv
