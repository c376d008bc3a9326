#include "worker/cli/run_command.h"

#include <unistd.h>

#include <fstream>
#include <functional>
#include <iostream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/flag_parser.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"
#include "worker/cli/request_json.h"
#include "worker/setup/model_setup_flags.h"
#include "worker/tokenizer/text_stream.h"

namespace lazykv {
namespace {

constexpr char kUsage[] = R"(usage: lazykv run --model PATH|synthetic:NAME [options]
  --doc TEXT             a retrieved document (repeatable, in order)
  --prompt TEXT          the question after the documents
  --requests FILE        JSON lines {"docs": [...], "prompt": "...", "max_tokens": N, ...}
  --max-tokens N         tokens to generate (default 64)
  --temperature T        0 is greedy (default 0)
  --top-p P              nucleus sampling mass (default 1)
  --seed S               sampling seed (default: a fresh one per request, printed)
  --json                 one JSON object per request on stdout
)";

struct RunFlags {
  ModelSetupFlags model;
  GenerateRequest defaults;
  std::vector<std::string> docs;
  std::string prompt;
  std::string requests_file;
  bool json = false;
};

absl::Status ParseFlags(int argc, char** argv, RunFlags& flags) {
  FlagParser parser(absl::StrCat(kUsage, ModelSetupUsage()));
  AddModelSetupFlags(parser, flags.model);
  parser.Add("--doc", [&](const std::string& v) {
    flags.docs.push_back(v);
    return absl::OkStatus();
  });
  parser.AddString("--prompt", &flags.prompt);
  parser.AddString("--requests", &flags.requests_file);
  parser.AddInt("--max-tokens", &flags.defaults.sampling.max_tokens);
  parser.AddFloat("--temperature", &flags.defaults.sampling.temperature);
  parser.AddFloat("--top-p", &flags.defaults.sampling.top_p);
  parser.AddUint64("--seed", &flags.defaults.sampling.seed);
  parser.AddSwitch("--json", &flags.json);
  RETURN_IF_ERROR(parser.Parse(argc, argv));
  if (absl::Status s = FinishModelSetupFlags(flags.model, absl::StrFormat("lazykv-run-%d", getpid())); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(s.message(), "\n", parser.usage()));
  }
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

void PrintHuman(size_t index, const GenerateRequest& request, const GenerateResult& result,
                const Tokenizer& tokenizer) {
  const Usage& u = result.usage;
  const double decode_seconds = result.total_seconds - result.ttft_seconds;
  std::cout << absl::StrFormat(
      "[%d] mode=%s docs=%d prompt_tokens=%d cached=%d (pool=%d host=%d disk=%d remote=%d) computed=%d "
      "chunks(hit=%d miss=%d recomputed=%d) kv_copied=%dB "
      "ttft=%.2fms decode=%.0f tok/s\n",
      index, AttentionModeName(result.mode), request.docs.size(), u.prompt_tokens, u.cached_tokens, u.pool_tokens,
      u.host_tokens, u.disk_tokens, u.remote_tokens, u.computed_tokens, u.chunk_hits, u.chunk_misses,
      u.chunk_recomputes, u.kv_bytes_copied, result.ttft_seconds * 1e3,
      result.tokens.size() > 1 && decode_seconds > 0 ? (result.tokens.size() - 1) / decode_seconds : 0.0);
  if (request.sampling.temperature > 0) std::cout << absl::StrFormat("    sampled with seed %d\n", result.seed);
  std::cout << "    " << ReplyText(tokenizer, result.prompt_token_ids, result.tokens) << "\n";
}

}  // namespace

int RunCommand(int argc, char** argv) {
  RunFlags flags;
  if (absl::Status s = ParseFlags(argc, argv, flags); !s.ok()) {
    std::cerr << s.message() << "\n";
    return absl::IsCancelled(s) ? 0 : 2;
  }
  if (flags.json) spdlog::set_level(spdlog::level::warn);
  auto loaded = SetUpEngine(flags.model.setup);
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
      std::cout << ResultToJsonLine(request, *result, *loaded->tokenizer) << "\n";
    } else {
      PrintHuman(i + 1, request, *result, *loaded->tokenizer);
    }
  }
  // Pending publications reach the cache tier before the process ends.
  if (ChunkPipeline* pipeline = loaded->engine->pipeline()) {
    pipeline->Flush();
    spdlog::info("chunk pipeline: {}", FormatPipelineStats(pipeline->stats()));
  }
  return 0;
}

}  // namespace lazykv
