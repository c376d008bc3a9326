// Shared by the GEMM kernel tests: a plain double-precision product of bf16 values (their
// exact fp32 twins) with each element's error scale, a per-element comparison within fp32
// accumulation's error, a SwiGLU of the products, and guard words after an output that a
// write past its end spoils.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace lazykv::testing {

// y = x w^T in double (x [rows][in], w [out][in]), and the sum of |x_k w_k| per element (the
// error's scale).
inline void Reference(const std::vector<float>& x, int rows, int in, const std::vector<float>& w, int out,
                      std::vector<double>* y, std::vector<double>* scale) {
  y->assign(static_cast<size_t>(rows) * out, 0.0);
  scale->assign(y->size(), 0.0);
  for (int r = 0; r < rows; ++r) {
    for (int o = 0; o < out; ++o) {
      double acc = 0, mag = 0;
      for (int k = 0; k < in; ++k) {
        const double p = static_cast<double>(x[static_cast<size_t>(r) * in + k]) * w[static_cast<size_t>(o) * in + k];
        acc += p;
        mag += std::fabs(p);
      }
      (*y)[static_cast<size_t>(r) * out + o] = acc;
      (*scale)[static_cast<size_t>(r) * out + o] = mag;
    }
  }
}

// Every element within fp32 accumulation's error of the reference: `relative` (default 5e-6)
// of the sum of the products' magnitudes (the skinny kernel's lane adds up to K/32 products in
// order, then the warp reduces: about 1.3e-6 for K = 14336), where one product left out or
// counted twice moves an element by K^-1 of that sum on average (7e-5 at K = 14336).
inline void ExpectClose(const std::vector<float>& got, const std::vector<double>& want,
                        const std::vector<double>& scale, double relative = 5e-6) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tolerance = relative * scale[i] + 1e-6;
    if (!(std::fabs(got[i] - want[i]) <= tolerance) && ++bad <= 5) {
      ADD_FAILURE() << "element " << i << ": " << got[i] << " against " << want[i] << " (scale " << scale[i] << ")";
    }
  }
  EXPECT_EQ(bad, 0);
}

// h[r][i] = SwiGLU(gate, up) in bf16 against the double-precision one of the products of
// [gate; up] (`prod` [rows][2 * hidden] and its `scale` from Reference): within bf16's rounding
// (2^-8 relative) plus the products' error carried through.
inline void ExpectSwiGluNear(const std::vector<__nv_bfloat16>& h, const std::vector<double>& prod,
                             const std::vector<double>& scale, int rows, int hidden) {
  int bad = 0;
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < hidden; ++i) {
      const size_t gi = static_cast<size_t>(r) * 2 * hidden + i, ui = gi + hidden;
      const double g = prod[gi], u = prod[ui];
      const double want = g / (1.0 + std::exp(-g)) * u;
      const double got = __bfloat162float(h[static_cast<size_t>(r) * hidden + i]);
      const double tolerance = 8e-3 * std::fabs(want) + 1e-4 * (scale[gi] + scale[ui]);
      if (!(std::fabs(got - want) <= tolerance) && ++bad <= 5) {
        ADD_FAILURE() << "h[" << r << "][" << i << "] " << got << " against " << want;
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

inline constexpr size_t kGuard = 64;  // floats (or bf16 pairs) of all-ones bits after an output

inline void ExpectGuardIntact(const void* guard) {
  std::vector<uint32_t> bits(kGuard);
  ASSERT_EQ(cudaMemcpy(bits.data(), guard, kGuard * sizeof(uint32_t), cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < kGuard; ++i) EXPECT_EQ(bits[i], 0xFFFFFFFFu) << "written past the output at " << i;
}

}  // namespace lazykv::testing
