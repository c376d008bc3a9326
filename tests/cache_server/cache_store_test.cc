// The cache tier's parts without the network: eviction policies, the host page arena
// under churn, single flight in the lease table, and the bugs the crash test
// (bench/cache_crash_test.cc) found in the disk tier and the tiered store.
#include <atomic>
#include <cstring>
#include <filesystem>
#include <future>
#include <random>
#include <set>
#include <thread>

#include "cache_server/disk_tier.h"
#include "cache_server/eviction_policy.h"
#include "cache_server/lease_table.h"
#include "cache_server/tiered_store.h"
#include "gtest/gtest.h"
#include "tests/cache_server/cache_test_util.h"
#include "tests/test_util.h"

namespace lazykv::testing {
namespace {

// Hit ratio of the hot keys after a scan of one-time keys, simulated over `policy`.
double HotSurvivors(const std::string& name) {
  const uint64_t capacity = 100;  // 100 entries of 1 byte
  auto policy = *cache::MakeEvictionPolicy(name, capacity);
  std::set<uint64_t> resident;
  auto access = [&](uint64_t id) {
    const Hash128 key{0, id};
    if (resident.contains(id)) {
      policy->Touch(key);
      return;
    }
    while (resident.size() >= capacity) resident.erase(policy->PopVictim()->low);
    policy->Insert(key, 1);
    resident.insert(id);
  };
  for (int round = 0; round < 5; ++round) {
    for (uint64_t hot = 0; hot < 50; ++hot) access(hot);  // documents asked again and again
  }
  for (uint64_t cold = 1000; cold < 1200; ++cold) access(cold);  // a burst of one-time documents
  int survivors = 0;
  for (uint64_t hot = 0; hot < 50; ++hot) survivors += resident.contains(hot);
  return survivors / 50.0;
}

TEST(EvictionPolicyTest, S3FifoKeepsHotDocumentsThroughABurstThatLruLoses) {
  EXPECT_EQ(HotSurvivors("lru"), 0.0);
  EXPECT_GE(HotSurvivors("s3fifo"), 0.9);
}

TEST(EvictionPolicyTest, EveryInsertedKeyLeavesExactlyOnce) {
  std::mt19937_64 rng(FreshSeed());
  for (const char* name : {"lru", "s3fifo"}) {
    auto policy = *cache::MakeEvictionPolicy(name, 1000);
    std::set<uint64_t> inserted;
    for (int i = 0; i < 500; ++i) {
      const uint64_t id = rng() % 200;
      if (rng() % 3 == 0 && inserted.contains(id)) {
        policy->Touch(Hash128{0, id});
      } else if (rng() % 5 == 0) {
        policy->Remove(Hash128{0, id});
        inserted.erase(id);
      } else {
        policy->Insert(Hash128{0, id}, 1 + rng() % 20);
        inserted.insert(id);
      }
    }
    EXPECT_EQ(policy->size(), inserted.size()) << name;
    std::set<uint64_t> popped;
    while (auto victim = policy->PopVictim()) EXPECT_TRUE(popped.insert(victim->low).second) << name;
    EXPECT_EQ(popped, inserted) << name;
  }
}

// A 96 MiB write runs outside the disk tier's lock: lookups of other chunks answer while
// it is under way, in a small fraction of its time.
TEST(DiskTierTest, LookupsDoNotWaitForALargeWrite) {
  std::mt19937_64 rng(FreshSeed());
  const std::string dir = TempDir("disk_tier_lock");
  auto disk = cache::DiskTier::Open(cache::DiskTierOptions{.path = dir + "/db", .capacity_bytes = 1ull << 30});
  ASSERT_TRUE(disk.ok()) << disk.status();
  const TestChunk small = RandomTestChunk(rng, 4096);
  const std::string small_stored = small.stored();
  ASSERT_TRUE((*disk)->Put(small.key, {small_stored}, small_stored.size()).ok());
  const TestChunk big_chunk = RandomTestChunk(rng, 96 << 20);
  const std::string big = big_chunk.stored();
  std::atomic<bool> writing{true};
  std::chrono::steady_clock::duration longest_lookup{0};
  int lookups = 0;
  std::thread reader([&] {
    while (writing.load()) {
      const auto start = std::chrono::steady_clock::now();
      EXPECT_TRUE((*disk)->SizeOf(small.key).has_value());
      longest_lookup = std::max(longest_lookup, std::chrono::steady_clock::now() - start);
      ++lookups;
    }
  });
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE((*disk)->Put(big_chunk.key, {big}, big.size()).ok());
  const auto write_time = std::chrono::steady_clock::now() - start;
  writing = false;
  reader.join();
  const double write_ms = std::chrono::duration<double, std::milli>(write_time).count();
  const double lookup_ms = std::chrono::duration<double, std::milli>(longest_lookup).count();
  std::printf("96 MiB write %.1f ms; %d lookups meanwhile, the longest %.3f ms\n", write_ms, lookups, lookup_ms);
  EXPECT_GT(lookups, 1);
  // Half the write: a lookup held by the write's lock would wait for most of it. A quarter
  // was crossed by preemption alone (0.36 of the write with three busy neighbours).
  EXPECT_LT(lookup_ms, write_ms / 2);
  disk->reset();
  std::filesystem::remove_all(dir);
}

TEST(TieredStoreTest, HostTierChurnNeverFragmentsAndStaysUnderCapacity) {
  std::mt19937_64 rng(FreshSeed());
  cache::TieredStoreOptions options;
  options.host_capacity_bytes = 8 << 20;
  options.page_bytes = 64 << 10;
  options.pin_host_memory = false;
  auto store = *cache::TieredStore::Open(options, nullptr);
  std::vector<TestChunk> live;
  std::vector<cache::ChunkReader> held;  // readers keep evicted values alive for a while
  for (int i = 0; i < 600; ++i) {
    TestChunk c = RandomTestChunk(rng, 50000 + rng() % (2 << 20));
    auto put = store->Put(c.key, c.stored());
    ASSERT_TRUE(put.ok()) << "put " << i << ": " << put.status();
    live.push_back(std::move(c));
    if (rng() % 4 == 0) {
      const TestChunk& probe = live[rng() % live.size()];
      if (auto r = store->Read(probe.key); r.ok()) {
        EXPECT_TRUE(r->ReadAll() == probe.stored());
        held.push_back(*std::move(r));
      }
    }
    if (held.size() > 3) held.erase(held.begin());
    if (rng() % 7 == 0) store->Delete(live[rng() % live.size()].key);
    EXPECT_LE(store->stats().host_used, options.host_capacity_bytes);
  }
  // The newest chunk is always there, byte for byte.
  auto last = store->Read(live.back().key);
  ASSERT_TRUE(last.ok());
  EXPECT_TRUE(last->ReadAll() == live.back().stored());
}

TEST(TieredStoreTest, EvictionFreesWhatAPutNeedsFromVictimsNobodyHolds) {
  std::mt19937_64 rng(FreshSeed());
  const std::string dir = TempDir("store_evict");
  cache::TieredStoreOptions options;
  options.page_bytes = 64 << 10;
  options.host_capacity_bytes = 6 * options.page_bytes;
  options.disk_capacity_bytes = 64 << 20;
  options.data_dir = dir + "/db";
  options.pin_host_memory = false;
  options.eviction_policy = "lru";
  options.space_wait = std::chrono::milliseconds(2000);
  auto store = *cache::TieredStore::Open(options, nullptr);
  auto put = [&] {
    TestChunk c = RandomTestChunk(rng, 40 << 10);  // one page each
    EXPECT_TRUE(store->Put(c.key, c.stored()).ok());
    EXPECT_TRUE(store->Flush().ok());  // on disk: only readers hold its pages now
    return c;
  };
  auto in_host = [&](const std::vector<TestChunk>& chunks) {
    int n = 0;
    for (const TestChunk& c : chunks) n += store->Locate(c.key)->tier == cache::StoreTier::kHost;
    return n;
  };
  // The four least recently used chunks are being read; two more fill the host tier.
  std::vector<TestChunk> read;
  for (int i = 0; i < 4; ++i) read.push_back(put());
  std::vector<cache::ChunkReader> readers;
  for (const TestChunk& c : read) readers.push_back(*store->Read(c.key));
  const TestChunk unread = put(), newest = put();
  // A one-page put evicts the unread chunk, not the four read ones ahead of it in the LRU
  // order (evicting them would free nothing until their reads end).
  const TestChunk fresh = put();
  EXPECT_EQ(in_host(read), 4);
  EXPECT_EQ(store->Locate(unread.key)->tier, cache::StoreTier::kDisk);
  // Now every chunk in RAM is being read: the put evicts just one and waits for its reader.
  readers.push_back(*store->Read(newest.key));
  readers.push_back(*store->Read(fresh.key));
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    readers.clear();
  });
  const TestChunk last = put();
  release.join();
  std::vector<TestChunk> held = read;
  held.push_back(newest);
  held.push_back(fresh);
  EXPECT_EQ(in_host(held), 5) << "more read chunks were evicted than the put needed";
  EXPECT_EQ(store->Locate(last.key)->tier, cache::StoreTier::kHost);
  for (const TestChunk& c : held) EXPECT_TRUE(store->Read(c.key)->ReadAll() == c.stored());
}

