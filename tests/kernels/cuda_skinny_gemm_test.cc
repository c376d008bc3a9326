// The skinny GEMM kernel (kernels/cuda/skinny_gemm.h) against a plain double-precision
// product of the same bf16 values, per element within fp32 accumulation's error, on random
// shapes for every row count it takes (K from one vector to Llama-3-8B's 14336, out not a
// multiple of anything); against cuBLASLt through Gemm (skinny kernel off); beta = 1; and the
// products it must leave to cuBLASLt (misaligned, K not a multiple of 8, too many rows); its
// two exact fusions bit for bit against the unfused kernels (and SwiGLU against a plain one);
// and the RMSNorm in its loads against a plain norm.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/skinny_gemm.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/gemm_reference.h"
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

TEST(CudaSkinnyGemmTest, MatchesAPlainProductOnRandomShapes) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const int ins[] = {8, 64, 136, 1000, 4096, 14336};
  for (int trial = 0; trial < 24; ++trial) {
    const int rows = 1 + trial % cuda::kSkinnyGemmMaxRows;
    // Every fourth shape has W rows enough for one warp a group (kernels/cuda/skinny_gemm.cu's
    // SkinnyKSplit: at least 16 groups of 4 an SM); the others split K over a CTA's warps.
    const bool wide = trial % 4 == 3;
    const int in = ins[rng() % (wide ? 4 : 6)];
    const int out = wide ? 64 * cuda::MultiprocessorCount() + static_cast<int>(rng() % 4000)
                         : 1 + static_cast<int>(rng() % (in >= 4096 ? 700 : 3000));
    SCOPED_TRACE(::testing::Message() << rows << " x " << in << " x " << out);
    std::vector<__nv_bfloat16> xb, wb;
    std::vector<float> x, w;
    RandomBf16(rng, static_cast<size_t>(rows) * in, xb, x);
    RandomBf16(rng, static_cast<size_t>(out) * in, wb, w);
    std::vector<double> want, scale;
    Reference(x, rows, in, w, out, &want, &scale);
    DeviceArena arena;
    __nv_bfloat16* xd = arena.Copy(xb);
    __nv_bfloat16* wd = arena.Copy(wb);
    // Guard floats past Y (all-ones bits): a write past the last element shows there.
    float* y = arena.Alloc<float>(want.size() + kGuard);
    CUDA_OK(cudaMemset(y + want.size(), 0xFF, kGuard * sizeof(float)));
    ASSERT_TRUE(cuda::SkinnyGemmApplies(xd, rows, in, wd));
    ASSERT_EQ(cuda::LaunchSkinnyGemm(xd, rows, in, wd, out, y, 0.0f, nullptr), cudaSuccess);
    ExpectClose(ToHost(y, want.size()), want, scale);
    ExpectGuardIntact(y + want.size());
    // beta = 1: y += x w^T.
    ASSERT_EQ(cuda::LaunchSkinnyGemm(xd, rows, in, wd, out, y, 1.0f, nullptr), cudaSuccess);
    std::vector<double> twice = want, twice_scale = scale;
    for (size_t i = 0; i < twice.size(); ++i) twice[i] *= 2, twice_scale[i] *= 2;
    ExpectClose(ToHost(y, want.size()), twice, twice_scale);
    // Through Gemm, against cuBLASLt (the same product by tensor cores).
    auto skinny = cuda::Gemm::Create(nullptr, cuda::GemmOptions{.skinny_kernel = true, .skinny_mma_kernel = false});
    auto lt = cuda::Gemm::Create(nullptr, cuda::GemmOptions{.skinny_kernel = false});
    ASSERT_TRUE(skinny.ok() && lt.ok());
    float* y_lt = arena.Alloc<float>(want.size());
    ASSERT_TRUE((*skinny)->Run(xd, rows, in, wd, out, y).ok());
    ASSERT_TRUE((*lt)->Run(xd, rows, in, wd, out, y_lt).ok());
    // Up to kSkinnyGemmFasterRows rows Gemm runs the skinny kernel (no cuBLASLt plan).
    EXPECT_EQ((*skinny)->plans(), rows <= cuda::kSkinnyGemmFasterRows ? 0u : 1u);
    EXPECT_EQ((*lt)->plans(), 1u);
    ExpectClose(ToHost(y, want.size()), want, scale);
    ExpectClose(ToHost(y_lt, want.size()), want, scale);
  }
}

