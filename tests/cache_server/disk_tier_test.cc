// The disk tier's value file of regions (cache_server/disk_tier.h, issue 21): the directory
// within its byte cap after every put, restarts over stale regions, corruption found by a
// read and by the scrub, and reads and writes racing the reuse of regions.
#include "cache_server/disk_tier.h"

#include <fcntl.h>
#include <rocksdb/db.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <random>
#include <thread>
#include <unordered_map>

#include "cache_server/value_file.h"
#include "gtest/gtest.h"
#include "tests/cache_server/cache_test_util.h"
#include "tests/test_util.h"

namespace lazykv::testing {
namespace {

using cache::DiskTier;
using cache::DiskTierOptions;

absl::Status PutChunk(DiskTier& disk, const TestChunk& chunk) {
  const std::string stored = chunk.stored();
  return disk.Put(chunk.key, {stored}, stored.size()).status();
}

// Flips one payload byte of `chunk` in the tier's value file (through the page cache the
// tier reads from).
void FlipPayloadByte(const std::string& dir, DiskTier& disk, const TestChunk& chunk, std::mt19937_64& rng) {
  const auto offset = disk.FileOffsetOf(chunk.key);
  ASSERT_TRUE(offset.has_value());
  const int fd = open(DiskTier::ValueFilePath(dir).c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const uint64_t at = *offset + kChunkHeaderBytes + rng() % chunk.payload.size();
  char byte = 0;
  ASSERT_EQ(pread(fd, &byte, 1, static_cast<off_t>(at)), 1);
  byte ^= 0x10;
  ASSERT_EQ(pwrite(fd, &byte, 1, static_cast<off_t>(at)), 1);
  close(fd);
}

// Ten times the cap in chunks of 4 KiB to 3 MiB: after every put, the directory (the larger
// of file sizes and allocated blocks, file by file: `du -sb` and `du -s`) is within the cap.
TEST(DiskTierCapTest, DirectoryStaysWithinTheCapAfterEveryPut) {
  std::mt19937_64 rng(FreshSeed());
  for (const uint64_t cap : {16ull << 20, 48ull << 20}) {
    const std::string dir = TempDir("disk_tier_cap") + "/db";
    auto disk = *DiskTier::Open({.path = dir, .capacity_bytes = cap, .scrub_bytes_per_second = 0});
    uint64_t put_bytes = 0, largest = 0;
    std::vector<TestChunk> chunks;
    while (put_bytes < 10 * cap) {
      const double u = std::uniform_real_distribution<double>(0, 1)(rng);
      chunks.push_back(RandomTestChunk(rng, static_cast<size_t>(4096 * std::exp(u * std::log(768.0)))));
      ASSERT_TRUE(PutChunk(*disk, chunks.back()).ok());
      put_bytes += chunks.back().stored().size();
      const uint64_t du = cache::MeasureDirectory(dir).larger();
      largest = std::max(largest, du);
      ASSERT_LE(du, cap) << "after " << chunks.size() << " puts";
      ASSERT_LE(disk->used_bytes(), disk->stats().value_file_bytes);
    }
    const cache::DiskTierStats st = disk->stats();
    std::printf("cap %llu MiB: %zu puts, directory at most %.3fx the cap; %llu regions reused, %llu evicted\n",
                static_cast<unsigned long long>(cap >> 20), chunks.size(), static_cast<double>(largest) / cap,
                static_cast<unsigned long long>(st.regions_reused), static_cast<unsigned long long>(st.chunks_evicted));
    EXPECT_GT(st.regions_reused, 0u);
    EXPECT_GT(st.entries, 0u);
    uint64_t present = 0;
    for (const TestChunk& c : chunks) {
      auto got = disk->Get(c.key);
      if (got.status().code() == absl::StatusCode::kNotFound) continue;
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_TRUE(*got == c.stored());
      ++present;
    }
    EXPECT_EQ(present, st.entries);
    disk.reset();
    std::filesystem::remove_all(std::filesystem::path(dir).parent_path());
  }
}

// Restarts over the two states a crash can leave: a value written but never indexed (its
// bytes are then overwritten), and index records pointing into regions reused since (a
// crash after a region's new epoch was written, before its chunks' records were deleted).
// Nothing indexed is lost, and nothing stale is served.
TEST(DiskTierRestartTest, StaleRecordsAndUnindexedValuesAreDroppedNeverServed) {
  std::mt19937_64 rng(FreshSeed());
  const std::string dir = TempDir("disk_tier_stale") + "/db";
  const DiskTierOptions options{.path = dir, .capacity_bytes = 8 << 20, .scrub_bytes_per_second = 0};
  std::vector<TestChunk> chunks;
  for (int i = 0; i < 4; ++i) chunks.push_back(RandomTestChunk(rng, 200 << 10));
  const TestChunk unindexed = RandomTestChunk(rng, 200 << 10);
  uint64_t unindexed_offset = 0, last_end = 0, region_bytes = 0;
  {
    auto disk = *DiskTier::Open(options);
    for (const TestChunk& c : chunks) ASSERT_TRUE(PutChunk(*disk, c).ok());
    ASSERT_TRUE(PutChunk(*disk, unindexed).ok());
    unindexed_offset = *disk->FileOffsetOf(unindexed.key);
    last_end = *disk->FileOffsetOf(chunks.back().key) + chunks.back().stored().size();
    region_bytes = disk->stats().region_bytes;
  }
  // The crash between the value's write and its index record: drop the record.
  std::unordered_map<Hash128, std::string, Hash128Hasher> saved_records;  // the first chunks' records, kept for later
  {
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), DiskTier::IndexPath(dir), &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    for (const TestChunk& c : chunks) {
      ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), DiskTier::IndexRecordKey(c.key), &saved_records[c.key]).ok());
    }
    ASSERT_TRUE(db->Delete(rocksdb::WriteOptions(), DiskTier::IndexRecordKey(unindexed.key)).ok());
    db->Close();
  }
  std::vector<TestChunk> later;
  {
    auto disk = *DiskTier::Open(options);
    EXPECT_EQ(disk->entries(), chunks.size());
    EXPECT_FALSE(disk->SizeOf(unindexed.key).has_value());
    for (const TestChunk& c : chunks) EXPECT_TRUE(*disk->Get(c.key) == c.stored());
    // The next put takes the unindexed value's place; then enough to reuse every region.
    const uint64_t file = disk->stats().value_file_bytes;
    for (uint64_t bytes = 0; bytes < 2 * file; bytes += 300 << 10) {
      later.push_back(RandomTestChunk(rng, 300 << 10));
      ASSERT_TRUE(PutChunk(*disk, later.back()).ok());
      if (later.size() == 1) {
        // The head resumes after the last indexed chunk, in the newest region or the next.
        const uint64_t at = *disk->FileOffsetOf(later.front().key);
        EXPECT_GE(at, last_end);
        EXPECT_LE(at, unindexed_offset + unindexed.stored().size() + region_bytes);
      }
    }
    for (const TestChunk& c : chunks) EXPECT_FALSE(disk->SizeOf(c.key).has_value()) << "not evicted by a full lap";
  }
  // The crash after reusing their regions, before deleting their records: put them back.
  {
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), DiskTier::IndexPath(dir), &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    for (const auto& [key, record] : saved_records) {
      ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), DiskTier::IndexRecordKey(key), record).ok());
    }
    db->Close();
  }
  auto disk = *DiskTier::Open(options);
  EXPECT_EQ(disk->stats().stale_at_open, saved_records.size());
  for (const TestChunk& c : chunks) {
    EXPECT_FALSE(disk->SizeOf(c.key).has_value());
    EXPECT_EQ(disk->Get(c.key).status().code(), absl::StatusCode::kNotFound);
  }
  int present = 0;
  for (const TestChunk& c : later) {
    auto got = disk->Get(c.key);
    if (got.status().code() == absl::StatusCode::kNotFound) continue;
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(*got == c.stored());
    ++present;
  }
  EXPECT_EQ(present, static_cast<int>(disk->entries()));
  EXPECT_GT(present, 0);
  EXPECT_EQ(disk->stats().corrupt_dropped, 0u);
  disk.reset();
  std::filesystem::remove_all(std::filesystem::path(dir).parent_path());
}

