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

// One row per mode: TTFT, throughputs, batch and queue per step, pool peak, prompt tokens
// (the header and a row alone, to print rows as modes finish).
std::string FormatLoadTable(const std::vector<ModeLoadResult>& results);
std::string FormatLoadTableHeader();
std::string FormatLoadRow(const ModeLoadResult& r);

// Where the time goes per mode: steps and their mean time, and the decode-only steps' batch,
// time, and time per decoded token.
std::string FormatStepTable(const std::vector<ModeLoadResult>& results);

// TTFT p50 per number of a request's documents found cached, a line per mode.
std::string FormatTtftByCachedTable(const std::vector<ModeLoadResult>& results);

// Lazy against block: how much lower lazy's TTFT and how much higher its throughput (an
// empty string without both modes).
std::string FormatLazyBlockRatios(const std::vector<ModeLoadResult>& results);

// The engine samples on its scheduling thread, one row of logits per decoding request per
// step: the milliseconds of one greedy row bound the tokens per second of any batch.
double HostGreedySampleMs(int vocab_size);

// RunModesUnderLoad with its report on stdout: the host sampling cost, each mode's row as it
// finishes (and the JSON at `json_path` rewritten, so a run cut short keeps what it
// measured), then the pool's capacity, the whole table, the step table and the ratios.
absl::Status RunModesAndReport(Backend& backend, const RagTrace& trace, const std::vector<AttentionMode>& modes,
                               const LoadOptions& options, nlohmann::json setup, const std::string& json_path);

nlohmann::json ToJson(const ModeLoadResult& r);
// {"setup": setup, "modes": [...], "lazy_over_block": {...} when both ran}.
nlohmann::json LoadRunToJson(const std::vector<ModeLoadResult>& results, const nlohmann::json& setup);

}  // namespace lazykv
