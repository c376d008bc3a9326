#include "worker/engine/chunk_pipeline.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>

#include "absl/strings/str_format.h"
#include "absl/strings/str_cat.h"
#include "common/chunk_codec.h"
#include "common/status_macros.h"

namespace lazykv {
namespace {

using Clock = std::chrono::steady_clock;

// How long a fetch waits (for a source's probe, for staging room) when nothing says what
// computing the chunk costs yet, and at most.
constexpr double kUnmeasuredComputeSeconds = 0.02;
constexpr double kMaxWaitSeconds = 1.0;

std::chrono::microseconds SecondsBound(double seconds) {
  return std::chrono::microseconds(static_cast<int64_t>(std::clamp(seconds, 0.0, kMaxWaitSeconds) * 1e6));
}

double SecondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// The cost model's name for where a hit rests.
std::string SourceName(ChunkSource source, const std::string& origin, const std::string& server_tier = "") {
  std::string name = origin.empty() ? ChunkSourceName(source) : absl::StrFormat("%s %s", ChunkSourceName(source), origin);
  if (!server_tier.empty()) absl::StrAppend(&name, " (", server_tier, ")");
  return name;
}

// The pieces of `pieces` from byte `offset` on.
MutablePieces Tail(const MutablePieces& pieces, uint64_t offset) {
  MutablePieces out;
  for (std::span<char> piece : pieces) {
    if (offset >= piece.size()) {
      offset -= piece.size();
      continue;
    }
    out.push_back(piece.subspan(offset));
    offset = 0;
  }
  return out;
}

ChunkOutcome FetchedOutcome(const Hash128& key, std::unique_ptr<StagedChunk> staged, ChunkSource source,
                            uint64_t stored_bytes) {
  ChunkOutcome outcome;
  outcome.key = key;
  outcome.fetched = true;
  outcome.staged = std::move(staged);
  outcome.source = source;
  outcome.stored_bytes = stored_bytes;
  return outcome;
}

// Lease waits are cut into slices so that a stopping pipeline is not held for long.
constexpr std::chrono::milliseconds kLeaseWaitSlice{1000};

}  // namespace

absl::StatusOr<FetchPolicy> ParseFetchPolicy(std::string_view name) {
  if (name == "auto") return FetchPolicy::kAuto;
  if (name == "always") return FetchPolicy::kAlways;
  if (name == "never") return FetchPolicy::kNever;
  return absl::InvalidArgumentError(
      absl::StrFormat("--fetch-policy: '%s' is not one of auto, always, never", std::string(name)));
}

const char* FetchPolicyName(FetchPolicy policy) {
  switch (policy) {
    case FetchPolicy::kAuto:
      return "auto";
    case FetchPolicy::kAlways:
      return "always";
    case FetchPolicy::kNever:
      return "never";
  }
  return "?";
}

std::string FormatPipelineStats(const ChunkPipelineStats& s) {
  return absl::StrFormat(
      "%d requested; %d fetched (%d bytes, %d failed, %d of them rejected); computed: %d misses, %d by choice, %d "
      "after a failed fetch, %d busy; %d published (%d failed, %d dropped); %d lease waits%s",
      s.requested, s.fetched, s.fetched_bytes, s.fetch_failures, s.chunks_rejected, s.computed_miss, s.computed_chosen,
      s.computed_failed, s.computed_busy, s.published, s.publish_failures, s.publications_dropped, s.lease_waits,
      s.fetched == 0 ? ""
                     : absl::StrFormat("; per fetched chunk: tier %.2f ms, checks %.2f ms, staging %.2f ms",
                                       1e3 * s.fetch_tier_seconds / s.fetched, 1e3 * s.fetch_check_seconds / s.fetched,
                                       1e3 * s.fetch_stage_seconds / s.fetched));
}

ChunkPipeline::ChunkPipeline(std::shared_ptr<ChunkTier> tier, Backend* backend, Hash128 fingerprint, KvDtype kv_dtype,
                             ChunkPipelineOptions options)
    : tier_(std::move(tier)),
      backend_(backend),
      fingerprint_(fingerprint),
      kv_dtype_(kv_dtype),
      options_(options),
      staging_gate_(options.max_concurrent_stagings),
      lease_keeper_(tier_.get(), options.max_lease_hold),
      publishers_(options.publish_threads, std::numeric_limits<size_t>::max()),
      workers_(options.tier_threads, static_cast<size_t>(std::max(1, options.max_queued_tasks))),
      lookups_(options.lookup_threads, static_cast<size_t>(std::max(1, options.max_queued_tasks))) {}

ChunkPipeline::~ChunkPipeline() {
  std::deque<ChunkOutcome> undelivered;
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    // Staged chunks nobody will import give their staging back now, so fetches still
    // queued do not wait for room that would come back only after them.
    undelivered.swap(outcomes_);
  }
  undelivered.clear();
  Flush();
}