// A flipped byte in the value file: a read reports DATA_LOSS and drops the chunk; the scrub
// (a pass, and the background thread) drops another without any read; both counted.
TEST(DiskTierScrubTest, CorruptValuesAreDroppedByAReadAndByTheScrub) {
  std::mt19937_64 rng(FreshSeed());
  const std::string dir = TempDir("disk_tier_scrub") + "/db";
  auto disk = *DiskTier::Open({.path = dir, .capacity_bytes = 32 << 20, .scrub_bytes_per_second = 64 << 20});
  std::vector<TestChunk> chunks;
  for (int i = 0; i < 8; ++i) {
    chunks.push_back(RandomTestChunk(rng, 300 << 10));
    ASSERT_TRUE(PutChunk(*disk, chunks.back()).ok());
  }
  FlipPayloadByte(dir, *disk, chunks[1], rng);
  const auto read = disk->Get(chunks[1].key);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
  EXPECT_NE(read.status().message().find("checksum"), std::string::npos) << read.status();
  EXPECT_EQ(disk->Get(chunks[1].key).status().code(), absl::StatusCode::kNotFound) << "a corrupt value was kept";
  EXPECT_EQ(disk->stats().corrupt_dropped, 1u);

  FlipPayloadByte(dir, *disk, chunks[4], rng);
  EXPECT_EQ(disk->ScrubPass(), 1u);
  EXPECT_FALSE(disk->SizeOf(chunks[4].key).has_value());
  EXPECT_EQ(disk->stats().scrub_corrupt, 1u);
  EXPECT_EQ(disk->stats().index_check_failures, 0u);

  std::atomic<int> dropped_by_thread{0};
  disk->StartScrub([&](const Hash128& key) {
    EXPECT_EQ(key, chunks[6].key);
    ++dropped_by_thread;
  });
  FlipPayloadByte(dir, *disk, chunks[6], rng);
  for (int i = 0; i < 100 && dropped_by_thread.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(dropped_by_thread.load(), 1);
  const cache::DiskTierStats st = disk->stats();
  EXPECT_EQ(st.corrupt_dropped, 3u);
  EXPECT_EQ(st.scrub_corrupt, 2u);
  EXPECT_GT(st.scrubbed_bytes, 0u);
  for (int i : {0, 2, 3, 5, 7}) EXPECT_TRUE(*disk->Get(chunks[i].key) == chunks[i].stored()) << i;
  disk.reset();
  std::filesystem::remove_all(std::filesystem::path(dir).parent_path());
}

// Two writers and four readers on a small file: regions are reopened under reads in
// progress and under each other's writes. Every read is the exact bytes or NOT_FOUND; the
// byte count equals the indexed chunks, and a restart finds exactly them.
TEST(DiskTierConcurrencyTest, ReadersAndWritersRacingRegionReuse) {
  const uint64_t seed = FreshSeed();
  const std::string dir = TempDir("disk_tier_race") + "/db";
  const DiskTierOptions options{.path = dir, .capacity_bytes = 12 << 20, .scrub_bytes_per_second = 256 << 20};
  auto disk = *DiskTier::Open(options);
  disk->StartScrub(nullptr);
  std::vector<TestChunk> chunks;
  std::vector<std::string> stored;
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 300; ++i) {
    chunks.push_back(RandomTestChunk(rng, 8192 + rng() % (1200 << 10)));
    stored.push_back(chunks.back().stored());
  }
  std::atomic<int> next{0};
  std::atomic<bool> done{false};
  std::atomic<int> ok{0}, not_found{0}, bad{0};
  auto writer = [&] {
    for (int i = next++; i < static_cast<int>(chunks.size()); i = next++) {
      EXPECT_TRUE(disk->Put(chunks[i].key, {stored[i]}, stored[i].size()).ok());
    }
  };
  auto reader = [&](uint64_t reader_seed) {
    std::mt19937_64 r(reader_seed);
    while (!done.load()) {
      const int upto = std::min<int>(next.load(), chunks.size());
      if (upto == 0) continue;
      const int i = std::max(0, upto - 1 - static_cast<int>(r() % 12));
      auto got = disk->Get(chunks[i].key);
      if (got.ok()) {
        ++ok;
        bad += *got != stored[i];
      } else if (got.status().code() == absl::StatusCode::kNotFound) {
        ++not_found;
      } else {
        ++bad;
        ADD_FAILURE() << got.status();
      }
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back(reader, seed + 1 + i);
  std::thread w1(writer), w2(writer);
  w1.join();
  w2.join();
  done = true;
  for (auto& t : threads) t.join();
  std::printf("reads: %d ok, %d not found, %d bad\n", ok.load(), not_found.load(), bad.load());
  EXPECT_EQ(bad, 0);
  EXPECT_GT(ok, 0);
  const cache::DiskTierStats st = disk->stats();
  EXPECT_EQ(st.corrupt_dropped, 0u);
  EXPECT_GT(st.regions_reused, 0u);
  std::unordered_map<Hash128, int, Hash128Hasher> indexed;
  uint64_t sum = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (auto size = disk->SizeOf(chunks[i].key)) {
      indexed[chunks[i].key] = static_cast<int>(i);
      sum += *size;
    }
  }
  EXPECT_EQ(sum, disk->used_bytes());
  EXPECT_EQ(indexed.size(), disk->entries());
  disk.reset();
  disk = *DiskTier::Open(options);
  EXPECT_EQ(disk->entries(), indexed.size());
  EXPECT_EQ(disk->stats().stale_at_open, 0u);
  for (const auto& [key, i] : indexed) EXPECT_TRUE(*disk->Get(key) == stored[i]);
  disk.reset();
  std::filesystem::remove_all(std::filesystem::path(dir).parent_path());
}

// A chunk larger than half the value file is refused, clearly; one larger than a region
// spans several and reads back.
TEST(DiskTierTest, ChunksSpanRegionsAndTheLargestAreRefused) {
  std::mt19937_64 rng(FreshSeed());
  const std::string dir = TempDir("disk_tier_span") + "/db";
  auto disk = *DiskTier::Open({.path = dir, .capacity_bytes = 32 << 20, .scrub_bytes_per_second = 0});
  const cache::DiskTierStats st = disk->stats();
  const TestChunk spanning = RandomTestChunk(rng, 3 * st.region_bytes);
  ASSERT_TRUE(PutChunk(*disk, spanning).ok());
  EXPECT_TRUE(*disk->Get(spanning.key) == spanning.stored());
  const TestChunk huge = RandomTestChunk(rng, st.value_file_bytes * 3 / 5);
  const absl::Status refused = PutChunk(*disk, huge);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("half its value file"), std::string::npos) << refused;
  EXPECT_EQ(DiskTier::Open({.path = dir + "2", .capacity_bytes = 4 << 20}).status().code(),
            absl::StatusCode::kInvalidArgument);
  disk.reset();
  std::filesystem::remove_all(std::filesystem::path(dir).parent_path());
}

}  // namespace
}  // namespace lazykv::testing
