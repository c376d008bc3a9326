#include "worker/cli/run_command.h"

#include <fstream>
#include <functional>
#include <iostream>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"
#include "worker/model_setup.h"
#include "worker/request_json.h"

namespace lazykv {
namespace {

constexpr char kUsage[] = R"(usage: lazykv run --model PATH|synthetic:NAME [options]
  --tokenizer PATH       llama2.c tokenizer.bin or SentencePiece .model
  --doc TEXT             a retrieved document (repeatable, in order)
  --prompt TEXT          the question after the documents
  --requests FILE        JSON lines {"docs": [...], "prompt": "...", "max_tokens": N, ...}
  --mode MODE            none | prefix | block | lazy (default lazy)
  --max-tokens N         tokens to generate (default 64)
  --temperature T        0 is greedy (default 0)
  --top-p P              nucleus sampling mass (default 1)
  --seed S               sampling seed (default 0)
  --block-size N         KV block size in tokens (default 16)
  --kv-pool-mib N        KV pool size (default 256)
  --json                 one JSON object per request on stdout
)";

struct RunFlags {
  ModelSetupOptions setup;
  GenerateRequest defaults;
  std::vector<std::string> docs;
  std::string prompt;
  std::string requests_file;
  bool json = false;
};

absl::Status ParseFlags(int argc, char** argv, RunFlags& flags) {
  auto number = [](const std::string& flag, const std::string& text, auto* out) -> absl::Status {
    bool ok;
    if constexpr (std::is_floating_point_v<std::remove_pointer_t<decltype(out)>>) {
      ok = absl::SimpleAtof(text, out);
    } else {
      ok = absl::SimpleAtoi(text, out);
    }
    return ok ? absl::OkStatus()
              : absl::InvalidArgumentError(absl::StrFormat("%s: '%s' is not a valid number", flag, text));
  };
  uint64_t pool_mib = flags.setup.kv_pool_bytes >> 20;
  const std::map<std::string, std::function<absl::Status(const std::string&)>> with_value = {
      {"--model", [&](const std::string& v) { flags.setup.model = v; return absl::OkStatus(); }},
      {"--tokenizer", [&](const std::string& v) { flags.setup.tokenizer = v; return absl::OkStatus(); }},
      {"--doc", [&](const std::string& v) { flags.docs.push_back(v); return absl::OkStatus(); }},
      {"--prompt", [&](const std::string& v) { flags.prompt = v; return absl::OkStatus(); }},
      {"--requests", [&](const std::string& v) { flags.requests_file = v; return absl::OkStatus(); }},
      {"--mode", [&](const std::string& v) -> absl::Status {
         ASSIGN_OR_RETURN(flags.setup.engine.mode, ParseAttentionMode(v));
         return absl::OkStatus();
       }},
      {"--max-tokens", [&](const std::string& v) { return number("--max-tokens", v, &flags.defaults.sampling.max_tokens); }},
      {"--temperature", [&](const std::string& v) { return number("--temperature", v, &flags.defaults.sampling.temperature); }},
      {"--top-p", [&](const std::string& v) { return number("--top-p", v, &flags.defaults.sampling.top_p); }},
      {"--seed", [&](const std::string& v) { return number("--seed", v, &flags.defaults.sampling.seed); }},
      {"--block-size", [&](const std::string& v) { return number("--block-size", v, &flags.setup.block_size); }},
      {"--kv-pool-mib", [&](const std::string& v) { return number("--kv-pool-mib", v, &pool_mib); }},
  };
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--json") {
      flags.json = true;
      continue;
    }
    if (arg == "--help" || arg == "-h") return absl::CancelledError(kUsage);
    std::string value;
    bool has_value = false;
    if (const size_t eq = arg.find('='); arg.starts_with("--") && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    auto it = with_value.find(arg);
    if (it == with_value.end()) return absl::InvalidArgumentError(absl::StrFormat("unknown flag %s\n%s", arg, kUsage));
    if (!has_value) {
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrFormat("%s needs a value", arg));
      value = argv[++i];
    }
    RETURN_IF_ERROR(it->second(value));
  }
  if (flags.setup.model.empty()) return absl::InvalidArgumentError(absl::StrFormat("--model is required\n%s", kUsage));
  flags.setup.kv_pool_bytes = pool_mib << 20;
  return flags.defaults.sampling.Validate();
}

