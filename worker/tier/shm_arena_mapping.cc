#include "worker/tier/shm_arena_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_format.h"
#include "common/paged_pieces.h"
#include "common/shm_host_id.h"

namespace lazykv {

absl::StatusOr<std::shared_ptr<const ShmArenaMapping>> ShmArenaMapping::Map(const ShmArenaIdentity& identity,
                                                                             const HostPinner* pinner) {
  const uint64_t page = identity.page_bytes;
  if (identity.server_pid <= 0 || identity.arena_fd < 0 || page == 0 || (page & (page - 1)) != 0 ||
      identity.arena_bytes == 0 || identity.arena_bytes % page != 0 || identity.arena_bytes / page > UINT32_MAX + 1ull) {
    return absl::InvalidArgumentError(absl::StrFormat("malformed arena identity: pid %d fd %d, %d bytes in pages of %d",
                                                      identity.server_pid, identity.arena_fd, identity.arena_bytes,
                                                      page));
  }
  const std::string here = HostBootId();
  if (here.empty() || identity.boot_id != here) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the server runs on another host (boot id '%s', this host's '%s')", identity.boot_id, here));
  }
  const std::string path = absl::StrFormat("/proc/%d/fd/%d", identity.server_pid, identity.arena_fd);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot open the server's arena %s: %s (not on this host, in another PID namespace, or "
                        "another user)",
                        path, std::strerror(errno)));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_dev) != identity.dev ||
      static_cast<uint64_t>(st.st_ino) != identity.ino || static_cast<uint64_t>(st.st_size) < identity.arena_bytes) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is not the server's arena (device, inode or size differ: another process under that pid)", path));
  }
  void* base = mmap(nullptr, identity.arena_bytes, PROT_READ, MAP_SHARED, fd, 0);
  const int saved = errno;
  close(fd);  // the mapping keeps the file
  // For publications: the same file, opened for writing (its pages are mapped writable one
  // reservation at a time, MAP_POPULATE: one call instead of a fault per 4 KiB page, 5x
  // faster on the test VM). Without it, this worker publishes over gRPC.
  int rw_fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  struct stat rw {};
  if (rw_fd >= 0 && (fstat(rw_fd, &rw) != 0 || rw.st_ino != st.st_ino || rw.st_dev != st.st_dev)) {
    close(rw_fd);
    rw_fd = -1;
  }
  if (base == MAP_FAILED) {
    if (rw_fd >= 0) close(rw_fd);
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot map the server's arena (%d bytes): %s", identity.arena_bytes, std::strerror(saved)));
  }
  auto mapping = std::shared_ptr<ShmArenaMapping>(
      new ShmArenaMapping(static_cast<const char*>(base), identity.arena_bytes, page));
  mapping->rw_fd_ = rw_fd;
  if (pinner != nullptr && pinner->pin && pinner->pin(base, identity.arena_bytes)) mapping->unpin_ = pinner->unpin;
  return mapping;
}

ShmArenaMapping::~ShmArenaMapping() {
  if (unpin_) unpin_(base_);
  munmap(const_cast<char*>(base_), bytes_);
  if (rw_fd_ >= 0) close(rw_fd_);
}

ShmArenaMapping::WritablePages::~WritablePages() {
  for (std::span<char> map : maps_) munmap(map.data(), map.size());
}

absl::StatusOr<std::unique_ptr<ShmArenaMapping::WritablePages>> ShmArenaMapping::MapWritable(
    std::span<const uint32_t> pages, uint64_t size) const {
  if (rw_fd_ < 0) return absl::FailedPreconditionError("the server's arena could not be opened for writing here");
  if (pages.size() != (size + page_bytes_ - 1) / page_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d pages for a value of %d bytes in pages of %d", pages.size(), size, page_bytes_));
  }
  std::unique_ptr<WritablePages> out(new WritablePages());
  size_t i = 0;
  while (i < pages.size()) {
    size_t run = 1;  // adjacent pages: one mapping
    while (i + run < pages.size() && pages[i + run] == pages[i] + run) ++run;
    for (size_t j = i; j < i + run; ++j) {
      if (pages[j] >= num_pages()) {
        return absl::InvalidArgumentError(
            absl::StrFormat("page %d is outside the arena of %d pages", pages[j], num_pages()));
      }
    }
    const uint64_t length = run * page_bytes_;
    void* at = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, rw_fd_,
                    static_cast<off_t>(static_cast<uint64_t>(pages[i]) * page_bytes_));
    if (at == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrFormat("cannot map reserved pages: %s", std::strerror(errno)));
    }
    out->maps_.emplace_back(static_cast<char*>(at), length);
    const uint64_t used = std::min<uint64_t>(length, size - i * page_bytes_);
    out->pieces_.emplace_back(static_cast<char*>(at), used);
    i += run;
  }
  return out;
}

absl::StatusOr<std::vector<std::string_view>> ShmArenaMapping::Pieces(std::span<const uint32_t> pages,
                                                                      uint64_t size) const {
  if (pages.size() != (size + page_bytes_ - 1) / page_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d pages for a value of %d bytes in pages of %d", pages.size(), size, page_bytes_));
  }
  return PagedPieces(base_, num_pages() * page_bytes_, page_bytes_, pages, 0, size);
}

}  // namespace lazykv
