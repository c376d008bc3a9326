// `lazykv generate --server HOST:PORT`: one request to a running lazykv-worker, its
// reply streamed to the terminal as it is generated.
#pragma once

namespace lazykv {

int GenerateCommand(int argc, char** argv);  // argv[0] is "generate"

}  // namespace lazykv
