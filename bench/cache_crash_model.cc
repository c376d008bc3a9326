#include "bench/cache_crash_model.h"

#include <grpcpp/support/status.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_format.h"
#include "common/chunk_codec.h"
#include "common/splitmix64.h"

namespace lazykv::crash {
namespace {

// 2 layers x (K, V) x 2 heads x 64 dims x bf16: 1 KiB of payload per token.
constexpr ChunkLayout kBaseLayout{
    .num_layers = 2, .n_kv_heads = 2, .head_dim = 64, .num_tokens = 1, .anchor_tokens = 1, .dtype = KvDtype::kBf16};

// The stream's first draws give the layout: mostly 1 KiB to 2 MiB, log-uniform; one in 32
// is 4 to 6 MiB, which a Get sends in several 4 MiB slices.
ChunkLayout LayoutOf(uint64_t& state) {
  ChunkLayout layout = kBaseLayout;
  const uint64_t kind = SplitMix64(state);
  const double u = SplitMix64Unit(state);
  const uint64_t big = SplitMix64(state);
  layout.num_tokens = kind % 32 == 0 ? static_cast<uint32_t>(4096 + big % 2048)
                                     : static_cast<uint32_t>(std::max(1.0, std::exp(u * std::log(2048.0))));
  layout.anchor_tokens = static_cast<uint32_t>(1 + SplitMix64(state) % 64);
  return layout;
}

uint64_t StreamSeed(const Hash128& key) { return key.high ^ (key.low * 0x9e3779b97f4a7c15ULL); }

std::string Describe(const CallRecord& c) {
  return absl::StrFormat("%s of key %d (incarnation %d, code %d, %.3f-%.3f s)", OpName(c.op), c.key_id, c.incarnation,
                         c.code, c.start_ns / 1e9, c.end_ns / 1e9);
}

}  // namespace

Hash128 KeyOf(uint64_t seed, uint64_t id) {
  uint64_t state = seed * 0xd1b54a32d192ed03ULL + id;
  const uint64_t high = SplitMix64(state);
  return Hash128{high, SplitMix64(state)};
}

void ChunkPartsOf(const Hash128& key, Hash128* fingerprint, std::string* header, std::string* payload) {
  uint64_t state = StreamSeed(key);
  const ChunkLayout layout = LayoutOf(state);
  fingerprint->high = SplitMix64(state);
  fingerprint->low = SplitMix64(state);
  payload->resize(layout.payload_bytes());
  for (size_t i = 0; i < payload->size(); i += 8) {
    const uint64_t word = SplitMix64(state);
    std::memcpy(payload->data() + i, &word, std::min<size_t>(8, payload->size() - i));
  }
  *header = EncodeChunkHeader(MakeChunkHeader(key, *fingerprint, layout, *payload));
}

std::string StoredChunkOf(const Hash128& key) {
  Hash128 fingerprint;
  std::string header, payload;
  ChunkPartsOf(key, &fingerprint, &header, &payload);
  return header + payload;
}

uint64_t StoredBytesOf(const Hash128& key) {
  uint64_t state = StreamSeed(key);
  return kChunkHeaderBytes + LayoutOf(state).payload_bytes();
}

const char* OpName(Op op) {
  switch (op) {
    case Op::kPut:
      return "put";
    case Op::kGet:
      return "get";
    case Op::kLookup:
      return "lookup";
    case Op::kDelete:
      return "delete";
    case Op::kLease:
      return "lease";
    case Op::kStats:
      return "stats";
  }
  return "?";
}

bool IsDefiniteOutcome(int code) {
  switch (static_cast<grpc::StatusCode>(code)) {
    case grpc::StatusCode::OK:
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::NOT_FOUND:
      return true;
    default:  // UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED, ...: the server may still act on it
      return false;
  }
}

void History::Add(const CallRecord& record) {
  MutexLock lock(&mu_);
  calls_.push_back(record);
}

void History::AddViolation(const std::string& category, const std::string& detail) {
  MutexLock lock(&mu_);
  auto& [count, examples] = violations_[category];
  ++count;
  if (examples.size() < 5) examples.push_back(detail);
}

std::vector<CallRecord> History::Calls() const {
  MutexLock lock(&mu_);
  return calls_;
}

std::map<std::string, std::pair<uint64_t, std::vector<std::string>>> History::Violations() const {
  MutexLock lock(&mu_);
  return violations_;
}

uint64_t History::violation_count() const {
  MutexLock lock(&mu_);
  uint64_t total = 0;
  for (const auto& [category, entry] : violations_) total += entry.first;
  return total;
}

uint64_t DurabilityChecker::SizeOf(int64_t id) {
  auto [it, inserted] = sizes_.try_emplace(id, 0);
  if (inserted) it->second = StoredBytesOf(KeyOf(seed_, static_cast<uint64_t>(id)));
  return it->second;
}

RestartCheck DurabilityChecker::Check(const std::vector<CallRecord>& calls,
                                      const std::vector<Incarnation>& incarnations,
                                      const std::unordered_map<int64_t, FoundKey>& found, int64_t check_ns,
                                      History& history) {
  struct KeyCalls {
    std::vector<const CallRecord*> puts, deletes, gets;
  };
  std::unordered_map<int64_t, KeyCalls> by_key;
  std::vector<std::pair<int64_t, int64_t>> touches;  // (end, key id) of every put and get
  for (const CallRecord& c : calls) {
    if (c.key_id < 0) continue;
    if (c.op == Op::kPut) by_key[c.key_id].puts.push_back(&c);
    if (c.op == Op::kDelete) by_key[c.key_id].deletes.push_back(&c);
    if (c.op == Op::kGet) by_key[c.key_id].gets.push_back(&c);
    if (c.op == Op::kPut || c.op == Op::kGet) touches.emplace_back(c.end_ns, c.key_id);
  }
  auto died = [&](int incarnation) {
    return incarnation < static_cast<int>(incarnations.size()) ? incarnations[incarnation].death_ns
                                                               : std::numeric_limits<int64_t>::max();
  };
  RestartCheck result;
  for (const auto& [id, where] : found) {
    ++result.keys_present;
    result.bytes_present += where.bytes;
  }
  std::vector<std::pair<int64_t, int64_t>> missing;  // (first put's start, key id)
  for (const auto& [id, keyed] : by_key) {
    if (keyed.puts.empty()) continue;
    int64_t anchor = std::numeric_limits<int64_t>::min();
    int64_t first_put = std::numeric_limits<int64_t>::max();
    for (const CallRecord* p : keyed.puts) {
      first_put = std::min(first_put, p->start_ns);
      if (p->code != 0 || p->incarnation >= static_cast<int>(incarnations.size())) continue;
      const Incarnation& server = incarnations[p->incarnation];
      if (p->end_ns <= server.death_ns - server.grace_ns) anchor = std::max(anchor, p->start_ns);
    }
    if (auto it = found_at_.find(id); it != found_at_.end()) anchor = std::max(anchor, it->second);
    if (anchor == std::numeric_limits<int64_t>::min()) continue;
    const bool deleted_since = std::any_of(keyed.deletes.begin(), keyed.deletes.end(),
                                           [&](const CallRecord* d) { return d->end_ns > anchor; });
    if (deleted_since) continue;
    ++result.required;
    if (found.contains(id)) {
      ++result.required_present;
    } else {
      missing.emplace_back(first_put, id);
    }
  }
  // LRU bound, newest reference first: the distinct keys touched after it only grow.
  std::sort(touches.begin(), touches.end(), std::greater<>());
  std::sort(missing.begin(), missing.end(), std::greater<>());
  std::unordered_set<int64_t> touched;
  uint64_t touched_bytes = 0;
  size_t next = 0;
  for (const auto& [since, id] : missing) {
    for (; next < touches.size() && touches[next].first > since; ++next) {
      if (touched.insert(touches[next].second).second) touched_bytes += SizeOf(touches[next].second);
    }
    const uint64_t others = touched_bytes - (touched.contains(id) ? SizeOf(id) : 0);
    if (SizeOf(id) + host_capacity_ + others > disk_capacity_) {
      ++result.evicted;
      continue;
    }
    ++result.lost;
    const CallRecord* last_ok = nullptr;
    for (const CallRecord* p : by_key[id].puts) {
      if (p->code == 0) last_ok = p;
    }
    history.AddViolation(
        "lost", absl::StrFormat("key %d (%d bytes) missing after restart; last acknowledged %s; %d other bytes "
                                "touched since its first put, host %d + disk cap %d",
                                id, SizeOf(id), last_ok != nullptr ? Describe(*last_ok) : "never", others,
                                host_capacity_, disk_capacity_));
  }
  // Resurrection: an OK delete after every put of the key had definitely ended.
  for (const auto& [id, keyed] : by_key) {
    for (const CallRecord* d : keyed.deletes) {
      if (d->code != 0) continue;
      const bool settled = std::all_of(keyed.puts.begin(), keyed.puts.end(), [&](const CallRecord* p) {
        return p->end_ns < d->start_ns && (IsDefiniteOutcome(p->code) || p->end_ns + 1'000'000'000 < d->start_ns ||
                                           died(p->incarnation) < d->start_ns);
      });
      if (!settled || reported_resurrected_.contains(id)) continue;
      std::string how;
      if (found.contains(id)) how = "found at the restart check";
      for (const CallRecord* g : keyed.gets) {
        if (how.empty() && g->code == 0 && g->start_ns > d->end_ns) how = "served by " + Describe(*g);
      }
      if (how.empty()) continue;
      ++result.resurrected;
      reported_resurrected_.insert(id);
      history.AddViolation("resurrected", absl::StrFormat("key %d deleted by %s, every put of it over before; %s", id,
                                                          Describe(*d), how));
      break;
    }
  }
  found_at_.clear();
  for (const auto& [id, where] : found) found_at_[id] = check_ns;
  return result;
}

}  // namespace lazykv::crash
