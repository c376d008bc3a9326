#include "worker/engine/kv_sequence.h"

#include <cstdlib>

#include "spdlog/spdlog.h"

namespace lazykv {

void KvSequence::AbortFillWithoutOwnTail() {
  spdlog::critical("KvSequence::FillTailSlot with no own tail block");
  std::abort();  // writing into a shared chunk block would corrupt every request using it
}

}  // namespace lazykv
