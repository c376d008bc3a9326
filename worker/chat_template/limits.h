// The bounds one chat-template render keeps: a template is configuration, but a render
// runs on request data, so a loop or a string that grows without end stops with an error
// instead of taking the worker's memory or time.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lazykv::jinja {

struct RenderLimits {
  // Bytes of output, and of any one string a template builds: beyond it the render is
  // RESOURCE_EXHAUSTED.
  size_t max_output_bytes = size_t{16} << 20;
  // Loop iterations over the whole render (all loops together), and items of any one list
  // (range(), list + list, list * n): beyond it RESOURCE_EXHAUSTED.
  int64_t max_iterations = 1 << 20;
  // Nested macro calls: beyond it RESOURCE_EXHAUSTED.
  int max_call_depth = 16;
};

}  // namespace lazykv::jinja
