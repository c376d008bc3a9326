#include "bench/trace_summary.h"

#include <algorithm>
#include <map>
#include <string_view>
#include <utility>

#include "absl/strings/str_format.h"

namespace lazykv::bench {

std::string ShortKernelName(std::string name) {
  static constexpr std::string_view kAnonymous = "(anonymous namespace)::";
  for (size_t at; (at = name.find(kAnonymous)) != std::string::npos;) name.erase(at, kAnonymous.size());
  // Outside template arguments: drop the parameters (from the first '('), and everything up
  // to the last "::" or space before them (namespaces, the return type).
  int depth = 0;
  size_t cut = 0;
  for (size_t i = 0; i < name.size(); ++i) {
    const char ch = name[i];
    if (ch == '<') ++depth;
    if (ch == '>') --depth;
    if (depth != 0) continue;
    if (ch == '(') {
      name.resize(i);
      break;
    }
    if (ch == ' ' || (ch == ':' && i + 1 < name.size() && name[i + 1] == ':')) cut = ch == ' ' ? i + 1 : i + 2;
  }
  name = name.substr(std::min(cut, name.size()));
  if (name.size() > 60) name = name.substr(0, 57) + "...";
  return name;
}

TraceTotals TotalTrace(const std::vector<TraceRecord>& records) {
  if (records.empty()) return {};
  std::vector<std::pair<uint64_t, uint64_t>> intervals;
  for (const TraceRecord& r : records) intervals.emplace_back(r.start_ns, std::max(r.start_ns, r.end_ns));
  std::sort(intervals.begin(), intervals.end());
  TraceTotals t;
  uint64_t covered_to = intervals.front().first;  // the union so far ends here
  for (const auto& [start, end] : intervals) {
    const uint64_t from = std::max(start, covered_to);
    if (end > from) t.busy_ns += end - from;
    covered_to = std::max(covered_to, end);
  }
  t.span_ns = covered_to - intervals.front().first;
  return t;
}

std::map<std::string, uint64_t> AddedTime(const std::vector<TraceRecord>& records) {
  std::map<std::string, uint64_t> added;
  if (records.empty()) return added;
  std::vector<const TraceRecord*> by_start;
  for (const TraceRecord& r : records) by_start.push_back(&r);
  std::stable_sort(by_start.begin(), by_start.end(),
                   [](const TraceRecord* a, const TraceRecord* b) { return a->start_ns < b->start_ns; });
  uint64_t ends = by_start.front()->start_ns;  // where the work so far ends
  for (const TraceRecord* r : by_start) {
    const uint64_t from = std::max(r->start_ns, ends);
    added[r->name] += r->end_ns > from ? r->end_ns - from : 0;
    ends = std::max(ends, r->end_ns);
  }
  return added;
}

std::string SummarizeTrace(const std::vector<TraceRecord>& records, int steps) {
  if (records.empty() || steps <= 0) return "kernel trace: no records\n";
  struct Sum {
    int calls = 0;
    uint64_t ns = 0;
    uint64_t adds_ns = 0;  // how much later the work so far ends for it (see the header)
  };
  std::map<std::string, Sum> by_name;
  for (const TraceRecord& r : records) {
    Sum& s = by_name[r.name];
    ++s.calls;
    s.ns += r.end_ns > r.start_ns ? r.end_ns - r.start_ns : 0;
  }
  for (const auto& [name, ns] : AddedTime(records)) by_name[name].adds_ns = ns;
  const TraceTotals totals = TotalTrace(records);
  const uint64_t span = std::max<uint64_t>(1, totals.span_ns), busy = totals.busy_ns;
  std::vector<std::pair<std::string, Sum>> sorted(by_name.begin(), by_name.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  const double per_step = 1e3 * steps;  // ns -> us per step
  std::string out =
      absl::StrFormat("%-60s %10s %10s %7s %10s\n", "kernel", "calls/step", "us/step", "share", "adds us");
  for (const auto& [name, s] : sorted) {
    out += absl::StrFormat("%-60s %10.1f %10.1f %6.1f%% %10.1f\n", name, static_cast<double>(s.calls) / steps,
                           s.ns / per_step, 100.0 * s.ns / span, s.adds_ns / per_step);
  }
  out += absl::StrFormat(
      "per step: span %.1f us, some work running %.1f us, gaps %.1f us (%.1f%%), %zu records over %d steps\n",
      span / per_step, busy / per_step, (span - busy) / per_step, 100.0 * (span - busy) / span, records.size(), steps);
  return out;
}

}  // namespace lazykv::bench
