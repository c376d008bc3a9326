#include "bench/quality/quality_run.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>
#include <random>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace lazykv::quality {

const std::array<Setting, kNumSettings>& Settings() {
  using M = AttentionMode;
  static const std::array<Setting, kNumSettings> settings = {{
      {"none", 0, M::kNone, M::kPrefix, false, kNone},
      {"prefix", 0, M::kPrefix, M::kPrefix, false, kNone},
      {"block", 0, M::kBlock, M::kBlock, false, kNone},
      {"lazy", 0, M::kLazy, M::kLazy, false, kNone},
      {"control", 0, M::kNone, M::kPrefix, true, kNone},
      {"none+long", 1, M::kNone, M::kPrefix, false, kNoneLong},
      {"lazy+long", 1, M::kLazy, M::kLazy, false, kNoneLong},
      {"none+noanchor", 2, M::kNone, M::kPrefix, false, kNoneBare},
      {"lazy+noanchor", 2, M::kLazy, M::kLazy, false, kNoneBare},
      {"lazy+repair4", 0, M::kLazy, M::kLazy, false, kNone, 4},
      {"lazy+repair16", 0, M::kLazy, M::kLazy, false, kNone, 16},
  }};
  return settings;
}

std::vector<int32_t> SketchIds(int vocab_size, int count, uint64_t seed) {
  std::vector<int32_t> ids(vocab_size);
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(std::min(count, vocab_size));
  std::sort(ids.begin(), ids.end());
  return ids;
}

namespace {

absl::Status CheckContext(const Engine& engine, const std::vector<StoryDoc>& corpus, const QualityCase& c,
                          int free_run_tokens) {
  size_t total = engine.anchor().size() + c.prompt.size() + std::max<size_t>(free_run_tokens, c.held_out.size());
  size_t control = total;
  for (int id : c.doc_ids) total += corpus[id].tokens.size();
  for (int id : c.control_ids) control += corpus[id].tokens.size();
  const size_t need = std::max(total, control);
  if (need > static_cast<size_t>(engine.config().max_seq_len)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("case %d (%d documents) needs %d positions with an anchor of %d tokens; the model's context "
                        "is %d: fewer documents or --free-run-tokens",
                        c.index, c.count, need, engine.anchor().size(), engine.config().max_seq_len));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RunResults> RunQuality(std::array<Engine*, 3> engines, const std::vector<StoryDoc>& corpus,
                                      const std::vector<QualityCase>& cases, const RunOptions& options) {
  const std::array<bool, 3> anchor_on = {true, options.long_anchor, options.anchorless};
  for (int a = 0; a < 3; ++a) {
    if (anchor_on[a] && engines[a] == nullptr) return absl::InvalidArgumentError("RunQuality: missing engine");
  }
  if (options.anchorless && !engines[2]->anchor().empty()) {
    return absl::InvalidArgumentError("RunQuality: engines[2] must be anchorless");
  }
  for (int a = 0; a < 3; ++a) {
    if (!anchor_on[a]) continue;
    for (const QualityCase& c : cases) RETURN_IF_ERROR(CheckContext(*engines[a], corpus, c, options.free_run_tokens));
  }
  const std::vector<int32_t> sketch_ids = SketchIds(engines[0]->config().vocab_size, options.sketch_size, options.seed);
  RunResults results;
  results.per_case.resize(cases.size());
  // Jobs live here; results are copied out at the end.
  struct Slot {
    size_t c;
    SettingId s;
    bool held_out;
    std::unique_ptr<ScoringJob> job;
  };
  std::vector<Slot> slots;
  auto active = [&](size_t c, SettingId s) {
    if (s == kPrefix || s == kBlock) return options.check_every > 0 && cases[c].index % options.check_every == 0;
    if (Settings()[s].repair > 0 && !options.repair) return false;
    return anchor_on[Settings()[s].anchor];
  };
  auto spec_for = [&](size_t c, SettingId s) {
    const Setting& setting = Settings()[s];
    const QualityCase& qc = cases[c];
    ScoringJobSpec spec;
    spec.docs = DocsOf(corpus, setting.control ? qc.control_ids : qc.doc_ids);
    spec.prompt = qc.prompt;
    spec.mode = setting.mode;
    spec.restart_mode = setting.restart_mode;
    spec.repair_tokens = setting.repair;
    return spec;
  };
  // Pass 1: the references' free runs and every held-out job; pass 2: the continuations
  // scored against a reference's free run.
  std::vector<std::array<int, kNumSettings>> continuation_slot(cases.size());
  auto build = [&](int pass) {
    for (size_t c = 0; c < cases.size(); ++c) {
      for (int si = 0; si < kNumSettings; ++si) {
        const SettingId s = static_cast<SettingId>(si);
        if (!active(c, s)) continue;
        const bool baseline = Settings()[s].reference == s;
        if ((pass == 0) == baseline) {
          ScoringJobSpec spec = spec_for(c, s);
          spec.free_run_tokens = options.free_run_tokens;
          spec.score_free_run = baseline;
          spec.sketch_ids = sketch_ids;
          if (!baseline) spec.target = &slots[continuation_slot[c][Settings()[s].reference]].job->target();
          continuation_slot[c][s] = static_cast<int>(slots.size());
          slots.push_back(Slot{c, s, false, std::make_unique<ScoringJob>(std::move(spec))});
        }
        if (pass == 0) {
          ScoringJobSpec spec = spec_for(c, s);
          spec.mode = spec.restart_mode;
          spec.full_free_run = false;
          spec.target = &cases[c].held_out;
          slots.push_back(Slot{c, s, true, std::make_unique<ScoringJob>(std::move(spec))});
        }
      }
    }
  };
  auto run = [&](int pass, size_t begin) -> absl::Status {
    for (int a = 0; a < 3; ++a) {
      if (!anchor_on[a]) continue;
      std::vector<ScoringJob*> jobs;
      for (size_t k = begin; k < slots.size(); ++k) {
        if (Settings()[slots[k].s].anchor == a) jobs.push_back(slots[k].job.get());
      }
      const auto start = std::chrono::steady_clock::now();
      RETURN_IF_ERROR(RunJobs(*engines[a], jobs, options.max_in_flight));
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      int requests = 0;
      for (const ScoringJob* job : jobs) requests += job->output().requests;
      spdlog::info("pass {} anchor {}: {} jobs, {} requests in {:.1f} s", pass + 1, a, jobs.size(), requests, seconds);
      results.requests += requests;
      results.seconds += seconds;
    }
    return absl::OkStatus();
  };
  slots.reserve(cases.size() * kNumSettings * 2);
  build(0);
  RETURN_IF_ERROR(run(0, 0));
  const size_t pass2 = slots.size();
  build(1);
  RETURN_IF_ERROR(run(1, pass2));
  for (Slot& slot : slots) {
    CaseSettingResult& r = results.per_case[slot.c][slot.s];
    r.ran = true;
    (slot.held_out ? r.held_out : r.continuation) = slot.job->output();
  }
  return results;
}

}  // namespace lazykv::quality
