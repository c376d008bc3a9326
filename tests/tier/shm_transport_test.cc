// The same-host transport with the real lazykv-cache-server on this machine (issue 17):
// chunks fetched in place from the server's shared host arena equal what was put
// (against the chunk as built, never against another fetch), the transport is chosen by
// itself (shm to a server whose arena maps, gRPC to one with --no-shm) and can be forced,
// the lease bounds push a fetch to gRPC, a client killed with kill -9 while holding read
// leases loses them on the server (pages free again, the server and a fresh client go on
// serving), and eviction never frees a page under a reader. Skips where the server has no
// shared memory.
#include <signal.h>
#include <sys/wait.h>

#include <filesystem>
#include <random>
#include <set>
#include <thread>

#include "common/grpc_util.h"
#include "gtest/gtest.h"
#include "tests/cache_server/cache_test_util.h"
#include "tests/test_util.h"
#include "worker/tier/remote_chunk_tier.h"
#include "worker/tier/shm_session.h"

namespace lazykv::testing {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

std::unique_ptr<RemoteChunkTier> MakeTier(const std::string& address, FetchTransport transport) {
  RemoteTierOptions options;
  options.servers = {address};
  options.holder = "shm-test";
  options.initial_call_deadline = milliseconds(500 * SlowdownFactor());
  options.transport = transport;
  auto tier = RemoteChunkTier::Create(options);
  EXPECT_TRUE(tier.ok()) << tier.status();
  return *std::move(tier);
}

// Polls the server's stats until `done` holds (true) or `timeout` passes (false).
template <typename Pred>
bool StatsReach(v1::KvCache::Stub& stub, Pred done, milliseconds timeout = milliseconds(5000)) {
  const auto until = Clock::now() + timeout * SlowdownFactor();
  while (Clock::now() < until) {
    if (done(Stats(stub))) return true;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return done(Stats(stub));
}

class ShmTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = FreshSeed();
    rng_.seed(seed_);
    dir_ = TempDir("shm_transport");
  }
  void TearDown() override {
    servers_.clear();
    std::filesystem::remove_all(dir_);
  }
  // A server with `flags` (no disk tier unless asked); null (and the test skipped) when
  // its arena is not shared but `need_shm`.
  ServerProcess* Start(std::vector<std::string> flags, bool need_shm = true) {
    const std::string sub = dir_ + "/s" + std::to_string(servers_.size());
    std::filesystem::create_directories(sub);
    flags.insert(flags.begin(), {"--disk-capacity", "0"});
    servers_.push_back(StartCacheServer(sub, flags));
    ServerProcess* server = servers_.back().get();
    EXPECT_TRUE(server->started()) << server->first_line();
    if (!server->started()) return nullptr;
    stub_ = CacheStub(server->address());
    if (need_shm && Stats(*stub_).shm_arena_bytes() == 0) return nullptr;
    return server;
  }
  std::vector<TestChunk> PutChunks(const std::vector<size_t>& payload_sizes) {
    std::vector<TestChunk> chunks;
    for (size_t size : payload_sizes) {
      chunks.push_back(RandomTestChunk(rng_, size));
      const PutOutcome put = PutChunk(*stub_, chunks.back());
      EXPECT_TRUE(put.status.ok()) << put.status.error_message();
    }
    return chunks;
  }

  // Deletes the chunks from the server; how many it held.
  uint32_t DeleteAll(const std::vector<TestChunk>& chunks) {
    grpc::ClientContext context;
    v1::DeleteRequest request;
    for (const TestChunk& chunk : chunks) *request.add_keys() = ToProto(chunk.key);
    v1::DeleteResponse response;
    EXPECT_TRUE(stub_->Delete(&context, request, &response).ok());
    return response.deleted();
  }

  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  std::string dir_;
  std::vector<std::unique_ptr<ServerProcess>> servers_;
  std::unique_ptr<v1::KvCache::Stub> stub_;
};

#define START_OR_SKIP(server, ...)                                                     \
  ServerProcess* server = Start(__VA_ARGS__);                                          \
  if (HasFailure()) return;                                                            \
  if (server == nullptr) GTEST_SKIP() << "the cache server has no shared memory here"

