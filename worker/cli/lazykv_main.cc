// The `lazykv` command: subcommands over the engine.
#include <iostream>
#include <string>

#include "common/malloc_tuning.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"
#include "worker/cli/generate_command.h"
#include "worker/cli/run_command.h"

int main(int argc, char** argv) {
  // Logs go to stderr so that stdout carries only results (JSON lines with --json).
  spdlog::set_default_logger(spdlog::stderr_color_mt("lazykv"));
  lazykv::TuneMallocForLargeBuffers();
  const std::string command = argc > 1 ? argv[1] : "";
  if (command == "run") return lazykv::RunCommand(argc - 1, argv + 1);
  if (command == "generate") return lazykv::GenerateCommand(argc - 1, argv + 1);
  std::cerr << "usage: lazykv run --model PATH|synthetic:NAME [options]       offline, in this process\n"
               "       lazykv generate --server HOST:PORT --prompt TEXT [...]  from a running lazykv-worker\n"
               "(lazykv COMMAND --help for the options)\n";
  return command.empty() || command == "--help" || command == "-h" ? 0 : 2;
}