absl::StatusOr<std::vector<GenerateRequest>> BuildRequests(const RunFlags& flags, const Tokenizer& tokenizer) {
  std::vector<GenerateRequest> requests;
  if (flags.requests_file.empty()) {
    GenerateRequest request = flags.defaults;
    for (const std::string& doc : flags.docs) request.docs.push_back(tokenizer.Encode(doc));
    request.prompt = tokenizer.Encode(flags.prompt);
    requests.push_back(std::move(request));
    return requests;
  }
  std::ifstream in(flags.requests_file);
  if (!in) return absl::NotFoundError(absl::StrFormat("cannot open --requests file %s", flags.requests_file));
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      return absl::InvalidArgumentError(absl::StrFormat("%s:%d: not valid JSON", flags.requests_file, line_no));
    }
    auto request = ParseRequestJson(j, tokenizer, flags.defaults);
    if (!request.ok()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s:%d: %s", flags.requests_file, line_no, request.status().message()));
    }
    requests.push_back(*std::move(request));
  }
  return requests;
}

void PrintHuman(size_t index, const GenerateRequest& request, const GenerateResult& result, const Tokenizer& tokenizer) {
  const Usage& u = result.usage;
  const double decode_seconds = result.total_seconds - result.ttft_seconds;
  std::cout << absl::StrFormat(
      "[%d] mode=%s docs=%d prompt_tokens=%d cached=%d computed=%d chunks(hit=%d miss=%d) kv_copied=%dB "
      "ttft=%.2fms decode=%.0f tok/s\n",
      index, AttentionModeName(result.mode), request.docs.size(), u.prompt_tokens, u.cached_tokens, u.computed_tokens,
      u.chunk_hits, u.chunk_misses, u.kv_bytes_copied, result.ttft_seconds * 1e3,
      result.tokens.size() > 1 && decode_seconds > 0 ? (result.tokens.size() - 1) / decode_seconds : 0.0);
  std::cout << "    " << DecodeContinuation(tokenizer, result.prompt_token_ids, result.tokens) << "\n";
}

}  // namespace

int RunCommand(int argc, char** argv) {
  RunFlags flags;
  if (absl::Status s = ParseFlags(argc, argv, flags); !s.ok()) {
    std::cerr << s.message() << "\n";
    return absl::IsCancelled(s) ? 0 : 2;
  }
  if (flags.json) spdlog::set_level(spdlog::level::warn);
  auto loaded = SetUpEngine(flags.setup);
  if (!loaded.ok()) {
    std::cerr << "lazykv: " << loaded.status().message() << "\n";
    return 1;
  }
  auto requests = BuildRequests(flags, *loaded->tokenizer);
  if (!requests.ok()) {
    std::cerr << "lazykv: " << requests.status().message() << "\n";
    return 2;
  }
  for (size_t i = 0; i < requests->size(); ++i) {
    const GenerateRequest& request = (*requests)[i];
    auto result = loaded->engine->Generate(request);
    if (!result.ok()) {
      std::cerr << absl::StrFormat("lazykv: request %d: %s\n", i + 1, result.status().ToString());
      return 1;
    }
    if (flags.json) {
      std::cout << ResultToJson(request, *result, *loaded->tokenizer).dump() << "\n";
    } else {
      PrintHuman(i + 1, request, *result, *loaded->tokenizer);
    }
  }
  return 0;
}

}  // namespace lazykv
