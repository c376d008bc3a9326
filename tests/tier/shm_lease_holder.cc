// A worker stand-in for shm_transport_test: fetches the given chunks from one cache server
// over the same-host transport, holds them (and so their read leases), prints
// "holding N" on stdout, and waits to be killed. Exits 1 if a fetch fails.
//   shm_lease_holder HOST:PORT KEY_HEX...
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <vector>

#include "worker/tier/remote_chunk_tier.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: shm_lease_holder HOST:PORT KEY_HEX...\n");
    return 2;
  }
  spdlog::set_default_logger(spdlog::stderr_color_mt("holder"));  // stdout is for the "holding" line
  lazykv::RemoteTierOptions options;
  options.servers = {argv[1]};
  options.holder = "shm_lease_holder";
  options.initial_call_deadline = std::chrono::seconds(2);
  options.transport = lazykv::FetchTransport::kShm;
  auto tier = lazykv::RemoteChunkTier::Create(options);
  if (!tier.ok()) return 1;
  std::vector<lazykv::FetchedChunk> held;
  for (int i = 2; i < argc; ++i) {
    auto key = lazykv::Hash128::FromHex(argv[i]);
    if (!key.ok()) return 2;
    auto fetched = (*tier)->Fetch(*key);
    if (!fetched.ok()) {
      std::printf("error fetching %s: %s\n", argv[i], std::string(fetched.status().message()).c_str());
      std::fflush(stdout);
      return 1;
    }
    held.push_back(*std::move(fetched));
  }
  std::printf("holding %zu\n", held.size());
  std::fflush(stdout);
  while (true) pause();
}
