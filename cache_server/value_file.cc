#include "cache_server/value_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_format.h"
#include "common/chunk_codec.h"
#include "common/status_macros.h"

namespace lazykv::cache {
namespace {

constexpr char kMagic[8] = {'L', 'K', 'V', 'V', 'A', 'L', 'S', '1'};
constexpr uint32_t kFormatVersion = 1;
constexpr uint32_t kSlotMagic = 0x524b564c;  // "LVKR"
constexpr uint64_t kSlotBytes = 32;
constexpr uint64_t kSuperblockBytes = ValueFile::kAlign;

struct Superblock {
  char magic[8];
  uint32_t version;
  uint32_t regions;
  uint64_t region_bytes;
  uint64_t data_offset;
  uint64_t file_bytes;
  uint64_t checksum;  // XXH3-64 of the bytes before it
};

struct Slot {
  uint32_t magic;
  uint32_t region;
  uint64_t epoch;
  uint64_t reserved;
  uint64_t checksum;  // XXH3-64 of the bytes before it
};
static_assert(sizeof(Slot) == kSlotBytes);

uint64_t RoundUp(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

uint64_t DataOffset(const ValueFileGeometry& g) {
  return kSuperblockBytes + RoundUp(g.regions * kSlotBytes, ValueFile::kAlign);
}

template <typename T>
uint64_t ChecksumOf(const T& record) {
  return ChunkPayloadChecksum(std::string_view(reinterpret_cast<const char*>(&record), offsetof(T, checksum)));
}

absl::Status Errno(std::string_view what, const std::string& path) {
  return absl::InternalError(absl::StrFormat("%s %s: %s", std::string(what), path, std::strerror(errno)));
}

absl::Status PwriteAll(int fd, const char* data, uint64_t length, uint64_t offset, const std::string& path) {
  while (length > 0) {
    const ssize_t n = pwrite(fd, data, length, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Errno("write", path);
    data += n;
    length -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t ValueFile::FileBytes(const ValueFileGeometry& geometry) {
  return DataOffset(geometry) + geometry.region_bytes * geometry.regions;
}

ValueFile::ValueFile(int fd, std::string path, const ValueFileGeometry& geometry)
    : fd_(fd), path_(std::move(path)), geometry_(geometry), data_offset_(DataOffset(geometry)) {}

ValueFile::~ValueFile() { close(fd_); }

absl::StatusOr<std::unique_ptr<ValueFile>> ValueFile::Open(const std::string& path, const ValueFileGeometry& geometry,
                                                           bool* created) {
  if (geometry.regions == 0 || geometry.region_bytes == 0 || geometry.region_bytes % kAlign != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("value file geometry %d regions of %d bytes is invalid",
                                                      geometry.regions, geometry.region_bytes));
  }
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot open value file", path);
  std::unique_ptr<ValueFile> file(new ValueFile(fd, path, geometry));
  Superblock super{};
  const ssize_t n = pread(fd, &super, sizeof(super), 0);
  const bool valid = n == static_cast<ssize_t>(sizeof(super)) && std::memcmp(super.magic, kMagic, 8) == 0 &&
                     super.version == kFormatVersion && super.checksum == ChecksumOf(super) &&
                     super.regions == geometry.regions && super.region_bytes == geometry.region_bytes &&
                     super.data_offset == file->data_offset_ && super.file_bytes == file->file_bytes();
  *created = !valid;
  if (!valid) {
    RETURN_IF_ERROR(file->Create());
  } else if (geometry.preallocate) {
    // Holes punched since (or a copy made sparse): take the blocks back.
    if (const int err = posix_fallocate(fd, 0, static_cast<off_t>(file->file_bytes())); err != 0) {
      errno = err;
      return Errno("cannot preallocate value file", path);
    }
  }
  return file;
}

absl::Status ValueFile::Create() {
  // Invalidate first, then size, zero the table, and write the superblock last.
  const std::string zeros(data_offset_, '\0');
  RETURN_IF_ERROR(PwriteAll(fd_, zeros.data(), kSuperblockBytes, 0, path_));
  if (ftruncate(fd_, static_cast<off_t>(file_bytes())) != 0) return Errno("cannot size value file", path_);
  if (const int err = geometry_.preallocate ? posix_fallocate(fd_, 0, static_cast<off_t>(file_bytes())) : 0; err != 0) {
    errno = err;
    return absl::ResourceExhaustedError(absl::StrFormat("cannot preallocate the value file %s (%d bytes): %s", path_,
                                                        file_bytes(), std::strerror(err)));
  }
  RETURN_IF_ERROR(PwriteAll(fd_, zeros.data(), zeros.size(), 0, path_));
  Superblock super{};
  std::memcpy(super.magic, kMagic, 8);
  super.version = kFormatVersion;
  super.regions = geometry_.regions;
  super.region_bytes = geometry_.region_bytes;
  super.data_offset = data_offset_;
  super.file_bytes = file_bytes();
  super.checksum = ChecksumOf(super);
  RETURN_IF_ERROR(Sync());
  RETURN_IF_ERROR(PwriteAll(fd_, reinterpret_cast<const char*>(&super), sizeof(super), 0, path_));
  return Sync();
}

absl::StatusOr<std::vector<uint64_t>> ValueFile::ReadEpochs() const {
  std::vector<Slot> slots(geometry_.regions);
  RETURN_IF_ERROR(Read(kSuperblockBytes, slots.size() * kSlotBytes, reinterpret_cast<char*>(slots.data())));
  std::vector<uint64_t> epochs(geometry_.regions, 0);
  for (uint32_t r = 0; r < geometry_.regions; ++r) {
    const Slot& s = slots[r];
    if (s.magic == kSlotMagic && s.region == r && s.checksum == ChecksumOf(s)) epochs[r] = s.epoch;
  }
  return epochs;
}

absl::Status ValueFile::WriteEpoch(uint32_t region, uint64_t epoch) {
  Slot slot{.magic = kSlotMagic, .region = region, .epoch = epoch, .reserved = 0, .checksum = 0};
  slot.checksum = ChecksumOf(slot);
  return PwriteAll(fd_, reinterpret_cast<const char*>(&slot), sizeof(slot), kSuperblockBytes + region * kSlotBytes,
                   path_);
}

absl::Status ValueFile::Write(uint64_t offset, const std::vector<std::string_view>& pieces) {
  uint64_t total = 0;
  for (std::string_view p : pieces) total += p.size();
  if (offset < data_offset_ || offset + total > data_end()) {
    return absl::OutOfRangeError(absl::StrFormat("write of %d bytes at %d is outside the regions", total, offset));
  }
  std::vector<iovec> iov;
  for (std::string_view p : pieces) {
    if (!p.empty()) iov.push_back(iovec{const_cast<char*>(p.data()), p.size()});
  }
  size_t next = 0;
  while (next < iov.size()) {
    const int count = static_cast<int>(std::min<size_t>(iov.size() - next, IOV_MAX));
    const ssize_t n = pwritev(fd_, iov.data() + next, count, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Errno("write", path_);
    offset += static_cast<uint64_t>(n);
    for (uint64_t left = static_cast<uint64_t>(n); left > 0;) {  // skip what was written
      const uint64_t take = std::min<uint64_t>(left, iov[next].iov_len);
      iov[next].iov_base = static_cast<char*>(iov[next].iov_base) + take;
      iov[next].iov_len -= take;
      left -= take;
      if (iov[next].iov_len == 0) ++next;
    }
  }
  return absl::OkStatus();
}

absl::Status ValueFile::Read(uint64_t offset, uint64_t length, char* out) const {
  if (offset + length > file_bytes()) {
    return absl::OutOfRangeError(absl::StrFormat("read of %d bytes at %d is past the file's end", length, offset));
  }
  while (length > 0) {
    const ssize_t n = pread(fd_, out, length, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n == 0 ? absl::DataLossError("value file is shorter than its geometry") : Errno("read", path_);
    out += n;
    length -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status ValueFile::Sync() {
  if (fdatasync(fd_) != 0) return Errno("fdatasync", path_);
  return absl::OkStatus();
}

DirectoryUsage MeasureDirectory(const std::string& dir) {
  DirectoryUsage usage;
  std::error_code error;  // files come and go under RocksDB's background jobs
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir, error)) {
    struct stat st;
    if (lstat(entry.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    usage.apparent_bytes += static_cast<uint64_t>(st.st_size);
    usage.allocated_bytes += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  return usage;
}

}  // namespace lazykv::cache
