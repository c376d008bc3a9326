// The order a backend lays a forward pass's sequences out in, so that the few-query sequences
// (which the CUDA backend's prefill kernel packs a KV group's heads into a tile for) can run as
// a launch apart from longer ones. Host code; stateless.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "worker/backend/backend.h"

namespace lazykv {

// A permutation of the indices of `steps`: the engine's order, except that where few_max > 0
// and both groups below hold a step with tokens, the steps after the leading run of steps with
// at most one token (the decoding sequences, which the engine puts first) go in two groups:
// those with at most few_max tokens, then the longer ones, each group in the engine's order.
// *many_first: where the longer group starts, counted among the steps with tokens; 0 where the
// order is the engine's.
std::vector<size_t> PrefillStepOrder(std::span<const SequenceStep> steps, size_t few_max, size_t* many_first);

}  // namespace lazykv
