// The model behind the cache server's crash test (bench/cache_crash_test.cc): chunks whose
// bytes follow from their key, the history of every call, and the checker that judges a
// restarted server against that history.
//
// Chunks: key id -> key (SplitMix64 of the run's seed and the id) -> chunk. The key's bytes
// seed a SplitMix64 stream that gives the chunk's size, fingerprint and payload, encoded
// with the chunk codec, so any chunk can be rebuilt (and any Get checked) from its key alone.
//
// The durability model, judged after each restart, from the history:
// - A key is REQUIRED when an anchor says it was durable and no Delete of it (whatever its
//   outcome) ended after that anchor began. Anchors: a Put acknowledged OK at least `grace`
//   before its server's death (the write-through runs in the background: DESIGN.md says a
//   chunk survives kill -9 within about a second), or the key's presence at an earlier
//   restart check (it was on disk then).
// - A required key that is missing is EVICTED when the disk tier's LRU can explain it, else
//   LOST (a violation). LRU can evict a key only once the distinct chunks written or read
//   after it, plus whatever host RAM could demote later, no longer fit beside it:
//     size(k) + host capacity + sum of sizes of the distinct other keys with a Put or Get
//     (any outcome) that ended after k's first Put began  >  disk capacity.
//   A restart rebuilds the LRU order from write order, which this bound also covers.
// - A key is RESURRECTED (a violation) when an OK Delete came after every Put of it had
//   definitely ended, and yet a restart check or a later OK Get finds it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/chunk_key.h"
#include "common/mutex.h"

namespace lazykv::crash {

// The key of `id` in the run seeded with `seed`.
Hash128 KeyOf(uint64_t seed, uint64_t id);
// The stored chunk (header + payload) for `key`: its only valid contents.
std::string StoredChunkOf(const Hash128& key);
// The chunk's header and payload separately (for a Put).
void ChunkPartsOf(const Hash128& key, Hash128* fingerprint, std::string* header, std::string* payload);
// header + payload bytes of StoredChunkOf(key), without building the payload.
uint64_t StoredBytesOf(const Hash128& key);

enum class Op : uint8_t { kPut, kGet, kLookup, kDelete, kLease, kStats };
const char* OpName(Op op);

// One call as the client saw it. Times are CLOCK_MONOTONIC nanoseconds (steady_clock).
struct CallRecord {
  Op op = Op::kPut;
  int32_t incarnation = 0;  // the server process it was sent to
  int64_t key_id = -1;      // -1: a call over many keys (Lookup) or none (Stats)
  int64_t start_ns = 0, end_ns = 0;
  int32_t deadline_ms = 0;
  int32_t code = 0;  // grpc::StatusCode
  bool already_stored = false;
};

// A call's outcome that says nothing can still happen on the server after the client saw it.
bool IsDefiniteOutcome(int code);

// Thread-safe: load threads add calls and violations from any thread.
class History {
 public:
  void Add(const CallRecord& record);
  void AddViolation(const std::string& category, const std::string& detail);
  std::vector<CallRecord> Calls() const;
  // Count per category and up to 5 examples each.
  std::map<std::string, std::pair<uint64_t, std::vector<std::string>>> Violations() const;
  uint64_t violation_count() const;

 private:
  mutable Mutex mu_;
  std::vector<CallRecord> calls_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::pair<uint64_t, std::vector<std::string>>> violations_ ABSL_GUARDED_BY(mu_);
};

struct Incarnation {
  int64_t start_ns = 0;
  int64_t death_ns = 0;  // a lower bound on when it died (killed, crashed or stopped)
  int64_t grace_ns = 0;  // a Put acknowledged this long before death must have survived it
  std::string cause;     // "kill", "crash point NAME", "sigterm", "crashed"
};

struct FoundKey {
  uint64_t bytes = 0;
  int tier = 0;  // v1::Tier
};

struct RestartCheck {
  uint64_t keys_present = 0, bytes_present = 0;
  uint64_t required = 0, required_present = 0, evicted = 0, lost = 0, resurrected = 0;
};

// Not thread-safe: the driver calls it between cycles, with the load stopped.
class DurabilityChecker {
 public:
  DurabilityChecker(uint64_t seed, uint64_t host_capacity, uint64_t disk_capacity)
      : seed_(seed), host_capacity_(host_capacity), disk_capacity_(disk_capacity) {}

  // After a restart: `found` is every key id the new server reports present (by Lookup of
  // every id ever used), `incarnations` every server so far (the last one dead), `calls` the
  // whole history. Adds LOST and RESURRECTED violations to `history`.
  RestartCheck Check(const std::vector<CallRecord>& calls, const std::vector<Incarnation>& incarnations,
                     const std::unordered_map<int64_t, FoundKey>& found, int64_t check_ns, History& history);

  uint64_t SizeOf(int64_t id);

 private:
  const uint64_t seed_, host_capacity_, disk_capacity_;
  std::unordered_map<int64_t, uint64_t> sizes_;
  std::unordered_map<int64_t, int64_t> found_at_;  // key id -> time of the last check that found it
  std::unordered_set<int64_t> reported_resurrected_;
};

}  // namespace lazykv::crash
