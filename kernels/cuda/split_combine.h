// Split-KV for the attention kernels (decode and prefill): when a launch would not fill the
// GPU, each (query row, head) pair's visible keys are cut into `splits` parts, each part
// leaves a partial softmax state (softmax_merge.cuh) in a workspace, and one combine kernel
// merges a pair's partials into its output.
//
// The workspace (floats), for a capacity of `pairs` pairs (pair = row * n_heads + head) and
// `splits` splits, state i = pair * splits + split:
//   m   [pairs][splits]            the split's running max, in log2 units (the scores times
//                                  log2(e) / sqrt(head_dim))
//   l   [pairs][splits]            its sum of 2^(score - m)
//   acc [pairs][splits][head_dim]  its unnormalized output, sum of 2^(score - m) v
// A split that saw no key has l = 0 (its m and acc are not used). SplitWorkspaceBytes()
// bytes in all.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace lazykv::cuda {

inline size_t SplitWorkspaceBytes(size_t pairs, int splits, int head_dim) {
  return pairs * splits * (head_dim + 2) * sizeof(float);
}

// The rows to combine come in groups (grid y): group g is rows [row_offsets[g],
// row_offsets[g + 1]) of the output, at most max_rows of them; with no row_offsets, one group
// of rows [0, max_rows). The output is [rows][n_heads][head_dim] fp32, pair (row, head) at
// (row * n_heads + head) * head_dim, row counted from 0 over all groups.
struct SplitCombineParams {
  const float* workspace = nullptr;
  float* out = nullptr;
  const int32_t* row_offsets = nullptr;  // [groups + 1], or null
  size_t pairs = 0;                      // the workspace's capacity in pairs
  int splits = 0;
  int n_heads = 0;
  int head_dim = 0;
  int max_rows = 0;
  int groups = 1;
};

// The threads that merge one pair: a CTA of 128 (decode: few pairs, up to 1024 splits, each
// split's weight formed once in shared memory) or one warp (prefill: many pairs, at most 16
// splits; where the launch is at most a wave, each lane holds every split's partials for its
// dimensions in registers, loaded before the weights are formed: one round trip a pair). The
// output is the same bit for bit either way.
enum class SplitCombineShape { kCtaPerPair, kWarpPerPair };

// Launches the combine (cudaErrorInvalidValue for bad shapes, else what cudaGetLastError
// reports after the launch).
cudaError_t LaunchSplitCombine(const SplitCombineParams& p, SplitCombineShape shape, cudaStream_t stream);

}  // namespace lazykv::cuda