TEST(CudaSkinnyGemmTest, LeavesOtherProductsToCublasLt) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  std::mt19937_64 rng(FreshSeed());
  DeviceArena arena;
  const int in = 264, out = 300;
  std::vector<__nv_bfloat16> xb, wb;
  std::vector<float> x, w;
  RandomBf16(rng, static_cast<size_t>(9) * in + 8, xb, x);
  RandomBf16(rng, static_cast<size_t>(out) * in, wb, w);
  __nv_bfloat16* xd = arena.Copy(xb);
  __nv_bfloat16* wd = arena.Copy(wb);
  EXPECT_FALSE(cuda::SkinnyGemmApplies(xd + 1, 2, in, wd)) << "x not 16-byte aligned";
  EXPECT_FALSE(cuda::SkinnyGemmApplies(xd, 2, in, wd + 4)) << "w not 16-byte aligned";
  EXPECT_FALSE(cuda::SkinnyGemmApplies(xd, 2, in - 4, wd)) << "K not a multiple of 8";
  EXPECT_FALSE(cuda::SkinnyGemmApplies(xd, cuda::kSkinnyGemmMaxRows + 1, in, wd)) << "too many rows";
  EXPECT_FALSE(cuda::SkinnyGemmApplies(xd, 0, in, wd));
  EXPECT_EQ(cuda::LaunchSkinnyGemm(xd + 1, 2, in, wd, out, arena.Alloc<float>(2 * out), 0.0f, nullptr),
            cudaErrorInvalidValue);
  // Gemm still computes them, by cuBLASLt: K not a multiple of 8, and more rows than the
  // kernel takes.
  for (const auto& [rows, k] : {std::pair{2, in - 4}, std::pair{cuda::kSkinnyGemmMaxRows + 1, in}}) {
    SCOPED_TRACE(::testing::Message() << rows << " x " << k);
    auto gemm = cuda::Gemm::Create(nullptr, cuda::GemmOptions{.skinny_kernel = true, .skinny_mma_kernel = false});
    ASSERT_TRUE(gemm.ok());
    std::vector<__nv_bfloat16> xk, wk;
    std::vector<float> xf, wf;
    RandomBf16(rng, static_cast<size_t>(rows) * k, xk, xf);
    RandomBf16(rng, static_cast<size_t>(out) * k, wk, wf);
    float* y = arena.Alloc<float>(static_cast<size_t>(rows) * out);
    ASSERT_TRUE((*gemm)->Run(arena.Copy(xk), rows, k, arena.Copy(wk), out, y).ok());
    EXPECT_EQ((*gemm)->plans(), 1u) << "planned for cuBLASLt";
    std::vector<double> want, scale;
    Reference(xf, rows, k, wf, out, &want, &scale);
    ExpectClose(ToHost(y, want.size()), want, scale);
  }
}

