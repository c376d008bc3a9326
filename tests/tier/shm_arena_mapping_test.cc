// The worker's read-only view of a cache server's shared host arena, in one process (the
// server's side is a HostArena of this process, opened through /proc/self's pid like
// another process would): a value's bytes through the mapping equal what was written
// (against the written string, across page boundaries, adjacent pages merged), the
// mapping refuses a file that is not the arena named and page lists that do not fit, is
// read-only (only a reservation's pages are mapped writable, and writes there land in the
// arena), and the arena's file cannot be shrunk under readers.
#include "worker/tier/shm_arena_mapping.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>

#include "cache_server/host_arena.h"
#include "common/shm_host_id.h"
#include "tests/test_util.h"

namespace lazykv {
namespace {

constexpr uint64_t kPage = 4096;

std::unique_ptr<cache::HostArena> SharedArena(uint64_t pages) {
  auto arena = cache::HostArena::Create(pages * kPage, kPage, /*pin_for_gpu=*/false, /*shared=*/true);
  EXPECT_TRUE(arena.ok()) << arena.status();
  return *std::move(arena);
}

ShmArenaIdentity IdentityOf(const cache::HostArena& arena) {
  return ShmArenaIdentity{.server_pid = getpid(),
                          .arena_fd = arena.fd(),
                          .arena_bytes = arena.capacity_bytes(),
                          .page_bytes = arena.page_bytes(),
                          .dev = arena.file_dev(),
                          .ino = arena.file_ino(),
                          .boot_id = HostBootId()};
}

std::string Concat(const std::vector<std::string_view>& pieces) {
  std::string out;
  for (std::string_view piece : pieces) out += piece;
  return out;
}

TEST(ShmArenaMapping, ReadsWhatTheServerWroteInPageOrder) {
  auto arena = SharedArena(16);
  if (!arena->shared()) GTEST_SKIP() << "no memfd here";
  std::mt19937_64 rng(testing::FreshSeed());
  // Pages out of order and partly adjacent (5, 6 then 2, then 9, 10, 11): a value of 5
  // pages and a bit, so the last page is partial.
  std::vector<uint32_t> pages{5, 6, 2, 9, 10, 11};
  const uint64_t size = 5 * kPage + 123;
  std::string bytes(size, '\0');
  for (char& c : bytes) c = static_cast<char>(rng());
  // Written through the arena's own view, as HostValue::Write does.
  for (uint64_t b = 0; b < size; b += kPage) {
    std::memcpy(arena->page(pages[b / kPage]), bytes.data() + b, std::min(kPage, size - b));
  }
  auto mapping = ShmArenaMapping::Map(IdentityOf(*arena));
  ASSERT_TRUE(mapping.ok()) << mapping.status();
  auto pieces = (*mapping)->Pieces(pages, size);
  ASSERT_TRUE(pieces.ok()) << pieces.status();
  EXPECT_EQ(pieces->size(), 3u) << "5,6 / 2 / 9,10,11: adjacent pages are one piece";
  EXPECT_EQ(Concat(*pieces), bytes);
  // A later write by the server is seen through the mapping (shared, not a copy).
  arena->page(2)[7] = static_cast<char>(~bytes[2 * kPage + 7]);
  EXPECT_EQ((*pieces)[1][7], arena->page(2)[7]);
}

TEST(ShmArenaMapping, RefusesPageListsThatDoNotFit) {
  auto arena = SharedArena(8);
  if (!arena->shared()) GTEST_SKIP() << "no memfd here";
  auto mapping = ShmArenaMapping::Map(IdentityOf(*arena));
  ASSERT_TRUE(mapping.ok()) << mapping.status();
  const std::vector<uint32_t> two{1, 2};
  EXPECT_TRUE((*mapping)->Pieces(two, 2 * kPage).ok());
  EXPECT_TRUE((*mapping)->Pieces(two, kPage + 1).ok());
  EXPECT_EQ((*mapping)->Pieces(two, kPage).status().code(), absl::StatusCode::kInvalidArgument) << "too many pages";
  EXPECT_EQ((*mapping)->Pieces(two, 2 * kPage + 1).status().code(), absl::StatusCode::kInvalidArgument)
      << "too few pages";
  const std::vector<uint32_t> outside{1, 8};
  EXPECT_EQ((*mapping)->Pieces(outside, 2 * kPage).status().code(), absl::StatusCode::kInvalidArgument)
      << "page 8 of an 8-page arena";
}

TEST(ShmArenaMapping, RefusesAFileThatIsNotTheArenaNamed) {
  auto arena = SharedArena(8);
  auto other = SharedArena(8);
  if (!arena->shared() || !other->shared()) GTEST_SKIP() << "no memfd here";
  ShmArenaIdentity wrong = IdentityOf(*arena);
  wrong.arena_fd = other->fd();  // the pid now names another file: its inode differs
  EXPECT_EQ(ShmArenaMapping::Map(wrong).status().code(), absl::StatusCode::kFailedPrecondition);
  ShmArenaIdentity larger = IdentityOf(*arena);
  larger.arena_bytes *= 2;
  EXPECT_EQ(ShmArenaMapping::Map(larger).status().code(), absl::StatusCode::kFailedPrecondition);
  ShmArenaIdentity gone = IdentityOf(*arena);
  gone.arena_fd = 100000;
  EXPECT_EQ(ShmArenaMapping::Map(gone).status().code(), absl::StatusCode::kFailedPrecondition);
  ShmArenaIdentity elsewhere = IdentityOf(*arena);
  elsewhere.boot_id = "00000000-0000-0000-0000-000000000000";  // another host: same pid, fd, inode
  EXPECT_EQ(ShmArenaMapping::Map(elsewhere).status().code(), absl::StatusCode::kFailedPrecondition);
  ShmArenaIdentity malformed = IdentityOf(*arena);
  malformed.page_bytes = 3000;
  EXPECT_EQ(ShmArenaMapping::Map(malformed).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShmArenaMapping, ThePrivateArenaHasNoFile) {
  auto arena = cache::HostArena::Create(8 * kPage, kPage, false, /*shared=*/false);
  ASSERT_TRUE(arena.ok());
  EXPECT_FALSE((*arena)->shared());
  EXPECT_EQ((*arena)->fd(), -1);
}

TEST(ShmArenaMapping, TheArenaCannotBeResizedUnderReaders) {
  auto arena = SharedArena(8);
  if (!arena->shared()) GTEST_SKIP() << "no memfd here";
  EXPECT_NE(ftruncate(arena->fd(), 0), 0) << "sealed: a shrink would make readers' pages SIGBUS";
  EXPECT_NE(ftruncate(arena->fd(), 16 * kPage), 0);
}

// The permissions the kernel holds for the mapping that contains `address`
// (/proc/self/maps: "r--s" is read-only and shared), or "".
std::string PermissionsAt(const void* address) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const auto at = reinterpret_cast<uintptr_t>(address);
  while (std::getline(maps, line)) {
    uintptr_t from = 0, to = 0;
    char perms[5] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %4s", &from, &to, perms) == 3 && from <= at && at < to) return perms;
  }
  return "";
}

TEST(ShmArenaMapping, TheReadersMappingIsReadOnlyAndAReservationsPagesAloneAreWritable) {
  auto arena = SharedArena(8);
  if (!arena->shared()) GTEST_SKIP() << "no memfd here";
  auto mapping = ShmArenaMapping::Map(IdentityOf(*arena));
  ASSERT_TRUE(mapping.ok());
  auto pieces = (*mapping)->Pieces(std::vector<uint32_t>{3}, 10);
  ASSERT_TRUE(pieces.ok());
  EXPECT_EQ(PermissionsAt((*pieces)[0].data()), "r--s");
  // Pages reserved for a publication (5, 6 then 2): mapped writable, only they, and
  // what is written there is what the server's arena holds.
  const std::vector<uint32_t> reserved{5, 6, 2};
  const uint64_t size = 2 * kPage + 100;
  auto writable = (*mapping)->MapWritable(reserved, size);
  ASSERT_TRUE(writable.ok()) << writable.status();
  ASSERT_EQ((*writable)->pieces().size(), 2u) << "5,6 / 2";
  EXPECT_EQ((*writable)->pieces()[0].size(), 2 * kPage);
  EXPECT_EQ((*writable)->pieces()[1].size(), 100u);
  EXPECT_EQ(PermissionsAt((*writable)->pieces()[0].data()), "rw-s");
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(i * 7 + 1);
  WriteToPieces((*writable)->pieces(), 0, bytes);
  EXPECT_EQ(std::string(arena->page(5), 2 * kPage) + std::string(arena->page(2), 100), bytes);
  EXPECT_EQ(PermissionsAt((*pieces)[0].data()), "r--s") << "the reader's view stays read-only";
  const void* gone = (*writable)->pieces()[0].data();
  writable->reset();
  EXPECT_NE(PermissionsAt(gone), "rw-s") << "unmapped with the reservation";
  EXPECT_EQ((*mapping)->MapWritable(std::vector<uint32_t>{8}, 10).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lazykv
