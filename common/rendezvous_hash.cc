#include "common/rendezvous_hash.h"

#include <xxhash.h>

namespace lazykv {

size_t RendezvousOwner(const Hash128& key, std::span<const std::string> servers) {
  size_t best = 0;
  uint64_t best_score = 0;
  for (size_t i = 0; i < servers.size(); ++i) {
    // The server name seeds a hash of the key: stable across processes and machines.
    const uint64_t seed = XXH3_64bits(servers[i].data(), servers[i].size());
    const uint64_t words[2] = {key.high, key.low};
    const uint64_t score = XXH3_64bits_withSeed(words, sizeof(words), seed);
    if (i == 0 || score > best_score) {
      best = i;
      best_score = score;
    }
  }
  return best;
}

}  // namespace lazykv
