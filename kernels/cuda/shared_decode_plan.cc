#include "kernels/cuda/shared_decode_plan.h"

#include <algorithm>
#include <unordered_map>

namespace lazykv::cuda {
namespace {

// Cuts n things into ceil(n / cap) pieces of as equal sizes as possible: piece i's offset and size.
struct EvenCut {
  int n, pieces;
  EvenCut(int n, int cap) : n(n), pieces(n <= 0 ? 0 : (n + cap - 1) / cap) {}
  int offset(int i) const { return i * (n / pieces) + std::min(i, n % pieces); }
  int size(int i) const { return n / pieces + (i < n % pieces ? 1 : 0); }
};

}  // namespace

SharedDecodePlan PlanSharedDecode(const SharedDecodeTables& t, const SharedDecodePlanOptions& options) {
  const int max_members = std::max(3, options.max_members);  // see the header
  const int max_entries = std::max(1, options.max_entries_per_item);
  const int num_seqs = t.table_offsets != nullptr ? std::max(0, t.num_seqs) : 0;
  const int n = num_seqs > 0 ? t.table_offsets[num_seqs] : 0;

  SharedDecodePlan plan;
  plan.shared_parts.assign(num_seqs, 0);
  plan.res_offsets.assign(1, 0);

  // Entries: their sequence, eligibility and key id (keys numbered in order of first reference).
  // Keys are found through the block id: a dense array over the pool's ids (a hash map when the
  // ids are sparse), then a short chain over token counts.
  std::vector<int32_t> seq_of(n), kid(n, -1);
  int32_t max_id = 0;
  for (int e = 0; e < n; ++e) max_id = std::max(max_id, t.block_ids[e]);
  const bool dense = max_id < std::max<int64_t>(int64_t{1} << 20, int64_t{8} * n);
  std::vector<int32_t> head(dense ? static_cast<size_t>(max_id) + 1 : 0, -1);
  std::unordered_map<int32_t, int32_t> head_map;
  std::vector<int32_t> key_tokens, key_next, ref_count;
  const auto find_key = [&](int32_t id, int32_t tokens) {
    int32_t* slot = dense ? &head[id] : &head_map.try_emplace(id, -1).first->second;
    for (int32_t k = *slot; k >= 0; k = key_next[k]) {
      if (key_tokens[k] == tokens) return k;
    }
    const int32_t k = static_cast<int32_t>(key_tokens.size());
    key_tokens.push_back(tokens);
    key_next.push_back(*slot);
    ref_count.push_back(0);
    *slot = k;
    return k;
  };
  for (int s = 0; s < num_seqs; ++s) {
    for (int e = t.table_offsets[s]; e < t.table_offsets[s + 1]; ++e) {
      seq_of[e] = s;
      const int32_t tokens = t.block_tokens[e];
      if (tokens <= 0 || t.block_ids[e] < 0 || static_cast<int64_t>(t.block_starts[e]) + tokens - 1 > t.positions[s]) {
        continue;
      }
      kid[e] = find_key(t.block_ids[e], tokens);
      ++ref_count[kid[e]];
    }
  }
  // Per key, its eligible entries in ascending order (one array, offsets per key).
  const int num_keys = static_cast<int>(key_tokens.size());
  std::vector<int32_t> ref_begin(num_keys + 1, 0), ref_list;
  for (int k = 0; k < num_keys; ++k) ref_begin[k + 1] = ref_begin[k] + ref_count[k];
  ref_list.resize(ref_begin[num_keys]);
  {
    std::vector<int32_t> fill(ref_begin.begin(), ref_begin.end() - 1);
    for (int e = 0; e < n; ++e) {
      if (kid[e] >= 0) ref_list[fill[kid[e]]++] = e;
    }
  }
  struct Refs {
    const int32_t* p;
    size_t n;
    size_t size() const { return n; }
    int32_t operator[](size_t i) const { return p[i]; }
  };
  const auto refs = [&](int32_t k) {
    return Refs{ref_list.data() + ref_begin[k], static_cast<size_t>(ref_begin[k + 1] - ref_begin[k])};
  };
  const auto shared = [&](int e) { return kid[e] >= 0 && ref_count[kid[e]] >= 2; };

  // cont[k]: every reference of key k is followed, in its sequence and at its delta, by a
  // reference of one same key, which has no other references.
  std::vector<char> cont(num_keys, 0);
  for (int k = 0; k < num_keys; ++k) {
    const Refs r = refs(k);
    if (r.size() < 2) continue;
    const auto follows = [&](int e) {
      const int f = e + 1;
      return f < t.table_offsets[seq_of[e] + 1] && shared(f) && t.block_deltas[f] == t.block_deltas[e];
    };
    if (!follows(r[0])) continue;
    const int32_t next = kid[r[0] + 1];
    bool ok = refs(next).size() == r.size();
    for (size_t i = 1; ok && i < r.size(); ++i) ok = follows(r[i]) && kid[r[i] + 1] == next;
    cont[k] = ok;
  }

  std::vector<char> covered(n, 0), done(num_keys, 0);
  for (int e0 = 0; e0 < n; ++e0) {
    if (!shared(e0) || done[kid[e0]]) continue;
    const int32_t first_key = kid[e0];
    const Refs r = refs(first_key);
    // A key whose first reference's predecessor continues into it is inside a run, not its head.
    const int pred = r[0] - 1;
    if (pred >= t.table_offsets[seq_of[r[0]]] && shared(pred) && cont[kid[pred]]) continue;
    int len = 0;
    for (int32_t k = first_key;; k = kid[r[0] + len]) {
      done[k] = 1;
      ++len;
      if (!cont[k] || len >= n) break;
    }
    ++plan.num_runs;
    const EvenCut pieces(len, max_entries), groups(static_cast<int>(r.size()), max_members);
    for (int pi = 0; pi < pieces.pieces; ++pi) {
      const int off = pieces.offset(pi), cnt = pieces.size(pi);
      int64_t piece_tokens = 0;
      for (int i = 0; i < cnt; ++i) piece_tokens += t.block_tokens[r[0] + off + i];
      for (int gi = 0; gi < groups.pieces; ++gi) {
        const int m0 = groups.offset(gi), mc = groups.size(gi);
        SharedWorkItem item;
        item.entry_first = r[m0] + off;
        item.num_entries = cnt;
        item.member_first = static_cast<int32_t>(plan.members.size());
        item.num_members = mc;
        plan.items.push_back(item);
        for (int m = m0; m < m0 + mc; ++m) {
          SharedMember member;
          member.entry_first = r[m] + off;
          member.seq = seq_of[r[m]];
          member.delta = t.block_deltas[member.entry_first];
          member.position = t.positions[member.seq];
          member.part = plan.shared_parts[member.seq]++;
          plan.members.push_back(member);
          for (int i = 0; i < cnt; ++i) covered[member.entry_first + i] = 1;
        }
        plan.item_entries += cnt;
        plan.item_tokens += piece_tokens;
        plan.shared_entry_refs += static_cast<int64_t>(cnt) * mc;
        plan.shared_token_refs += piece_tokens * mc;
      }
    }
  }

  if (options.solo_items) {  // eligible entries referenced once: items of one member
    for (int s = 0; s < num_seqs; ++s) {
      const int end = t.table_offsets[s + 1];
      for (int e = t.table_offsets[s]; e < end;) {
        if (covered[e] || kid[e] < 0) {
          ++e;
          continue;
        }
        int f = e + 1;
        while (f < end && f - e < max_entries && !covered[f] && kid[f] >= 0 && t.block_deltas[f] == t.block_deltas[e]) {
          ++f;
        }
        SharedWorkItem item;
        item.entry_first = e;
        item.num_entries = f - e;
        item.member_first = static_cast<int32_t>(plan.members.size());
        item.num_members = 1;
        plan.items.push_back(item);
        SharedMember member;
        member.seq = s;
        member.entry_first = e;
        member.delta = t.block_deltas[e];
        member.position = t.positions[s];
        member.part = plan.shared_parts[s]++;
        plan.members.push_back(member);
        ++plan.num_solo_items;
        plan.item_entries += f - e;
        for (int i = e; i < f; ++i) {
          covered[i] = 1;
          plan.item_tokens += t.block_tokens[i];
        }
        e = f;
      }
    }
  }

  for (int s = 0; s < num_seqs; ++s) {
    for (int e = t.table_offsets[s]; e < t.table_offsets[s + 1]; ++e) {
      if (covered[e]) continue;
      plan.res_block_ids.push_back(t.block_ids[e]);
      plan.res_block_tokens.push_back(t.block_tokens[e]);
      plan.res_block_deltas.push_back(t.block_deltas[e]);
      plan.res_block_starts.push_back(t.block_starts[e]);
    }
    plan.res_offsets.push_back(static_cast<int32_t>(plan.res_block_ids.size()));
    plan.max_residual_entries = std::max(plan.max_residual_entries, plan.res_offsets[s + 1] - plan.res_offsets[s]);
    plan.max_shared_parts = std::max(plan.max_shared_parts, plan.shared_parts[s]);
  }
  return plan;
}

}  // namespace lazykv::cuda
