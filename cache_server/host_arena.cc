#include "cache_server/host_arena.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_format.h"
#include "cache_server/pinned_memory.h"

namespace lazykv::cache {
namespace {

// A memfd of `bytes`, sealed so that nobody can shrink it under a reader (which would
// turn its reads into SIGBUS) or grow it; -1 with errno when the kernel refuses one.
int CreateSealedMemfd(uint64_t bytes) {
  const int fd = memfd_create("lazykv-host-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    const int saved = errno;
    close(fd);
    errno = saved;
    return -1;
  }
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HostArena>> HostArena::Create(uint64_t capacity_bytes, uint64_t page_bytes,
                                                             bool pin_for_gpu, bool shared) {
  if (page_bytes < 4096 || (page_bytes & (page_bytes - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("page size %d must be a power of two >= 4096", page_bytes));
  }
  const uint64_t num_pages = capacity_bytes / page_bytes;
  if (num_pages == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("host capacity %d bytes is less than one page of %d bytes", capacity_bytes, page_bytes));
  }
  if (num_pages > UINT32_MAX) return absl::InvalidArgumentError("host capacity: too many pages");
  const uint64_t bytes = num_pages * page_bytes;
  int fd = -1;
  if (shared) {
    fd = CreateSealedMemfd(bytes);
    if (fd < 0) {
      spdlog::warn("host arena: no shared memory ({}); the same-host transport is off", std::strerror(errno));
    }
  }
  // Reserved lazily by the kernel: untouched pages cost no RAM (a memfd's pages too).
  void* base = fd >= 0 ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0)
                       : mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    const int saved = errno;
    if (fd >= 0) close(fd);
    return absl::ResourceExhaustedError(
        absl::StrFormat("cannot map %d bytes of host memory: %s", bytes, std::strerror(saved)));
  }
  const bool pinned = pin_for_gpu && PinHostMemory(base, bytes);
  return std::unique_ptr<HostArena>(new HostArena(static_cast<char*>(base), page_bytes, num_pages, pinned, fd));
}

HostArena::HostArena(char* base, uint64_t page_bytes, uint64_t num_pages, bool pinned, int fd)
    : base_(base), fd_(fd), page_bytes_(page_bytes), num_pages_(num_pages), pinned_(pinned) {
  if (fd_ >= 0) {
    struct stat st {};
    if (fstat(fd_, &st) == 0) {
      file_dev_ = static_cast<uint64_t>(st.st_dev);
      file_ino_ = static_cast<uint64_t>(st.st_ino);
    }
  }
  free_.reserve(num_pages);
  for (uint64_t i = num_pages; i-- > 0;) free_.push_back(static_cast<uint32_t>(i));
}

HostArena::~HostArena() {
  if (pinned_) UnpinHostMemory(base_);
  munmap(base_, num_pages_ * page_bytes_);
  if (fd_ >= 0) close(fd_);
}

bool HostArena::TryAllocate(uint64_t n, std::vector<uint32_t>* pages) {
  MutexLock lock(&mu_);
  if (free_.size() < n) return false;
  // Popped from the top: the stack holds runs in descending order (Free pushes them
  // reversed), so a value gets ascending, mostly adjacent pages: fewer, larger pieces for
  // the device copies and for a same-host reader's mapping.
  pages->insert(pages->end(), free_.rbegin(), free_.rbegin() + static_cast<ptrdiff_t>(n));
  free_.resize(free_.size() - n);
  return true;
}

void HostArena::Free(std::span<const uint32_t> pages) {
  if (pages.empty()) return;
  {
    MutexLock lock(&mu_);
    free_.insert(free_.end(), pages.rbegin(), pages.rend());
  }
  freed_.SignalAll();
}

uint64_t HostArena::free_pages() const {
  MutexLock lock(&mu_);
  return free_.size();
}

bool HostArena::WaitForFreePages(uint64_t n, std::chrono::steady_clock::time_point deadline) {
  MutexLock lock(&mu_);
  while (free_.size() < n) {
    if (!freed_.WaitUntil(&mu_, deadline)) return free_.size() >= n;
  }
  return true;
}

void HostValue::Write(uint64_t offset, std::string_view bytes) {
  const uint64_t page_bytes = arena_->page_bytes();
  while (!bytes.empty()) {
    const uint64_t in_page = offset % page_bytes;
    const uint64_t n = std::min<uint64_t>(page_bytes - in_page, bytes.size());
    std::memcpy(arena_->page(pages_[offset / page_bytes]) + in_page, bytes.data(), n);
    bytes.remove_prefix(n);
    offset += n;
  }
}

std::vector<std::string_view> HostValue::Pieces(uint64_t offset, uint64_t length) const {
  std::vector<std::string_view> pieces;
  const uint64_t page_bytes = arena_->page_bytes();
  while (length > 0) {
    const uint64_t in_page = offset % page_bytes;
    const uint64_t n = std::min(page_bytes - in_page, length);
    pieces.emplace_back(arena_->page(pages_[offset / page_bytes]) + in_page, n);
    offset += n;
    length -= n;
  }
  return pieces;
}

std::vector<std::span<char>> HostValue::WritablePieces() {
  std::vector<std::span<char>> out;
  for (std::string_view piece : Pieces(0, size_)) out.emplace_back(const_cast<char*>(piece.data()), piece.size());
  return out;
}

void HostValue::Read(uint64_t offset, uint64_t length, char* out) const {
  for (std::string_view piece : Pieces(offset, length)) {
    std::memcpy(out, piece.data(), piece.size());
    out += piece.size();
  }
}

}  // namespace lazykv::cache
