// The element type of what the CUDA backend stores: weight matrices, GEMM inputs, the KV
// pool and chunk payloads. bf16 is the default (the tensor-core attention kernels need
// it); fp32 is the backend's full-precision mode, which runs attention on the generic
// kernel and matches the fp32 CPU backend up to fp32 arithmetic order.
#pragma once

#include <cstddef>

namespace lazykv::cuda {

enum class Element { kBf16, kFp32 };

inline size_t ElementBytes(Element e) { return e == Element::kFp32 ? 4 : 2; }
inline const char* ElementName(Element e) { return e == Element::kFp32 ? "fp32" : "bf16"; }

}  // namespace lazykv::cuda