// Found by the crash test: an eviction wrote the delete of the victim's size record under
// a key read from the LRU node it had just freed, so the size records of evicted chunks
// stayed on disk, and a restart indexed chunks without values (DATA_LOSS on read, and the
// trim to the cap deleted live chunks instead). Reads reorder the LRU so that victims are
// not the oldest writes, as on a server.
TEST(DiskTierTest, EvictedChunksStayEvictedAcrossARestart) {
  std::mt19937_64 rng(FreshSeed());
  const std::string dir = TempDir("disk_tier_evict_restart");
  const uint64_t chunk_bytes = 300 << 10;  // about 13 fit the 8 MiB cap's value file
  const cache::DiskTierOptions options{.path = dir + "/db", .capacity_bytes = 8 << 20};
  std::vector<TestChunk> chunks;
  std::set<size_t> live;
  uint64_t entries = 0, used = 0;
  {
    auto disk = *cache::DiskTier::Open(options);
    for (int i = 0; i < 60; ++i) {
      chunks.push_back(RandomTestChunk(rng, chunk_bytes));
      const std::string stored = chunks.back().stored();
      ASSERT_TRUE(disk->Put(chunks.back().key, {stored}, stored.size()).ok());
      const size_t touch = rng() % chunks.size();
      (void)disk->Get(chunks[touch].key);
    }
    for (size_t i = 0; i < chunks.size(); ++i) {
      if (disk->SizeOf(chunks[i].key)) live.insert(i);
    }
    entries = disk->entries();
    used = disk->used_bytes();
    ASSERT_EQ(entries, live.size());
  }
  auto disk = *cache::DiskTier::Open(options);
  EXPECT_EQ(disk->entries(), entries) << "evicted chunks came back as size records";
  EXPECT_EQ(disk->used_bytes(), used);
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (live.contains(i)) {
      auto got = disk->Get(chunks[i].key);
      ASSERT_TRUE(got.ok()) << "chunk " << i << ": " << got.status();
      EXPECT_TRUE(*got == chunks[i].stored());
    } else {
      EXPECT_FALSE(disk->SizeOf(chunks[i].key).has_value()) << "evicted chunk " << i << " is indexed again";
    }
  }
  disk.reset();
  std::filesystem::remove_all(dir);
}

