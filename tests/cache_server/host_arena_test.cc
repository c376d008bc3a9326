// HostArena and HostValue: pages handed out all or nothing, bytes that cross page
// boundaries read back as written (against a plain string), pages returned by the last
// holder, and a waiter woken by a free on another thread.
#include "cache_server/host_arena.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <thread>

#include "tests/test_util.h"

namespace lazykv::cache {
namespace {

std::unique_ptr<HostArena> Arena(uint64_t capacity, uint64_t page) {
  auto arena = HostArena::Create(capacity, page, /*pin_for_gpu=*/false);
  EXPECT_TRUE(arena.ok()) << arena.status();
  return *std::move(arena);
}

TEST(HostArena, RoundsCapacityDownToPagesAndAllocatesAllOrNothing) {
  auto arena = Arena(10 * 4096 + 100, 4096);
  EXPECT_EQ(arena->num_pages(), 10u);
  EXPECT_EQ(arena->capacity_bytes(), 10u * 4096);
  EXPECT_EQ(arena->PagesFor(1), 1u);
  EXPECT_EQ(arena->PagesFor(4096), 1u);
  EXPECT_EQ(arena->PagesFor(4097), 2u);
  std::vector<uint32_t> pages;
  ASSERT_TRUE(arena->TryAllocate(7, &pages));
  EXPECT_EQ(std::set<uint32_t>(pages.begin(), pages.end()).size(), 7u);
  EXPECT_FALSE(arena->TryAllocate(4, &pages));
  EXPECT_EQ(pages.size(), 7u);  // a refused allocation takes nothing
  EXPECT_EQ(arena->free_pages(), 3u);
  arena->Free(pages);
  EXPECT_EQ(arena->free_pages(), 10u);
}

TEST(HostArena, HandsOutAscendingRunsAndGetsThemBackInOrder) {
  // Adjacent ascending pages make one piece for a device copy or a same-host reader.
  auto arena = Arena(16 * 4096, 4096);
  std::vector<uint32_t> first, second;
  ASSERT_TRUE(arena->TryAllocate(4, &first));
  EXPECT_EQ(first, (std::vector<uint32_t>{0, 1, 2, 3}));
  ASSERT_TRUE(arena->TryAllocate(3, &second));
  EXPECT_EQ(second, (std::vector<uint32_t>{4, 5, 6}));
  arena->Free(first);
  std::vector<uint32_t> again;
  ASSERT_TRUE(arena->TryAllocate(4, &again));
  EXPECT_EQ(again, first) << "a freed run comes back whole and in order (and warm)";
}

TEST(HostValue, ReadsBackWhatWasWrittenAcrossPagesAndFreesItsPages) {
  const uint64_t seed = testing::FreshSeed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  auto arena = Arena(64 * 4096, 4096);
  for (int trial = 0; trial < 50; ++trial) {
    const uint64_t size = 1 + rng() % (40 * 4096);
    std::string reference(size, '\0');
    for (char& c : reference) c = static_cast<char>(rng());
    std::vector<uint32_t> pages;
    ASSERT_TRUE(arena->TryAllocate(arena->PagesFor(size), &pages));
    {
      HostValue value(arena.get(), pages, size);
      // Written in random pieces, as a stream's messages arrive.
      for (uint64_t at = 0; at < size;) {
        const uint64_t n = std::min<uint64_t>(size - at, 1 + rng() % 12000);
        value.Write(at, std::string_view(reference).substr(at, n));
        at += n;
      }
      const uint64_t offset = rng() % size, length = rng() % (size - offset + 1);
      std::string read(length, '\0');
      value.Read(offset, length, read.data());
      EXPECT_EQ(read, reference.substr(offset, length));
      std::string joined;
      for (std::string_view piece : value.Pieces(offset, length)) joined += piece;
      EXPECT_EQ(joined, reference.substr(offset, length));
      EXPECT_EQ(arena->free_pages(), arena->num_pages() - pages.size());
    }
    EXPECT_EQ(arena->free_pages(), arena->num_pages());
  }
}

TEST(HostArena, AWaiterWakesWhenAnotherThreadFreesPages) {
  auto arena = Arena(4 * 4096, 4096);
  std::vector<uint32_t> pages;
  ASSERT_TRUE(arena->TryAllocate(4, &pages));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(arena->WaitForFreePages(1, start + std::chrono::milliseconds(50)));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(50));
  std::thread freer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    arena->Free(std::span(pages).first(2));
  });
  EXPECT_TRUE(arena->WaitForFreePages(2, std::chrono::steady_clock::now() + std::chrono::seconds(10)));
  freer.join();
  EXPECT_EQ(arena->free_pages(), 2u);
}

}  // namespace
}  // namespace lazykv::cache
