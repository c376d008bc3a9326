// The rounds of the lazy prefill CTAs' 32-way search (lazy_prefill_cta.cuh, FirstEntryPast):
// the first block-table entry of a range, in logical order, whose start is past a position,
// found by one warp that reads 32 evenly spaced entries a round (one load a lane) instead of a
// binary search's chain of dependent loads: two rounds up to 1024 entries. The rounds'
// arithmetic is here, for host and device alike, so that the CPU test
// (tests/kernels/entry_search_test.cc) checks it against std::upper_bound.
#pragma once

#if defined(__CUDACC__)
#define LAZYKV_ENTRY_SEARCH_FN __host__ __device__ inline
#else
#define LAZYKV_ENTRY_SEARCH_FN inline
#endif

namespace lazykv::cuda {

// A search over [lo, hi) for the first entry whose predicate ("past") holds, the predicate
// being false then true along the range (entries at or past hi count as past). Each round, lane
// i (0..31) evaluates entry Probe(i); Next takes the lowest lane whose entry was past.
struct EntrySearchRound {
  int lo = 0, hi = 0;

  // Probes lo, lo + step, ..., lo + 31 step cover [lo, hi); step 1 in the last round.
  LAZYKV_ENTRY_SEARCH_FN int Step() const {
    const int step = (hi - lo + 31) / 32;
    return step > 1 ? step : 1;
  }
  LAZYKV_ENTRY_SEARCH_FN int Probe(int lane) const { return lo + lane * Step(); }

  // Whether lane's probe is past `pos`: at or beyond hi (then never loaded), or its entry's
  // start, load_start(index), greater than pos.
  template <typename LoadStart>
  LAZYKV_ENTRY_SEARCH_FN bool ProbeIsPast(int lane, int pos, LoadStart load_start) const {
    const int idx = Probe(lane);
    return idx >= hi || load_start(idx) > pos;
  }

  // The lowest lane set in a ballot of ProbeIsPast, 32 when none: Next's argument.
  static LAZYKV_ENTRY_SEARCH_FN int FirstLane(unsigned mask) {
#if defined(__CUDA_ARCH__)
    return mask != 0 ? __ffs(static_cast<int>(mask)) - 1 : 32;
#else
    return mask != 0 ? __builtin_ctz(mask) : 32;
#endif
  }

  // first_past: the lowest lane whose probe was past, 32 when none. True with *answer set once
  // the search has ended; otherwise [lo, hi) is narrowed to what the next round must probe.
  LAZYKV_ENTRY_SEARCH_FN bool Next(int first_past, int* answer) {
    const int step = Step();
    if (step == 1) {
      *answer = first_past < 32 ? lo + first_past : hi;
      return true;
    }
    if (first_past == 0) {
      *answer = lo;
      return true;
    }
    // The answer is past probe first_past - 1 (not past) and at most probe first_past (past,
    // or hi when no probe was).
    const int probe_past = lo + first_past * step;
    hi = probe_past < hi ? probe_past : hi;
    lo = lo + (first_past - 1) * step + 1;
    return false;
  }
};

}  // namespace lazykv::cuda

#undef LAZYKV_ENTRY_SEARCH_FN
