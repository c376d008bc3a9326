// A sequence's block table over the paged pool and the block references it holds
// (released on destruction, so every error and cancellation path gives its blocks back).
// Not thread-safe: owned by the engine's scheduling thread, as its allocator is.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/kv_block_ref.h"
#include "worker/engine/kv_block_allocator.h"

namespace lazykv {

class KvSequence {
 public:
  explicit KvSequence(KvBlockAllocator* allocator) : allocator_(allocator) {}
  ~KvSequence() { Clear(); }
  KvSequence(const KvSequence&) = delete;
  KvSequence& operator=(const KvSequence&) = delete;

  // REQUIRES: the allocator outlives the sequence.

  // Appends blocks whose references the caller hands over; each entry gets `delta` (the
  // rotation delta of DESIGN.md section 2). The next own token starts a new block.
  void AdoptBlocks(std::span<const KvBlockRef> refs, int32_t delta) {
    for (const KvBlockRef& ref : refs) {
      table_.push_back(KvBlockRef{ref.block, ref.num_tokens, delta});
      held_.push_back(ref.block);
    }
    tail_is_own_ = false;  // the next own token starts a new block
  }
  // Appends blocks the caller keeps holding too (takes a reference of its own), delta 0.
  // REQUIRES: every block is allocated.
  void ShareBlocks(std::span<const KvBlockRef> refs) {
    for (const KvBlockRef& ref : refs) allocator_->Ref(ref.block);
    AdoptBlocks(refs, 0);
  }
  void AdoptEmptyOwnBlock(int32_t block) {
    table_.push_back(KvBlockRef{block, 0, 0});
    held_.push_back(block);
    tail_is_own_ = true;
  }
  // Whether the next own token fits in the last block (an own block with a free slot).
  bool TailHasRoom(int block_size) const { return tail_is_own_ && table_.back().num_tokens < block_size; }
  // Counts one more token in the own tail block.
  // REQUIRES: TailHasRoom(block_size); aborts when the tail is not an own block (writing
  // into a shared chunk block would corrupt every request that uses it).
  void FillTailSlot() {
    if (!tail_is_own_) AbortFillWithoutOwnTail();
    ++table_.back().num_tokens;
  }
  // Ends the run of own tokens in the tail block after `copied_slots` more slots that a
  // copy fills (a repaired chunk's rest of the block): the next own token starts a new block.
  // REQUIRES: the tail is an own block with copied_slots free slots (aborts when it is not own).
  void EndOwnRun(int32_t copied_slots) {
    if (!tail_is_own_) AbortFillWithoutOwnTail();
    table_.back().num_tokens += copied_slots;
    tail_is_own_ = false;
  }
  // Blocks allocated ahead for this sequence's later own blocks, whose references the caller
  // hands over (Engine::GrowOwnTail takes the blocks of a document or question cut into pieces
  // as one run at its first piece): AdoptSpareOwnBlock puts the first of them in the table, in
  // order; those never adopted are released with the sequence.
  void HoldSpareOwnBlocks(std::span<const int32_t> blocks) {
    spare_.insert(spare_.end(), blocks.begin(), blocks.end());
  }
  size_t num_spare_own_blocks() const { return spare_.size(); }
  // REQUIRES: num_spare_own_blocks() > 0.
  void AdoptSpareOwnBlock() {
    AdoptEmptyOwnBlock(spare_.front());
    spare_.erase(spare_.begin());
  }
  const std::vector<KvBlockRef>& table() const { return table_; }
  size_t num_held() const { return held_.size(); }  // in the table (spares not counted)
  void Clear() {
    for (int32_t block : held_) allocator_->Unref(block);
    for (int32_t block : spare_) allocator_->Unref(block);
    held_.clear();
    spare_.clear();
    table_.clear();
    tail_is_own_ = false;
  }

 private:
  [[noreturn]] static void AbortFillWithoutOwnTail();  // kv_sequence.cc: logs, then aborts

  KvBlockAllocator* allocator_;
  std::vector<KvBlockRef> table_;
  std::vector<int32_t> held_;
  std::vector<int32_t> spare_;  // HoldSpareOwnBlocks', not yet in the table
  bool tail_is_own_ = false;
};

}  // namespace lazykv
