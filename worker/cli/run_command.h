// `lazykv run`: the offline CLI. One engine serves the given requests in order, so reuse
// across requests shows in their usage.
#pragma once

namespace lazykv {

int RunCommand(int argc, char** argv);  // argv[0] is "run"

}  // namespace lazykv
