#include "bench/cache_crash_load.h"

#include <grpc/grpc.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_format.h"
#include "common/chunk_codec.h"
#include "common/chunk_wire.h"
#include "common/grpc_util.h"
#include "common/splitmix64.h"
#include "proto/kvcache.grpc.pb.h"

namespace lazykv::crash {
namespace {

using Clock = std::chrono::steady_clock;
using grpc::StatusCode;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

void SetDeadline(grpc::ClientContext* context, int ms) {
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(ms));
}

bool ValidTier(v1::Tier tier) { return tier == v1::TIER_HOST || tier == v1::TIER_DISK; }

// One load thread: its connection, its random stream, and the checks of its answers.
class Caller {
 public:
  Caller(const LoadOptions& options, int incarnation, const std::string& address, History* history)
      : options_(options), incarnation_(incarnation), history_(history) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    args.SetMaxSendMessageSize(64 << 20);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
    channel_ = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    stub_ = v1::KvCache::NewStub(channel_);
  }

  // Returns the bytes sent.
  uint64_t Put(int64_t id, uint64_t lease_id) {
    const Hash128 key = KeyOf(options_.seed, static_cast<uint64_t>(id));
    Hash128 fingerprint;
    std::string header, payload;
    ChunkPartsOf(key, &fingerprint, &header, &payload);
    grpc::ClientContext context;
    SetDeadline(&context, options_.put_deadline_ms);
    v1::PutResponse response;
    CallRecord record = Begin(Op::kPut, id, options_.put_deadline_ms);
    const grpc::Status status = PutChunkSlices(*stub_, &context, ToProto(key), ToProto(fingerprint), lease_id, header,
                                               payload, 1 << 20, &response);
    record.already_stored = response.already_stored();
    Finish(record, status);
    const uint64_t size = header.size() + payload.size();
    if (status.ok() && response.stored_bytes() != size) {
      history_->AddViolation("put_wrong_size", absl::StrFormat("key %d: stored_bytes %d, the chunk has %d", id,
                                                               response.stored_bytes(), size));
    }
    if (status.error_code() == StatusCode::INVALID_ARGUMENT || status.error_code() == StatusCode::DATA_LOSS) {
      history_->AddViolation("put_refused", absl::StrFormat("key %d: a valid chunk refused: %d %s", id,
                                                            status.error_code(), status.error_message()));
    }
    return size;
  }

  void Get(int64_t id) {
    const Hash128 key = KeyOf(options_.seed, static_cast<uint64_t>(id));
    grpc::ClientContext context;
    SetDeadline(&context, options_.get_deadline_ms);
    v1::GetRequest request;
    *request.mutable_key() = ToProto(key);
    std::string stored;
    v1::Tier tier = v1::TIER_UNSPECIFIED;
    CallRecord record = Begin(Op::kGet, id, options_.get_deadline_ms);
    const grpc::Status status = GetChunkInto(channel_.get(), &context, request, &stored, &tier);
    Finish(record, status);
    if (status.error_code() == StatusCode::DATA_LOSS) {
      history_->AddViolation("get_data_loss", absl::StrFormat("key %d: %s", id, status.error_message()));
    }
    if (!status.ok()) return;
    if (!ValidTier(tier)) history_->AddViolation("get_bad_tier", absl::StrFormat("key %d: tier %d", id, tier));
    if (stored == StoredChunkOf(key)) return;
    auto chunk = DecodeChunk(stored);
    if (!chunk.ok()) {
      history_->AddViolation("get_corrupt_chunk", absl::StrFormat("key %d: %d bytes that do not decode: %s", id,
                                                                  stored.size(), chunk.status().message()));
    } else if (chunk->header.key != key) {
      history_->AddViolation("get_wrong_chunk",
                             absl::StrFormat("key %d: served the chunk of key %s", id, chunk->header.key.ToHex()));
    } else {
      history_->AddViolation("get_wrong_bytes",
                             absl::StrFormat("key %d: %d bytes, valid, but not its chunk", id, stored.size()));
    }
  }

