// Dense fp32 building blocks of the Llama forward pass (CPU reference).
#pragma once

#include <cstddef>

namespace lazykv::cpu {

// out[r] = x[r] / rms(x[r]) * weight, for `rows` rows of `dim`.
void RmsNorm(const float* x, const float* weight, int rows, int dim, float eps, float* out);

// y[r][o] = sum_i x[r][i] * w[o][i]: x is [rows][in], w is [out][in] (PyTorch layout).
void MatmulTransposed(const float* x, int rows, int in, const float* w, int out, float* y);

// gate[i] = silu(gate[i]) * up[i].
void SwiGlu(float* gate, const float* up, size_t n);

// x[i] += y[i].
void AddInPlace(float* x, const float* y, size_t n);

}  // namespace lazykv::cpu