// A read racing the eviction of its chunk (its region reopened and overwritten) is
// NOT_FOUND, never DATA_LOSS (which counts it corrupt) nor other bytes. Each put of a chunk
// of nearly half the value file evicts the chunks two puts back; readers read the newest.
TEST(DiskTierTest, ReadRacingTheEvictionOfItsChunkIsNotFoundNotDataLoss) {
  std::mt19937_64 rng(FreshSeed());
  const std::string dir = TempDir("disk_tier_read_race");
  auto disk = *cache::DiskTier::Open({.path = dir + "/db", .capacity_bytes = 6 << 20, .scrub_bytes_per_second = 0});
  const uint64_t chunk_bytes = disk->stats().value_file_bytes * 2 / 5;
  std::vector<TestChunk> chunks;
  std::vector<std::string> stored;
  for (int i = 0; i < 120; ++i) {
    chunks.push_back(RandomTestChunk(rng, chunk_bytes));
    stored.push_back(chunks.back().stored());
  }
  std::atomic<int> written{0};
  std::atomic<bool> done{false};
  std::atomic<int> data_loss{0}, not_found{0}, ok{0}, wrong{0};
  auto read = [&](int back) {
    while (!done.load()) {
      const int i = written.load() - 1 - back;
      if (i < 0) continue;
      auto got = disk->Get(chunks[i].key);
      data_loss += got.status().code() == absl::StatusCode::kDataLoss;
      not_found += got.status().code() == absl::StatusCode::kNotFound;
      ok += got.ok();
      wrong += got.ok() && *got != stored[i];
    }
  };
  std::thread reader(read, 0), second_reader(read, 1), third_reader(read, 2);
  for (size_t i = 0; i < chunks.size(); ++i) {
    ASSERT_TRUE(disk->Put(chunks[i].key, {stored[i]}, stored[i].size()).ok());
    written.fetch_add(1);
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));  // reads pile up, then the next put
  }
  done = true;
  reader.join();
  second_reader.join();
  third_reader.join();
  std::printf("reads: %d ok, %d not found, %d data loss, %d wrong bytes\n", ok.load(), not_found.load(),
              data_loss.load(), wrong.load());
  EXPECT_EQ(data_loss, 0);
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(disk->stats().corrupt_dropped, 0u);
  EXPECT_GT(ok, 0);
  disk.reset();
  std::filesystem::remove_all(dir);
}