  void Lookup(const std::vector<int64_t>& ids) {
    v1::LookupRequest request;
    for (int64_t id : ids) *request.add_keys() = ToProto(KeyOf(options_.seed, static_cast<uint64_t>(id)));
    grpc::ClientContext context;
    SetDeadline(&context, options_.small_deadline_ms);
    v1::LookupResponse response;
    CallRecord record = Begin(Op::kLookup, -1, options_.small_deadline_ms);
    const grpc::Status status = stub_->Lookup(&context, request, &response);
    Finish(record, status);
    if (!status.ok()) return;
    if (response.results_size() != static_cast<int>(ids.size())) {
      history_->AddViolation("lookup_wrong_count",
                             absl::StrFormat("%d results for %d keys", response.results_size(), ids.size()));
      return;
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      const v1::LookupResult& result = response.results(static_cast<int>(i));
      if (!result.found()) continue;
      const uint64_t size = StoredBytesOf(KeyOf(options_.seed, static_cast<uint64_t>(ids[i])));
      if (result.stored_bytes() != size || !ValidTier(result.tier())) {
        history_->AddViolation("lookup_wrong_size",
                               absl::StrFormat("key %d: %d bytes in tier %d, the chunk has %d", ids[i],
                                               result.stored_bytes(), result.tier(), size));
      }
    }
  }

  void Delete(int64_t id) {
    v1::DeleteRequest request;
    *request.add_keys() = ToProto(KeyOf(options_.seed, static_cast<uint64_t>(id)));
    grpc::ClientContext context;
    SetDeadline(&context, options_.small_deadline_ms);
    v1::DeleteResponse response;
    CallRecord record = Begin(Op::kDelete, id, options_.small_deadline_ms);
    Finish(record, stub_->Delete(&context, request, &response));
  }

  // Lease on a fresh key, then (when granted) the put under it. Returns the bytes put.
  uint64_t LeaseThenPut(int64_t id) {
    v1::LeaseRequest request;
    *request.mutable_key() = ToProto(KeyOf(options_.seed, static_cast<uint64_t>(id)));
    request.set_holder("crash-test");
    request.set_ttl_ms(3000);
    grpc::ClientContext context;
    SetDeadline(&context, options_.small_deadline_ms);
    v1::LeaseResponse response;
    CallRecord record = Begin(Op::kLease, id, options_.small_deadline_ms);
    const grpc::Status status = stub_->Lease(&context, request, &response);
    Finish(record, status);
    if (!status.ok() || response.outcome() != v1::LeaseResponse::GRANTED) return 0;
    return Put(id, response.lease_id());
  }

  void Stats(ServerObservations* observed) {
    grpc::ClientContext context;
    SetDeadline(&context, options_.small_deadline_ms);
    v1::StatsResponse response;
    CallRecord record = Begin(Op::kStats, -1, options_.small_deadline_ms);
    const grpc::Status status = stub_->Stats(&context, v1::StatsRequest(), &response);
    Finish(record, status);
    if (!status.ok()) return;
    auto raise = [](std::atomic<uint64_t>& to, uint64_t value) {
      uint64_t seen = to.load();
      while (value > seen && !to.compare_exchange_weak(seen, value)) {
      }
    };
    raise(observed->max_pending_disk_writes, response.pending_disk_writes());
    raise(observed->demotions, response.demotions());
    raise(observed->promotions, response.promotions());
    for (const v1::TierStats& tier : response.tiers()) {
      raise(tier.tier() == v1::TIER_DISK ? observed->disk_evictions : observed->host_evictions, tier.evictions());
    }
    if (response.corrupt_values() > 0 && !reported_corrupt_) {
      reported_corrupt_ = true;
      history_->AddViolation("corrupt_values", absl::StrFormat("incarnation %d counts %d corrupt values", incarnation_,
                                                               response.corrupt_values()));
    }
  }

 private:
  CallRecord Begin(Op op, int64_t id, int deadline_ms) const {
    return CallRecord{
        .op = op, .incarnation = incarnation_, .key_id = id, .start_ns = NowNs(), .deadline_ms = deadline_ms};
  }
  void Finish(CallRecord& record, const grpc::Status& status) {
    record.end_ns = NowNs();
    record.code = status.error_code();
    history_->Add(record);
    const int64_t allowed_ns = (record.deadline_ms + 1000) * int64_t{1'000'000};
    if (record.end_ns - record.start_ns > allowed_ns) {
      history_->AddViolation(
          "overran_deadline",
          absl::StrFormat("%s of key %d took %.3f s against a deadline of %d ms (status %d)", OpName(record.op),
                          record.key_id, (record.end_ns - record.start_ns) / 1e9, record.deadline_ms, record.code));
    }
  }

