#include "worker/cli/request_json.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace lazykv {
namespace {

using nlohmann::json;

absl::StatusOr<std::vector<int32_t>> TokensOf(const json& value, const Tokenizer& tokenizer, const std::string& field) {
  if (value.is_string()) return tokenizer.Encode(value.get<std::string>());
  if (value.is_array()) {
    std::vector<int32_t> ids;
    for (const json& id : value) {
      if (!id.is_number_integer())
        return absl::InvalidArgumentError(absl::StrCat(field, ": token ids must be integers"));
      ids.push_back(id.get<int32_t>());
    }
    return ids;
  }
  return absl::InvalidArgumentError(absl::StrCat(field, ": expected text or a list of token ids"));
}

}  // namespace

absl::StatusOr<GenerateRequest> ParseRequestJson(const json& j, const Tokenizer& tokenizer,
                                                 const GenerateRequest& defaults) {
  if (!j.is_object()) return absl::InvalidArgumentError("request must be a JSON object");
  GenerateRequest request = defaults;
  try {
    for (auto& [key, value] : j.items()) {
      if (key == "docs") {
        if (!value.is_array()) return absl::InvalidArgumentError("docs: expected a list");
        request.docs.clear();
        for (size_t d = 0; d < value.size(); ++d) {
          ASSIGN_OR_RETURN(auto ids, TokensOf(value[d], tokenizer, absl::StrCat("docs[", d, "]")));
          request.docs.push_back(std::move(ids));
        }
      } else if (key == "prompt") {
        ASSIGN_OR_RETURN(request.prompt, TokensOf(value, tokenizer, "prompt"));
      } else if (key == "max_tokens") {
        request.sampling.max_tokens = value.get<int>();
      } else if (key == "temperature") {
        request.sampling.temperature = value.get<float>();
      } else if (key == "top_p") {
        request.sampling.top_p = value.get<float>();
      } else if (key == "seed") {
        request.sampling.seed = value.get<uint64_t>();
      } else if (key == "mode") {
        ASSIGN_OR_RETURN(request.mode, ParseAttentionMode(value.get<std::string>()));
      } else {
        return absl::InvalidArgumentError(absl::StrCat("unknown field '", key, "'"));
      }
    }
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("bad field type: ", e.what()));
  }
  return request;
}

json ResultToJson(const GenerateRequest& request, const GenerateResult& result, const Tokenizer& tokenizer) {
  const Usage& u = result.usage;
  return json{
      {"mode", AttentionModeName(result.mode)},
      {"prompt_token_ids", result.prompt_token_ids},
      {"doc_token_ids", request.docs},
      {"tokens", result.tokens},
      {"logprobs", result.logprobs},
      {"text", DecodeContinuation(tokenizer, result.prompt_token_ids, result.tokens)},
      {"finish_reason", result.finish_reason},
      {"seed", result.seed},
      {"usage",
       {{"prompt_tokens", u.prompt_tokens},
        {"cached_tokens", u.cached_tokens},
        {"computed_tokens", u.computed_tokens},
        {"pool_tokens", u.pool_tokens},
        {"host_tokens", u.host_tokens},
        {"disk_tokens", u.disk_tokens},
        {"remote_tokens", u.remote_tokens},
        {"completion_tokens", result.tokens.size()},
        {"chunk_hits", u.chunk_hits},
        {"cached_documents", u.cached_documents},
        {"chunk_misses", u.chunk_misses},
        {"chunk_recomputes", u.chunk_recomputes},
        {"recomputed_tokens", u.recomputed_tokens},
        {"kv_bytes_copied", u.kv_bytes_copied},
        {"kv_bytes_fetched", u.kv_bytes_fetched},
        {"host_bytes_fetched", u.host_bytes_fetched},
        {"disk_bytes_fetched", u.disk_bytes_fetched},
        {"remote_bytes_fetched", u.remote_bytes_fetched}}},
      {"timing", {{"ttft_ms", result.ttft_seconds * 1e3}, {"total_ms", result.total_seconds * 1e3}}},
  };
}

}  // namespace lazykv
