// A stored chunk's bytes (or a part of them) as contiguous pieces that some owner keeps
// alive: pages of the cache tier's host arena, a gRPC receive buffer, a string. Moving
// chunk bytes as pieces lets a reader copy straight from where they rest (pinned pages
// to the GPU) instead of gathering them into one string first. The bytes past a point may
// rest in GPU memory (a same-host cache server's GPU tier, opened through CUDA IPC): only a
// device copy reads those; CopyTo and ToString refuse them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace lazykv {

// Immutable once built: safe to read from several threads. Copies share the owner.
class ChunkBytes {
 public:
  ChunkBytes() = default;
  // `owner` keeps every piece valid (may be null when the pieces are static).
  ChunkBytes(std::vector<std::string_view> pieces, std::shared_ptr<const void> owner);
  static ChunkBytes FromString(std::string bytes);
  // Host pieces, then pieces that are device pointers (as std::string_view, never read on
  // the host): a chunk whose header is in host memory and whose payload is on a GPU.
  static ChunkBytes WithDeviceTail(std::vector<std::string_view> host_pieces,
                                   std::vector<std::string_view> device_pieces, std::shared_ptr<const void> owner);

  const std::vector<std::string_view>& pieces() const { return pieces_; }
  uint64_t size() const { return size_; }
  // [offset, offset + length) clamped to size(), sharing the owner.
  ChunkBytes Slice(uint64_t offset, uint64_t length) const;
  // Bytes [on_device_from(), size()) are in GPU memory (size() when none are).
  uint64_t on_device_from() const { return on_device_from_; }
  bool on_device() const { return on_device_from_ < size_; }
  // Copies [offset, offset + length) (within size()) into `out`. REQUIRES: the range is in
  // host memory (offset + length <= on_device_from(); checked: aborts otherwise).
  void CopyTo(uint64_t offset, uint64_t length, char* out) const;
  std::string ToString() const;
  // The bytes as one view when they are one piece (else empty).
  std::string_view Contiguous() const { return pieces_.size() == 1 ? pieces_[0] : std::string_view(); }

 private:
  std::vector<std::string_view> pieces_;
  std::shared_ptr<const void> owner_;
  uint64_t size_ = 0;
  uint64_t on_device_from_ = ~0ull;  // clamped to size_ by every constructor
};

// Writable pieces covering a buffer, in order (a publication's destination).
using MutablePieces = std::vector<std::span<char>>;

// Copies `bytes` into `pieces` from byte `offset` of their concatenation on.
// Precondition: offset + bytes.size() fits within the pieces.
void WriteToPieces(const MutablePieces& pieces, uint64_t offset, std::string_view bytes);

}  // namespace lazykv
