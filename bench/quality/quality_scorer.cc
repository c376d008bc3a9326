#include "bench/quality/quality_scorer.h"

#include <deque>
#include <unordered_map>

#include "absl/strings/str_format.h"
#include "bench/quality/quality_metrics.h"
#include "common/status_macros.h"

namespace lazykv::quality {

const std::vector<int32_t>& ScoringJob::target() const { return spec_.score_free_run ? own_target_ : *spec_.target; }

std::optional<GenerateRequest> ScoringJob::NextRequest() {
  if (done_) return std::nullopt;
  request_tokens_ = 0;
  GenerateRequest request;
  request.docs = spec_.docs;
  request.prompt = spec_.prompt;
  request.record_logits = true;
  request.repair_tokens = spec_.repair_tokens;
  request.sampling.temperature = 0;
  request.sampling.seed = 0;
  if (!free_run_done_) {
    request.mode = spec_.mode;
    request.sampling.max_tokens = spec_.score_free_run ? spec_.free_run_tokens : static_cast<int>(spec_.target->size());
    return request;
  }
  const std::vector<int32_t>& t = target();
  request.mode = spec_.restart_mode;
  request.prompt.insert(request.prompt.end(), t.begin(), t.begin() + pos_);
  request.sampling.max_tokens = static_cast<int>(t.size() - pos_);
  return request;
}

bool ScoringJob::OnToken(int32_t token) {
  const size_t k = request_tokens_++;
  if (!free_run_done_ && (spec_.full_free_run || spec_.score_free_run)) return false;
  const std::vector<int32_t>& t = free_run_done_ ? target() : *spec_.target;
  const size_t i = (free_run_done_ ? pos_ : 0) + k;
  return i >= t.size() || t[i] != token;
}

absl::Status ScoringJob::Take(const GenerateResult& result) {
  ++out_.requests;
  if (!free_run_done_) {
    free_run_done_ = true;
    out_.prompt_tokens = result.usage.prompt_tokens;
    out_.computed_tokens = result.usage.computed_tokens;
    out_.repaired_tokens = result.usage.repaired_tokens;
    out_.generated = result.tokens;
    if (result.finish_reason == "stop" && result.step_logits.size() > result.tokens.size()) {
      out_.generated.push_back(ArgMax(result.step_logits[result.tokens.size()]));  // the EOS it sampled
    }
    if (!spec_.sketch_ids.empty()) {
      for (const std::vector<float>& logits : result.step_logits) {
        std::vector<float>& row = out_.sketch.emplace_back();
        row.reserve(spec_.sketch_ids.size());
        for (int32_t id : spec_.sketch_ids) row.push_back(logits[id]);
      }
    }
    if (spec_.score_free_run) own_target_ = out_.generated;
  }
  const std::vector<int32_t>& t = target();
  const size_t start = pos_;
  for (size_t s = 0; s < result.step_logits.size() && pos_ < t.size(); ++s) {
    const std::vector<float>& logits = result.step_logits[s];
    const int32_t want = t[pos_];
    const bool greedy_match = ArgMax(logits) == want;
    out_.logprobs.push_back(LogProbOf(logits, want));
    out_.top1.push_back(greedy_match ? 1 : 0);
    ++pos_;
    if (!greedy_match) break;  // the steps after this one saw another token
  }
  if (pos_ >= t.size()) {
    done_ = true;
  } else if (pos_ == start) {
    return absl::InternalError(absl::StrFormat("a request scored no target token (at %d of %d)", pos_, t.size()));
  }
  return absl::OkStatus();
}

absl::Status RunJobs(Engine& engine, std::span<ScoringJob* const> jobs, int max_in_flight) {
  size_t next = 0;
  std::deque<ScoringJob*> ready;  // jobs whose last request finished
  std::unordered_map<RequestId, ScoringJob*> in_flight;
  std::vector<EngineEvent> events;
  while (true) {
    while (static_cast<int>(in_flight.size()) < max_in_flight && (!ready.empty() || next < jobs.size())) {
      ScoringJob* job;
      if (!ready.empty()) {
        job = ready.front();
        ready.pop_front();
      } else {
        job = jobs[next++];
      }
      std::optional<GenerateRequest> request = job->NextRequest();
      if (!request) continue;
      ASSIGN_OR_RETURN(const RequestId id, engine.Submit(*std::move(request)));
      in_flight.emplace(id, job);
    }
    if (in_flight.empty()) return absl::OkStatus();
    events.clear();
    engine.Step(&events);
    for (const EngineEvent& event : events) {
      auto it = in_flight.find(event.id);
      if (it == in_flight.end()) continue;
      ScoringJob* job = it->second;
      if (event.kind == EngineEvent::Kind::kToken) {
        if (job->OnToken(event.token.id)) engine.StopEarly(event.id);
        continue;
      }
      in_flight.erase(it);
      if (event.kind == EngineEvent::Kind::kFailed) return event.status;
      RETURN_IF_ERROR(job->Take(*event.result));
      ready.push_back(job);
    }
  }
}

}  // namespace lazykv::quality