// Found by the crash test: a delete while the chunk's write-through was still queued (or
// under way) removed nothing on disk, and the disk writer then stored it, so the deleted
// chunk came back (at once, and after a restart). A read promoting the disk copy while the
// chunk is deleted must not bring it back either.
// A chunk larger than the whole host tier goes straight to disk (it was refused although
// the disk had room): it reads back exactly, from disk, survives a restart, and such
// chunks are buffered within max_chunk_bytes at once; a corrupt one is refused unstored.
TEST(TieredStoreTest, AChunkLargerThanTheHostTierGoesStraightToDisk) {
  std::mt19937_64 rng(FreshSeed());
  const std::string dir = TempDir("store_oversize");
  cache::TieredStoreOptions options;
  options.host_capacity_bytes = 4 << 20;
  options.page_bytes = 64 << 10;
  options.disk_capacity_bytes = 128 << 20;
  options.data_dir = dir + "/db";
  options.pin_host_memory = false;
  options.max_chunk_bytes = 16 << 20;
  const TestChunk big = RandomTestChunk(rng, 10 << 20), small = RandomTestChunk(rng, 100 << 10);
  {
    auto store = *cache::TieredStore::Open(options, nullptr);
    ASSERT_TRUE(store->Put(small.key, small.stored()).ok());
    auto stored = store->Put(big.key, big.stored());
    ASSERT_TRUE(stored.ok()) << stored.status();
    EXPECT_FALSE(*stored);
    ASSERT_TRUE(store->Locate(big.key).has_value());
    EXPECT_EQ(store->Locate(big.key)->tier, cache::StoreTier::kDisk);
    auto read = store->Read(big.key);
    ASSERT_TRUE(read.ok()) << read.status();
    std::string bytes;
    for (std::string_view piece : read->Pieces(0, read->size())) bytes.append(piece);
    EXPECT_TRUE(bytes == big.stored());
    EXPECT_EQ(*store->Put(big.key, big.stored()), true) << "stored once";
    // Two at once would buffer 20 MiB of the 16 MiB allowed: the second waits its turn.
    auto first = store->BeginPut(big.stored().size());
    ASSERT_TRUE(first.ok());
    auto second = store->BeginPut(big.stored().size());
    ASSERT_FALSE(second.ok());
    EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(second.status().message().find("straight to disk"), std::string::npos) << second.status();
    first->reset();
    EXPECT_TRUE(store->BeginPut(big.stored().size()).ok()) << "the budget came back";
    // A corrupt one is refused and not stored.
    TestChunk bad = RandomTestChunk(rng, 9 << 20);
    std::string corrupt = bad.stored();
    corrupt[corrupt.size() / 2] ^= 1;
    EXPECT_FALSE(store->Put(bad.key, corrupt).ok());
    EXPECT_FALSE(store->Locate(bad.key).has_value());
    EXPECT_TRUE(store->Locate(small.key).has_value()) << "nothing stored was lost";
  }
  auto reopened = *cache::TieredStore::Open(options, nullptr);
  auto read = reopened->Read(big.key);
  ASSERT_TRUE(read.ok()) << read.status();
  std::string bytes;
  for (std::string_view piece : read->Pieces(0, read->size())) bytes.append(piece);
  EXPECT_TRUE(bytes == big.stored());
  EXPECT_TRUE(reopened->Delete(big.key));
  EXPECT_FALSE(reopened->Locate(big.key).has_value());
}

