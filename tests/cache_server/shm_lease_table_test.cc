// ShmLeaseTable: a read lease keeps a value's pages out of the arena's free list after
// every other holder let go (the pages a same-host reader reads are never reused under
// it), until it is released or its session closes; leases are bounded per session (count
// and bytes) and in total; a session is its owner's only; Shutdown cancels every session.
// A session that ends while its worker's process (a real child process here) lives on is
// orphaned: its pages stay held until the process exits or the hold passes.
// The reference is the arena's own free-page count.
#include "cache_server/shm_lease_table.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <set>
#include <thread>

#include "tests/test_util.h"

namespace lazykv::cache {
namespace {

constexpr uint64_t kPage = 4096;

class ShmLeaseTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto arena = HostArena::Create(64 * kPage, kPage, /*pin_for_gpu=*/false, /*shared=*/true);
    ASSERT_TRUE(arena.ok()) << arena.status();
    arena_ = *std::move(arena);
  }
  // A value of `pages` pages, as the store would hold it.
  std::shared_ptr<const HostValue> Value(uint64_t pages) {
    std::vector<uint32_t> taken;
    EXPECT_TRUE(arena_->TryAllocate(pages, &taken));
    return std::make_shared<const HostValue>(arena_.get(), std::move(taken), pages * kPage);
  }
  std::unique_ptr<HostArena> arena_;
  CacheMetrics metrics_;
};

TEST_F(ShmLeaseTableTest, LeaseKeepsPagesUntilReleasedAndOnlyOnce) {
  ShmLeaseTable table({}, &metrics_);
  auto session = table.OpenSession("w1", nullptr);
  ASSERT_TRUE(session.ok());
  auto value = Value(3);
  auto lease = table.Acquire(*session, "w1", value);
  ASSERT_TRUE(lease.ok()) << lease.status();
  value.reset();  // the store evicted it: only the lease holds it now
  EXPECT_EQ(arena_->free_pages(), 61u) << "a leased value's pages must not go back";
  EXPECT_EQ(table.totals().leases, 1u);
  EXPECT_EQ(table.totals().bytes, 3 * kPage);
  EXPECT_EQ(metrics_.shm_leases->Value(), 1);
  EXPECT_FALSE(table.Release(*session, *lease + 1)) << "an id the session does not hold";
  EXPECT_TRUE(table.Release(*session, *lease));
  EXPECT_EQ(arena_->free_pages(), 64u);
  EXPECT_FALSE(table.Release(*session, *lease)) << "released twice";
  EXPECT_EQ(table.totals().leases, 0u);
  EXPECT_EQ(table.totals().bytes, 0u);
  EXPECT_EQ(metrics_.shm_leased_bytes->Value(), 0);
}

// A lookup's leases (LookupRequest.lookup_id): released together by the lookup's id, only
// those still held, only that lookup's; a release that arrives before the lookup's leases
// refuses them when they come; a lookup's share of the bounds.
TEST_F(ShmLeaseTableTest, ALookupsLeasesGoTogetherByItsId) {
  ShmLeaseTable table({.max_leases_per_session = 8}, &metrics_);
  auto session = table.OpenSession("w1", nullptr);
  ASSERT_TRUE(session.ok());
  auto share = [&](uint64_t lookup_id) {
    std::shared_ptr<const HostValue> value = Value(1);
    return table.Acquire(*session, "w1", std::shared_ptr<const void>(value), value->size(), 0.5, lookup_id);
  };
  auto a1 = share(7), a2 = share(7), b1 = share(8), c1 = share(9);
  ASSERT_TRUE(a1.ok() && a2.ok() && b1.ok() && c1.ok());
  EXPECT_EQ(share(10).status().code(), absl::StatusCode::kResourceExhausted) << "half of 8 leases, 4 held";
  EXPECT_TRUE(table.Release(*session, *a2));  // one of lookup 7's, used and done with
  EXPECT_EQ(arena_->free_pages(), 61u);
  EXPECT_EQ(table.ReleaseLookup(*session, 7), 1) << "only what lookup 7 still holds";
  EXPECT_EQ(table.totals().leases, 2u);
  EXPECT_EQ(arena_->free_pages(), 62u);
  EXPECT_EQ(share(7).status().code(), absl::StatusCode::kFailedPrecondition) << "lookup 7 was released";
  EXPECT_EQ(table.ReleaseLookup(*session, 5), 0) << "a release that overtakes its lookup";
  EXPECT_EQ(share(5).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(table.ReleaseLookup(*session + 1, 8), 0) << "another session's id";
  EXPECT_EQ(table.ReleaseLookup(*session, 8), 1);
  EXPECT_EQ(table.ReleaseLookup(*session, 9), 1);
  EXPECT_EQ(table.totals().leases, 0u);
  EXPECT_EQ(arena_->free_pages(), 64u);
}

TEST_F(ShmLeaseTableTest, ClosingASessionDropsItsLeasesNotOthers) {
  ShmLeaseTable table({}, &metrics_);
  auto a = table.OpenSession("w1", nullptr);
  auto b = table.OpenSession("w2", nullptr);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
  ASSERT_TRUE(table.Acquire(*a, "w1", Value(2)).ok());
  ASSERT_TRUE(table.Acquire(*a, "w1", Value(2)).ok());
  ASSERT_TRUE(table.Acquire(*b, "w2", Value(5)).ok());
  EXPECT_EQ(arena_->free_pages(), 55u);
  table.CloseSession(*a);  // the worker died
  EXPECT_EQ(arena_->free_pages(), 59u);
  EXPECT_EQ(table.totals().sessions, 1u);
  EXPECT_EQ(table.totals().leases, 1u);
  EXPECT_EQ(metrics_.shm_sessions->Value(), 1);
  auto late = table.Acquire(*a, "w1", Value(1));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition) << "a closed session leases nothing";
  EXPECT_EQ(arena_->free_pages(), 59u) << "the refused value went back";
  table.CloseSession(*b);
  EXPECT_EQ(arena_->free_pages(), 64u);
  EXPECT_EQ(metrics_.shm_leases->Value(), 0);
}

