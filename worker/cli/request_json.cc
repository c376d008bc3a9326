#include "worker/cli/request_json.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/tokenizer/text_stream.h"

namespace lazykv {
namespace {

using nlohmann::json;

// `value` as a T. nlohmann's get<T>() converts a number T cannot hold with a plain cast:
// undefined behaviour for a float (e.g. "seed": 1e30), a silent wrap for an integer (an id
// of 2^32 + 1 would become 1). Such numbers are refused; other values convert as get<T>()
// does (a float in range is truncated; a string throws json::type_error).
template <typename T>
absl::StatusOr<T> NumberAs(const json& value, const std::string& field) {
  bool in_range = true;
  if (value.is_number_unsigned()) {
    in_range = std::in_range<T>(value.get<uint64_t>());
  } else if (value.is_number_integer()) {
    in_range = std::in_range<T>(value.get<int64_t>());
  } else if (value.is_number_float()) {  // truncated toward zero, so (min - 1, max + 1)
    const double v = value.get<double>();
    in_range = v > static_cast<double>(std::numeric_limits<T>::min()) - 1.0 &&
               v < static_cast<double>(std::numeric_limits<T>::max()) + 1.0;
  }
  if (!in_range) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", value.dump(), " is out of range [",
                                                   std::numeric_limits<T>::min(), ", ", std::numeric_limits<T>::max(),
                                                   "]"));
  }
  return value.get<T>();
}

absl::StatusOr<std::vector<int32_t>> TokensOf(const json& value, const Tokenizer& tokenizer, const std::string& field) {
  if (value.is_string()) return tokenizer.Encode(value.get<std::string>());
  if (value.is_array()) {
    std::vector<int32_t> ids;
    for (const json& id : value) {
      if (!id.is_number_integer())
        return absl::InvalidArgumentError(absl::StrCat(field, ": token ids must be integers"));
      ASSIGN_OR_RETURN(const int32_t checked, NumberAs<int32_t>(id, field));
      ids.push_back(checked);
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
        ASSIGN_OR_RETURN(request.sampling.max_tokens, NumberAs<int>(value, "max_tokens"));
      } else if (key == "temperature") {
        request.sampling.temperature = value.get<float>();
      } else if (key == "top_p") {
        request.sampling.top_p = value.get<float>();
      } else if (key == "seed") {
        ASSIGN_OR_RETURN(request.sampling.seed, NumberAs<uint64_t>(value, "seed"));
      } else if (key == "mode") {
        ASSIGN_OR_RETURN(request.mode, ParseAttentionMode(value.get<std::string>()));
      } else if (key == "repair_tokens") {
        ASSIGN_OR_RETURN(request.repair_tokens, NumberAs<int>(value, "repair_tokens"));
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
      {"text", ReplyText(tokenizer, result.prompt_token_ids, result.tokens)},
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
        {"repaired_tokens", u.repaired_tokens},
        {"kv_bytes_copied", u.kv_bytes_copied},
        {"kv_bytes_fetched", u.kv_bytes_fetched},
        {"host_bytes_fetched", u.host_bytes_fetched},
        {"disk_bytes_fetched", u.disk_bytes_fetched},
        {"remote_bytes_fetched", u.remote_bytes_fetched}}},
      {"timing", {{"ttft_ms", result.ttft_seconds * 1e3}, {"total_ms", result.total_seconds * 1e3}}},
  };
}

std::string ResultToJsonLine(const GenerateRequest& request, const GenerateResult& result, const Tokenizer& tokenizer) {
  return ResultToJson(request, result, tokenizer).dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace lazykv
