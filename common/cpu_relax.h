// A hint to the CPU inside a busy-wait loop (x86 PAUSE, ARM YIELD): the spinning thread yields
// pipeline resources to its sibling hyperthread and does not flood the memory system, while
// its core stays awake (no halt, so no wake-up latency when the awaited write lands).
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace lazykv {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__) || defined(__arm__)
  __asm__ __volatile__("yield");
#endif
}

}  // namespace lazykv
