// A backend that hands every call to another (the CPU backend, say), for tests that record what
// the engine asks of a backend: a subclass overrides the calls it watches and calls this class's.
// ForwardAndSample is not forwarded: Backend's own calls Forward, so a recorder of Forward sees
// every pass.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "worker/backend/backend.h"

namespace lazykv::testing {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  const ModelConfig& config() const override { return inner_->config(); }
  std::string kv_dtype() const override { return inner_->kv_dtype(); }
  int block_size() const override { return inner_->block_size(); }
  int num_blocks() const override { return inner_->num_blocks(); }
  uint64_t kv_bytes_per_block() const override { return inner_->kv_bytes_per_block(); }
  Hash128 model_fingerprint() const override { return inner_->model_fingerprint(); }
  absl::Status Forward(std::span<const SequenceStep> steps, std::vector<std::vector<float>>* logits) override {
    return inner_->Forward(steps, logits);
  }
  absl::Status CopyBlocksRotated(std::span<const BlockCopy> copies) override {
    return inner_->CopyBlocksRotated(copies);
  }
  absl::Status WarmUp(int max_rows, int max_logit_rows) override { return inner_->WarmUp(max_rows, max_logit_rows); }
  absl::StatusOr<std::unique_ptr<ExportedChunk>> CaptureChunk(std::span<const KvBlockRef> blocks) override {
    return inner_->CaptureChunk(blocks);
  }
  absl::StatusOr<std::unique_ptr<StagedChunk>> StageChunk(const ChunkBytes& payload,
                                                          const StageOptions& options) override {
    return inner_->StageChunk(payload, options);
  }
  absl::Status ImportStaged(std::unique_ptr<StagedChunk> staged, std::span<const KvBlockRef> blocks) override {
    return inner_->ImportStaged(std::move(staged), blocks);
  }

 private:
  std::unique_ptr<Backend> inner_;
};

}  // namespace lazykv::testing
