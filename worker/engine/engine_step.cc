// One scheduling step: admit what fits, move chunk work along, then one forward pass
// over every decoding request plus up to max_prefill_tokens of prefill (oldest first),
// and sample.
#include <algorithm>

#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"
#include "worker/engine/engine.h"
#include "worker/engine/engine_state.h"

namespace lazykv {

int Engine::Step(std::vector<EngineEvent>* events) {
  const auto start = SteadyClock::now();
  Admit();
  AdvanceChunkJobs(events);
  const auto chunks_done = SteadyClock::now();
  std::vector<PrefillWork> prefill = PlanPrefill();
  const int ran = RunBatch(prefill, events);
  events->insert(events->end(), pending_events_.begin(), pending_events_.end());
  pending_events_.clear();
  const auto end = SteadyClock::now();
  ++timings_.steps;
  timings_.chunk_seconds += SecondsBetween(start, chunks_done);
  timings_.batch_seconds += SecondsBetween(chunks_done, end);
  return ran;
}

std::vector<Engine::PrefillWork> Engine::PlanPrefill() {
  struct Candidate {
    RequestId order;
    PrefillWork work;
    size_t remaining;
  };
  std::vector<Candidate> candidates;
  for (const auto& [key, job] : jobs_) {
    if (job->state == ChunkJob::State::kEncode && job->context_set && job->encoded < job->tokens.size()) {
      candidates.push_back({job->owner, PrefillWork{.job = job.get()}, job->tokens.size() - job->encoded});
    }
  }
  for (const auto& [id, request] : running_) {
    if (request->phase == Request::Phase::kPrefill) {
      // Up to own_ready: a repaired document's tokens wait for the segments before them.
      if (request->own_done < request->own_ready) {
        candidates.push_back({id, PrefillWork{.request = request.get()}, request->own_ready - request->own_done});
      }
    }
  }
  // The oldest request's work first; its chunks before its own tokens.
  std::stable_sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.order != b.order ? a.order < b.order : (a.work.job != nullptr) > (b.work.job != nullptr);
  });
  if (pipeline_) {
    int64_t backlog = 0;
    for (const Candidate& c : candidates) backlog += static_cast<int64_t>(c.remaining);
    pipeline_->SetPrefillBacklog(backlog);
  }
  std::vector<PrefillWork> plan;
  size_t budget = options_.max_prefill_tokens;
  for (Candidate& c : candidates) {
    if (budget == 0) break;
    c.work.count = std::min(budget, c.remaining);
    budget -= c.work.count;
    plan.push_back(c.work);
  }
  return plan;
}

