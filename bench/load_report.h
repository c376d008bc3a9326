// How load-test results are shown: JSON for files and plots, text tables for people.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "bench/load_stats.h"
#include "nlohmann/json.hpp"

namespace lazykv {

nlohmann::json ToJson(const Distribution& d);
nlohmann::json ToJson(const UsageCounts& u);
nlohmann::json ToJson(const RequestResult& r);
nlohmann::json ToJson(const LoadSummary& s);

// One run: {"summary": ..., "requests": [...]}.
nlohmann::json RunToJson(const LoadSummary& summary, const std::vector<RequestResult>& results);

// One run in a few labelled lines.
std::string FormatLoadTable(const LoadSummary& s);

// One row per mode, the same columns for each.
std::string FormatCompareTable(const std::vector<std::pair<std::string, LoadSummary>>& rows);

}  // namespace lazykv
