// lazykv-worker with TLS and tokens on its Generation API, and mutual TLS and a token
// towards a cache server that checks them (real processes): clients with the client
// role get exactly what an unsecured worker answers, and a second worker is served the
// first one's chunks through the secured tier; callers without the role are refused and
// counted; a worker whose cache credentials are wrong still serves, computing its chunks.
#include <gtest/gtest.h>

#include <csignal>
#include <httplib.h>
#include <signal.h>

#include <atomic>
#include <fstream>
#include <thread>
#include <sstream>

#include "common/chunk_key.h"
#include "common/grpc_util.h"
#include "common/security/transport_security.h"
#include "proto/generate.grpc.pb.h"
#include "tests/cache_server/cache_test_util.h"
#include "tests/security/security_test_util.h"
#include "tests/test_util.h"
#include "worker/setup/model_setup.h"

namespace lazykv::testing {
namespace {

struct Reply {
  grpc::Status status;
  std::vector<int32_t> tokens;
  v1::GenerateDone done;
};

Reply Generate(const std::string& address, const ClientSecurityOptions& security, const v1::GenerateRequest& request) {
  auto stub = v1::Generation::NewStub(MakeClientChannel(address, security));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = stub->Generate(&context, request);
  Reply reply;
  v1::GenerateResponse message;
  while (reader->Read(&message)) {
    if (message.has_delta()) {
      reply.tokens.insert(reply.tokens.end(), message.delta().token_ids().begin(), message.delta().token_ids().end());
    }
    if (message.has_done()) reply.done = message.done();
  }
  reply.status = reader->Finish();
  return reply;
}

v1::GenerateRequest StoryRequest() {
  v1::GenerateRequest request;
  request.add_documents()->set_text("Lily had a red ball. She liked to throw it high in the sky.");
  request.add_documents()->set_text("Tom had a big dog named Max. Max liked to run in the park.");
  request.set_prompt_text("One day, Lily and Tom");
  request.mutable_sampling()->set_max_tokens(24);
  request.mutable_sampling()->set_temperature(0);
  return request;
}

class WorkerSecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    signal(SIGPIPE, SIG_IGN);  // a TLS scrape the server refuses mid-handshake
    if (!HaveModel("stories260K.bin") || !HaveModel("tok512.bin")) GTEST_SKIP() << "stories260K files missing";
    certs_ = MakeDevCerts();
    dir_ = TempDir("worker_security");
    cache_ = StartCacheServer(
        dir_, {"--tls-cert", certs_.server_cert, "--tls-key", certs_.server_key, "--tls-client-ca", certs_.ca,
               "--auth-tokens", certs_.tokens, "--host-capacity", "64MiB", "--disk-capacity", "0"});
    ASSERT_TRUE(cache_->started());
  }

  std::vector<std::string> Model() const {
    return {"--model", ModelPath("stories260K.bin"), "--tokenizer", ModelPath("tok512.bin")};
  }

  // A worker with TLS and tokens on its API, using the cache server with `cache_token`.
  std::unique_ptr<ServerProcess> StartSecureWorker(const std::string& name, const std::string& cache_token) {
    std::vector<std::string> args = {"--listen",
                                     "127.0.0.1:0",
                                     "--metrics-listen",
                                     "127.0.0.1:0",
                                     "--tls-cert",
                                     certs_.server_cert,
                                     "--tls-key",
                                     certs_.server_key,
                                     "--auth-tokens",
                                     certs_.tokens,
                                     "--cache-servers",
                                     cache_->address(),
                                     "--cache-tls-ca",
                                     certs_.ca,
                                     "--cache-tls-cert",
                                     certs_.client_cert,
                                     "--cache-tls-key",
                                     certs_.client_key,
                                     "--cache-auth-token",
                                     cache_token,
                                     "--cache-min-deadline-ms",
                                     "200"};
    const std::vector<std::string> model = Model();
    args.insert(args.end(), model.begin(), model.end());
    auto worker = std::make_unique<ServerProcess>(LAZYKV_WORKER, args, dir_ + "/" + name + ".log");
    EXPECT_TRUE(worker->started()) << "see " << dir_ << "/" << name << ".log";
    return worker;
  }

  ClientSecurityOptions Client(const std::string& token_file) const {
    return ClientSecurityOptions{.tls_ca_file = certs_.ca, .auth_token_file = token_file};
  }

