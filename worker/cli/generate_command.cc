#include "worker/cli/generate_command.h"

#include <grpcpp/grpcpp.h>

#include <iostream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/flag_parser.h"
#include "common/security/transport_security.h"
#include "proto/generate.grpc.pb.h"

namespace lazykv {
namespace {

constexpr char kUsage[] = R"(usage: lazykv generate --server HOST:PORT [--doc TEXT]... --prompt TEXT [options]
  --server HOST:PORT     a lazykv-worker
  --doc TEXT             a retrieved document (repeatable, in order)
  --prompt TEXT          the question after the documents
  --max-tokens N         tokens to generate (default: the worker's)
  --temperature T        0 is greedy (default 0)
  --top-p P              nucleus sampling mass (default 1)
  --seed S               sampling seed (default: the worker draws one, printed)
  --stop TEXT            stop before this text (repeatable)
  --mode MODE            override the worker's attention mode (benchmarks)
  --repair-tokens N      recompute each document's first N tokens in context (lazy, block)
  --deadline-ms N        give up after N ms (default 60000)
The reply streams to stdout; usage and timings follow on stderr.
Security (a worker with --tls-cert, --auth-tokens):
)";

}  // namespace

int GenerateCommand(int argc, char** argv) {
  std::string server;
  v1::GenerateRequest request;
  int deadline_ms = 60000;
  int max_tokens = 0;
  float temperature = 0, top_p = 0;
  std::optional<uint64_t> seed;
  std::string prompt, mode;
  int repair_tokens = 0;
  ClientSecurityOptions security;
  FlagParser parser(absl::StrCat(kUsage, ClientSecurityUsage("")));
  AddClientSecurityFlags(parser, security, "");
  parser.AddString("--server", &server);
  parser.Add("--doc", [&](const std::string& v) {
    request.add_documents()->set_text(v);
    return absl::OkStatus();
  });
  parser.AddString("--prompt", &prompt);
  parser.AddInt("--max-tokens", &max_tokens);
  parser.AddFloat("--temperature", &temperature);
  parser.AddFloat("--top-p", &top_p);
  parser.AddUint64("--seed", &seed);
  parser.Add("--stop", [&](const std::string& v) {
    request.mutable_sampling()->add_stop(v);
    return absl::OkStatus();
  });
  parser.AddString("--mode", &mode);
  parser.AddInt("--repair-tokens", &repair_tokens);
  parser.AddInt("--deadline-ms", &deadline_ms);
  if (absl::Status s = parser.Parse(argc, argv); !s.ok()) {
    std::cerr << s.message() << "\n";
    return absl::IsCancelled(s) ? 0 : 2;
  }
  if (server.empty()) {
    std::cerr << "--server is required\n" << parser.usage();
    return 2;
  }
  if (absl::Status s = CheckClientSecurity(server, security); !s.ok()) {
    std::cerr << "--" << s.message() << "\n";
    return 2;
  }
  if (!prompt.empty()) request.set_prompt_text(prompt);
  request.mutable_sampling()->set_max_tokens(max_tokens);
  request.mutable_sampling()->set_temperature(temperature);
  request.mutable_sampling()->set_top_p(top_p);
  if (seed) request.mutable_sampling()->set_seed(*seed);
  request.set_mode(mode);
  request.set_repair_tokens(repair_tokens);

  auto stub = v1::Generation::NewStub(MakeClientChannel(server, security));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  auto reader = stub->Generate(&context, request);
  v1::GenerateResponse response;
  v1::GenerateDone done;
  while (reader->Read(&response)) {
    if (response.has_delta()) {
      std::cout << response.delta().text() << std::flush;
    } else if (response.has_done()) {
      done = response.done();
    }
  }
  const grpc::Status status = reader->Finish();
  std::cout << "\n";
  if (!status.ok()) {
    std::cerr << absl::StrFormat("lazykv generate: %s: %s\n",
                                 absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())),
                                 status.error_message());
    return 1;
  }
  const v1::Usage& u = done.usage();
  std::cerr << absl::StrFormat(
      "[%s] finish=%s prompt_tokens=%d (pool=%d host=%d disk=%d remote=%d computed=%d, of which recomputed=%d; "
      "repaired=%d) completion_tokens=%d seed=%d queue=%.1fms ttft=%.1fms total=%.1fms\n",
      done.mode(), v1::FinishReason_Name(done.finish_reason()), u.prompt_tokens(), u.pool_tokens(), u.host_tokens(),
      u.disk_tokens(), u.remote_tokens(), u.computed_tokens(), u.recomputed_tokens(),
      u.repaired_tokens(), u.completion_tokens(),
      done.seed(), done.timings().queue_ms(), done.timings().ttft_ms(), done.timings().total_ms());
  return 0;
}

}  // namespace lazykv