void ChunkPipeline::Request(std::vector<ChunkRequest> chunks) {
  if (chunks.empty()) return;
  {
    MutexLock lock(&mu_);
    stats_.requested += chunks.size();
  }
  // Shared, not moved into the task: a refused task is dropped, and its chunks still need outcomes.
  auto shared = std::make_shared<const std::vector<ChunkRequest>>(std::move(chunks));
  if (!lookups_.TrySubmit([this, shared] { RunLookup(*shared); })) {
    for (const ChunkRequest& chunk : *shared) {
      ChunkOutcome outcome;
      outcome.key = chunk.key;
      outcome.reason = ComputeReason::kBusy;
      Deliver(std::move(outcome));
    }
  }
}

void ChunkPipeline::RunLookup(const std::vector<ChunkRequest>& chunks) {
  std::vector<Hash128> keys;
  for (const ChunkRequest& chunk : chunks) keys.push_back(chunk.key);
  std::vector<std::optional<TierHit>> hits = tier_->Lookup(keys);
  hits.resize(keys.size());
  // Each chunk goes on by itself on the fetch pool (fetches of one request in parallel); on
  // a full queue the rest run here, on this lookup thread.
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ChunkRequest chunk = chunks[i];
    std::optional<TierHit> hit = std::move(hits[i]);
    if (!workers_.TrySubmit([this, chunk, hit] { Resolve(chunk, hit); })) Resolve(chunk, hit);
  }
}

bool ChunkPipeline::ShouldFetch(const TierHit& hit, int num_tokens, bool* explore) {
  *explore = false;
  switch (options_.fetch_policy) {
    case FetchPolicy::kAlways:
      return true;
    case FetchPolicy::kNever:
      return false;
    case FetchPolicy::kAuto:
      break;
  }
  const std::string source = SourceName(hit.source, hit.origin, hit.server_tier);
  auto choice = cost_.Decide(source, hit.stored_bytes, num_tokens, QueuedPrefillTokens());
  if (choice == FetchCostModel::Choice::kAwaitProbe) {
    // An unmeasured source's probe is under way: its answer, within what computing the
    // chunk would cost (a chunk waiting longer would be computed sooner), decides.
    cost_.AwaitProbe(source, Clock::now() + FetchWaitBound(num_tokens));
    choice = cost_.Decide(source, hit.stored_bytes, num_tokens, QueuedPrefillTokens());
    if (choice == FetchCostModel::Choice::kAwaitProbe) choice = FetchCostModel::Choice::kRecompute;
  }
  // Unmeasured sources get one fetch at a time; the burst behind it waits for its answer.
  *explore = choice == FetchCostModel::Choice::kExplore;
  if (choice == FetchCostModel::Choice::kRecompute) chosen_since_report_ += num_tokens;
  return choice != FetchCostModel::Choice::kRecompute;
}

std::chrono::microseconds ChunkPipeline::FetchWaitBound(int num_tokens) const {
  {
    MutexLock lock(&mu_);
    if (stopping_) return std::chrono::microseconds(0);  // nobody waits for the outcome
  }
  const std::optional<double> compute = cost_.ComputeSeconds(num_tokens + static_cast<int>(std::min<int64_t>(
                                                                              QueuedPrefillTokens(), 1 << 24)));
  // At least two steps: a chunk computed instead is ready only at the end of a step, and
  // staging room frees when the engine imports what is staged, at its next step.
  const double steps = 2 * cost_.StepSeconds(num_tokens).value_or(0.0);
  return SecondsBound(std::max(compute.value_or(kUnmeasuredComputeSeconds), steps));
}

