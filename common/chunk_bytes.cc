#include "common/chunk_bytes.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace lazykv {

ChunkBytes::ChunkBytes(std::vector<std::string_view> pieces, std::shared_ptr<const void> owner)
    : owner_(std::move(owner)) {
  for (std::string_view piece : pieces) {
    if (piece.empty()) continue;
    size_ += piece.size();
    pieces_.push_back(piece);
  }
  on_device_from_ = size_;
}

ChunkBytes ChunkBytes::WithDeviceTail(std::vector<std::string_view> host_pieces,
                                      std::vector<std::string_view> device_pieces, std::shared_ptr<const void> owner) {
  ChunkBytes out(std::move(host_pieces), std::move(owner));
  out.on_device_from_ = out.size_;
  for (std::string_view piece : device_pieces) {
    if (piece.empty()) continue;
    out.size_ += piece.size();
    out.pieces_.push_back(piece);
  }
  return out;
}

ChunkBytes ChunkBytes::FromString(std::string bytes) {
  auto owned = std::make_shared<const std::string>(std::move(bytes));
  std::vector<std::string_view> pieces{std::string_view(*owned)};
  return ChunkBytes(std::move(pieces), std::move(owned));
}

ChunkBytes ChunkBytes::Slice(uint64_t offset, uint64_t length) const {
  std::vector<std::string_view> out;
  uint64_t at = 0;
  const uint64_t end = std::min(size_, offset + std::min(length, size_));
  for (std::string_view piece : pieces_) {
    const uint64_t piece_end = at + piece.size();
    if (piece_end > offset && at < end) {
      const uint64_t from = std::max(offset, at) - at;
      const uint64_t to = std::min(end, piece_end) - at;
      out.push_back(piece.substr(from, to - from));
    }
    at = piece_end;
    if (at >= end) break;
  }
  ChunkBytes slice(std::move(out), owner_);
  if (on_device_from_ < size_) {  // where the device bytes start, in the slice
    const uint64_t begin = std::min(offset, size_);
    slice.on_device_from_ = on_device_from_ <= begin ? 0 : std::min(slice.size_, on_device_from_ - begin);
  }
  return slice;
}

void ChunkBytes::CopyTo(uint64_t offset, uint64_t length, char* out) const {
  if (offset + length > on_device_from_) {
    std::fprintf(stderr, "ChunkBytes::CopyTo: bytes [%llu, %llu) rest in GPU memory from %llu on\n",
                 static_cast<unsigned long long>(offset), static_cast<unsigned long long>(offset + length),
                 static_cast<unsigned long long>(on_device_from_));
    std::abort();
  }
  const ChunkBytes part = Slice(offset, length);  // a temporary's pieces() would dangle in the loop
  for (std::string_view piece : part.pieces()) {
    std::memcpy(out, piece.data(), piece.size());
    out += piece.size();
  }
}

std::string ChunkBytes::ToString() const {
  std::string out(size_, '\0');
  CopyTo(0, size_, out.data());
  return out;
}

void WriteToPieces(const MutablePieces& pieces, uint64_t offset, std::string_view bytes) {
  uint64_t at = 0;
  for (std::span<char> piece : pieces) {
    if (bytes.empty()) return;
    const uint64_t piece_end = at + piece.size();
    if (piece_end > offset) {
      const uint64_t from = offset - at;
      const uint64_t n = std::min<uint64_t>(bytes.size(), piece.size() - from);
      std::memcpy(piece.data() + from, bytes.data(), n);
      bytes.remove_prefix(n);
      offset += n;
    }
    at = piece_end;
  }
}

}  // namespace lazykv
