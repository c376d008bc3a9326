// How engine_load_bench's runs are shown: one table row per mode, the lazy/block ratios,
// and the same as JSON.
#pragma once

#include <string>
#include <vector>

#include "bench/engine_load_bench.h"
#include "nlohmann/json.hpp"

namespace lazykv {

// The KV pool and how many worst-case requests of each mode it holds at once.
std::string FormatLoadCapacity(const std::vector<ModeLoadResult>& results, int block_size, uint64_t bytes_per_block);

// One row per mode: TTFT, throughputs, batch and queue per step, pool peak, prompt tokens.
std::string FormatLoadTable(const std::vector<ModeLoadResult>& results);

// Lazy against block: how much lower lazy's TTFT and how much higher its throughput (an
// empty string without both modes).
std::string FormatLazyBlockRatios(const std::vector<ModeLoadResult>& results);

nlohmann::json ToJson(const ModeLoadResult& r);
// {"setup": setup, "modes": [...], "lazy_over_block": {...} when both ran}.
nlohmann::json LoadRunToJson(const std::vector<ModeLoadResult>& results, const nlohmann::json& setup);

}  // namespace lazykv
