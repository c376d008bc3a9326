// Rendezvous (highest-random-weight) hashing: the owner of a key among N servers is the
// one with the highest hash of (server, key). Removing a server moves only its keys;
// every client computes the same owner with no coordination.
#pragma once

#include <span>
#include <string>

#include "common/chunk_key.h"

namespace lazykv {

// Index of the owner of `key` in `servers` (which must be non-empty).
size_t RendezvousOwner(const Hash128& key, std::span<const std::string> servers);

}  // namespace lazykv