  // What a worker with no security and no cache tier answers.
  Reply Reference(const v1::GenerateRequest& request) {
    std::vector<std::string> args = {"--listen", "127.0.0.1:0", "--no-cache-tier"};
    const std::vector<std::string> model = Model();
    args.insert(args.end(), model.begin(), model.end());
    ServerProcess plain(LAZYKV_WORKER, args, dir_ + "/reference.log");
    EXPECT_TRUE(plain.started());
    return Generate(plain.address(), ClientSecurityOptions{}, request);
  }

  DevCerts certs_;
  std::string dir_;
  std::unique_ptr<ServerProcess> cache_;
};

TEST_F(WorkerSecurityTest, ClientsAreServedThroughTlsAndWorkersShareChunksThroughTheSecuredTier) {
  const v1::GenerateRequest request = StoryRequest();
  const Reply reference = Reference(request);
  ASSERT_TRUE(reference.status.ok()) << reference.status.error_message();
  ASSERT_FALSE(reference.tokens.empty());

  auto first = StartSecureWorker("first", certs_.worker_token);
  const Reply computed = Generate(first->address(), Client(certs_.client_token), request);
  ASSERT_TRUE(computed.status.ok()) << computed.status.error_message();
  EXPECT_EQ(computed.tokens, reference.tokens);
  EXPECT_EQ(computed.done.usage().remote_tokens(), 0);
  EXPECT_EQ(first->Stop(SIGTERM), 0);  // flushes its publications to the cache server

  auto second = StartSecureWorker("second", certs_.worker_token);
  const Reply fetched = Generate(second->address(), Client(certs_.client_token), request);
  ASSERT_TRUE(fetched.status.ok()) << fetched.status.error_message();
  EXPECT_EQ(fetched.tokens, reference.tokens);
  // Both documents (and the anchor) came from the cache server over mutual TLS.
  EXPECT_GT(fetched.done.usage().remote_tokens(), 0) << fetched.done.usage().DebugString();
}