// The fused kernels of a decode step equal, bit for bit, the kernels they replace: fp32 X
// rounded in the loads against LaunchToBf16 then the GEMM, and SwiGLU in the epilogue against
// the GEMM of [gate; up] then LaunchSwiGlu; the latter also within rounding of a plain SwiGLU
// of the double-precision products.
TEST(CudaSkinnyGemmTest, FusedKernelsEqualTheUnfusedOnes) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int trial = 0; trial < 16; ++trial) {
    const int rows = 1 + trial % cuda::kSkinnyGemmMaxRows;
    // Every fourth trial wide enough for one warp a group (of 4 outputs, of 2 for SwiGLU) in
    // both kernels: the other path of the K split (SkinnyKSplit).
    const bool wide = trial % 4 == 3;
    const int in = 8 * (1 + static_cast<int>(rng() % (wide ? 64 : 600)));
    const int out = wide ? 64 * cuda::MultiprocessorCount() + static_cast<int>(rng() % 1000)
                         : 1 + static_cast<int>(rng() % 900);  // also the SwiGLU's hidden: odd ones too
    SCOPED_TRACE(::testing::Message() << rows << " x " << in << " x " << out);
    DeviceArena arena;
    // fp32 X with values bf16 cannot hold exactly.
    std::vector<float> x32(static_cast<size_t>(rows) * in);
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

    // X rounded in the loads.
    __nv_bfloat16* x_rounded = arena.Alloc<__nv_bfloat16>(x32.size());
    float* y_unfused = arena.Alloc<float>(static_cast<size_t>(rows) * out);
    float* y_fused = arena.Alloc<float>(static_cast<size_t>(rows) * out + kGuard);
    CUDA_OK(cudaMemset(y_fused + static_cast<size_t>(rows) * out, 0xFF, kGuard * sizeof(float)));
    ASSERT_EQ(cuda::LaunchToBf16(x32d, x32.size(), x_rounded, nullptr), cudaSuccess);
    ASSERT_EQ(cuda::LaunchSkinnyGemm(x_rounded, rows, in, wd, out, y_unfused, 0.0f, nullptr), cudaSuccess);
    ASSERT_EQ(cuda::LaunchSkinnyGemmRoundingX(x32d, rows, in, wd, out, y_fused, 0.0f, nullptr), cudaSuccess);
    const std::vector<float> a = ToHost(y_unfused, static_cast<size_t>(rows) * out);
    const std::vector<float> b = ToHost(y_fused, a.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "rounding in the loads";
    ExpectGuardIntact(y_fused + a.size());
    // beta = 1 adds to y: the same fp32 sums as the unfused GEMM with beta = 1.
    ASSERT_EQ(cuda::LaunchSkinnyGemm(x_rounded, rows, in, wd, out, y_unfused, 1.0f, nullptr), cudaSuccess);
    ASSERT_EQ(cuda::LaunchSkinnyGemmRoundingX(x32d, rows, in, wd, out, y_fused, 1.0f, nullptr), cudaSuccess);
    const std::vector<float> a2 = ToHost(y_unfused, a.size());
    const std::vector<float> b2 = ToHost(y_fused, a.size());
    EXPECT_EQ(std::memcmp(a2.data(), b2.data(), a2.size() * sizeof(float)), 0) << "rounding in the loads, beta 1";
    EXPECT_NE(std::memcmp(a.data(), a2.data(), a.size() * sizeof(float)), 0) << "beta 1 added nothing";

    // SwiGLU in the epilogue.
    float* gu = arena.Alloc<float>(static_cast<size_t>(rows) * 2 * out);
    __nv_bfloat16* h_unfused = arena.Alloc<__nv_bfloat16>(static_cast<size_t>(rows) * out);
    __nv_bfloat16* h_fused = arena.Alloc<__nv_bfloat16>(static_cast<size_t>(rows) * out + 2 * kGuard);
    CUDA_OK(cudaMemset(h_fused + static_cast<size_t>(rows) * out, 0xFF, kGuard * sizeof(uint32_t)));
    ASSERT_EQ(cuda::LaunchSkinnyGemm(xd, rows, in, gud, 2 * out, gu, 0.0f, nullptr), cudaSuccess);
    ASSERT_EQ(cuda::LaunchSwiGlu(gu, rows, out, h_unfused, nullptr), cudaSuccess);
    ASSERT_EQ(cuda::LaunchSkinnyGateUpSwiGlu(xd, rows, in, gud, out, h_fused, nullptr), cudaSuccess);
    const std::vector<__nv_bfloat16> hu = ToHost(h_unfused, static_cast<size_t>(rows) * out);
    const std::vector<__nv_bfloat16> hf = ToHost(h_fused, hu.size());
    EXPECT_EQ(std::memcmp(hu.data(), hf.data(), hu.size() * sizeof(__nv_bfloat16)), 0) << "SwiGLU in the epilogue";
    ExpectGuardIntact(h_fused + hu.size());
    std::vector<double> prod, scale;
    Reference(xf, rows, in, guf, 2 * out, &prod, &scale);
    ExpectSwiGluNear(hf, prod, scale, rows, out);
  }
}