TEST_F(ShmTransportTest, FetchesAreByteExactAndGoOverShmByThemselves) {
  SCOPED_TRACE(seed_);
  START_OR_SKIP(server, {"--host-capacity", "64MiB", "--metrics-listen", "127.0.0.1:0"});
  // Under a page, just over one, many pages with a partial last one, a few MiB.
  const std::vector<TestChunk> chunks = PutChunks({100, (256 << 10) + 1000, (1 << 20) + 7000, 3 << 20});
  auto tier = MakeTier(server->address(), FetchTransport::kAuto);
  std::vector<FetchedChunk> held;
  uint64_t total = 0;
  for (const TestChunk& chunk : chunks) {
    auto fetched = tier->Fetch(chunk.key);
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    EXPECT_EQ(fetched->stored.ToString(), chunk.stored());
    EXPECT_TRUE(fetched->payload_verified) << "the server checked it at admission; the bytes are read in place";
    EXPECT_EQ(fetched->origin, server->address());
    total += chunk.stored().size();
    held.push_back(*std::move(fetched));
  }
  TransportStats t = tier->transport_stats();
  EXPECT_EQ(t.shm_chunks, chunks.size());
  EXPECT_EQ(t.shm_bytes, total);
  EXPECT_EQ(t.grpc_chunks, 0u);
  EXPECT_EQ(t.shm_sessions, 1u);
  v1::StatsResponse s = Stats(*stub_);
  EXPECT_EQ(s.shm_bytes_sent(), total);
  EXPECT_EQ(s.grpc_bytes_sent(), 0u);
  EXPECT_EQ(s.shm_sessions(), 1u);
  EXPECT_EQ(s.shm_leases(), chunks.size()) << "every fetched chunk is leased while held";
  const std::string page = HttpGet(server->metrics_address(), "/metrics");
  EXPECT_EQ(Metric(page, "lazykv_cache_bytes_sent_total{transport=\"shm\"}"), static_cast<double>(total));
  EXPECT_EQ(Metric(page, "lazykv_cache_chunks_sent_total{transport=\"shm\"}"), static_cast<double>(chunks.size()));
  EXPECT_EQ(Metric(page, "lazykv_cache_bytes_sent_total{transport=\"grpc\"}"), 0);
  EXPECT_EQ(Metric(page, "lazykv_cache_shm_leases"), static_cast<double>(chunks.size()));
  // The bytes' owner releases the lease when the last copy goes: not before.
  ChunkBytes copy = held[0].stored.Slice(kChunkHeaderBytes, 1000);
  held.erase(held.begin());
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(Stats(*stub_).shm_leases(), chunks.size()) << "a slice of the chunk still holds its lease";
  EXPECT_EQ(copy.ToString(), chunks[0].stored().substr(kChunkHeaderBytes, 1000));
  copy = ChunkBytes();
  EXPECT_TRUE(StatsReach(*stub_, [&](const v1::StatsResponse& r) { return r.shm_leases() == chunks.size() - 1; }));
  held.clear();
  EXPECT_TRUE(StatsReach(*stub_, [](const v1::StatsResponse& r) { return r.shm_leases() == 0; }))
      << Stats(*stub_).DebugString();
  // A missing key is a miss over shm, not asked again over gRPC.
  auto missing = tier->Fetch(Hash128{rng_(), rng_()});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(tier->transport_stats().grpc_chunks, 0u);
  EXPECT_EQ(tier->transport_stats().shm_fallbacks, 0u);
  tier.reset();  // the session ends
  EXPECT_TRUE(StatsReach(*stub_, [](const v1::StatsResponse& r) { return r.shm_sessions() == 0; }));
}

