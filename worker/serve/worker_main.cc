// lazykv-worker: serves the Generation gRPC API (proto/generate.proto) over one engine
// with continuous batching, plus gRPC health checking and Prometheus metrics. On
// SIGTERM or SIGINT it reports NOT_SERVING, lets in-flight calls finish (up to
// --shutdown-grace-ms), and flushes its chunk publications to the cache tier.
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <filesystem>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/byte_size.h"
#include "common/flag_parser.h"
#include "common/malloc_tuning.h"
#include "common/server_runtime.h"
#include "worker/openai/chat_settings.h"
#include "worker/openai/openai_server.h"
#include "worker/serve/generation_loop.h"
#include "worker/serve/generation_service.h"
#include "worker/setup/model_setup_flags.h"

namespace lazykv {
namespace {

constexpr char kUsage[] = R"(usage: lazykv-worker --listen HOST:PORT --model PATH|synthetic:NAME [options]
  --listen HOST:PORT       the Generation API (a port of 0 picks a free one; printed on stdout)
  --metrics-listen HOST:PORT  Prometheus /metrics (default: off)
  --max-running-requests N requests run at once, at most; more wait in the queue (default 256)
  --max-queued-requests N  requests that may wait (for KV pool room or a running slot); past it
                           RESOURCE_EXHAUSTED naming the limits (default 64)
  --default-max-tokens N   when a call does not set sampling.max_tokens (default 64)
  --max-message-bytes B    largest gRPC message (default 16MiB)
  --max-text-bytes B       largest document text or prompt text, checked before tokenizing (default 1MiB)
  --document-token-cache-bytes B  document texts and their tokens kept, so that a popular
                           document sent as text is tokenized once (least recently used go
                           first; default 64MiB, at least 64KiB; 0: tokenize every time)
  --shutdown-grace-ms N    time given to in-flight calls on SIGTERM (default 10000)
  --max-threads N          gRPC handler threads (each Generate in flight holds one); calls past
                           them get RESOURCE_EXHAUSTED (default 1024)
  --calibrate-prefill-tokens N  before serving, time prefills of 2N and N tokens alone: the
                           anchor of the fetch-or-recompute decision's prefill cost, and a
                           warm-up (default: 512 on a GPU; off on the CPU, whose passes are slow
                           and where fetching wins anyway; 0: off, the cost is then learned
                           from steps alone)
  --idle-spin-us N          when the engine runs out of work, its thread watches for the next
                           request this long before it sleeps: a request arriving meanwhile
                           starts without a thread wake-up (at most one core, N us after each
                           time the engine goes idle; default: 2000 on a GPU, 0 on the CPU,
                           whose steps are too slow for a wake-up to matter; 0: sleep at once;
                           at most 1000000)
  --no-warm-up             serve without the backend warm-up: on a GPU, every GEMM shape a step
                           can have is otherwise planned and run once before serving (about a
                           second for an 8B model), where the first steps would pay for it
The OpenAI-compatible HTTP API (off unless --http-listen):
  --http-listen HOST:PORT  POST /v1/completions, /v1/chat/completions; GET /v1/models, /health
  --served-model-name N[,N...]  the names `model` may give (default: the model's file or directory name)
  --chat-template chatml|FILE   a tokenizer_config.json, a template file, or the built-in ChatML
                           (default: the model directory's; none: chat completions are refused)
  --http-threads N         connections served at once (default 64)
  --http-max-queued N      connections that may wait for a thread; past it 429 (default 64)
  --http-request-timeout-s N  longest a request may run (default 600)
  --http-max-body-bytes B  largest request body (default 16MiB)
Security of the Generation API and /metrics (plaintext and no tokens: loopback only):
)";

struct WorkerFlags {
  ModelSetupFlags model;
  std::string listen;
  std::string metrics_listen;
  ServerSecurityOptions security;
  int max_threads = 1024;
  GenerationServiceOptions service;
  uint64_t max_message_bytes = 16 << 20;
  int shutdown_grace_ms = 10000;
  OpenAiServerOptions http;
  std::string served_model_names;
  std::string chat_template;
  int http_request_timeout_s = 600;
  uint64_t http_max_body_bytes = 16 << 20;
  int calibrate_prefill_tokens = -1;  // -1: 512 on a GPU, off on the CPU
  bool no_warm_up = false;
  int idle_spin_us = -1;  // -1: 2000 on a GPU, 0 on the CPU
  uint64_t document_token_cache_bytes = 64 << 20;
};

absl::Status ParseWorkerFlags(int argc, char** argv, WorkerFlags& f) {
  FlagParser parser(absl::StrCat(kUsage, kServerSecurityUsage, ModelSetupUsage()));
  AddModelSetupFlags(parser, f.model);
  AddServerSecurityFlags(parser, f.security);
  parser.AddInt("--max-threads", &f.max_threads);
  parser.AddInt("--calibrate-prefill-tokens", &f.calibrate_prefill_tokens);
  parser.AddSwitch("--no-warm-up", &f.no_warm_up);
  parser.AddInt("--idle-spin-us", &f.idle_spin_us);
  parser.AddString("--listen", &f.listen);
  parser.AddString("--metrics-listen", &f.metrics_listen);
  parser.AddInt("--max-running-requests", &f.model.setup.engine.max_running_requests);
  parser.AddInt("--max-queued-requests", &f.model.setup.engine.max_queued_requests);
  parser.AddInt("--default-max-tokens", &f.service.default_max_tokens);
  parser.AddByteSize("--max-message-bytes", &f.max_message_bytes);
  parser.AddByteSize("--max-text-bytes", &f.service.max_text_bytes);
  parser.AddByteSize("--document-token-cache-bytes", &f.document_token_cache_bytes);
  parser.AddInt("--shutdown-grace-ms", &f.shutdown_grace_ms);
  parser.AddString("--http-listen", &f.http.listen);
  parser.AddString("--served-model-name", &f.served_model_names);
  parser.AddString("--chat-template", &f.chat_template);
  parser.AddInt("--http-threads", &f.http.threads);
  parser.AddInt("--http-max-queued", &f.http.max_queued_connections);
  parser.AddInt("--http-request-timeout-s", &f.http_request_timeout_s);
  parser.AddByteSize("--http-max-body-bytes", &f.http_max_body_bytes);
  if (absl::Status s = parser.Parse(argc, argv); !s.ok()) return s;
  if (f.listen.empty()) return absl::InvalidArgumentError(absl::StrCat("--listen is required\n", parser.usage()));
  if (absl::Status s = FinishModelSetupFlags(f.model, absl::StrFormat("lazykv-worker-%d", getpid())); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(s.message(), "\n", parser.usage()));
  }
  if (f.service.default_max_tokens <= 0) return absl::InvalidArgumentError("--default-max-tokens must be positive");
  if (f.max_threads <= 0) return absl::InvalidArgumentError("--max-threads must be positive");
  if (f.document_token_cache_bytes != 0 && f.document_token_cache_bytes < (64 << 10)) {
    return absl::InvalidArgumentError("--document-token-cache-bytes must be 0 (off) or at least 64KiB");
  }
  if (f.idle_spin_us < -1 || f.idle_spin_us > 1000000) {
    return absl::InvalidArgumentError("--idle-spin-us must be within 0-1000000");
  }
  if (absl::Status s = CheckServerSecurity(f.listen, f.security); !s.ok()) return s;
  if (f.http.threads <= 0) return absl::InvalidArgumentError("--http-threads must be positive");
  if (f.http.max_queued_connections < 0) return absl::InvalidArgumentError("--http-max-queued must be >= 0");
  if (f.http_request_timeout_s <= 0) return absl::InvalidArgumentError("--http-request-timeout-s must be positive");
  f.http.request_timeout = std::chrono::seconds(f.http_request_timeout_s);
  f.http.max_body_bytes = f.http_max_body_bytes;
  f.http.limits.max_documents = f.service.max_documents;
  f.http.limits.max_stop_strings = f.service.max_stop_strings;
  // Served names: the flag's, else the model's file or directory name ("stories15M").
  std::string model = f.model.setup.model;
  if (model.starts_with("synthetic:")) model = model.substr(std::string_view("synthetic:").size());
  f.http.served_model_names = absl::StrSplit(
      f.served_model_names.empty()
          ? std::filesystem::path(model.ends_with("/") ? model.substr(0, model.size() - 1) : model).stem().string()
          : f.served_model_names,
      ',', absl::SkipEmpty());
  return absl::OkStatus();
}

// Where the scheduling thread's time went, and what the chunk pipeline decided and measured.
void LogStepProfile(const Engine& engine) {
  const StepTimings& t = engine.step_timings();
  spdlog::info(
      "steps: {} in {:.3f} s: chunk bookkeeping {:.3f} s, batches {:.3f} s (forward {:.3f} s, publication "
      "captures {:.3f} s)",
      t.steps, t.chunk_seconds + t.batch_seconds, t.chunk_seconds, t.batch_seconds, t.forward_seconds,
      t.publish_seconds);
  if (const std::string backend = engine.backend_profile(); !backend.empty()) spdlog::info("backend: {}", backend);
  ChunkPipeline* pipeline = engine.pipeline();
  if (pipeline == nullptr) return;
  spdlog::info("chunk pipeline: {}", FormatPipelineStats(pipeline->stats()));
  if (const TransportStats s = pipeline->tier().transport_stats();
      s.grpc_chunks + s.shm_chunks + s.cuda_ipc_chunks + s.nccl_chunks > 0) {
    spdlog::info("fetched by transport: grpc {}, shm {}, cuda_ipc {}, nccl {} chunks ({} shm fallbacks)", s.grpc_chunks,
                 s.shm_chunks, s.cuda_ipc_chunks, s.nccl_chunks, s.shm_fallbacks);
  }
  for (const auto& e : pipeline->cost_model().Sources()) {
    spdlog::info("fetch cost: {}: {:.3f} ms + {:.2f} GB/s over {} fetches", e.source, e.latency_seconds * 1e3,
                 e.bytes_per_second / 1e9, e.samples);
  }
  const FetchCostModel& cost = pipeline->cost_model();
  spdlog::info("prefill cost: {:.2f} us per token (calibrated {:.2f}, fitted from steps {:.2f}; 0: none)",
               cost.PrefillSecondsPerToken() * 1e6, cost.CalibratedSecondsPerToken() * 1e6,
               cost.FittedSecondsPerToken() * 1e6);
}

int Serve(int argc, char** argv) {
  WorkerFlags flags;
  if (absl::Status s = ParseWorkerFlags(argc, argv, flags); !s.ok()) return ExitForFlagError(s, "lazykv-worker");
  BlockTerminationSignals();

  auto loaded = SetUpEngine(flags.model.setup);
  if (!loaded.ok()) {
    spdlog::error("{}", std::string(loaded.status().message()));
    return 1;
  }
  if (!flags.no_warm_up) {
    // Not fatal: an unprepared shape is prepared at its first step instead.
    if (absl::Status s = loaded->engine->WarmUpBackend(); !s.ok()) {
      spdlog::warn("backend warm-up failed: {}", s.ToString());
    }
  }
  const int calibrate_tokens =
      flags.calibrate_prefill_tokens >= 0 ? flags.calibrate_prefill_tokens : (loaded->on_gpu ? 512 : 0);
  if (calibrate_tokens > 0) {
    // Not fatal: without it the cost is learned from the steps served.
    if (auto s = loaded->engine->CalibratePrefill(calibrate_tokens, 2); !s.ok()) {
      spdlog::warn("prefill calibration failed: {}", s.status().ToString());
    }
  }
  ChunkPipeline* tier = loaded->engine->pipeline();
  auto metrics = std::make_shared<WorkerMetrics>();
  auto authorizer =
      CallAuthorizer::Create(flags.security.auth_tokens_file, std::chrono::seconds(flags.security.reload_interval_s));
  if (!authorizer.ok()) {
    spdlog::error("{}", std::string(authorizer.status().message()));
    return 1;
  }
  auto metrics_server =
      MetricsServer::Start(flags.metrics_listen, metrics->registry(), flags.security, authorizer->get());
  if (!metrics_server.ok()) {
    spdlog::error("{}", std::string(metrics_server.status().message()));
    return 1;
  }
  const int idle_spin_us = flags.idle_spin_us >= 0 ? flags.idle_spin_us : (loaded->on_gpu ? 2000 : 0);
  GenerationLoop loop(std::move(loaded->engine), metrics,
                      GenerationLoopOptions{.idle_spin = std::chrono::microseconds(idle_spin_us)});
  std::unique_ptr<DocumentTokenCache> document_tokens;
  if (flags.document_token_cache_bytes > 0) {
    document_tokens = std::make_unique<DocumentTokenCache>(
        loaded->tokenizer.get(), flags.document_token_cache_bytes,
        [metrics = metrics.get()](bool cached) { metrics->CountDocumentTokens(cached); });
    flags.service.document_tokens = document_tokens.get();  // the gRPC and the HTTP API alike
  }
  GenerationService service(&loop, loaded->tokenizer.get(), flags.service, authorizer->get());

  std::unique_ptr<OpenAiServer> http;
  std::optional<ChatTemplate> chat_template;
  if (!flags.http.listen.empty()) {
    const std::string& tokenizer_flag = flags.model.setup.tokenizer;
    // The model's directory, then the tokenizer's (the flag may name the directory or a file in it).
    std::string tokenizer_dir = tokenizer_flag;
    if (!tokenizer_dir.empty() && !std::filesystem::is_directory(tokenizer_dir)) {
      tokenizer_dir = std::filesystem::path(tokenizer_dir).parent_path().string();
    }
    auto template_loaded = LoadChatTemplate(flags.chat_template, {flags.model.setup.model, tokenizer_dir});
    if (!template_loaded.ok()) {
      spdlog::error("{}", std::string(template_loaded.status().message()));
      return 1;
    }
    chat_template = *std::move(template_loaded);
    const ChatTemplate* chat = chat_template ? &*chat_template : nullptr;
    spdlog::info("chat template: {}", chat == nullptr ? "none (chat completions are refused)" : "loaded");
    auto started_http = OpenAiServer::Start(flags.http, flags.security, &loop, loaded->tokenizer.get(),
                                            MakeChatSettings(chat, *loaded->tokenizer, loop.engine().anchor()),
                                            flags.service, authorizer->get());
    if (!started_http.ok()) {
      spdlog::error("{}", std::string(started_http.status().message()));
      return 1;
    }
    http = *std::move(started_http);
  }

  int port = 0;
  auto started = StartGrpcServer(GrpcServerOptions{.listen = flags.listen,
                                                   .service_name = v1::Generation::service_full_name(),
                                                   .credentials = MakeServerCredentials(flags.security),
                                                   .max_message_bytes = flags.max_message_bytes,
                                                   .max_threads = flags.max_threads},
                                 &service, &port);
  if (!started.ok()) {
    spdlog::error("{}", std::string(started.status().message()));
    return 1;
  }
  std::unique_ptr<grpc::Server> server = *std::move(started);
  const ModelConfig& config = loop.engine().config();
  spdlog::info("model {} ({} layers, dim {}, vocab {}), mode {}, cache tier {}", config.name, config.n_layers,
               config.dim, config.vocab_size, AttentionModeName(loop.engine().default_mode()),
               tier != nullptr ? tier->tier().Describe() : "off");
  PrintListening("lazykv-worker", flags.listen, port, metrics_server->get(), flags.metrics_listen, flags.http.listen,
                 http != nullptr ? http->port() : 0);

  const int signal_number = WaitForTerminationSignal();
  spdlog::info("signal {}: finishing in-flight calls", signal_number);
  server->GetHealthCheckService()->Shutdown();  // NOT_SERVING, and its own calls end
  if (http != nullptr) http->BeginShutdown();   // new HTTP requests: 503
  // Calls still running at the deadline are cancelled: their handlers cancel their
  // requests in the engine and return.
  const auto grace_end = std::chrono::steady_clock::now() + std::chrono::milliseconds(flags.shutdown_grace_ms);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(flags.shutdown_grace_ms));
  if (http != nullptr) http->WaitForCalls(grace_end);  // HTTP requests get the same grace
  loop.Stop();                                         // what still runs fails (UNAVAILABLE), so HTTP handlers return
  if (http != nullptr) http->Stop();
  if (tier != nullptr) tier->Flush();  // computed chunks reach the cache tier
  LogStepProfile(loop.engine());
  if (idle_spin_us > 0) {
    const GenerationLoop::IdleSpins spins = loop.idle_spins();
    spdlog::info("engine idle watches: {} took a request, {} ran out ({} us each)", spins.caught, spins.expired,
                 idle_spin_us);
  }
  spdlog::info("stopped cleanly");
  return 0;
}

}  // namespace
}  // namespace lazykv

int main(int argc, char** argv) {
  spdlog::set_default_logger(spdlog::stderr_color_mt("worker"));
  lazykv::TuneMallocForLargeBuffers();
  return lazykv::Serve(argc, argv);
}
