// The offline CLI as a user runs it: a requests file through one engine, JSON out.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace lazykv::testing {
namespace {

struct Output {
  int exit_code;
  std::string out;
};

// Each call gets a fresh embedded cache tier unless `cache_dir` names one to share.
Output RunCli(const std::string& args, const std::string& cache_dir = "") {
  const std::string dir =
      cache_dir.empty()
          ? (std::filesystem::temp_directory_path() / ("lazykv_cli_cache_" + std::to_string(FreshSeed()))).string()
          : cache_dir;
  const std::string command = "LAZYKV_CACHE_DIR=" + dir + " " + std::string(LAZYKV_CLI) + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  std::string out;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) out.append(buffer, n);
  const int status = pclose(pipe);
  if (cache_dir.empty()) std::filesystem::remove_all(dir);
  return {WEXITSTATUS(status), out};
}

std::vector<nlohmann::json> JsonLines(const std::string& out) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] == '{') lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

TEST(CliTest, RequestsFileShowsLazyReuseAcrossReorderedDocuments) {
  if (!HaveModel("stories260K.bin") || !HaveModel("tok512.bin")) GTEST_SKIP() << "no ../shared/models";
  const std::string requests =
      (std::filesystem::temp_directory_path() / ("requests_" + std::to_string(FreshSeed()) + ".jsonl")).string();
  {
    std::ofstream out(requests);
    out << R"({"docs": ["Lily had a red ball.", "Tom liked to run fast."], "prompt": "One day", "max_tokens": 8})"
        << "\n";
    out << R"({"docs": ["Tom liked to run fast.", "Lily had a red ball."], "prompt": "Then", "max_tokens": 8, "temperature": 0.8, "seed": 3})"
        << "\n";
  }
  const Output run = RunCli("run --model " + ModelPath("stories260K.bin") + " --tokenizer " + ModelPath("tok512.bin") +
                            " --mode lazy --json --requests " + requests);
  std::filesystem::remove(requests);
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const auto lines = JsonLines(run.out);
  ASSERT_EQ(lines.size(), 2u) << run.out;
  for (const auto& j : lines) {
    for (const char* field : {"prompt_token_ids", "doc_token_ids", "tokens", "logprobs", "text", "usage"}) {
      EXPECT_TRUE(j.contains(field)) << field;
    }
    EXPECT_EQ(j["tokens"].size(), j["logprobs"].size());
    EXPECT_EQ(j["prompt_token_ids"][0], 1);  // the anchor
    const auto& u = j["usage"];
    EXPECT_EQ(u["cached_tokens"].get<int>() + u["computed_tokens"].get<int>(), u["prompt_tokens"].get<int>());
    EXPECT_EQ(u["prompt_tokens"].get<size_t>(), j["prompt_token_ids"].size());
  }
  const int doc_tokens = lines[1]["doc_token_ids"][0].size() + lines[1]["doc_token_ids"][1].size();
  EXPECT_EQ(lines[0]["usage"]["cached_tokens"], 0);
  EXPECT_EQ(lines[1]["usage"]["cached_tokens"], 1 + doc_tokens);
}

TEST(CliTest, EmbeddedCacheTierServesTheNextProcessFromDisk) {
  if (!HaveModel("stories260K.bin") || !HaveModel("tok512.bin")) GTEST_SKIP() << "no ../shared/models";
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("lazykv_cli_shared_" + std::to_string(FreshSeed()))).string();
  const std::string model = " --model " + ModelPath("stories260K.bin") + " --tokenizer " + ModelPath("tok512.bin");
  const std::string docs = " --doc 'Lily had a red ball.' --doc 'Tom liked to run fast.' --max-tokens 12 --json";
  const Output first = RunCli("run" + model + docs + " --prompt 'One day'", dir);
  // Always fetch: this test is about what the tier keeps (with auto, an unmeasured source
  // serves one chunk while the others are computed; chunk_pipeline_test covers that).
  const Output second = RunCli("run" + model + docs + " --prompt 'One day' --fetch-policy always", dir);
  const Output alone = RunCli("run" + model + docs + " --prompt 'One day' --no-cache-tier");
  std::filesystem::remove_all(dir);
  ASSERT_EQ(first.exit_code, 0) << first.out;
  ASSERT_EQ(second.exit_code, 0) << second.out;
  ASSERT_EQ(alone.exit_code, 0) << alone.out;
  const auto a = JsonLines(first.out), b = JsonLines(second.out), c = JsonLines(alone.out);
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  ASSERT_EQ(c.size(), 1u);
  const int shared = 1 + a[0]["doc_token_ids"][0].size() + a[0]["doc_token_ids"][1].size();  // anchor + docs
  EXPECT_EQ(a[0]["usage"]["cached_tokens"], 0);
  // The second process starts with an empty pool: every shared chunk comes from the
  // embedded tier (host RAM is empty too after a restart, so from disk).
  EXPECT_EQ(b[0]["usage"]["disk_tokens"], shared);
  EXPECT_EQ(b[0]["usage"]["pool_tokens"], 0);
  EXPECT_EQ(b[0]["usage"]["cached_tokens"], shared);
  EXPECT_GT(b[0]["usage"]["kv_bytes_fetched"].get<uint64_t>(), 0u);
  EXPECT_EQ(b[0]["tokens"], a[0]["tokens"]);
  EXPECT_EQ(c[0]["tokens"], a[0]["tokens"]);
}