void ChunkPipeline::SetPrefillBacklog(int64_t tokens) {
  engine_backlog_ = tokens;
  chosen_since_report_ = 0;
}

void ChunkPipeline::Resolve(const ChunkRequest& chunk, const std::optional<TierHit>& hit) {
  if (!hit) {
    LeaseOrWait(chunk, ComputeReason::kMiss);
    return;
  }
  bool explore = false;
  if (!ShouldFetch(*hit, chunk.num_tokens, &explore)) {
    tier_->NotFetching(chunk.key);  // what the lookup leased for the fetch goes now
    ChunkOutcome outcome;
    outcome.key = chunk.key;
    outcome.reason = ComputeReason::kChosen;
    outcome.publish = false;  // the tier holds it already
    Deliver(std::move(outcome));
    return;
  }
  ChunkSource source = hit->source;
  uint64_t bytes = 0;
  std::unique_ptr<StagedChunk> staged = FetchAndStage(chunk, &source, &bytes, hit->server_tier);
  // The probe is over either way (a chunk may be fetched from elsewhere than its hit said).
  if (explore) cost_.ProbeDone(SourceName(hit->source, hit->origin, hit->server_tier));
  if (staged) {
    Deliver(FetchedOutcome(chunk.key, std::move(staged), source, bytes));
    return;
  }
  LeaseOrWait(chunk, ComputeReason::kFailed);
}

