// One entry of a sequence's KV block table (DESIGN.md section 2). The rotation delta
// belongs to the reference, not to the physical block: one physical chunk block is
// shared by many requests, each placing it at its own logical position.
#pragma once

#include <cstdint>

namespace lazykv {

struct KvBlockRef {
  int32_t block = 0;       // physical block id in the pool
  int32_t num_tokens = 0;  // valid slots, filled from slot 0
  int32_t delta = 0;       // logical position minus the position its keys were rotated at
};

}  // namespace lazykv