  const LoadOptions& options_;
  const int incarnation_;
  History* history_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KvCache::Stub> stub_;
  bool reported_corrupt_ = false;
};

}  // namespace

Load::Load(const LoadOptions& options, int incarnation, const std::string& address, std::atomic<int64_t>* next_id,
           History* history, ServerObservations* observed)
    : options_(options),
      incarnation_(incarnation),
      address_(address),
      next_id_(next_id),
      history_(history),
      observed_(observed) {
  for (int i = 0; i < options_.threads; ++i) threads_.emplace_back([this, i] { Run(i); });
  threads_.emplace_back([this] { PollStats(); });
}

Load::~Load() {
  Stop();
  for (std::thread& t : threads_) t.join();
}

void Load::Stop() { stop_.store(true); }

void Load::PollStats() {
  Caller caller(options_, incarnation_, address_, history_);
  while (!stop_.load()) {
    caller.Stats(observed_);
    for (int i = 0; i < 10 && !stop_.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
}

void Load::Run(int thread_index) {
  Caller caller(options_, incarnation_, address_, history_);
  uint64_t rng = options_.seed ^ (static_cast<uint64_t>(incarnation_) << 32) ^ (thread_index * 0x9e3779b97f4a7c15ULL);
  auto sleep_until = [this](Clock::time_point until) {
    while (!stop_.load() && Clock::now() < until) {
      std::this_thread::sleep_for(std::min<Clock::duration>(until - Clock::now(), std::chrono::milliseconds(20)));
    }
    return !stop_.load();
  };
  // Ids already handed out: the newest `window`, or any.
  auto recent = [&](int64_t window) -> int64_t {
    const int64_t n = next_id_->load();
    if (n == 0) return -1;
    return n - 1 - static_cast<int64_t>(SplitMix64(rng) % static_cast<uint64_t>(std::min(n, window)));
  };
  auto any = [&]() -> int64_t {
    const int64_t n = next_id_->load();
    return n == 0 ? -1 : static_cast<int64_t>(SplitMix64(rng) % static_cast<uint64_t>(n));
  };
  const auto interval =
      std::chrono::nanoseconds(static_cast<int64_t>(1e9 * options_.threads / options_.ops_per_second));
  const double put_ns_per_byte = 1e9 * options_.threads / (options_.put_mbps * 1e6);
  Clock::time_point next_op = Clock::now(), next_put = Clock::now();
  while (sleep_until(next_op)) {
    next_op = std::max(next_op + interval, Clock::now() - std::chrono::seconds(1));
    uint64_t dice = SplitMix64(rng) % 100;
    const bool put = dice < 35 || dice >= 93;
    if (put && Clock::now() < next_put) dice = 35;  // past the put budget: a get instead
    if (dice < 35 || dice >= 93) {  // a put (1 in 5 of a recent key, mostly a fresh one), or lease then put
      uint64_t bytes = 0;
      if (dice >= 93) {
        bytes = caller.LeaseThenPut(next_id_->fetch_add(1));
      } else {
        const int64_t again = SplitMix64(rng) % 5 == 0 ? recent(200) : -1;
        bytes = caller.Put(again >= 0 ? again : next_id_->fetch_add(1), 0);
      }
      next_put = std::max(next_put, Clock::now()) +
                 std::chrono::nanoseconds(static_cast<int64_t>(static_cast<double>(bytes) * put_ns_per_byte));
    } else if (dice < 70) {  // mostly recent keys (host RAM), some old ones (disk, promotion)
      const int64_t id = SplitMix64(rng) % 10 < 7 ? recent(300) : any();
      if (id >= 0) caller.Get(id);
    } else if (dice < 85) {
      std::vector<int64_t> ids;
      for (int i = 0; i < 8; ++i) {
        if (const int64_t id = i % 2 == 0 ? recent(300) : any(); id >= 0) ids.push_back(id);
      }
      if (!ids.empty()) caller.Lookup(ids);
    } else {  // delete one of the newest keys, often while its write-through is pending
      if (const int64_t id = recent(16); id >= 0) caller.Delete(id);
    }
  }
}

}  // namespace lazykv::crash