std::unique_ptr<StagedChunk> ChunkPipeline::FetchAndStage(const ChunkRequest& chunk, ChunkSource* source,
                                                          uint64_t* bytes, const std::string& server_tier) {
  const auto start = Clock::now();
  Clock::time_point fetched_at, checked_at, staged_at;
  auto staged = [&]() -> absl::StatusOr<std::unique_ptr<StagedChunk>> {
    ASSIGN_OR_RETURN(FetchedChunk fetched, tier_->Fetch(chunk.key));
    fetched_at = Clock::now();
    const double setup_seconds = fetched.setup_seconds;
    *source = fetched.source;
    *bytes = fetched.stored.size();
    std::string header_bytes(std::min<uint64_t>(kChunkHeaderBytes, fetched.stored.size()), '\0');
    fetched.stored.CopyTo(0, header_bytes.size(), header_bytes.data());
    ASSIGN_OR_RETURN(const ChunkHeader header, DecodeChunkHeader(header_bytes));
    const ChunkLayout expected = MakeChunkLayout(backend_->config(), kv_dtype_, chunk.num_tokens, chunk.anchor_tokens);
    if (header.key != chunk.key || header.model_fingerprint != fingerprint_ || !(header.layout == expected)) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "fetched chunk does not fit this model: key %s, fingerprint %s, %d tokens after %d anchor tokens",
          header.key.ToHex(), header.model_fingerprint.ToHex(), header.layout.num_tokens, header.layout.anchor_tokens));
    }
    const ChunkBytes payload = fetched.stored.Slice(kChunkHeaderBytes, fetched.stored.size());
    // A stored chunk refused for its MAC, its values or its checksum is reported, so the tier
    // drops it and the next fetcher computes it instead of refusing it again. (A checksum
    // mismatch may have happened in transit over gRPC: the tier then checks its own copy,
    // finds it good and keeps it; read in place from a same-host server's memory, it is the
    // stored copy that is bad.)
    auto refuse = [&](absl::Status status, std::string_view reason) {
      tier_->ReportInvalid(chunk.key, header_bytes, reason);
      return status;
    };
    if (payload.size() != header.payload_bytes) return absl::DataLossError("fetched chunk is truncated");
    // The CPU passes: the checksum where the tier has not checked it (gRPC; the tier's own
    // memory is checked at admission), and the MAC when the fleet signs its chunks (a
    // signature guards against a cache server that is not trusted, so every fetch checks it).
    // Nothing unsigned or non-finite reaches the pool (PERMISSION_DENIED: rejected).
    // A payload on a GPU (a same-host server's GPU tier) was checked by its server and is
    // never read on the host; the tier fetches that way only where no host check is due.
    if (payload.on_device() && (!fetched.payload_verified || options_.mac)) {
      return absl::FailedPreconditionError("fetched chunk rests on a GPU, where its checksum or MAC cannot be checked");
    }
    if (!fetched.payload_verified) {
      if (absl::Status s = VerifyChunkPayload(header, payload.pieces()); !s.ok()) return refuse(s, "checksum");
    }
    if (options_.mac) {
      if (absl::Status s = options_.mac->Verify(header, payload.pieces()); !s.ok()) return refuse(s, "mac");
    }
    std::string origin = std::move(fetched.origin);
    checked_at = Clock::now();
    // The values are checked where the bytes land (on a GPU, a pass at device memory speed).
    // A few at a time through the link, in the order they came; and staging held by chunks
    // the engine has not imported yet frees at its next step. Both waits together last as
    // long as computing the chunk would take at most. The wait for a turn is queueing, not
    // the source's cost, and is left out of its estimate.
    const auto queued_at = Clock::now();
    const auto give_up_at = queued_at + FetchWaitBound(chunk.num_tokens);
    if (!staging_gate_.Enter(give_up_at)) {
      return absl::ResourceExhaustedError("chunk staging: no turn before computing it would be sooner");
    }
    const double queued_seconds = SecondsSince(queued_at);
    absl::StatusOr<std::unique_ptr<StagedChunk>> out =
        backend_->StageChunk(payload, {.check_finite = true, .wait_for_room_until = give_up_at});
    staging_gate_.Leave();
    if (out.status().code() == absl::StatusCode::kPermissionDenied) {
      return refuse(absl::PermissionDeniedError(absl::StrCat("fetched ", out.status().message())), "non_finite");
    }
    if (!out.ok()) return out.status();
    staged_at = Clock::now();
    cost_.RecordFetch(SourceName(*source, origin, *source == ChunkSource::kRemote ? server_tier : ""), *bytes,
                      std::max(0.0, SecondsSince(start) - setup_seconds - queued_seconds));
    return out;
  }();
  MutexLock lock(&mu_);
  if (!staged.ok()) {
    ++stats_.fetch_failures;
    if (staged.status().code() == absl::StatusCode::kPermissionDenied) ++stats_.chunks_rejected;
    // Not found: evicted since the lookup. Unavailable: a down server, logged once by the tier.
    if (staged.status().code() != absl::StatusCode::kNotFound &&
        staged.status().code() != absl::StatusCode::kUnavailable) {
      spdlog::warn("fetch of chunk {} failed, computing it: {}", chunk.key.ToHex(), staged.status().ToString());
    }
    return nullptr;
  }
  ++stats_.fetched;
  stats_.fetched_bytes += *bytes;
  stats_.fetch_tier_seconds += std::chrono::duration<double>(fetched_at - start).count();
  stats_.fetch_check_seconds += std::chrono::duration<double>(checked_at - fetched_at).count();
  stats_.fetch_stage_seconds += std::chrono::duration<double>(staged_at - checked_at).count();
  return *std::move(staged);
}

std::chrono::milliseconds ChunkPipeline::ComputeBound(int num_tokens, double factor, std::chrono::milliseconds lo,
                                                      std::chrono::milliseconds hi,
                                                      std::chrono::milliseconds unmeasured) const {
  hi = std::max(lo, hi);
  const std::optional<double> step = cost_.StepSeconds(num_tokens);
  if (!step.has_value()) return std::clamp(unmeasured, lo, hi);
  const double seconds = factor * std::max(0.0, *step);
  const auto bound = std::chrono::milliseconds(static_cast<int64_t>(std::min(seconds, 86400.0) * 1e3));
  return std::clamp(bound, lo, hi);
}

