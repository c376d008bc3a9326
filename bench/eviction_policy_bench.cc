// Host-tier eviction policy against LRU on Zipf traces of document reads (the cache
// server's access pattern: a read of a missing chunk is followed by its insertion).
// Documents have log-normal sizes; capacity is a fraction of all documents' bytes.
// Reports object and byte hit ratios per policy, in the same run on the same traces.
//
//   eviction_policy_bench [--docs N] [--accesses N] [--seed S]
#include <cmath>
#include <cstdio>
#include <unordered_map>

#include "cache_server/eviction_policy.h"
#include "common/flag_parser.h"
#include "common/zipf.h"

namespace lazykv {
namespace {

struct HitRatio {
  double objects = 0, bytes = 0;
};

HitRatio Simulate(const std::string& policy_name, const std::vector<uint64_t>& sizes, const std::vector<size_t>& trace,
                  uint64_t capacity) {
  auto policy = *cache::MakeEvictionPolicy(policy_name, capacity);
  std::unordered_map<size_t, uint64_t> resident;
  uint64_t used = 0, hits = 0, hit_bytes = 0, total_bytes = 0;
  for (size_t doc : trace) {
    const Hash128 key{0, doc};
    total_bytes += sizes[doc];
    if (resident.contains(doc)) {
      ++hits;
      hit_bytes += sizes[doc];
      policy->Touch(key);
      continue;
    }
    if (sizes[doc] > capacity) continue;
    while (used + sizes[doc] > capacity) {
      const Hash128 victim = *policy->PopVictim();
      used -= resident.at(victim.low);
      resident.erase(victim.low);
    }
    policy->Insert(key, sizes[doc]);
    resident[doc] = sizes[doc];
    used += sizes[doc];
  }
  return HitRatio{static_cast<double>(hits) / trace.size(), static_cast<double>(hit_bytes) / total_bytes};
}

int Main(int argc, char** argv) {
  int docs = 20000, accesses = 1000000;
  uint64_t seed = 1;
  FlagParser parser("usage: eviction_policy_bench [--docs N] [--accesses N] [--seed S]\n");
  parser.AddInt("--docs", &docs);
  parser.AddInt("--accesses", &accesses);
  parser.AddUint64("--seed", &seed);
  if (absl::Status s = parser.Parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return absl::IsCancelled(s) ? 0 : 2;
  }
  uint64_t rng = seed;
  // Log-normal sizes around 1 MiB (a few hundred tokens of a small model's KV), 64 KiB to 16 MiB.
  std::vector<uint64_t> sizes(docs);
  uint64_t all_bytes = 0;
  for (uint64_t& size : sizes) {
    const double u1 = std::max(1e-12, SplitMix64Unit(rng)), u2 = SplitMix64Unit(rng);
    const double normal = std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2);
    size = static_cast<uint64_t>(std::clamp(std::exp(std::log(1 << 20) + 0.8 * normal), 65536.0, 16.0 * (1 << 20)));
    all_bytes += size;
  }
  std::printf("eviction policy vs LRU: %d documents (%.1f GiB), %d Zipf accesses per trace, seed %llu\n", docs,
              all_bytes / double(1ull << 30), accesses, static_cast<unsigned long long>(seed));
  std::printf("%-5s %-9s %12s %12s %12s %12s %10s\n", "s", "capacity", "lru_obj", "s3fifo_obj", "lru_bytes",
              "s3fifo_bytes", "miss_cut");
  for (double s : {0.6, 0.8, 1.0, 1.1, 1.2}) {
    const ZipfSampler zipf(docs, s);
    // A fixed random ranking: popularity is unrelated to size or id.
    std::vector<size_t> rank_to_doc(docs);
    for (int i = 0; i < docs; ++i) rank_to_doc[i] = i;
    for (int i = docs - 1; i > 0; --i) std::swap(rank_to_doc[i], rank_to_doc[SplitMix64(rng) % (i + 1)]);
    std::vector<size_t> trace(accesses);
    for (size_t& doc : trace) doc = rank_to_doc[zipf.Sample(rng)];
    for (double fraction : {0.01, 0.05, 0.1, 0.2}) {
      const uint64_t capacity = static_cast<uint64_t>(all_bytes * fraction);
      const HitRatio lru = Simulate("lru", sizes, trace, capacity);
      const HitRatio s3 = Simulate("s3fifo", sizes, trace, capacity);
      // Share of LRU's misses that the policy avoids.
      const double miss_cut = (s3.objects - lru.objects) / (1 - lru.objects);
      const std::string cap = std::to_string(static_cast<int>(fraction * 100)) + "%";
      std::printf("%-5.1f %-9s %12.4f %12.4f %12.4f %12.4f %9.1f%%\n", s, cap.c_str(), lru.objects, s3.objects,
                  lru.bytes, s3.bytes, miss_cut * 100);
    }
  }
  return 0;
}

}  // namespace
}  // namespace lazykv

int main(int argc, char** argv) { return lazykv::Main(argc, argv); }