TEST_F(WorkerSecurityTest, CallsWithoutTheClientRoleAreRefusedAndCounted) {
  auto worker = StartSecureWorker("worker", certs_.worker_token);
  const v1::GenerateRequest request = StoryRequest();
  EXPECT_EQ(Generate(worker->address(), Client(""), request).status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Generate(worker->address(), Client(certs_.admin_token), request).status.error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Generate(worker->address(), Client(certs_.worker_token), request).status.error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Generate(worker->address(), ClientSecurityOptions{.auth_token_file = certs_.client_token}, request)
                .status.error_code(),
            grpc::StatusCode::UNAVAILABLE);  // plaintext to a TLS port
  {
    auto stub = v1::Generation::NewStub(MakeClientChannel(worker->address(), Client("")));
    grpc::ClientContext context;
    v1::TokenizeRequest tokenize;
    tokenize.set_text("Once upon a time");
    v1::TokenizeResponse ids;
    EXPECT_EQ(stub->Tokenize(&context, tokenize, &ids).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  EXPECT_TRUE(Generate(worker->address(), Client(certs_.client_token), request).status.ok());

  const size_t colon = worker->metrics_address().rfind(':');
  httplib::SSLClient scraper(worker->metrics_address().substr(0, colon),
                             std::stoi(worker->metrics_address().substr(colon + 1)));
  scraper.set_ca_cert_path(certs_.ca.c_str());
  scraper.enable_server_certificate_verification(true);
  auto anonymous = scraper.Get("/metrics");
  ASSERT_TRUE(anonymous);
  EXPECT_EQ(anonymous->status, 401);
  auto page = scraper.Get("/metrics", {{"Authorization", "Bearer " + certs_.Token(certs_.admin_token)}});
  ASSERT_TRUE(page);
  ASSERT_EQ(page->status, 200);
  EXPECT_EQ(Metric(page->body, "lazykv_worker_requests_total{outcome=\"UNAUTHENTICATED\"}"), 2) << page->body;
  EXPECT_EQ(Metric(page->body, "lazykv_worker_requests_total{outcome=\"PERMISSION_DENIED\"}"), 2);
  EXPECT_EQ(Metric(page->body, "lazykv_worker_requests_total{outcome=\"OK\"}"), 1);
}

TEST_F(WorkerSecurityTest, AWorkerWithWrongCacheCredentialsStillServesAndStoresNothing) {
  const v1::GenerateRequest request = StoryRequest();
  const Reply reference = Reference(request);
  // The client role cannot publish to the cache server: every tier call is refused.
  auto worker = StartSecureWorker("misconfigured", certs_.client_token);
  const Reply reply = Generate(worker->address(), Client(certs_.client_token), request);
  ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
  EXPECT_EQ(reply.tokens, reference.tokens);
  EXPECT_EQ(worker->Stop(SIGTERM), 0);
  std::stringstream log;
  log << std::ifstream(dir_ + "/misconfigured.log").rdbuf();
  EXPECT_NE(log.str().find("refused this worker's credentials"), std::string::npos) << log.str();

  ClientSecurityOptions admin{.tls_ca_file = certs_.ca,
                              .tls_cert_file = certs_.client_cert,
                              .tls_key_file = certs_.client_key,
                              .auth_token_file = certs_.admin_token};
  auto stub = v1::KvCache::NewStub(MakeClientChannel(cache_->address(), admin));
  grpc::ClientContext context;
  v1::StatsResponse stats;
  ASSERT_TRUE(stub->Stats(&context, v1::StatsRequest(), &stats).ok());
  ASSERT_GT(stats.tiers_size(), 0);
  EXPECT_EQ(stats.tiers(0).entries(), 0);
}

TEST_F(WorkerSecurityTest, ALeaseSquatterCostsAColdWorkerABoundedWaitNotAStall) {
  // A malicious fleet member (a worker token) takes the lease on a document's chunk with
  // the longest TTL the server allows and renews it for ever, never publishing.
  const v1::GenerateRequest request = StoryRequest();
  const Reply reference = Reference(request);
  ASSERT_TRUE(reference.status.ok());
  ModelSetupOptions setup;
  setup.model = ModelPath("stories260K.bin");
  setup.tokenizer = ModelPath("tok512.bin");
  setup.cache_tier.enabled = false;
  auto local = SetUpEngine(setup);
  ASSERT_TRUE(local.ok()) << local.status();
  const Hash128 squatted = MakeChunkKey(local->engine->model_fingerprint(), local->engine->anchor(),
                                        local->tokenizer->Encode(request.documents(0).text()));
  ClientSecurityOptions squatter_security{.tls_ca_file = certs_.ca,
                                          .tls_cert_file = certs_.client_cert,
                                          .tls_key_file = certs_.client_key,
                                          .auth_token_file = certs_.worker_token};
  auto squatter = v1::KvCache::NewStub(MakeClientChannel(cache_->address(), squatter_security));
  v1::LeaseResponse lease;
  {
    grpc::ClientContext context;
    v1::LeaseRequest take;
    *take.mutable_key() = ToProto(squatted);
    take.set_ttl_ms(120000);
    ASSERT_TRUE(squatter->Lease(&context, take, &lease).ok());
    ASSERT_EQ(lease.outcome(), v1::LeaseResponse::GRANTED);
  }
  std::atomic<bool> done{false};
  std::thread renewer([&] {
    while (!done) {
      grpc::ClientContext context;
      v1::RenewLeaseRequest renew;
      *renew.mutable_key() = ToProto(squatted);
      renew.set_lease_id(lease.lease_id());
      renew.set_ttl_ms(120000);
      v1::RenewLeaseResponse renewed;
      squatter->RenewLease(&context, renew, &renewed);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  // A cold worker (no step measured yet) waits at most its cold bound (2 s) for the
  // squatter, then computes the document itself; once measured, a few compute times.
  auto worker = StartSecureWorker("squatted", certs_.worker_token);
  const auto start = std::chrono::steady_clock::now();
  const Reply first = Generate(worker->address(), Client(certs_.client_token), request);
  const double first_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  v1::GenerateRequest again = request;
  again.set_prompt_text("Then Tom said");
  const auto second_start = std::chrono::steady_clock::now();
  const Reply second = Generate(worker->address(), Client(certs_.client_token), again);
  const double second_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - second_start).count();
  done = true;
  renewer.join();
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(first.tokens, reference.tokens);
  EXPECT_LT(first_seconds, 6.0 * SlowdownFactor()) << "the squatter stalled a cold worker";
  ASSERT_TRUE(second.status.ok()) << second.status.error_message();
  EXPECT_LT(second_seconds, 2.0 * SlowdownFactor()) << "the squatter stalled a measured worker";
}

}  // namespace
}  // namespace lazykv::testing
