// JSON form of generate requests and results (the CLI's --requests lines and --json
// output). Documents and prompts may be text or lists of token ids.
#pragma once

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "worker/engine/engine.h"
#include "worker/tokenizer/tokenizer.h"

namespace lazykv {

// Parses {"docs": [...], "prompt": ..., "max_tokens": N, "temperature": T, "top_p": P,
// "seed": S, "mode": M}; absent fields take `defaults`. Unknown fields are errors.
absl::StatusOr<GenerateRequest> ParseRequestJson(const nlohmann::json& j, const Tokenizer& tokenizer,
                                                 const GenerateRequest& defaults);

nlohmann::json ResultToJson(const GenerateRequest& request, const GenerateResult& result, const Tokenizer& tokenizer);
// ResultToJson as one line of valid JSON: text that is not valid UTF-8 (a generation that
// ends inside a multi-byte character, or a lone byte-fallback token) has those bytes
// replaced by U+FFFD; the exact output stays in "tokens".
std::string ResultToJsonLine(const GenerateRequest& request, const GenerateResult& result, const Tokenizer& tokenizer);

}  // namespace lazykv
