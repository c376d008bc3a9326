#include "bench/device_sink.h"

namespace lazykv::bench {

absl::StatusOr<std::unique_ptr<DeviceSink>> DeviceSink::Create(size_t, bool) {
  return absl::UnimplementedError("--device: this build has no CUDA");
}

}  // namespace lazykv::bench