TEST_F(ShmLeaseTableTest, ASessionIsItsOwnersOnly) {
  ShmLeaseTable table({}, &metrics_);
  auto session = table.OpenSession("w1", nullptr);
  ASSERT_TRUE(session.ok());
  EXPECT_EQ(table.Acquire(*session, "intruder", Value(1)).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(table.Acquire(*session + 1, "w1", Value(1)).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(table.totals().leases, 0u);
}

TEST_F(ShmLeaseTableTest, BoundsPerSessionAndInTotal) {
  ShmLeaseTable table(ShmLeaseLimits{.max_sessions = 2,
                                     .max_leases_per_session = 3,
                                     .max_bytes_per_session = 8 * kPage,
                                     .max_bytes_total = 12 * kPage},
                      &metrics_);
  auto a = table.OpenSession("w1", nullptr);
  auto b = table.OpenSession("w2", nullptr);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(table.OpenSession("w3", nullptr).status().code(), absl::StatusCode::kResourceExhausted);
  // Count: three leases of one page, the fourth refused.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(table.Acquire(*a, "w1", Value(1)).ok());
  EXPECT_EQ(table.Acquire(*a, "w1", Value(1)).status().code(), absl::StatusCode::kResourceExhausted);
  // Bytes per session: 6 pages fit (6 <= 8), 9 do not; the other session is not limited by a's.
  ASSERT_TRUE(table.Acquire(*b, "w2", Value(6)).ok());
  EXPECT_EQ(table.Acquire(*b, "w2", Value(3)).status().code(), absl::StatusCode::kResourceExhausted);
  // b at its share exactly (6 + 2 = 8 pages); 11 in all, within the total of 12.
  EXPECT_TRUE(table.Acquire(*b, "w2", Value(2)).ok());
  EXPECT_EQ(table.totals().bytes, 11 * kPage);
  table.CloseSession(*b);
  EXPECT_TRUE(table.OpenSession("w3", nullptr).ok()) << "a closed session frees its place";
  EXPECT_EQ(arena_->free_pages(), 61u);
}

TEST_F(ShmLeaseTableTest, TotalBytesBoundAcrossSessions) {
  ShmLeaseTable table(ShmLeaseLimits{.max_bytes_per_session = 8 * kPage, .max_bytes_total = 10 * kPage}, &metrics_);
  auto a = table.OpenSession("w1", nullptr);
  auto b = table.OpenSession("w2", nullptr);
  ASSERT_TRUE(table.Acquire(*a, "w1", Value(8)).ok());
  EXPECT_EQ(table.Acquire(*b, "w2", Value(3)).status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(table.Acquire(*b, "w2", Value(2)).ok());
}

TEST_F(ShmLeaseTableTest, ShutdownCancelsEverySessionAndRefusesNewOnes) {
  ShmLeaseTable table({}, &metrics_);
  std::set<int> cancelled;
  ASSERT_TRUE(table.OpenSession("w1", [&] { cancelled.insert(1); }).ok());
  ASSERT_TRUE(table.OpenSession("w2", [&] { cancelled.insert(2); }).ok());
  table.Shutdown();
  EXPECT_EQ(cancelled, (std::set<int>{1, 2}));
  EXPECT_EQ(table.OpenSession("w3", nullptr).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(ShmLeaseTableTest, ReservationsHoldPagesUntilTakenAbandonedOrTheSessionCloses) {
  ShmLeaseTable table(ShmLeaseLimits{.max_leases_per_session = 3, .max_bytes_per_session = 10 * kPage}, &metrics_);
  auto session = table.OpenSession("w1", nullptr);
  ASSERT_TRUE(session.ok());
  auto reservation = [&](uint64_t pages) {
    std::vector<uint32_t> taken;
    EXPECT_TRUE(arena_->TryAllocate(pages, &taken));
    auto writer =
        std::make_unique<ChunkWriter>(std::make_shared<HostValue>(arena_.get(), std::move(taken), pages * kPage));
    return ShmLeaseTable::Reservation{.key = Hash128{pages, 7}, .model_fingerprint = {}, .writer = std::move(writer)};
  };
  auto a = table.Reserve(*session, "w1", reservation(2));
  auto b = table.Reserve(*session, "w1", reservation(3));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(arena_->free_pages(), 59u);
  EXPECT_EQ(table.totals().reservations, 2u);
  EXPECT_EQ(table.totals().bytes, 5 * kPage);
  // The bounds count reservations with leases: 5 + 6 pages exceed 10.
  EXPECT_EQ(table.Reserve(*session, "w1", reservation(6)).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(arena_->free_pages(), 59u) << "the refused reservation's pages went back";
  ASSERT_TRUE(table.Acquire(*session, "w1", Value(1)).ok());
  EXPECT_EQ(table.Reserve(*session, "w1", reservation(1)).status().code(), absl::StatusCode::kResourceExhausted)
      << "three held: at max_leases_per_session";
  // Taken for its commit: the writer comes back whole, and only to its owner, once.
  EXPECT_EQ(table.TakeReservation(*session, "intruder", *a).status().code(), absl::StatusCode::kFailedPrecondition);
  auto taken = table.TakeReservation(*session, "w1", *a);
  ASSERT_TRUE(taken.ok());
  EXPECT_EQ(taken->key, (Hash128{2, 7}));
  EXPECT_EQ(taken->writer->host_pages().size(), 2u);
  EXPECT_EQ(table.TakeReservation(*session, "w1", *a).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(table.totals().reservations, 1u);
  EXPECT_EQ(arena_->free_pages(), 58u) << "a taken reservation's pages are the committer's now";
  taken = absl::CancelledError("dropped");
  EXPECT_EQ(arena_->free_pages(), 60u);
  EXPECT_TRUE(table.Abandon(*session, *b));
  EXPECT_FALSE(table.Abandon(*session, *b));
  EXPECT_EQ(arena_->free_pages(), 63u);
  ASSERT_TRUE(table.Reserve(*session, "w1", reservation(4)).ok());
  EXPECT_EQ(arena_->free_pages(), 59u);
  table.CloseSession(*session);  // the worker died mid-publication
  EXPECT_EQ(arena_->free_pages(), 64u);
  EXPECT_EQ(table.totals().reservations, 0u);
  EXPECT_EQ(table.totals().bytes, 0u);
}

TEST_F(ShmLeaseTableTest, LeaseIdsAreDistinct) {
  ShmLeaseTable table({}, &metrics_);
  auto session = table.OpenSession("w1", nullptr);
  std::set<uint64_t> ids;
  for (int i = 0; i < 40; ++i) {
    auto lease = table.Acquire(*session, "w1", Value(1));
    ASSERT_TRUE(lease.ok());
    EXPECT_NE(*lease, 0u);
    ids.insert(*lease);
  }
  EXPECT_EQ(ids.size(), 40u);
}

// A child process that waits to be killed (a worker's stand-in), and reaps it.
class Child {
 public:
  Child() {
    pid_ = fork();
    if (pid_ == 0) {
      while (true) pause();
    }
  }
  ~Child() { Kill(); }
  int pid() const { return pid_; }
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  int pid_ = -1;
};

TEST_F(ShmLeaseTableTest, ASessionEndingWhileItsProcessLivesKeepsItsPagesUntilTheProcessExits) {
  ShmLeaseTable table({}, &metrics_);
  Child worker;
  ASSERT_GT(worker.pid(), 0);
  auto session = table.OpenSession("w1", nullptr, worker.pid());
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE(table.Acquire(*session, "w1", Value(3)).ok());
  std::vector<uint32_t> taken;
  ASSERT_TRUE(arena_->TryAllocate(2, &taken));
  auto writer = std::make_unique<ChunkWriter>(std::make_shared<HostValue>(arena_.get(), std::move(taken), 2 * kPage));
  ASSERT_TRUE(
      table.Reserve(*session, "w1", {.key = Hash128{1, 2}, .model_fingerprint = {}, .writer = std::move(writer)}).ok());
  EXPECT_EQ(arena_->free_pages(), 59u);

  table.CloseSession(*session);  // its stream ended (a keepalive timeout), the process lives
  ShmLeaseTable::Totals t = table.totals();
  EXPECT_EQ(t.sessions, 0u);
  EXPECT_EQ(t.orphaned_sessions, 1u);
  EXPECT_EQ(t.leases, 1u);
  EXPECT_EQ(t.reservations, 1u);
  EXPECT_EQ(t.bytes, 5 * kPage) << "an orphan's bytes still count against the bounds";
  EXPECT_EQ(metrics_.shm_orphaned_sessions->Value(), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // several reaper rounds
  EXPECT_EQ(arena_->free_pages(), 59u) << "pages of a live process's ended session were reused";
  EXPECT_FALSE(table.Release(*session, 1)) << "the session is gone for its calls";

  worker.Kill();
  EXPECT_TRUE(testing::Eventually([&] { return arena_->free_pages() == 64u; })) << arena_->free_pages();
  t = table.totals();
  EXPECT_EQ(t.orphaned_sessions, 0u);
  EXPECT_EQ(t.leases + t.reservations + t.bytes, 0u);
  EXPECT_EQ(metrics_.shm_orphaned_sessions->Value(), 0);
}

TEST_F(ShmLeaseTableTest, AnExitedOrUnknownProcessFreesAtOnceAndTheHoldIsBounded) {
  ShmLeaseTable table(ShmLeaseLimits{.orphan_hold = std::chrono::seconds(1)}, &metrics_);
  // The process exited before its session ended (kill -9: the socket closes as it exits).
  {
    Child worker;
    auto session = table.OpenSession("w1", nullptr, worker.pid());
    ASSERT_TRUE(session.ok());
    ASSERT_TRUE(table.Acquire(*session, "w1", Value(4)).ok());
    worker.Kill();
    table.CloseSession(*session);
    EXPECT_EQ(table.totals().orphaned_sessions, 0u);
    EXPECT_EQ(arena_->free_pages(), 64u);
  }
  // No pid given, or the server's own (a worker may not name a process that never exits):
  // as before, nothing is held past the session.
  for (int pid : {0, static_cast<int>(getpid())}) {
    auto session = table.OpenSession("w1", nullptr, pid);
    ASSERT_TRUE(table.Acquire(*session, "w1", Value(4)).ok());
    table.CloseSession(*session);
    EXPECT_EQ(arena_->free_pages(), 64u) << "pid " << pid;
  }
  // One caller holds at most four orphans: the oldest goes first.
  {
    Child alive;
    for (int i = 0; i < 5; ++i) {
      auto session = table.OpenSession("w2", nullptr, alive.pid());
      ASSERT_TRUE(table.Acquire(*session, "w2", Value(2)).ok());
      table.CloseSession(*session);
    }
    EXPECT_EQ(table.totals().orphaned_sessions, 4u);
    EXPECT_EQ(arena_->free_pages(), 64u - 8u);
    alive.Kill();
    EXPECT_TRUE(testing::Eventually([&] { return arena_->free_pages() == 64u; }));
  }
  // A process that never exits: held for orphan_hold, then dropped.
  Child frozen;
  kill(frozen.pid(), SIGSTOP);
  auto session = table.OpenSession("w1", nullptr, frozen.pid());
  ASSERT_TRUE(table.Acquire(*session, "w1", Value(4)).ok());
  const auto closed = std::chrono::steady_clock::now();
  table.CloseSession(*session);
  EXPECT_EQ(table.totals().orphaned_sessions, 1u);
  EXPECT_TRUE(testing::Eventually([&] { return arena_->free_pages() == 64u; }));
  const double held = std::chrono::duration<double>(std::chrono::steady_clock::now() - closed).count();
  EXPECT_GE(held, 0.95) << "dropped before the hold passed";
  EXPECT_EQ(table.totals().orphaned_sessions, 0u);
}

}  // namespace
}  // namespace lazykv::cache
