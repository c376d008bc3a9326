// The chunk-shared decode planner (kernels/cuda/shared_decode_plan.h) on the CPU: random batches
// of sequences that draw documents from a small set (Zipf-like), each at its own delta, with
// repeated documents, partial uses (a document's later blocks only, or a delta change inside
// it, as repair leaves them), own blocks, partly filled blocks and queries that do not see
// their whole table; every plan is checked against the contract in the header.
#include "kernels/cuda/shared_decode_plan.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace lazykv::testing {
namespace {

using cuda::PlanSharedDecode;
using cuda::SharedDecodePlan;
using cuda::SharedDecodePlanOptions;
using cuda::SharedDecodeTables;

struct Table {
  std::vector<int32_t> ids, tokens, deltas, starts, offsets = {0}, positions;
  int32_t length = 0;
  void Add(int32_t id, int32_t count, int32_t delta) {
    ids.push_back(id);
    tokens.push_back(count);
    deltas.push_back(delta);
    starts.push_back(length);
    length += count;
  }
  void End(int32_t position) {
    offsets.push_back(static_cast<int32_t>(ids.size()));
    positions.push_back(position);
    length = 0;
  }
  SharedDecodeTables View() const {
    return {ids.data(), tokens.data(), deltas.data(), starts.data(), offsets.data(), positions.data(), num_seqs()};
  }
  int num_seqs() const { return static_cast<int>(positions.size()); }
};

uint64_t Key(const Table& t, int e) {
  return (static_cast<uint64_t>(t.ids[e]) << 32) | static_cast<uint32_t>(t.tokens[e]);
}

bool Eligible(const Table& t, int s, int e) {
  return t.tokens[e] > 0 && static_cast<int64_t>(t.starts[e]) + t.tokens[e] - 1 <= t.positions[s];
}

// Checks every clause of the planner's contract.
void CheckPlan(const Table& t, const SharedDecodePlan& plan, const SharedDecodePlanOptions& options) {
  const int n = t.offsets.back();
  std::vector<int> seq_of(n);
  for (int s = 0; s < t.num_seqs(); ++s) {
    for (int e = t.offsets[s]; e < t.offsets[s + 1]; ++e) seq_of[e] = s;
  }
  std::map<uint64_t, int> key_count;
  for (int s = 0; s < t.num_seqs(); ++s) {
    for (int e = t.offsets[s]; e < t.offsets[s + 1]; ++e) {
      if (Eligible(t, s, e)) ++key_count[Key(t, e)];
    }
  }

  std::vector<int> covered(n, 0);
  std::vector<std::set<int>> parts(t.num_seqs());
  ASSERT_EQ(plan.shared_parts.size(), static_cast<size_t>(t.num_seqs()));
  int members_seen = 0;
  for (const cuda::SharedWorkItem& item : plan.items) {
    ASSERT_EQ(item.member_first, members_seen) << "members grouped by item, in order";
    members_seen += item.num_members;
    ASSERT_LE(static_cast<size_t>(members_seen), plan.members.size());
    EXPECT_GE(item.num_members, options.solo_items ? 1 : 2);
    EXPECT_LE(item.num_members, std::max(3, options.max_members));
    EXPECT_GE(item.num_entries, 1);
    EXPECT_LE(item.num_entries, std::max(1, options.max_entries_per_item));
    for (int m = item.member_first; m < item.member_first + item.num_members; ++m) {
      const cuda::SharedMember& member = plan.members[m];
      ASSERT_GE(member.seq, 0);
      ASSERT_LT(member.seq, t.num_seqs());
      ASSERT_GE(member.entry_first, t.offsets[member.seq]);
      ASSERT_LE(member.entry_first + item.num_entries, t.offsets[member.seq + 1]) << "inside its own table";
      EXPECT_TRUE(parts[member.seq].insert(member.part).second) << "part used twice";
      EXPECT_EQ(member.position, t.positions[member.seq]);
      for (int i = 0; i < item.num_entries; ++i) {
        const int e = member.entry_first + i, f = item.entry_first + i;
        ++covered[e];
        if (item.num_members == 1) {
          EXPECT_EQ(key_count[Key(t, e)], 1) << "a solo item holds entries referenced once";
        }
        EXPECT_EQ(t.ids[e], t.ids[f]) << "same blocks as the item";
        EXPECT_EQ(t.tokens[e], t.tokens[f]);
        EXPECT_EQ(t.deltas[e], member.delta) << "one delta per member";
        EXPECT_TRUE(Eligible(t, member.seq, e)) << "only fully visible entries are shared";
      }
    }
  }
  EXPECT_EQ(static_cast<size_t>(members_seen), plan.members.size());
  int max_parts = 0;
  for (int s = 0; s < t.num_seqs(); ++s) {
    EXPECT_EQ(static_cast<int>(parts[s].size()), plan.shared_parts[s]);
    if (!parts[s].empty()) {
      EXPECT_EQ(*parts[s].rbegin(), plan.shared_parts[s] - 1) << "parts numbered 0..n-1";
    }
    max_parts = std::max(max_parts, plan.shared_parts[s]);
  }
  EXPECT_EQ(plan.max_shared_parts, max_parts);

  // Exactly once: each entry is covered by one member, or it is the next residual entry.
  ASSERT_EQ(plan.res_offsets.size(), static_cast<size_t>(t.num_seqs() + 1));
  int max_res = 0;
  for (int s = 0; s < t.num_seqs(); ++s) {
    int r = plan.res_offsets[s];
    for (int e = t.offsets[s]; e < t.offsets[s + 1]; ++e) {
      ASSERT_LE(covered[e], 1) << "entry " << e << " covered twice";
      const bool referenced_once = !Eligible(t, s, e) || key_count[Key(t, e)] < 2;
      if (!Eligible(t, s, e)) {
        EXPECT_EQ(covered[e], 0) << "an entry the query does not wholly see is residual";
      } else if (referenced_once && !options.solo_items) {
        EXPECT_EQ(covered[e], 0) << "an entry referenced once is residual";
      } else {
        EXPECT_EQ(covered[e], 1) << "an entry the shared kernel can take is never left to the residual";
      }
      if (covered[e]) continue;
      ASSERT_LT(r, plan.res_offsets[s + 1]) << "entry " << e << " missing from the residual table";
      EXPECT_EQ(plan.res_block_ids[r], t.ids[e]);
      EXPECT_EQ(plan.res_block_tokens[r], t.tokens[e]);
      EXPECT_EQ(plan.res_block_deltas[r], t.deltas[e]);
      EXPECT_EQ(plan.res_block_starts[r], t.starts[e]);
      ++r;
    }
    EXPECT_EQ(r, plan.res_offsets[s + 1]) << "extra residual entries in sequence " << s;
    max_res = std::max(max_res, plan.res_offsets[s + 1] - plan.res_offsets[s]);
  }
  EXPECT_EQ(plan.max_residual_entries, max_res);
}

TEST(SharedDecodePlanTest, HandBuiltBatch) {
  // Document A: 3 blocks (ids 100..102, the last with 5 tokens), B: 2 blocks (200, 201).
  // Seq 0: A at delta 10, own block. Seq 1: B, then A at delta 40, own. Seq 2: A at delta 7,
  // own. Seq 3: B then own; seq 4: own only.
  Table t;
  int32_t own = 1000;
  auto add_a = [&](int32_t delta) {
    t.Add(100, 16, delta);
    t.Add(101, 16, delta);
    t.Add(102, 5, delta);
  };
  auto add_b = [&](int32_t delta) {
    t.Add(200, 16, delta);
    t.Add(201, 16, delta);
  };
  add_a(10);
  t.Add(own++, 3, 0);
  t.End(t.length - 1);
  add_b(1);
  add_a(40);
  t.Add(own++, 9, 0);
  t.End(t.length - 1);
  add_a(7);
  t.Add(own++, 16, 0);
  t.End(t.length - 1);
  add_b(1);
  t.Add(own++, 1, 0);
  t.End(t.length - 1);
  t.Add(own++, 4, 0);
  t.End(t.length - 1);

  SharedDecodePlanOptions options;
  options.max_entries_per_item = 2;
  const SharedDecodePlan plan = PlanSharedDecode(t.View(), options);
  CheckPlan(t, plan, options);
  EXPECT_EQ(plan.num_runs, 2);              // A (3 members), B (2 members)
  ASSERT_EQ(plan.items.size(), 3u);         // A in 2 pieces (2 + 1 entries), B in 1
  EXPECT_EQ(plan.items[0].num_members, 3);  // A is met first (seq 0)
  EXPECT_EQ(plan.items[0].num_entries, 2);
  EXPECT_EQ(plan.items[1].num_entries, 1);
  EXPECT_EQ(plan.members[plan.items[0].member_first + 1].delta, 40);
  EXPECT_EQ(plan.items[2].num_members, 2);
  EXPECT_EQ(plan.shared_parts, (std::vector<int32_t>{2, 3, 2, 1, 0}));
  EXPECT_EQ(plan.res_offsets, (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(plan.item_tokens, 16 + 16 + 5 + 32);
  EXPECT_EQ(plan.shared_token_refs, 3 * 37 + 2 * 32);

  // Solo items: the own blocks (referenced once) become items of one member; nothing is left.
  SharedDecodePlanOptions solo = options;
  solo.solo_items = true;
  const SharedDecodePlan p1 = PlanSharedDecode(t.View(), solo);
  CheckPlan(t, p1, solo);
  EXPECT_EQ(p1.num_solo_items, 5);
  ASSERT_EQ(p1.items.size(), 8u);
  EXPECT_EQ(p1.items[3].num_members, 1);
  EXPECT_EQ(p1.res_offsets, (std::vector<int32_t>{0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(p1.max_residual_entries, 0);
  EXPECT_EQ(p1.shared_parts, (std::vector<int32_t>{3, 4, 3, 2, 1}));

  // Seq 2's query at position 20 sees A's first block whole, not the second: A's first block
  // is shared by 3, its others by 2, so A becomes two runs (and B the third).
  Table hidden = t;
  hidden.positions[2] = 20;
  const SharedDecodePlan p2 = PlanSharedDecode(hidden.View(), options);
  CheckPlan(hidden, p2, options);
  EXPECT_EQ(p2.num_runs, 3);
  EXPECT_EQ(p2.shared_parts[2], 1);
  EXPECT_EQ(p2.items[0].num_members, 3);
  EXPECT_EQ(p2.items[0].num_entries, 1);
}

TEST(SharedDecodePlanTest, MemberCapSplitsEvenly) {
  Table t;
  for (int s = 0; s < 33; ++s) {
    t.Add(7, 16, s);
    t.Add(8, 16, s);
    t.Add(1000 + s, 2, 0);
    t.End(t.length - 1);
  }
  SharedDecodePlanOptions options;
  options.max_members = 16;
  const SharedDecodePlan plan = PlanSharedDecode(t.View(), options);
  CheckPlan(t, plan, options);
  ASSERT_EQ(plan.items.size(), 3u);  // 33 members: 11 + 11 + 11
  for (const auto& item : plan.items) {
    EXPECT_EQ(item.num_members, 11);
    EXPECT_EQ(item.num_entries, 2);
  }
  // 17 members at a cap of 16: 9 + 8, never a group of one.
  Table u;
  for (int s = 0; s < 17; ++s) {
    u.Add(7, 16, s);
    u.End(u.length - 1);
  }
  const SharedDecodePlan p2 = PlanSharedDecode(u.View(), options);
  CheckPlan(u, p2, options);
  ASSERT_EQ(p2.items.size(), 2u);
  EXPECT_EQ(p2.items[0].num_members, 9);
  EXPECT_EQ(p2.items[1].num_members, 8);
}

TEST(SharedDecodePlanTest, RandomSharingPatterns) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  int64_t total_items = 0, total_shared = 0, total_entries = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int block = std::uniform_int_distribution<int>(1, 32)(rng);
    const int num_docs = std::uniform_int_distribution<int>(1, 12)(rng);
    // Documents: 1..8 blocks, the last partly filled, unique ids.
    std::vector<std::vector<std::pair<int32_t, int32_t>>> docs(num_docs);
    int32_t next_id = 0;
    for (auto& doc : docs) {
      const int blocks = std::uniform_int_distribution<int>(1, 8)(rng);
      for (int b = 0; b < blocks; ++b) {
        const int fill = b + 1 < blocks ? block : std::uniform_int_distribution<int>(1, block)(rng);
        doc.push_back({next_id++, fill});
      }
    }
    // Zipf-like document choice.
    std::vector<double> weights(num_docs);
    for (int d = 0; d < num_docs; ++d) weights[d] = 1.0 / std::pow(d + 1.0, 1.1);
    std::discrete_distribution<int> pick(weights.begin(), weights.end());
    Table t;
    const int num_seqs = std::uniform_int_distribution<int>(1, 40)(rng);
    for (int s = 0; s < num_seqs; ++s) {
      const int uses = std::uniform_int_distribution<int>(0, 6)(rng);
      for (int u = 0; u < uses; ++u) {
        const auto& doc = docs[pick(rng)];
        int32_t delta = static_cast<int32_t>(rng() % 5000);
        const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
        const int skip = kind == 0 ? std::uniform_int_distribution<int>(0, static_cast<int>(doc.size()) - 1)(rng) : 0;
        for (size_t b = skip; b < doc.size(); ++b) {
          if (kind == 1 && b == doc.size() / 2) delta += 1;  // a delta change inside the document
          t.Add(doc[b].first, doc[b].second, delta);
        }
      }
      const int own_tokens = std::uniform_int_distribution<int>(0, 3 * block)(rng);
      for (int done = 0; done < own_tokens; done += block) t.Add(next_id++, std::min(block, own_tokens - done), 0);
      if (rng() % 20 == 0) t.Add(next_id++, 0, 0);  // an empty entry
      const bool hidden = t.length > 0 && rng() % 8 == 0;
      t.End(hidden ? std::uniform_int_distribution<int32_t>(0, t.length - 1)(rng) : std::max(0, t.length - 1));
    }
    SharedDecodePlanOptions options;
    options.max_members = std::uniform_int_distribution<int>(2, 20)(rng);  // 2 counts as 3
    options.max_entries_per_item = std::uniform_int_distribution<int>(1, 10)(rng);
    options.solo_items = trial % 2 == 1;
    const SharedDecodePlan plan = PlanSharedDecode(t.View(), options);
    CheckPlan(t, plan, options);
    if (options.solo_items) {
      int solo = 0;
      for (const auto& item : plan.items) solo += item.num_members == 1;
      EXPECT_EQ(solo, plan.num_solo_items);
    }
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "trial " << trial << ": " << num_seqs << " sequences, " << num_docs << " documents";
      return;
    }
    total_items += static_cast<int64_t>(plan.items.size());
    total_shared += plan.shared_entry_refs;
    total_entries += t.offsets.back();
  }
  EXPECT_GT(total_items, 300);                 // the patterns do share
  EXPECT_GT(total_shared * 5, total_entries);  // a good part of the references
}

TEST(SharedDecodePlanTest, EmptyBatch) {
  Table t;
  const SharedDecodePlan plan = PlanSharedDecode(t.View());
  EXPECT_TRUE(plan.items.empty());
  EXPECT_EQ(plan.res_offsets, std::vector<int32_t>{0});
}

}  // namespace
}  // namespace lazykv::testing