TEST_F(ShmTransportTest, GrpcWhenForcedOrWhenTheServerHasNoSharedArena) {
  SCOPED_TRACE(seed_);
  START_OR_SKIP(shared, {"--host-capacity", "32MiB"});
  const std::vector<TestChunk> on_shared = PutChunks({5000, 600 << 10});
  auto forced = MakeTier(shared->address(), FetchTransport::kGrpc);
  for (const TestChunk& chunk : on_shared) {
    auto fetched = forced->Fetch(chunk.key);
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    EXPECT_EQ(fetched->stored.ToString(), chunk.stored());
  }
  EXPECT_EQ(forced->transport_stats().grpc_chunks, on_shared.size());
  EXPECT_EQ(forced->transport_stats().shm_chunks, 0u);
  EXPECT_EQ(Stats(*stub_).shm_sessions(), 0u) << "--transport grpc opens no session";

  ServerProcess* plain = Start({"--host-capacity", "32MiB", "--no-shm"}, /*need_shm=*/false);
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(Stats(*stub_).shm_arena_bytes(), 0u);
  const std::vector<TestChunk> on_plain = PutChunks({5000, 600 << 10});
  auto automatic = MakeTier(plain->address(), FetchTransport::kAuto);
  for (const TestChunk& chunk : on_plain) {
    auto fetched = automatic->Fetch(chunk.key);
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    EXPECT_EQ(fetched->stored.ToString(), chunk.stored());
  }
  EXPECT_EQ(automatic->transport_stats().grpc_chunks, on_plain.size());
  EXPECT_EQ(automatic->transport_stats().shm_chunks, 0u);
  EXPECT_EQ(automatic->transport_stats().shm_sessions, 0u);
  // Forced shm towards it: a miss, never a gRPC transfer.
  auto shm_only = MakeTier(plain->address(), FetchTransport::kShm);
  EXPECT_FALSE(shm_only->Fetch(on_plain[0].key).ok());
  EXPECT_EQ(shm_only->transport_stats().grpc_chunks, 0u);
  EXPECT_EQ(Stats(*stub_).grpc_bytes_sent(), on_plain[0].stored().size() + on_plain[1].stored().size());
}

TEST_F(ShmTransportTest, PastTheSessionsLeaseBoundAFetchGoesOverGrpc) {
  SCOPED_TRACE(seed_);
  START_OR_SKIP(server, {"--host-capacity", "32MiB", "--shm-max-leases", "2"});
  const std::vector<TestChunk> chunks = PutChunks({70 << 10, 70 << 10, 70 << 10, 70 << 10});
  auto tier = MakeTier(server->address(), FetchTransport::kAuto);
  std::vector<FetchedChunk> held;
  for (int i = 0; i < 3; ++i) {
    auto fetched = tier->Fetch(chunks[i].key);
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    EXPECT_EQ(fetched->stored.ToString(), chunks[i].stored());
    held.push_back(*std::move(fetched));
  }
  TransportStats t = tier->transport_stats();
  EXPECT_EQ(t.shm_chunks, 2u);
  EXPECT_EQ(t.grpc_chunks, 1u) << "the third lease was refused (RESOURCE_EXHAUSTED): served over gRPC";
  EXPECT_EQ(t.shm_fallbacks, 1u);
  EXPECT_EQ(Stats(*stub_).shm_leases(), 2u);
  held.erase(held.begin());  // one lease released: room for another
  ASSERT_TRUE(StatsReach(*stub_, [](const v1::StatsResponse& r) { return r.shm_leases() == 1; }));
  auto fourth = tier->Fetch(chunks[3].key);
  ASSERT_TRUE(fourth.ok());
  EXPECT_EQ(fourth->stored.ToString(), chunks[3].stored());
  EXPECT_EQ(tier->transport_stats().shm_chunks, 3u);
}

