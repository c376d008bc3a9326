#include "worker/tier/embedded_chunk_tier.h"

#include "absl/strings/str_format.h"
#include "common/byte_size.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace lazykv {

// This process is the only owner of the embedded tier's leases.
constexpr char kOwner[] = "embedded";
namespace {

ChunkSource SourceOf(cache::StoreTier tier) {
  return tier == cache::StoreTier::kHost ? ChunkSource::kHost : ChunkSource::kDisk;
}

}  // namespace

absl::StatusOr<std::unique_ptr<EmbeddedChunkTier>> EmbeddedChunkTier::Open(const cache::TieredStoreOptions& options) {
  ASSIGN_OR_RETURN(auto store, cache::TieredStore::Open(options, nullptr));
  return std::unique_ptr<EmbeddedChunkTier>(new EmbeddedChunkTier(std::move(store)));
}

EmbeddedChunkTier::EmbeddedChunkTier(std::unique_ptr<cache::TieredStore> store)
    : store_(std::move(store)),
      leases_([this](const Hash128& key) { return store_->Locate(key).has_value(); }, &store_->metrics()) {}

std::vector<std::optional<TierHit>> EmbeddedChunkTier::Lookup(std::span<const Hash128> keys) {
  std::vector<std::optional<TierHit>> out;
  for (const Hash128& key : keys) {
    if (const auto where = store_->Lookup(key)) {
      out.push_back(TierHit{SourceOf(where->tier), where->bytes, "", ""});
    } else {
      out.push_back(std::nullopt);
    }
  }
  return out;
}

absl::StatusOr<FetchedChunk> EmbeddedChunkTier::Fetch(const Hash128& key) {
  ASSIGN_OR_RETURN(cache::ChunkReader reader, store_->Read(key));  // checked as it was read
  auto owner = std::make_shared<const cache::ChunkReader>(std::move(reader));
  const ChunkSource source = SourceOf(owner->tier());
  std::vector<std::string_view> pieces = owner->Pieces(0, owner->size());
  return FetchedChunk{ChunkBytes(std::move(pieces), std::move(owner)), source, "", /*payload_verified=*/true};
}

namespace {

// A chunk written straight into the store's host pages, committed (checked) at the end.
class EmbeddedPublishSlot final : public PublishSlot {
 public:
  EmbeddedPublishSlot(cache::TieredStore* store, cache::LeaseTable* leases, const Hash128& key,
                      std::unique_ptr<cache::ChunkWriter> writer)
      : store_(store), leases_(leases), key_(key), writer_(std::move(writer)), pieces_(writer_->WritablePieces()) {}
  const MutablePieces& Pieces() override { return pieces_; }
  absl::Status Commit() override {
    if (writer_ == nullptr) return absl::FailedPreconditionError("publish slot committed twice");
    auto stored = store_->Commit(key_, std::move(writer_));
    leases_->Published(key_);
    return stored.status();
  }

 private:
  cache::TieredStore* store_;
  cache::LeaseTable* leases_;
  Hash128 key_;
  std::unique_ptr<cache::ChunkWriter> writer_;  // its pages go back if never committed
  MutablePieces pieces_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PublishSlot>> EmbeddedChunkTier::BeginPublish(const Hash128& key,
                                                                             const Hash128& model_fingerprint,
                                                                             uint64_t stored_bytes, uint64_t lease_id) {
  ASSIGN_OR_RETURN(std::unique_ptr<cache::ChunkWriter> writer, store_->BeginPut(stored_bytes));
  return std::unique_ptr<PublishSlot>(new EmbeddedPublishSlot(store_.get(), &leases_, key, std::move(writer)));
}

LeaseAnswer EmbeddedChunkTier::Lease(const Hash128& key, std::chrono::milliseconds ttl,
                                     std::chrono::milliseconds wait) {
  const auto result = leases_.Acquire(key, "embedded", kOwner, ttl, cache::LeaseTable::Clock::now() + wait);
  using Outcome = cache::LeaseTable::Outcome;
  switch (result.outcome) {
    case Outcome::kGranted:
      return {LeaseAnswer::State::kGranted, result.lease_id, result.remaining};
    case Outcome::kStored:
      return {LeaseAnswer::State::kStored};
    case Outcome::kHeld:
      return {LeaseAnswer::State::kHeld, result.lease_id, result.remaining};
    case Outcome::kShuttingDown:
      break;
  }
  return {LeaseAnswer::State::kUnavailable};
}

void EmbeddedChunkTier::ReleaseLease(const Hash128& key, uint64_t lease_id) { leases_.Release(key, lease_id, kOwner); }

absl::Status EmbeddedChunkTier::RenewLease(const Hash128& key, uint64_t lease_id, std::chrono::milliseconds ttl) {
  if (leases_.Renew(key, lease_id, kOwner, ttl)) return absl::OkStatus();
  return absl::NotFoundError(absl::StrFormat("lease %d no longer holds chunk %s", lease_id, key.ToHex()));
}

void EmbeddedChunkTier::ReportInvalid(const Hash128& key, std::string_view header, std::string_view reason) {
  absl::StatusOr<cache::ChunkReader> read = store_->Read(key);
  if (!read.ok() || read->size() < kChunkHeaderBytes || header.size() != kChunkHeaderBytes) return;
  std::string stored_header(kChunkHeaderBytes, '\0');
  read->Read(0, kChunkHeaderBytes, stored_header.data());
  if (stored_header == header && store_->Delete(key)) {
    spdlog::warn("embedded tier dropped chunk {}: refused by its fetcher ({})", key.ToHex(), std::string(reason));
  }
}

absl::Status EmbeddedChunkTier::Publish(const Hash128& key, const Hash128& model_fingerprint, std::string_view stored,
                                        uint64_t lease_id) {
  auto status = store_->Put(key, stored);
  leases_.Published(key);
  return status.status();
}

std::string EmbeddedChunkTier::Describe() const {
  const auto s = store_->stats();
  return absl::StrFormat("embedded cache tier: host %s, disk %s at %s", FormatByteSize(s.host_capacity),
                         FormatByteSize(s.disk_capacity), store_->options().data_dir);
}

}  // namespace lazykv
