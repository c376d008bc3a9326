// The order of a persistent prefill launch's work tiles (lazy_prefill_cta.cuh, WorkList), for
// host and device alike, so that the CPU test (tests/kernels/prefill_work_order_test.cc) checks
// that the list holds every work tile once, heaviest groups first.
//
// The list runs from the query tiles with the most causal keys (every sequence's last tiles) to
// those with the fewest, in groups of `group` query tiles. A query tile is counted from its own
// sequence's last (`from_last`; MakeWork turns it into the tile), so that sequences of different
// lengths have their last tiles in the first group alike (counted from the longest sequence's
// last, a question's one tile over 4k cached keys, the launch's longest KV loop, came last of
// all beside documents' tiles). The split stays static: within a group the sequences go in
// order, so heavy tiles of later sequences can still gather on a few CTAs
// (bench/results/prefill_schedule_2026-11-29.md).
// Within a group, index i is head group i % heads, then from_last, then sequence-and-split; the
// groups go from from_last 0 up, and the last group holds tiles % group when that is not 0.
// CTA b of a persistent grid takes indices b, b + gridDim.x, ...
//
// Why groups: the CTAs that run at once (about one grid's worth of consecutive indices) should
// read the same sequence's keys and values, so that L2 serves most of their loads. With the
// sequence inside the query tile (group 1), 132 CTAs at 4k keys and 4 sequences ran 32 KV heads
// of four sequences at once (64 MB, more than L2) and their keys arrived later than the one-tile
// kernel's, whose grid runs head, query tile, then sequence
// (bench/results/prefill_order_2026-11-28.md).
#pragma once

#include <algorithm>

#if defined(__CUDACC__)
#define LAZYKV_WORK_ORDER_FN __host__ __device__ inline
#else
#define LAZYKV_WORK_ORDER_FN inline
#endif

namespace lazykv::cuda {

struct PrefillWorkOrder {
  int heads = 0;              // head groups (n_heads / pack)
  int tiles = 0;              // query tiles per sequence
  int seqs = 0;               // sequences times splits
  int group = 1;              // query tiles per group (1 .. tiles)
  int full_groups_count = 0;  // the indices in whole groups: heads * group * seqs * (tiles / group)
  int count = 0;              // heads * tiles * seqs
};

// A work tile's coordinates: head group, query tile counted from the sequence's last (0: its
// last; inactive where the sequence has fewer tiles), sequence * splits + split.
struct PrefillWorkCoords {
  int hx, from_last, sz;
};

// The order of heads * tiles * seqs work tiles (all >= 1; tiles: the longest sequence's) for a grid of `ctas` CTAs:
// groups of about one grid's worth of work tiles. Precondition: heads * tiles * seqs fits an int (the launcher checks
// it).
inline PrefillWorkOrder MakePrefillWorkOrder(int heads, int tiles, int seqs, long long ctas) {
  PrefillWorkOrder o;
  o.heads = heads;
  o.tiles = tiles;
  o.seqs = seqs;
  o.group = static_cast<int>(std::clamp<long long>(ctas / heads, 1, tiles));
  o.full_groups_count = heads * o.group * seqs * (tiles / o.group);
  o.count = heads * tiles * seqs;
  return o;
}

// The work tile at list index `index` (0 <= index < o.count).
LAZYKV_WORK_ORDER_FN PrefillWorkCoords PrefillWorkAt(const PrefillWorkOrder& o, int index) {
  int group = o.group, first_from_last = 0;  // this group's size and its first tile, from the last
  if (index >= o.full_groups_count) {
    index -= o.full_groups_count;
    group = o.tiles % o.group;
    first_from_last = o.tiles - group;
  }
  const int hx = index % o.heads, rest = index / o.heads;
  const int in_group = rest % group, rest2 = rest / group;
  const int from_last = first_from_last + (rest2 / o.seqs) * group + in_group;
  return PrefillWorkCoords{hx, from_last, rest2 % o.seqs};
}

}  // namespace lazykv::cuda