TEST_F(ShmTransportTest, AClientKilledWhileHoldingLeasesLosesThemAndTheServerGoesOn) {
  SCOPED_TRACE(seed_);
  // 64 pages of 256 KiB; four chunks of 13 pages each take 52.
  START_OR_SKIP(server, {"--host-capacity", "16MiB", "--shm-max-lease-bytes-per-session", "16MiB",
                         "--shm-max-lease-bytes", "16MiB"});
  const size_t kPayload = 3 << 20;
  const std::vector<TestChunk> chunks = PutChunks({kPayload, kPayload, kPayload, kPayload});
  std::vector<std::string> args{server->address()};
  for (const TestChunk& chunk : chunks) args.push_back(chunk.key.ToHex());
  SpawnedServer holder = SpawnServer(LAZYKV_SHM_LEASE_HOLDER, args, dir_ + "/holder.log");
  ASSERT_GT(holder.pid, 0);
  ASSERT_EQ(holder.first_line, "holding 4") << "see " << dir_ << "/holder.log";
  v1::StatsResponse s = Stats(*stub_);
  EXPECT_EQ(s.shm_sessions(), 1u);
  EXPECT_EQ(s.shm_leases(), 4u);
  // Deleted while leased: out of the index, the pages still held by the reader.
  EXPECT_EQ(DeleteAll(chunks), 4u);
  const TestChunk blocked = RandomTestChunk(rng_, kPayload);
  EXPECT_EQ(PutChunk(*stub_, blocked).status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << "12 pages are free: the leased 52 must not be reused";

  ASSERT_EQ(kill(holder.pid, SIGKILL), 0);
  const auto killed = Clock::now();
  int status = 0;
  waitpid(holder.pid, &status, 0);
  EXPECT_TRUE(StatsReach(*stub_, [](const v1::StatsResponse& r) { return r.shm_leases() == 0 && r.shm_sessions() == 0; }))
      << Stats(*stub_).DebugString();
  std::printf("leases of the killed client dropped %.1f ms after kill -9\n",
              std::chrono::duration<double, std::milli>(Clock::now() - killed).count());
  EXPECT_EQ(Stats(*stub_).shm_leased_bytes(), 0u);
  // The pages are free again: four more chunks of 13 pages fit, and a fresh client reads
  // them in place.
  const std::vector<TestChunk> after = PutChunks({kPayload, kPayload, kPayload, kPayload});
  auto tier = MakeTier(server->address(), FetchTransport::kAuto);
  for (const TestChunk& chunk : after) {
    auto fetched = tier->Fetch(chunk.key);
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    EXPECT_EQ(fetched->stored.ToString(), chunk.stored());
  }
  EXPECT_EQ(tier->transport_stats().shm_chunks, after.size());
}

// A client frozen (SIGSTOP) while it holds read leases: its connection times out (a short
// keepalive here) and its session ends, but its process lives and could resume in the middle
// of a copy, so the server keeps its pages (no put may take them) until the process exits.
TEST_F(ShmTransportTest, AFrozenClientsSessionEndsButItsPagesStayUntilItsProcessExits) {
  SCOPED_TRACE(seed_);
  START_OR_SKIP(server, {"--host-capacity", "16MiB", "--shm-max-lease-bytes-per-session", "16MiB",
                         "--shm-max-lease-bytes", "16MiB", "--keepalive-ms", "300"});
  const size_t kPayload = 3 << 20;
  const std::vector<TestChunk> chunks = PutChunks({kPayload, kPayload, kPayload, kPayload});
  std::vector<std::string> args{server->address()};
  for (const TestChunk& chunk : chunks) args.push_back(chunk.key.ToHex());
  SpawnedServer holder = SpawnServer(LAZYKV_SHM_LEASE_HOLDER, args, dir_ + "/holder.log");
  ASSERT_GT(holder.pid, 0);
  ASSERT_EQ(holder.first_line, "holding 4") << "see " << dir_ << "/holder.log";
  EXPECT_EQ(DeleteAll(chunks), 4u);  // out of the index: only the client's leases hold the pages
  ASSERT_EQ(kill(holder.pid, SIGSTOP), 0);
  EXPECT_TRUE(StatsReach(*stub_, [](const v1::StatsResponse& r) {
    return r.shm_sessions() == 0 && r.shm_orphaned_sessions() == 1;
  })) << "the frozen client's session did not end: "
      << Stats(*stub_).DebugString();
  const v1::StatsResponse frozen = Stats(*stub_);
  EXPECT_EQ(frozen.shm_leases(), 4u);
  EXPECT_EQ(PutChunk(*stub_, RandomTestChunk(rng_, kPayload)).status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << "the frozen client's pages were given to a new chunk";

  ASSERT_EQ(kill(holder.pid, SIGKILL), 0);
  waitpid(holder.pid, nullptr, 0);
  EXPECT_TRUE(StatsReach(*stub_, [](const v1::StatsResponse& r) {
    return r.shm_leases() == 0 && r.shm_orphaned_sessions() == 0 && r.shm_leased_bytes() == 0;
  })) << Stats(*stub_).DebugString();
  const std::vector<TestChunk> after = PutChunks({kPayload, kPayload, kPayload, kPayload});
  auto tier = MakeTier(server->address(), FetchTransport::kAuto);
  for (const TestChunk& chunk : after) {
    auto fetched = tier->Fetch(chunk.key);
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    EXPECT_EQ(fetched->stored.ToString(), chunk.stored());
  }
}

TEST_F(ShmTransportTest, EvictionNeverFreesAPageUnderAReader) {
  SCOPED_TRACE(seed_);
  // 16 pages of 256 KiB; four chunks of 4 pages fill them.
  START_OR_SKIP(server, {"--host-capacity", "4MiB", "--shm-max-lease-bytes-per-session", "4MiB",
                         "--shm-max-lease-bytes", "4MiB"});
  const size_t kPayload = (1 << 20) - 4096;
  const std::vector<TestChunk> chunks = PutChunks({kPayload, kPayload, kPayload, kPayload});
  auto channel = grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
  auto session = ShmClientSession::Open(channel, "eviction-test", std::chrono::seconds(5));
  ASSERT_TRUE(session.ok()) << session.status();
  auto stub = v1::KvCache::NewStub(channel);
  auto shm_get = [&](const Hash128& key, v1::ShmGetResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ShmGetRequest request;
    request.set_session_id((*session)->id());
    *request.mutable_key() = ToProto(key);
    return stub->ShmGet(&context, request, response);
  };
  std::vector<ChunkBytes> held;
  std::vector<std::set<uint32_t>> pages;
  for (const TestChunk& chunk : chunks) {
    v1::ShmGetResponse response;
    const grpc::Status status = shm_get(chunk.key, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    pages.emplace_back(response.pages().begin(), response.pages().end());
    auto bytes = (*session)->Adopt(response);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    held.push_back(*std::move(bytes));
  }
  // A put needs 4 pages; every page is leased. The store evicts a leased chunk from its
  // index (its pages free only when the reader lets go), waits for them, and gives up.
  const TestChunk newcomer = RandomTestChunk(rng_, kPayload);
  EXPECT_EQ(PutChunk(*stub_, newcomer).status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  std::vector<size_t> evicted;
  for (size_t i = 0; i < chunks.size(); ++i) {
    grpc::ClientContext context;
    v1::LookupRequest request;
    *request.add_keys() = ToProto(chunks[i].key);
    v1::LookupResponse response;
    ASSERT_TRUE(stub_->Lookup(&context, request, &response).ok());
    if (!response.results(0).found()) evicted.push_back(i);
  }
  ASSERT_FALSE(evicted.empty()) << "the put should have evicted a leased chunk";
  for (size_t i = 0; i < chunks.size(); ++i) {
    EXPECT_EQ(held[i].ToString(), chunks[i].stored()) << "chunk " << i << ": bytes changed under a reader";
  }
  // The reader lets go of the evicted chunk: its pages, and only they, take the newcomer.
  std::set<uint32_t> freed;
  for (size_t i : evicted) {
    freed.insert(pages[i].begin(), pages[i].end());
    held[i] = ChunkBytes();
  }
  ASSERT_TRUE(StatsReach(*stub_, [&](const v1::StatsResponse& r) { return r.shm_leases() == 4 - evicted.size(); }));
  ASSERT_TRUE(PutChunk(*stub_, newcomer).status.ok());
  v1::ShmGetResponse response;
  ASSERT_TRUE(shm_get(newcomer.key, &response).ok());
  const std::set<uint32_t> reused(response.pages().begin(), response.pages().end());
  for (uint32_t page : reused) EXPECT_TRUE(freed.contains(page)) << "page " << page << " was not freed";
  auto bytes = (*session)->Adopt(response);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->ToString(), newcomer.stored());
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (!held[i].pieces().empty()) {
      EXPECT_EQ(held[i].ToString(), chunks[i].stored()) << "chunk " << i;
    }
  }
}

TEST_F(ShmTransportTest, PublishesInPlaceIntoReservedPagesAndTheServerChecksThem) {
  SCOPED_TRACE(seed_);
  START_OR_SKIP(server, {"--host-capacity", "32MiB"});
  auto tier = MakeTier(server->address(), FetchTransport::kAuto);
  auto publish = [&](const TestChunk& chunk, const std::string& bytes) -> absl::Status {
    auto slot = tier->BeginPublish(chunk.key, chunk.fingerprint, bytes.size(), 0);
    if (!slot.ok()) return slot.status();
    WriteToPieces((*slot)->Pieces(), 0, bytes);
    return (*slot)->Commit();
  };
  auto stored_over_grpc = [&](const TestChunk& chunk) {
    const GetOutcome got = RawGet(*stub_, chunk.key);
    return got.status.ok() ? got.stored : std::string();
  };
  const TestChunk chunk = RandomTestChunk(rng_, (700 << 10) + 300);
  ASSERT_TRUE(publish(chunk, chunk.stored()).ok());
  EXPECT_EQ(stored_over_grpc(chunk), chunk.stored()) << "read back by the other transport";
  EXPECT_EQ(tier->transport_stats().shm_published_chunks, 1u);
  v1::StatsResponse s = Stats(*stub_);
  EXPECT_EQ(s.shm_bytes_received(), chunk.stored().size());
  EXPECT_EQ(s.shm_reservations(), 0u);
  // Again: stored already, nothing reserved or sent.
  ASSERT_TRUE(publish(chunk, chunk.stored()).ok());
  EXPECT_EQ(tier->transport_stats().shm_published_chunks, 1u);

  // A payload changed after its checksum was computed, and a header naming another key:
  // refused at commit, not stored, the pages back.
  TestChunk corrupt = RandomTestChunk(rng_, 300 << 10);
  std::string flipped = corrupt.stored();
  flipped[kChunkHeaderBytes + 1000] ^= 0x40;
  EXPECT_FALSE(publish(corrupt, flipped).ok());
  EXPECT_TRUE(stored_over_grpc(corrupt).empty());
  const TestChunk other = RandomTestChunk(rng_, 300 << 10);
  TestChunk wrong_key = other;
  wrong_key.key = Hash128{rng_(), rng_()};
  EXPECT_EQ(publish(wrong_key, other.stored()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(stored_over_grpc(wrong_key).empty());

  // Abandoned (the slot dropped uncommitted): the reservation goes, nothing is stored.
  const TestChunk abandoned = RandomTestChunk(rng_, 300 << 10);
  {
    auto slot = tier->BeginPublish(abandoned.key, abandoned.fingerprint, abandoned.stored().size(), 0);
    ASSERT_TRUE(slot.ok()) << slot.status();
    EXPECT_EQ(Stats(*stub_).shm_reservations(), 1u);
  }
  EXPECT_TRUE(StatsReach(*stub_, [](const v1::StatsResponse& r) {
    return r.shm_reservations() == 0 && r.shm_leased_bytes() == 0;
  })) << Stats(*stub_).DebugString();
  EXPECT_TRUE(stored_over_grpc(abandoned).empty());
  EXPECT_EQ(Stats(*stub_).shm_bytes_received(), chunk.stored().size());
}

TEST_F(ShmTransportTest, ARestartedServerInvalidatesTheSessionCleanly) {
  SCOPED_TRACE(seed_);
  START_OR_SKIP(server, {"--host-capacity", "32MiB"});
  const std::string address = server->address();
  const std::vector<TestChunk> before = PutChunks({600 << 10});
  auto tier = MakeTier(address, FetchTransport::kAuto);
  auto held = tier->Fetch(before[0].key);
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_EQ(tier->transport_stats().shm_chunks, 1u);
  server->Stop(SIGKILL);
  // Bytes handed out before stay readable and unchanged: the mapping keeps the old arena.
  EXPECT_EQ(held->stored.ToString(), before[0].stored());

  const std::string sub = dir_ + "/restarted";
  std::filesystem::create_directories(sub);
  servers_.push_back(StartCacheServer(sub, {"--disk-capacity", "0", "--host-capacity", "32MiB", "--listen", address}));
  ASSERT_TRUE(servers_.back()->started()) << servers_.back()->first_line();
  ASSERT_EQ(servers_.back()->address(), address);
  stub_ = CacheStub(address);
  const std::vector<TestChunk> after = PutChunks({600 << 10, 300 << 10});
  // The old session is unknown to the new server: that fetch goes over gRPC (after the
  // connection comes back), and the next opens a new session.
  absl::StatusOr<FetchedChunk> first = absl::UnavailableError("not yet");
  for (const auto until = Clock::now() + std::chrono::seconds(5 * SlowdownFactor()); Clock::now() < until;) {
    first = tier->Fetch(after[0].key);
    if (first.ok()) break;
    std::this_thread::sleep_for(milliseconds(50));
  }
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->stored.ToString(), after[0].stored());
  auto second = tier->Fetch(after[1].key);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->stored.ToString(), after[1].stored());
  EXPECT_EQ(tier->transport_stats().shm_chunks, 2u) << "the second fetch went over a new session";
  EXPECT_EQ(Stats(*stub_).shm_sessions(), 1u);
  EXPECT_EQ(Stats(*stub_).shm_leases(), 1u);
  held = absl::UnavailableError("dropped");  // its release goes to the dead session: nothing breaks
  EXPECT_EQ(Stats(*stub_).shm_leases(), 1u);
}

}  // namespace
}  // namespace lazykv::testing
