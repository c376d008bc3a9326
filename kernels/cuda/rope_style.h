// The model config's RoPE style (common/model_config.h) as the CUDA kernels name it
// (paged_kv.h): the one place where the two enums meet. Host code only.
#pragma once

#include "common/model_config.h"
#include "kernels/cuda/paged_kv.h"

namespace lazykv::cuda {

inline RopeStyle KernelRopeStyle(lazykv::RopeStyle style) {
  return style == lazykv::RopeStyle::kInterleaved ? RopeStyle::kInterleaved : RopeStyle::kRotateHalf;
}

}  // namespace lazykv::cuda