// The RMSNorm in the loads (LaunchSkinnyGemmNormingX, LaunchSkinnyGateUpSwiGluNormingX)
// against a plain one written here: per row s = 1 / sqrt(mean(x^2) + eps) in double, then
// s * sum_k bf16(g_k x_k) w_k in double. The kernel differs from it only by fp32 sums (the
// products' and the squares'), so within 5e-6 of the products' magnitudes as above; a norm
// left out, a wrong mean (over the lanes' part, or K - 8) or a gain not applied moves
// elements by far more. Also within bf16's rounding of the unfused path (norm kernel, GEMM),
// which rounds g x s instead of g x.
TEST(CudaSkinnyGemmTest, NormInTheLoadsMatchesAPlainNorm) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.25f, 2.0f);
  const int ins[] = {8, 200, 1024, 4096};
  // The last trial's outputs outnumber what the grid covers at once (16 CTAs an SM of 16 or 8
  // outputs), so each warp runs several groups and must start each one's squares afresh.
  for (int trial = 0; trial < 17; ++trial) {
    const bool many_groups = trial == 16;
    const int rows = many_groups ? 3 : 1 + trial % cuda::kSkinnyGemmMaxRows;
    const int in = many_groups ? 8 : ins[rng() % 4];
    const int out = many_groups ? 40000 : 1 + static_cast<int>(rng() % 700);
    const float eps = trial % 2 == 0 ? 1e-5f : 1e-6f;
    SCOPED_TRACE(::testing::Message() << rows << " x " << in << " x " << out);
    DeviceArena arena;
    // Rows of different scales, so that a scale taken from the wrong row shows.
    std::vector<float> x(static_cast<size_t>(rows) * in), gain(in);
    for (int r = 0; r < rows; ++r) {
      const float row_scale = std::ldexp(1.0f, r % 5 - 2);
      for (int k = 0; k < in; ++k) x[static_cast<size_t>(r) * in + k] = row_scale * normal(rng);
    }
    for (float& g : gain) g = uniform(rng);
    std::vector<__nv_bfloat16> wb, gub;
    std::vector<float> wf, guf;
    RandomBf16(rng, static_cast<size_t>(out) * in, wb, wf);
    RandomBf16(rng, static_cast<size_t>(2 * out) * in, gub, guf);
    // The reference's inputs: bf16(g x) per element, and each row's scale.
    std::vector<float> gx(x.size());
    std::vector<double> row_scale(rows);
    for (int r = 0; r < rows; ++r) {
      double ss = 0;
      for (int k = 0; k < in; ++k) {
        const float v = x[static_cast<size_t>(r) * in + k];
        ss += static_cast<double>(v) * v;
        gx[static_cast<size_t>(r) * in + k] = __bfloat162float(__float2bfloat16(gain[k] * v));
      }
      row_scale[r] = 1.0 / std::sqrt(ss / in + eps);
    }
    const float* xd = arena.Copy(x);
    const float* gd = arena.Copy(gain);

    std::vector<double> want, scale;
    Reference(gx, rows, in, wf, out, &want, &scale);
    for (int r = 0; r < rows; ++r) {
      for (int o = 0; o < out; ++o) {
        want[static_cast<size_t>(r) * out + o] *= row_scale[r];
        scale[static_cast<size_t>(r) * out + o] *= row_scale[r];
      }
    }
    float* y = arena.Alloc<float>(want.size() + kGuard);
    CUDA_OK(cudaMemset(y + want.size(), 0xFF, kGuard * sizeof(float)));
    ASSERT_EQ(cuda::LaunchSkinnyGemmNormingX(xd, gd, eps, rows, in, arena.Copy(wb), out, y, nullptr), cudaSuccess);
    const std::vector<float> got = ToHost(y, want.size());
    ExpectClose(got, want, scale);
    ExpectGuardIntact(y + want.size());

    // The unfused path: the norm kernel, then the GEMM of its bf16 output.
    __nv_bfloat16* normed = arena.Alloc<__nv_bfloat16>(x.size());
    float* x_copy = arena.Copy(x);
    float* y_unfused = arena.Alloc<float>(want.size());
    ASSERT_EQ(cuda::LaunchResidualRmsNorm(x_copy, nullptr, gd, rows, in, eps, normed, nullptr), cudaSuccess);
    ASSERT_EQ(cuda::LaunchSkinnyGemm(normed, rows, in, arena.Copy(wb), out, y_unfused, 0.0f, nullptr), cudaSuccess);
    const std::vector<float> unfused = ToHost(y_unfused, want.size());
    int far = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      // Both paths round X's factor to bf16, each within 2^-8 relative: 2^-7 a product at most.
      if (!(std::fabs(got[i] - unfused[i]) <= 8e-3 * scale[i] + 1e-6) && ++far <= 5) {
        ADD_FAILURE() << "element " << i << ": " << got[i] << " against the unfused " << unfused[i];
      }
    }
    EXPECT_EQ(far, 0);

    // The gate/up GEMM with SwiGLU: the same norm, the scale applied before SwiGLU.
    std::vector<double> prod, prod_scale;
    Reference(gx, rows, in, guf, 2 * out, &prod, &prod_scale);
    __nv_bfloat16* h = arena.Alloc<__nv_bfloat16>(static_cast<size_t>(rows) * out + 2 * kGuard);
    CUDA_OK(cudaMemset(h + static_cast<size_t>(rows) * out, 0xFF, kGuard * sizeof(uint32_t)));
    ASSERT_EQ(cuda::LaunchSkinnyGateUpSwiGluNormingX(xd, gd, eps, rows, in, arena.Copy(gub), out, h, nullptr),
              cudaSuccess);
    const std::vector<__nv_bfloat16> hh = ToHost(h, static_cast<size_t>(rows) * out);
    ExpectGuardIntact(h + hh.size());
    int bad = 0;
    for (int r = 0; r < rows; ++r) {
      for (int i = 0; i < out; ++i) {
        const size_t gi = static_cast<size_t>(r) * 2 * out + i, ui = gi + out;
        const double g = prod[gi] * row_scale[r], u = prod[ui] * row_scale[r];
        const double want_h = g / (1.0 + std::exp(-g)) * u;
        const double got_h = __bfloat162float(hh[static_cast<size_t>(r) * out + i]);
        const double tolerance = 8e-3 * std::fabs(want_h) + 1e-4 * row_scale[r] * (prod_scale[gi] + prod_scale[ui]);
        if (!(std::fabs(got_h - want_h) <= tolerance) && ++bad <= 5) {
          ADD_FAILURE() << "h[" << r << "][" << i << "] " << got_h << " against " << want_h;
        }
      }
    }
    EXPECT_EQ(bad, 0);
  }
  // Refused: a gain that is not 16-byte aligned.
  DeviceArena arena;
  std::vector<float> x(64, 1.0f);
  std::vector<__nv_bfloat16> wb;
  std::vector<float> wf;
  RandomBf16(rng, 8 * 64, wb, wf);
  float* xd = arena.Copy(x);
  EXPECT_EQ(cuda::LaunchSkinnyGemmNormingX(xd, xd + 1, 1e-5f, 1, 64, arena.Copy(wb), 8, arena.Alloc<float>(8), nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace lazykv
