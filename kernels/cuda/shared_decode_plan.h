// Host-side planner of chunk-shared decode attention (shared_decode_attention.h; DESIGN.md
// section 2): in a decode batch (one query per sequence), the block-table entries that several
// references have in common (the same physical blocks in the same order: one document's chunk,
// placed by each sequence at its own delta) are found once, so that the GPU reads each such
// block's K/V once per step for all the queries that use it. Plain C++ (no CUDA), run once per
// step for all layers; unit-tested on the CPU (tests/kernels/shared_decode_plan_test.cc).
//
// Input: host copies of the flat block table of paged_kv.h (block_ids, block_tokens,
// block_deltas, block_starts, table_offsets) and the queries' positions.
//
// Definitions. An entry is *eligible* when it holds tokens and the query sees all of them
// (block_starts[e] + block_tokens[e] - 1 <= positions[seq]); the others stay per-sequence. Its
// key is (block id, valid tokens). A key referenced by >= 2 eligible entries (of any sequences,
// or twice in one) is shared. A *run* is a maximal list of shared keys k_0..k_{n-1} such that
// every reference of k_i is followed, in its own sequence, by a reference of k_{i+1} with the
// same delta, and k_{i+1} has no other references (so every reference of the run starts at a
// reference of k_0 and covers n consecutive entries at one delta: a document's chunk, or a
// piece of one where the users differ). Runs of distinct keys are disjoint, and the references
// of a run never overlap (a finite set of entries cannot equal itself shifted).
//
// Output. Each run is cut into work items: its entries into pieces of at most
// max_entries_per_item entries, its references ("members") into groups of at most max_members
// (sizes as equal as possible, so that no group of a shared run has fewer than 2 members). A
// work item is one (piece, member group); each of its members gets its own partial-state slot
// ("part") in its sequence, numbered from 0 per sequence. Every eligible or not entry that no
// work item covers goes to the residual table: per sequence, in order, with its original
// block, tokens, delta and start, for the per-sequence decode kernel. Every (sequence, entry)
// is covered exactly once, by one member of one work item or by the residual table.
#pragma once

#include <cstdint>
#include <vector>

namespace lazykv::cuda {

// A work item: entries [entry_first, entry_first + num_entries) of the flat table (those of its
// first member; every member references the same blocks with the same token counts) and
// members [member_first, member_first + num_members) of the plan's member list. Plain int32
// fields so that the device reads the host's array as is.
struct SharedWorkItem {
  int32_t entry_first = 0;
  int32_t num_entries = 0;
  int32_t member_first = 0;
  int32_t num_members = 0;
};

// One reference of a work item's blocks: sequence `seq` uses them from its flat entry
// `entry_first` on, all at rotation delta `delta`; its query is at `position` (copied from the
// tables, so that the kernel need not look it up); its partial state goes to slot `part` of the
// sequence's shared parts.
struct SharedMember {
  int32_t seq = 0;
  int32_t entry_first = 0;
  int32_t delta = 0;
  int32_t position = 0;
  int32_t part = 0;
};

// Host pointers to one layer's decode block table (paged_kv.h's layout: table_offsets has
// num_seqs + 1 elements, the others table_offsets[num_seqs]) and the query positions
// ([num_seqs]). Plain pointers, not std::span: the header is also read by nvcc in C++17.
struct SharedDecodeTables {
  const int32_t* block_ids = nullptr;
  const int32_t* block_tokens = nullptr;
  const int32_t* block_deltas = nullptr;
  const int32_t* block_starts = nullptr;
  const int32_t* table_offsets = nullptr;
  const int32_t* positions = nullptr;
  int num_seqs = 0;
};

struct SharedDecodePlanOptions {
  // References per work item; at least 3 (a smaller value counts as 3: groups of at most 2
  // would leave one reference of an odd group alone, and the even cut needs cap >= 3 to keep
  // every group at >= 2).
  int max_members = 16;
  int max_entries_per_item = 16;  // entries per work item (>= 1; the kernel takes at most 64)
  // Also give the shared kernel the entries referenced once (solo work items: one member, a run
  // of consecutive such entries of one sequence at one delta, cut at max_entries_per_item), so
  // that the per-sequence kernel is left only the entries its query does not wholly see.
  bool solo_items = false;
};

struct SharedDecodePlan {
  std::vector<SharedWorkItem> items;
  std::vector<SharedMember> members;  // grouped by item
  std::vector<int32_t> shared_parts;  // [num_seqs]: parts (members) per sequence
  int max_shared_parts = 0;           // max of shared_parts
  // The residual table (paged_kv.h's layout over the same pool): per sequence, its entries no
  // work item covers, in logical order.
  std::vector<int32_t> res_block_ids, res_block_tokens, res_block_deltas, res_block_starts;
  std::vector<int32_t> res_offsets;  // [num_seqs + 1]
  int max_residual_entries = 0;
  // Statistics: entries (and tokens) covered by work items, counted once per reference and
  // once per work item (what the shared kernel reads).
  int64_t shared_entry_refs = 0, shared_token_refs = 0;
  int64_t item_entries = 0, item_tokens = 0;
  int num_runs = 0;
  int num_solo_items = 0;  // items of one member (solo_items), after the shared ones

  int num_seqs() const { return static_cast<int>(shared_parts.size()); }
};

// Plans one decode step. The tables must be well formed (offsets non-decreasing, ids >= 0).
SharedDecodePlan PlanSharedDecode(const SharedDecodeTables& tables, const SharedDecodePlanOptions& options = {});

}  // namespace lazykv::cuda
