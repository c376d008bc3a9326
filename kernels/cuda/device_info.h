// Facts about the current CUDA device that launchers ask on every call, cached per device.
#pragma once

namespace lazykv::cuda {

// The current device's SM count, asked of the driver once per device (132 if unknown).
int MultiprocessorCount();

}  // namespace lazykv::cuda
