// The flags shared by every program that builds an engine (`lazykv run`,
// `lazykv-worker`): the model, the KV pool, the attention mode and the cache tier.
#pragma once

#include <string>

#include "common/flag_parser.h"
#include "worker/setup/model_setup.h"

namespace lazykv {

// Usage lines for the flags below, to paste into a program's usage text.
std::string ModelSetupUsage();

struct ModelSetupFlags {
  ModelSetupOptions setup;
  bool no_cache_tier = false;
};

void AddModelSetupFlags(FlagParser& parser, ModelSetupFlags& flags);
// After parsing: checks --model and fills in what the flags imply; `holder` names this
// process in the cache tier's lease logs.
absl::Status FinishModelSetupFlags(ModelSetupFlags& flags, const std::string& holder);

}  // namespace lazykv