TEST(TieredStoreTest, DeletedChunksStayDeletedWhileWritesAndReadsRace) {
  std::mt19937_64 rng(FreshSeed());
  const std::string dir = TempDir("store_delete_race");
  cache::TieredStoreOptions options;
  options.host_capacity_bytes = 64 << 20;
  options.page_bytes = 64 << 10;
  options.disk_capacity_bytes = 512 << 20;
  options.data_dir = dir + "/db";
  options.pin_host_memory = false;
  std::vector<Hash128> deleted;
  {
    auto store = *cache::TieredStore::Open(options, nullptr);
    for (int i = 0; i < 5; ++i) {
      const TestChunk big = RandomTestChunk(rng, 24 << 20);  // keeps the disk writer busy
      const TestChunk queued = RandomTestChunk(rng, 100 << 10);
      ASSERT_TRUE(store->Put(big.key, big.stored()).ok());
      ASSERT_TRUE(store->Put(queued.key, queued.stored()).ok());
      EXPECT_TRUE(store->Delete(queued.key));  // still queued behind the big one
      EXPECT_TRUE(store->Delete(big.key));     // queued or being written
      deleted.push_back(queued.key);
      deleted.push_back(big.key);
    }
    ASSERT_TRUE(store->Flush().ok());
    for (const Hash128& key : deleted) EXPECT_FALSE(store->Locate(key).has_value()) << "a deleted chunk came back";
  }
  {
    // Reads of a chunk on disk only (promotions) racing its delete, in a small host tier.
    cache::TieredStoreOptions small = options;
    small.host_capacity_bytes = 4 << 20;
    auto store = *cache::TieredStore::Open(small, nullptr);
    for (int i = 0; i < 40; ++i) {
      const TestChunk c = RandomTestChunk(rng, 200 << 10);
      ASSERT_TRUE(store->Put(c.key, c.stored()).ok());
      ASSERT_TRUE(store->Flush().ok());
      for (int j = 0; j < 3; ++j) {  // push c out of host RAM (it is on disk already)
        const TestChunk filler = RandomTestChunk(rng, 1500 << 10);
        ASSERT_TRUE(store->Put(filler.key, filler.stored()).ok());
      }
      std::thread reader([&] { (void)store->Read(c.key); });
      store->Delete(c.key);
      reader.join();
      EXPECT_FALSE(store->Locate(c.key).has_value()) << "a read brought back a deleted chunk";
      deleted.push_back(c.key);
    }
  }
  auto store = *cache::TieredStore::Open(options, nullptr);
  for (const Hash128& key : deleted) EXPECT_FALSE(store->Locate(key).has_value()) << "a deleted chunk came back";
  store.reset();
  std::filesystem::remove_all(dir);
}

TEST(LeaseTableTest, ManyWaitersOneComputes) {
  std::atomic<bool> stored = false;
  cache::CacheMetrics metrics;
  cache::LeaseTable leases([&](const Hash128&) { return stored.load(); }, &metrics);
  const Hash128 key{1, 2};
  using Outcome = cache::LeaseTable::Outcome;
  std::vector<std::future<Outcome>> callers;
  for (int i = 0; i < 8; ++i) {
    callers.push_back(std::async(std::launch::async, [&] {
      const auto result = leases.Acquire(key, "t", "t", std::chrono::seconds(10),
                                         cache::LeaseTable::Clock::now() + std::chrono::seconds(10));
      if (result.outcome == Outcome::kGranted) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // computing
        stored = true;
        leases.Published(key);
      }
      return result.outcome;
    }));
  }
  int granted = 0, woke_stored = 0;
  for (auto& c : callers) {
    const Outcome o = c.get();
    granted += o == Outcome::kGranted;
    woke_stored += o == Outcome::kStored;
  }
  EXPECT_EQ(granted, 1);
  EXPECT_EQ(woke_stored, 7);
  EXPECT_EQ(metrics.lease_grants->Value(), 1);
  EXPECT_EQ(leases.active(), 0u);
}

}  // namespace
}  // namespace lazykv::testing
