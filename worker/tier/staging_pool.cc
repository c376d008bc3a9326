#include "worker/tier/staging_pool.h"

#include <chrono>
#include <cstdlib>

#include "absl/strings/str_format.h"

namespace lazykv {
namespace {

constexpr uint64_t kGranule = 2ull << 20;  // sizes rounded up, so that near sizes share buffers

}  // namespace

class StagingPool::Lent final : public StagingBuffer {
 public:
  Lent(std::shared_ptr<StagingPool> pool, Block block, double allocation_seconds = 0)
      : pool_(std::move(pool)), block_(block), allocation_seconds_(allocation_seconds) {}
  ~Lent() override { pool_->GiveBack(block_); }
  char* data() const override { return block_.data; }
  uint64_t size() const override { return block_.size; }
  double allocation_seconds() const override { return allocation_seconds_; }

 private:
  const std::shared_ptr<StagingPool> pool_;
  const Block block_;
  const double allocation_seconds_;
};

std::shared_ptr<StagingPool> StagingPool::Create(int device, uint64_t max_bytes) {
  return std::shared_ptr<StagingPool>(new StagingPool(device, max_bytes));
}

StagingPool::~StagingPool() {
  for (const Block& block : kept_) Free(block.data);
}

absl::StatusOr<char*> StagingPool::Allocate(uint64_t bytes) {
  if (device_ >= 0) return AllocateDevice(device_, bytes);
  char* data = static_cast<char*>(std::malloc(bytes));
  if (data == nullptr) return absl::ResourceExhaustedError(absl::StrFormat("no host memory for %d bytes", bytes));
  return data;
}

void StagingPool::Free(char* data) {
  if (device_ >= 0) {
    FreeDevice(device_, data);
  } else {
    std::free(data);
  }
}

absl::StatusOr<std::shared_ptr<StagingBuffer>> StagingPool::Acquire(uint64_t bytes) {
  const uint64_t size = std::max<uint64_t>(kGranule, (bytes + kGranule - 1) / kGranule * kGranule);
  std::vector<Block> drop;
  {
    MutexLock lock(&mu_);
    // The smallest kept buffer that fits.
    size_t best = kept_.size();
    for (size_t i = 0; i < kept_.size(); ++i) {
      if (kept_[i].size >= size && (best == kept_.size() || kept_[i].size < kept_[best].size)) best = i;
    }
    if (best < kept_.size()) {
      const Block block = kept_[best];
      kept_.erase(kept_.begin() + static_cast<std::ptrdiff_t>(best));
      kept_bytes_ -= block.size;
      outstanding_ += block.size;
      return std::shared_ptr<StagingBuffer>(new Lent(shared_from_this(), block));
    }
    if (outstanding_ + size > max_bytes_) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "staging: %d bytes asked, %d of %d are in use", size, outstanding_, max_bytes_));
    }
    // Room for the new one: kept buffers that do not fit go, largest first.
    while (outstanding_ + kept_bytes_ + size > max_bytes_ && !kept_.empty()) {
      drop.push_back(kept_.back());
      kept_bytes_ -= kept_.back().size;
      kept_.pop_back();
    }
    outstanding_ += size;  // reserved before the allocation, which runs without the lock
  }
  const auto start = std::chrono::steady_clock::now();
  for (const Block& block : drop) Free(block.data);
  auto data = Allocate(size);
  if (!data.ok()) {
    MutexLock lock(&mu_);
    outstanding_ -= size;
    return data.status();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return std::shared_ptr<StagingBuffer>(new Lent(shared_from_this(), Block{*data, size}, seconds));
}

void StagingPool::GiveBack(Block block) {
  MutexLock lock(&mu_);
  outstanding_ -= block.size;
  kept_.push_back(block);
  kept_bytes_ += block.size;
}

uint64_t StagingPool::outstanding_bytes() const {
  MutexLock lock(&mu_);
  return outstanding_;
}

uint64_t StagingPool::kept_bytes() const {
  MutexLock lock(&mu_);
  return kept_bytes_;
}

}  // namespace lazykv