void ChunkPipeline::LeaseOrWait(const ChunkRequest& chunk, ComputeReason reason) {
  ChunkOutcome outcome;
  outcome.key = chunk.key;
  outcome.reason = reason;
  // Short leases (a crashed holder blocks nobody for long), renewed while computing; and
  // a bounded wait for another holder (a squatter costs a bounded wait).
  // Unmeasured: the longest lease (it is renewed anyway), and a moderate wait.
  const std::chrono::milliseconds ttl =
      ComputeBound(chunk.num_tokens, 4, options_.min_lease_ttl, options_.lease_ttl, options_.lease_ttl);
  const auto give_up_at = Clock::now() + ComputeBound(chunk.num_tokens, 3, options_.min_lease_wait,
                                                      options_.max_lease_wait, options_.cold_lease_wait);
  std::chrono::milliseconds wait{0};
  bool counted_wait = false;
  while (true) {
    const LeaseAnswer answer = tier_->Lease(chunk.key, ttl, wait);
    switch (answer.state) {
      case LeaseAnswer::State::kGranted:
        lease_keeper_.Keep(chunk.key, answer.lease_id, ttl);
        outcome.lease_id = answer.lease_id;
        Deliver(std::move(outcome));
        return;
      case LeaseAnswer::State::kUnavailable:
        Deliver(std::move(outcome));
        return;
      case LeaseAnswer::State::kStored: {
        // Stored since the lookup (another worker published it), or stored but unreadable.
        ChunkSource source = ChunkSource::kHost;
        uint64_t bytes = 0;
        if (reason == ComputeReason::kMiss) {
          if (std::unique_ptr<StagedChunk> staged = FetchAndStage(chunk, &source, &bytes)) {
            Deliver(FetchedOutcome(chunk.key, std::move(staged), source, bytes));
            return;
          }
          outcome.reason = ComputeReason::kFailed;
        }
        outcome.publish = false;
        Deliver(std::move(outcome));
        return;
      }
      case LeaseAnswer::State::kHeld: {
        const auto now = Clock::now();
        bool stopping;
        {
          MutexLock lock(&mu_);
          stopping = stopping_;
          if (!counted_wait) ++stats_.lease_waits;
        }
        counted_wait = true;
        if (now >= give_up_at || stopping) {  // waited long enough: the holder publishes
          outcome.publish = false;
          Deliver(std::move(outcome));
          return;
        }
        // Wait for the publication, or past the lease's expiry (then it is granted to us).
        wait = std::min({answer.remaining + std::chrono::milliseconds(50), kLeaseWaitSlice,
                         std::chrono::duration_cast<std::chrono::milliseconds>(give_up_at - now)});
        break;
      }
    }
  }
}

void ChunkPipeline::Deliver(ChunkOutcome outcome) {
  {
    MutexLock lock(&mu_);
    if (!outcome.fetched) {
      switch (outcome.reason) {
        case ComputeReason::kMiss:
          ++stats_.computed_miss;
          break;
        case ComputeReason::kChosen:
          ++stats_.computed_chosen;
          break;
        case ComputeReason::kFailed:
          ++stats_.computed_failed;
          break;
        case ComputeReason::kBusy:
          ++stats_.computed_busy;
          break;
      }
    }
    outcomes_.push_back(std::move(outcome));
  }
  outcome_ready_.SignalAll();
}

std::vector<ChunkOutcome> ChunkPipeline::Poll() {
  MutexLock lock(&mu_);
  std::vector<ChunkOutcome> out;
  out.reserve(outcomes_.size());
  for (ChunkOutcome& outcome : outcomes_) out.push_back(std::move(outcome));
  outcomes_.clear();
  return out;
}

void ChunkPipeline::WaitForOutcome(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  MutexLock lock(&mu_);
  while (outcomes_.empty()) {
    if (outcome_ready_.WaitUntil(&mu_, deadline)) continue;
    if (Clock::now() >= deadline) return;
  }
}

bool ChunkPipeline::TryReservePublish(const Hash128& key, uint64_t payload_bytes, uint64_t lease_id) {
  {
    MutexLock lock(&mu_);
    if (stats_.publish_bytes_in_flight + payload_bytes <= options_.max_publish_bytes) {
      stats_.publish_bytes_in_flight += payload_bytes;
      ++publications_in_flight_;
      return true;
    }
    ++stats_.publications_dropped;
  }
  ReleaseLease(key, lease_id);  // let another worker compute and publish it
  return false;
}

