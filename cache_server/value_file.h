// The disk tier's value file (DESIGN.md section 4): one file of a fixed size, set at open,
// so the bytes it takes on disk never exceed it. Sparse by default (blocks are allocated as
// chunks are written: a server, a worker's embedded tier or a test that uses little takes
// little); with `preallocate` its blocks are reserved at open (posix_fallocate), so a full
// device cannot fail a write later.
//
// Layout (little-endian):
//   [0, 4 KiB)                 superblock: magic "LKVVALS1", format version, geometry, XXH3-64
//   [4 KiB, data_offset)       the region table: one 32-byte slot per region
//                              {magic, region, epoch, XXH3-64 of the first 24 bytes}
//   [data_offset, file_bytes)  `regions` regions of `region_bytes` each, holding chunk values
// A region's epoch is the number it was given the last time it was (re)opened for writing;
// epochs come from one counter that only grows, so an index entry written with a region's
// epoch is stale once that region carries a larger one. A slot that fails its checksum
// reads as epoch 0: "never written", which makes every entry pointing into it stale.
//
// Durability: writes go to the page cache (they survive kill -9 of the process); Sync()
// (fdatasync) makes them survive power loss, and is called only on flush and shutdown.
//
// Thread-safe: positional I/O on one descriptor and immutable geometry. Callers order
// writes and reads of the same bytes (DiskTier does, with region epochs).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace lazykv::cache {

struct ValueFileGeometry {
  uint64_t region_bytes = 0;  // a multiple of 4 KiB
  uint32_t regions = 0;
  bool preallocate = false;  // not part of the format: how the file's blocks are taken
  friend bool operator==(const ValueFileGeometry&, const ValueFileGeometry&) = default;
};

class ValueFile {
 public:
  static constexpr uint64_t kAlign = 4096;

  // Opens `path`, or creates it (preallocated, every region at epoch 0) when it is absent,
  // unreadable or of another geometry; `*created` says which. The file holds nothing of
  // value before its superblock is written, last, so a crash during creation leaves a file
  // that the next open recreates.
  static absl::StatusOr<std::unique_ptr<ValueFile>> Open(const std::string& path, const ValueFileGeometry& geometry,
                                                         bool* created);
  ~ValueFile();
  ValueFile(const ValueFile&) = delete;
  ValueFile& operator=(const ValueFile&) = delete;

  // Bytes the whole file takes (superblock, region table and regions).
  static uint64_t FileBytes(const ValueFileGeometry& geometry);

  const ValueFileGeometry& geometry() const { return geometry_; }
  uint64_t file_bytes() const { return FileBytes(geometry_); }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t data_end() const { return data_offset_ + geometry_.region_bytes * geometry_.regions; }
  uint64_t RegionStart(uint32_t region) const { return data_offset_ + geometry_.region_bytes * region; }
  // REQUIRES: data_offset() <= offset < data_end().
  uint32_t RegionOf(uint64_t offset) const {
    return static_cast<uint32_t>((offset - data_offset_) / geometry_.region_bytes);
  }

  // Every region's epoch as stored (0: never opened, or a slot that fails its checksum).
  absl::StatusOr<std::vector<uint64_t>> ReadEpochs() const;
  absl::Status WriteEpoch(uint32_t region, uint64_t epoch);

  absl::Status Write(uint64_t offset, const std::vector<std::string_view>& pieces);
  absl::Status Read(uint64_t offset, uint64_t length, char* out) const;
  absl::Status Sync();  // fdatasync

 private:
  ValueFile(int fd, std::string path, const ValueFileGeometry& geometry);
  absl::Status Create();

  const int fd_;
  const std::string path_;
  const ValueFileGeometry geometry_;
  const uint64_t data_offset_;
};

// What a directory takes on disk: the sum over its regular files of their sizes (what
// `du -sb` reports) and of their allocated blocks (st_blocks * 512, what `du -s` reports).
struct DirectoryUsage {
  uint64_t apparent_bytes = 0;
  uint64_t allocated_bytes = 0;
  uint64_t larger() const { return apparent_bytes > allocated_bytes ? apparent_bytes : allocated_bytes; }
};
DirectoryUsage MeasureDirectory(const std::string& dir);

}  // namespace lazykv::cache