int Engine::RunBatch(std::vector<PrefillWork>& prefill, std::vector<EngineEvent>* events) {
  // One entry per forward row group: a decoding request, or a piece of prefill.
  struct Target {
    Request* request = nullptr;
    ChunkJob* job = nullptr;
    Hash128 job_key;
    size_t count = 0;
    bool decode = false;
  };
  std::vector<Target> targets;
  std::vector<std::pair<RequestId, absl::Status>> failed;
  std::vector<std::pair<Hash128, absl::Status>> failed_jobs;
  for (const auto& [id, request] : running_) {
    if (request->phase != Request::Phase::kDecode) continue;
    if (absl::Status s = GrowOwnTail(request->seq, 1); !s.ok()) {
      failed.emplace_back(id, s);
      continue;
    }
    targets.push_back(Target{.request = request.get(), .job = nullptr, .job_key = {}, .count = 1, .decode = true});
  }
  for (const PrefillWork& work : prefill) {
    KvSequence& seq = work.job != nullptr ? work.job->encoder : work.request->seq;
    // The tokens that later pieces will append right after this one (PlanPrefill's remaining).
    const size_t ahead = work.job != nullptr ? work.job->tokens.size() - work.job->encoded - work.count
                                             : work.request->own_ready - work.request->own_done - work.count;
    if (absl::Status s = GrowOwnTail(seq, work.count, ahead); !s.ok()) {
      if (work.job != nullptr) {
        failed_jobs.emplace_back(work.job->key, s);
      } else {
        failed.emplace_back(work.request->id, s);
      }
      continue;
    }
    targets.push_back(Target{.request = work.request,
                             .job = work.job,
                             .job_key = work.job != nullptr ? work.job->key : Hash128{},
                             .count = work.count,
                             .decode = false});
  }

  // Every sequence's table is final now: the steps may point into them. A request samples
  // when it decodes or finishes its prefill (unless max_tokens is 0); its uniform is drawn
  // here, from its own generator, so the tokens do not depend on the backend.
  std::vector<SequenceStep> steps;
  std::vector<StepSampling> sampling;
  int tokens_run = 0;
  for (const Target& t : targets) {
    tokens_run += static_cast<int>(t.count);
    StepSampling sample;
    if (t.job != nullptr) {
      steps.push_back(SequenceStep{std::span(t.job->tokens).subspan(t.job->encoded, t.count), t.job->encoder.table(),
                                   LogitsWanted::kNone});
    } else {
      Request& r = *t.request;
      const bool samples = (t.decode || r.own_done + t.count == r.own.size()) && r.input.sampling.max_tokens > 0;
      const std::span<const int32_t> tokens = t.decode ? std::span<const int32_t>(&r.next_input, 1)
                                                       : std::span<const int32_t>(r.own).subspan(r.own_done, t.count);
      steps.push_back(SequenceStep{tokens, r.seq.table(), samples ? LogitsWanted::kLast : LogitsWanted::kNone});
      if (samples) {
        sample = StepSampling{
            .sample = true, .row = NextRowSampling(r.input.sampling, *r.rng), .keep_logits = r.input.record_logits};
      }
    }
    sampling.push_back(sample);
  }
  std::vector<SampledToken> sampled;
  std::vector<std::vector<float>> logits;
  if (!steps.empty()) {
    const auto start = SteadyClock::now();
    const absl::Status s = backend_->ForwardAndSample(steps, sampling, &sampled, &logits);
    const double forward_seconds = SecondsBetween(start, SteadyClock::now());
    timings_.forward_seconds += forward_seconds;
    if (pipeline_ && s.ok()) {
      StepShape shape;
      for (const Target& t : targets) {
        if (!t.decode) {
          shape.prefill_tokens += static_cast<int>(t.count);
          continue;
        }
        ++shape.decode_rows;
        for (const KvBlockRef& ref : t.request->seq.table()) shape.decode_kv_tokens += ref.num_tokens;
      }
      pipeline_->RecordStep(shape, forward_seconds);
    }
    if (!s.ok()) {
      spdlog::error("forward pass over {} sequences failed: {}", steps.size(), s.ToString());
      for (const Target& t : targets) {
        if (t.job != nullptr) {
          failed_jobs.emplace_back(t.job->key, s);
        } else {
          failed.emplace_back(t.request->id, s);
        }
      }
      targets.clear();
    }
  }

  for (size_t i = 0; i < targets.size(); ++i) {
    const Target& t = targets[i];
    if (t.job != nullptr) {
      // Look the job up again: finishing another job may have ended it.
      auto it = jobs_.find(t.job_key);
      if (it == jobs_.end()) continue;
      ChunkJob& job = *it->second;
      job.encoded += t.count;
      if (job.encoded == job.tokens.size()) FinishEncoding(job, events);
      continue;
    }
    Request& r = *t.request;
    if (t.decode) {
      SampleNext(r, sampled[i], logits[i], events);
      continue;
    }
    r.own_done += t.count;
    if (r.own_done < r.own.size()) {
      if (r.own_done == r.own_ready) {  // a repaired document's tokens ran: attach what follows
        if (absl::Status s = AttachReadySegments(r); !s.ok()) failed.emplace_back(r.id, s);
      }
      continue;
    }
    r.result.usage.computed_tokens += static_cast<int>(r.own.size()) - r.result.usage.repaired_tokens;
    if (r.result.mode == AttentionMode::kPrefix) {
      // Publish the full blocks this request computed (one table entry per block).
      for (size_t b = r.prefix_reused_blocks; b < r.prefix_keys.size(); ++b) {
        index_.Insert(r.prefix_keys[b], {r.seq.table()[b]});
      }
    }
    if (r.input.sampling.max_tokens == 0) {
      r.result.finish_reason = "length";
      Finish(r, events);
    } else {
      SampleNext(r, sampled[i], logits[i], events);
    }
  }
  for (auto& [key, status] : failed_jobs) {
    if (auto it = jobs_.find(key); it != jobs_.end()) FailJob(*it->second, status, events);
  }
  for (auto& [id, status] : failed) {
    // A request may have gone already (its job failed first).
    if (auto it = running_.find(id); it != running_.end()) Fail(*it->second, status, events);
  }
  return tokens_run;
}

void Engine::FinishEncoding(ChunkJob& job, std::vector<EngineEvent>* events) {
  const std::vector<KvBlockRef> blocks(job.encoder.table().begin() + job.context_entries, job.encoder.table().end());
  index_.Insert(job.key, blocks);
  if (pipeline_ && job.publish) {
    const auto start = SteadyClock::now();
    PublishChunk(job.key, blocks, job.is_anchor ? 0 : static_cast<int>(options_.anchor.size()), job.lease_id);
    timings_.publish_seconds += SecondsBetween(start, SteadyClock::now());
  }
  CompleteJob(job, blocks, ChunkSource::kComputed, 0, events);  // ends the job (usage: job.recompute)
}

void Engine::SampleNext(Request& r, const SampledToken& next, std::span<const float> logits,
                        std::vector<EngineEvent>* events) {
  GenerateResult& result = r.result;
  if (r.input.record_logits) result.step_logits.emplace_back(logits.begin(), logits.end());
  if (result.tokens.empty() && result.ttft_seconds == 0) {
    result.ttft_seconds = SecondsBetween(r.arrived, SteadyClock::now());
  }
  if (config().IsEndOfSequence(next.id) ||
      std::ranges::find(r.input.sampling.stop_token_ids, next.id) != r.input.sampling.stop_token_ids.end()) {
    result.finish_reason = "stop";
    Finish(r, events);
    return;
  }
  result.tokens.push_back(next.id);
  result.logprobs.push_back(next.logprob);
  events->push_back(
      EngineEvent{.id = r.id, .kind = EngineEvent::Kind::kToken, .token = next, .result = nullptr, .status = {}});
  if (static_cast<int>(result.tokens.size()) == r.input.sampling.max_tokens) {
    result.finish_reason = "length";
    Finish(r, events);
    return;
  }
  r.next_input = next.id;
  r.phase = Request::Phase::kDecode;
}

}  // namespace lazykv