TEST(CliTest, EmptyRequestGeneratesFromTheAnchorAndBadInputFailsClearly) {
  const Output ok = RunCli("run --model synthetic:tiny --max-tokens 5 --json");
  ASSERT_EQ(ok.exit_code, 0) << ok.out;
  const auto lines = JsonLines(ok.out);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["tokens"].size(), 5u);
  EXPECT_EQ(lines[0]["prompt_token_ids"].size(), 1u);

  const Output bad_mode = RunCli("run --model synthetic:tiny --mode sideways");
  EXPECT_EQ(bad_mode.exit_code, 2);
  EXPECT_NE(bad_mode.out.find("unknown mode 'sideways'"), std::string::npos) << bad_mode.out;
  const Output bad_model = RunCli("run --model /nonexistent/model.bin");
  EXPECT_EQ(bad_model.exit_code, 1);
  EXPECT_NE(bad_model.out.find("/nonexistent/model.bin"), std::string::npos) << bad_model.out;
  // Numbers out of their field's range are refused, naming the field (found by fuzzing: a
  // seed of 4.7e21 was undefined behaviour, a token id of 2^32 + 1 wrapped to 1).
  const std::string requests =
      (std::filesystem::temp_directory_path() / ("bad_" + std::to_string(FreshSeed()) + ".jsonl")).string();
  for (const auto& [line, field] : std::vector<std::pair<std::string, std::string>>{
           {R"({"prompt": "x", "seed": 4.7e21})", "seed"},
           {R"({"prompt": "x", "seed": -1})", "seed"},
           {R"({"prompt": "x", "max_tokens": 8.9e35})", "max_tokens"},
           {R"({"docs": [[5, 4294967297]], "prompt": "x"})", "docs"}}) {
    std::ofstream(requests) << line << "\n";
    const Output out_of_range = RunCli("run --model synthetic:tiny --requests " + requests);
    EXPECT_NE(out_of_range.exit_code, 0) << line;
    EXPECT_NE(out_of_range.out.find(field), std::string::npos) << line << ": " << out_of_range.out;
    EXPECT_NE(out_of_range.out.find("out of range"), std::string::npos) << line << ": " << out_of_range.out;
  }
  std::filesystem::remove(requests);
  const Output bad_number = RunCli("run --model synthetic:tiny --max-tokens many");
  EXPECT_EQ(bad_number.exit_code, 2);
  EXPECT_NE(bad_number.out.find("--max-tokens"), std::string::npos) << bad_number.out;
}

// --device: cpu always runs; auto runs wherever (the GPU when there is one); cuda runs on a
// GPU machine and otherwise fails saying why; a misspelt device is refused.
TEST(CliTest, DeviceChoice) {
  for (const std::string device : {"cpu", "auto"}) {
    const Output run = RunCli("run --model synthetic:tiny --max-tokens 3 --json --no-cache-tier --device " + device);
    ASSERT_EQ(run.exit_code, 0) << device << ": " << run.out;
    EXPECT_EQ(JsonLines(run.out)[0]["tokens"].size(), 3u);
  }
  const Output cuda = RunCli("run --model synthetic:tiny --max-tokens 3 --json --no-cache-tier --device cuda");
  if (cuda.exit_code != 0) {
    EXPECT_EQ(cuda.exit_code, 1);
    EXPECT_TRUE(cuda.out.find("GPU") != std::string::npos || cuda.out.find("CUDA") != std::string::npos) << cuda.out;
  }
  const Output bad = RunCli("run --model synthetic:tiny --device tpu");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.out.find("unknown device 'tpu'"), std::string::npos) << bad.out;
}

// --dtype: on the CPU, fp32 and bf16 (its GPU-like numerics) both run, with log
// probabilities that differ by bf16 rounding; a misspelt dtype is refused. On a GPU machine, stories260K in fp32 on
// cuda prints the same 100 greedy tokens as on the CPU.
TEST(CliTest, DtypeChoice) {
  std::vector<double> first_logprob;
  for (const std::string dtype : {"fp32", "bf16"}) {
    const Output run =
        RunCli("run --model synthetic:tiny --max-tokens 3 --json --no-cache-tier --device cpu --dtype " + dtype);
    ASSERT_EQ(run.exit_code, 0) << dtype << ": " << run.out;
    const auto lines = JsonLines(run.out);
    ASSERT_EQ(lines.size(), 1u) << run.out;
    EXPECT_EQ(lines[0]["tokens"].size(), 3u);
    first_logprob.push_back(lines[0]["logprobs"][0].get<double>());
  }
  EXPECT_NE(first_logprob[0], first_logprob[1]);
  EXPECT_NEAR(first_logprob[0], first_logprob[1], 0.1);
  const Output bad = RunCli("run --model synthetic:tiny --dtype fp8");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.out.find("unknown --dtype 'fp8'"), std::string::npos) << bad.out;

  if (!HaveModel("stories260K.bin") || !HaveModel("tok512.bin")) return;
  const std::string stories = "run --model " + ModelPath("stories260K.bin") + " --tokenizer " +
                              ModelPath("tok512.bin") + " --max-tokens 100 --json --no-cache-tier --dtype fp32";
  const Output cpu = RunCli(stories + " --device cpu");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.out;
  const Output cuda = RunCli(stories + " --device cuda");
  if (cuda.exit_code != 0) return;  // no GPU here (DeviceChoice checks the message)
  EXPECT_EQ(JsonLines(cuda.out)[0]["tokens"], JsonLines(cpu.out)[0]["tokens"]);
}

}  // namespace
}  // namespace lazykv::testing
