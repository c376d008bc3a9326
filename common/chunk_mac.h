// Chunk authentication (DESIGN.md section 5): an HMAC-SHA256 under a fleet secret over a
// chunk's header fields (key, model fingerprint, layout, sizes, checksum: the header's
// first 88 bytes) and its whole payload. The worker that computes a chunk signs it; every
// worker that fetches one checks it before the bytes reach the GPU, so whoever can reach a
// cache server but lacks the secret cannot make a worker use KV it did not compute.
// The tag lives in the header's last 32 bytes (all zero: unsigned).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/chunk_codec.h"

namespace lazykv {

class ChunkMac {
 public:
  // The secret: the file's bytes (at least 32; surrounding whitespace is ignored).
  static absl::StatusOr<std::shared_ptr<const ChunkMac>> FromKeyFile(const std::string& path);
  // REQUIRES: key.size() >= 32.
  explicit ChunkMac(std::string key) : key_(std::move(key)) {}

  // The tag of `header` (its mac field ignored) with `payload` in pieces.
  std::array<uint8_t, kChunkMacBytes> Sign(const ChunkHeader& header, std::span<const std::string_view> payload) const;
  // PERMISSION_DENIED unless header.mac is the tag (compared in constant time).
  absl::Status Verify(const ChunkHeader& header, std::span<const std::string_view> payload) const;

  // Thread-safe: const, and each call has its own OpenSSL context.

 private:
  std::string key_;
};

}  // namespace lazykv