void ChunkPipeline::CancelPublish(const Hash128& key, uint64_t payload_bytes, uint64_t lease_id) {
  {
    MutexLock lock(&mu_);
    stats_.publish_bytes_in_flight -= payload_bytes;
    ++stats_.publications_dropped;
    if (--publications_in_flight_ == 0) publish_idle_.SignalAll();
  }
  ReleaseLease(key, lease_id);
}

void ChunkPipeline::Publish(const Hash128& key, const ChunkLayout& layout, uint64_t lease_id,
                            std::unique_ptr<ExportedChunk> exported) {
  // std::function needs a copyable callable: the exported chunk travels in a shared_ptr.
  std::shared_ptr<ExportedChunk> shared(std::move(exported));
  publishers_.Submit(
      [this, key, layout, lease_id, shared]() mutable { RunPublication(key, layout, lease_id, std::move(shared)); });
}

void ChunkPipeline::RunPublication(const Hash128& key, const ChunkLayout& layout, uint64_t lease_id,
                                   std::shared_ptr<ExportedChunk> exported) {
  const uint64_t payload_bytes = layout.payload_bytes();
  const absl::Status status = [&]() -> absl::Status {
    if (exported->payload_bytes() != payload_bytes) {
      return absl::InternalError(
          absl::StrFormat("captured %d bytes for a %d-byte payload", exported->payload_bytes(), payload_bytes));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<PublishSlot> slot,
                     tier_->BeginPublish(key, fingerprint_, kChunkHeaderBytes + payload_bytes, lease_id));
    const MutablePieces& pieces = slot->Pieces();
    const MutablePieces payload = Tail(pieces, kChunkHeaderBytes);
    RETURN_IF_ERROR(exported->CopyTo(payload));
    exported.reset();  // staging memory back as soon as the bytes are out
    PayloadChecksummer checksum;
    for (std::span<char> piece : payload) checksum.Update(std::string_view(piece.data(), piece.size()));
    ChunkHeader header{.layout_version = kChunkFormatVersion,
                       .key = key,
                       .model_fingerprint = fingerprint_,
                       .layout = layout,
                       .payload_bytes = payload_bytes,
                       .payload_checksum = checksum.Finish()};
    if (options_.mac) {
      std::vector<std::string_view> views;
      for (std::span<char> piece : payload) views.emplace_back(piece.data(), piece.size());
      header.mac = options_.mac->Sign(header, views);
    }
    WriteToPieces(pieces, 0, EncodeChunkHeader(header));
    return slot->Commit();
  }();
  exported.reset();
  if (!status.ok()) {
    if (status.code() == absl::StatusCode::kUnavailable) {  // a down server: logged once by the tier
      spdlog::debug("publishing chunk {} failed: {}", key.ToHex(), status.ToString());
    } else {
      spdlog::warn("publishing chunk {} failed: {}", key.ToHex(), status.ToString());
    }
    if (lease_id != 0) tier_->ReleaseLease(key, lease_id);  // let a waiter compute it
  }
  lease_keeper_.Forget(key, lease_id);  // published (which ended the lease), or released
  MutexLock lock(&mu_);
  stats_.publish_bytes_in_flight -= payload_bytes;
  if (status.ok()) {
    ++stats_.published;
    stats_.published_bytes += kChunkHeaderBytes + payload_bytes;
  } else {
    ++stats_.publish_failures;
  }
  if (--publications_in_flight_ == 0) publish_idle_.SignalAll();
}

void ChunkPipeline::ReleaseLease(const Hash128& key, uint64_t lease_id) {
  if (lease_id == 0) return;
  lease_keeper_.Forget(key, lease_id);
  publishers_.Submit([this, key, lease_id] { tier_->ReleaseLease(key, lease_id); });
}

void ChunkPipeline::RecordStep(const StepShape& step, double seconds) { cost_.RecordStep(step, seconds); }

void ChunkPipeline::Flush() {
  MutexLock lock(&mu_);
  while (publications_in_flight_ > 0) publish_idle_.Wait(&mu_);
}

ChunkPipelineStats ChunkPipeline::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

}  // namespace lazykv
