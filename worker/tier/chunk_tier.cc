#include "worker/tier/chunk_tier.h"

namespace lazykv {
namespace {

// The default slot: one string, published whole at Commit.
class StringPublishSlot final : public PublishSlot {
 public:
  StringPublishSlot(ChunkTier* tier, const Hash128& key, const Hash128& fingerprint, uint64_t bytes, uint64_t lease_id)
      : tier_(tier), key_(key), fingerprint_(fingerprint), lease_id_(lease_id), bytes_(bytes, '\0') {
    pieces_.emplace_back(bytes_.data(), bytes_.size());
  }
  const MutablePieces& Pieces() override { return pieces_; }
  absl::Status Commit() override { return tier_->Publish(key_, fingerprint_, bytes_, lease_id_); }

 private:
  ChunkTier* tier_;
  Hash128 key_, fingerprint_;
  uint64_t lease_id_;
  std::string bytes_;
  MutablePieces pieces_;
};

}  // namespace

const char* ChunkSourceName(ChunkSource source) {
  switch (source) {
    case ChunkSource::kPool:
      return "pool";
    case ChunkSource::kHost:
      return "host";
    case ChunkSource::kDisk:
      return "disk";
    case ChunkSource::kRemote:
      return "remote";
    case ChunkSource::kComputed:
      return "computed";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<PublishSlot>> ChunkTier::BeginPublish(const Hash128& key,
                                                                     const Hash128& model_fingerprint,
                                                                     uint64_t stored_bytes, uint64_t lease_id) {
  return std::make_unique<StringPublishSlot>(this, key, model_fingerprint, stored_bytes, lease_id);
}

}  // namespace lazykv
