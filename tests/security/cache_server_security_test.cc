// The cache server under attack, as a real process with mutual TLS and tokens: callers
// without a certificate, without a token, with a token of the wrong role, or hogging
// streams are refused with the right code and counted, what is stored is never lost, and
// legitimate workers are unaffected. Rotated certificates and tokens are picked up
// without a restart.
#include <gtest/gtest.h>

#include <csignal>
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "common/chunk_mac.h"
#include "common/chunk_wire.h"
#include "common/grpc_util.h"
#include "common/security/transport_security.h"
#include "tests/cache_server/cache_test_util.h"
#include "tests/security/security_test_util.h"
#include "tests/test_util.h"

namespace lazykv::testing {
namespace {

std::unique_ptr<v1::KvCache::Stub> SecureStub(const std::string& address, const ClientSecurityOptions& security) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  return v1::KvCache::NewStub(MakeClientChannel(address, security, args));
}

grpc::Status LookupStatus(v1::KvCache::Stub& stub, const Hash128& key, bool* found = nullptr) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::LookupRequest request;
  *request.add_keys() = ToProto(key);
  v1::LookupResponse response;
  grpc::Status status = stub.Lookup(&context, request, &response);
  if (found != nullptr) *found = status.ok() && response.results(0).found();
  return status;
}

grpc::Status DeleteStatus(v1::KvCache::Stub& stub, const Hash128& key) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::DeleteRequest request;
  *request.add_keys() = ToProto(key);
  v1::DeleteResponse response;
  return stub.Delete(&context, request, &response);
}

grpc::Status StatsStatus(v1::KvCache::Stub& stub) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::StatsResponse response;
  return stub.Stats(&context, v1::StatsRequest(), &response);
}

grpc::Status LeaseStatus(v1::KvCache::Stub& stub, const Hash128& key) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::LeaseRequest request;
  *request.mutable_key() = ToProto(key);
  request.set_ttl_ms(60000);
  v1::LeaseResponse response;
  return stub.Lease(&context, request, &response);
}

// GET /metrics over HTTPS; the status (0: no connection) and the body.
std::pair<int, std::string> ScrapeMetrics(const std::string& address, const DevCerts& trust, const DevCerts* identity,
                                          const std::string& token) {
  const size_t colon = address.rfind(':');
  httplib::SSLClient client(address.substr(0, colon), std::stoi(address.substr(colon + 1)),
                            identity != nullptr ? identity->client_cert : std::string(),
                            identity != nullptr ? identity->client_key : std::string());
  client.set_ca_cert_path(trust.ca.c_str());
  client.enable_server_certificate_verification(true);
  client.set_connection_timeout(5, 0);
  httplib::Headers headers;
  if (!token.empty()) headers.emplace("Authorization", "Bearer " + token);
  auto result = client.Get("/metrics", headers);
  if (!result) return {0, ""};
  return {result->status, result->body};
}

class CacheServerSecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    signal(SIGPIPE, SIG_IGN);  // a TLS scrape the server refuses mid-handshake
    certs_ = MakeDevCerts();
    dir_ = TempDir("cache_security");
  }

  std::unique_ptr<ServerProcess> StartSecure(std::vector<std::string> extra = {}) {
    std::vector<std::string> flags = {"--tls-cert",       certs_.server_cert,
                                      "--tls-key",        certs_.server_key,
                                      "--tls-client-ca",  certs_.ca,
                                      "--auth-tokens",    certs_.tokens,
                                      "--metrics-listen", "127.0.0.1:0",
                                      "--host-capacity",  "32MiB",
                                      "--disk-capacity",  "32MiB"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    auto server = StartCacheServer(dir_, flags);
    EXPECT_TRUE(server->started());
    return server;
  }

  ClientSecurityOptions As(const std::string& token_file) const {
    return ClientSecurityOptions{.tls_ca_file = certs_.ca,
                                 .tls_cert_file = certs_.client_cert,
                                 .tls_key_file = certs_.client_key,
                                 .auth_token_file = token_file};
  }

  DevCerts certs_;
  std::string dir_;
};

TEST_F(CacheServerSecurityTest, MutualTlsRefusesClientsWithoutAFleetCertificate) {
  auto server = StartSecure();
  std::mt19937_64 rng(FreshSeed());
  const TestChunk chunk = RandomTestChunk(rng, 64 << 10);
  auto worker = SecureStub(server->address(), As(certs_.worker_token));
  ASSERT_TRUE(PutChunk(*worker, chunk).status.ok());

  // Plaintext, TLS without a client certificate, and a certificate from another CA: no
  // call gets through, whatever token it carries.
  const DevCerts stranger = MakeDevCerts();
  std::vector<std::pair<std::string, ClientSecurityOptions>> outsiders = {
      {"plaintext", ClientSecurityOptions{.auth_token_file = certs_.worker_token}},
      {"no client certificate",
       ClientSecurityOptions{.tls_ca_file = certs_.ca, .auth_token_file = certs_.worker_token}},
      {"another CA's certificate", ClientSecurityOptions{.tls_ca_file = certs_.ca,
                                                         .tls_cert_file = stranger.client_cert,
                                                         .tls_key_file = stranger.client_key,
                                                         .auth_token_file = certs_.worker_token}},
  };
  for (const auto& [what, security] : outsiders) {
    SCOPED_TRACE(what);
    auto stub = SecureStub(server->address(), security);
    EXPECT_EQ(LookupStatus(*stub, chunk.key).error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_EQ(RawGet(*stub, chunk.key).status.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_FALSE(PutChunk(*stub, RandomTestChunk(rng, 4096)).status.ok());
  }
  // A client that does not trust the server's CA refuses it too.
  auto wrong_trust = SecureStub(server->address(), ClientSecurityOptions{.tls_ca_file = stranger.ca,
                                                                         .tls_cert_file = certs_.client_cert,
                                                                         .tls_key_file = certs_.client_key});
  EXPECT_EQ(LookupStatus(*wrong_trust, chunk.key).error_code(), grpc::StatusCode::UNAVAILABLE);

  // The fleet's worker still reads its chunk, byte for byte.
  const GetOutcome got = RawGet(*worker, chunk.key);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.stored, chunk.stored());

  // The metrics endpoint is mutual TLS too.
  EXPECT_EQ(ScrapeMetrics(server->metrics_address(), certs_, nullptr, certs_.Token(certs_.admin_token)).first, 0);
  EXPECT_EQ(ScrapeMetrics(server->metrics_address(), certs_, &certs_, certs_.Token(certs_.admin_token)).first, 200);
}

TEST_F(CacheServerSecurityTest, EveryMethodNeedsItsRoleAndRefusalsLoseNothing) {
  auto server = StartSecure();
  std::mt19937_64 rng(FreshSeed());
  const TestChunk stored = RandomTestChunk(rng, 256 << 10);
  auto worker = SecureStub(server->address(), As(certs_.worker_token));
  ASSERT_TRUE(PutChunk(*worker, stored).status.ok());

  const std::string forged_token = certs_.dir + "/forged.token";
  std::ofstream(forged_token) << "0123456789abcdef0123456789abcdef\n";
  const std::string bearer_typo = certs_.dir + "/typo.token";  // the worker's token, one character off
  std::string typo = certs_.Token(certs_.worker_token);
  typo.back() = typo.back() == 'a' ? 'b' : 'a';
  std::ofstream(bearer_typo) << typo << "\n";

  const TestChunk attack = RandomTestChunk(rng, 64 << 10);
  // Under the stored chunk's key: another payload (a poisoning attempt).
  TestChunk overwrite = RandomTestChunk(rng, 64 << 10);
  overwrite.key = stored.key;
  overwrite.fingerprint = stored.fingerprint;
  overwrite.header = MakeChunkHeader(stored.key, stored.fingerprint, overwrite.header.layout, overwrite.payload);

  int unauthenticated = 0;
  for (const std::string& token_file : {std::string(), forged_token, bearer_typo}) {
    SCOPED_TRACE(token_file.empty() ? "no token" : token_file);
    auto stub = SecureStub(server->address(), As(token_file));
    EXPECT_EQ(LookupStatus(*stub, stored.key).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(RawGet(*stub, stored.key).status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(PutChunk(*stub, attack).status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(PutChunk(*stub, overwrite).status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(LeaseStatus(*stub, attack.key).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(DeleteStatus(*stub, stored.key).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(StatsStatus(*stub).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    unauthenticated += 7;
  }
  // Wrong roles: a worker cannot delete or read stats; a client cannot touch chunks.
  EXPECT_EQ(DeleteStatus(*worker, stored.key).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(StatsStatus(*worker).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  auto client = SecureStub(server->address(), As(certs_.client_token));
  EXPECT_EQ(PutChunk(*client, attack).status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(RawGet(*client, stored.key).status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(LeaseStatus(*client, attack.key).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  const int permission_denied = 5;

  // Nothing the refused calls sent was stored or removed.
  bool found = false;
  ASSERT_TRUE(LookupStatus(*worker, attack.key, &found).ok());
  EXPECT_FALSE(found);
  const GetOutcome got = RawGet(*worker, stored.key);
  ASSERT_TRUE(got.status.ok());
  EXPECT_EQ(got.stored, stored.stored());

  // The admin reads stats and may delete; each refusal was counted by its reason.
  auto admin = SecureStub(server->address(), As(certs_.admin_token));
  EXPECT_TRUE(StatsStatus(*admin).ok());
  const auto [code, page] = ScrapeMetrics(server->metrics_address(), certs_, &certs_, certs_.Token(certs_.admin_token));
  ASSERT_EQ(code, 200);
  EXPECT_EQ(Metric(page, "lazykv_cache_rejected_total{reason=\"unauthenticated\"}"), unauthenticated) << page;
  EXPECT_EQ(Metric(page, "lazykv_cache_rejected_total{reason=\"permission_denied\"}"), permission_denied);
  EXPECT_EQ(ScrapeMetrics(server->metrics_address(), certs_, &certs_, "").first, 401);
  EXPECT_EQ(ScrapeMetrics(server->metrics_address(), certs_, &certs_, certs_.Token(certs_.worker_token)).first, 403);
  EXPECT_TRUE(DeleteStatus(*admin, stored.key).ok());
  ASSERT_TRUE(LookupStatus(*worker, stored.key, &found).ok());
  EXPECT_FALSE(found);
}

TEST_F(CacheServerSecurityTest, RotatedCertificatesAndTokensArePickedUpWithoutARestart) {
  // The client trusts the current CA and the next one, as during a real rotation.
  const DevCerts next = MakeDevCerts();
  const std::string trust_both = certs_.dir + "/both-cas.pem";
  {
    std::ofstream bundle(trust_both);
    bundle << std::ifstream(certs_.ca).rdbuf() << std::ifstream(next.ca).rdbuf();
  }
  auto server = StartSecure({"--tls-reload-s", "1"});
  auto served_certificate = [&](const std::string& token_file) -> std::pair<grpc::Status, std::string> {
    // A fresh channel: a new handshake.
    auto stub = SecureStub(server->address(), ClientSecurityOptions{.tls_ca_file = trust_both,
                                                                    .tls_cert_file = certs_.client_cert,
                                                                    .tls_key_file = certs_.client_key,
                                                                    .auth_token_file = token_file});
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::LookupRequest request;
    *request.add_keys() = ToProto(Hash128{1, 2});
    v1::LookupResponse response;
    grpc::Status status = stub->Lookup(&context, request, &response);
    std::string pem;
    if (auto auth = context.auth_context()) {
      for (const auto& value : auth->FindPropertyValues("x509_pem_cert")) pem.assign(value.data(), value.size());
    }
    return {status, pem};
  };
  auto read = [](const std::string& path) {
    std::stringstream s;
    s << std::ifstream(path).rdbuf();
    return s.str();
  };
  auto [status, pem] = served_certificate(certs_.worker_token);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(pem, read(certs_.server_cert));

  // Rotate the server's certificate and key (renames, as a secret volume is updated), and
  // the tokens: the worker's token is replaced by a new one.
  std::filesystem::copy_file(next.server_cert, certs_.server_cert + ".new");
  std::filesystem::copy_file(next.server_key, certs_.server_key + ".new");
  std::filesystem::rename(certs_.server_key + ".new", certs_.server_key);
  std::filesystem::rename(certs_.server_cert + ".new", certs_.server_cert);
  const std::string new_worker_token = certs_.dir + "/new-worker.token";
  std::ofstream(new_worker_token) << "fedcba9876543210fedcba9876543210\n";
  std::ofstream(certs_.tokens + ".new") << "fedcba9876543210fedcba9876543210 worker-2 worker\n"
                                        << certs_.Token(certs_.admin_token) << " admin admin\n";
  std::filesystem::rename(certs_.tokens + ".new", certs_.tokens);

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  std::string served = pem;
  while (served != read(next.server_cert) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    served = served_certificate(new_worker_token).second;
  }
  EXPECT_EQ(served, read(next.server_cert)) << "the rotated certificate was not served within 15 s";
  EXPECT_TRUE(served_certificate(new_worker_token).first.ok());
  EXPECT_EQ(served_certificate(certs_.worker_token).first.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // The metrics endpoint serves the new certificate too: a scraper trusting only the
  // next CA gets through.
  EXPECT_EQ(ScrapeMetrics(server->metrics_address(), next, &certs_, certs_.Token(certs_.admin_token)).first, 200);
}

TEST_F(CacheServerSecurityTest, OneClientCannotTakeEveryStream) {
  const std::string tokens = certs_.dir + "/two-workers";
  std::ofstream(tokens) << "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa hog worker\nbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb fair worker\n"
                        << certs_.Token(certs_.admin_token) << " admin admin\n";
  std::ofstream(certs_.dir + "/hog.token") << "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n";
  std::ofstream(certs_.dir + "/fair.token") << "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb\n";
  auto server = StartCacheServer(
      dir_, {"--tls-cert", certs_.server_cert, "--tls-key", certs_.server_key, "--auth-tokens", tokens, "--max-streams",
             "4", "--max-streams-per-client", "2", "--disk-capacity", "0", "--host-capacity", "16MiB",
             "--metrics-listen", "127.0.0.1:0"});
  ASSERT_TRUE(server->started());
  auto as = [&](const std::string& name) {
    return SecureStub(server->address(),
                      ClientSecurityOptions{.tls_ca_file = certs_.ca, .auth_token_file = certs_.dir + "/" + name});
  };
  auto hog = as("hog.token");
  std::mt19937_64 rng(FreshSeed());
  // The hog opens two Put streams and leaves them open after their first message.
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientWriter<v1::PutRequest>>> held;
  std::vector<v1::PutResponse> responses(3);
  for (int i = 0; i < 2; ++i) {
    const TestChunk chunk = RandomTestChunk(rng, 1 << 20);
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    held.push_back(hog->Put(contexts.back().get(), &responses[i]));
    v1::PutRequest first;
    *first.mutable_key() = ToProto(chunk.key);
    *first.mutable_model_fingerprint() = ToProto(chunk.fingerprint);
    first.set_header(EncodeChunkHeader(chunk.header));
    ASSERT_TRUE(held.back()->Write(first));
  }
  // Both are being served (each holds a stream slot).
  double active = 0;
  for (int i = 0; i < 500 && active < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    active = Metric(ScrapeMetrics(server->metrics_address(), certs_, nullptr, certs_.Token(certs_.admin_token)).second,
                         "lazykv_cache_active_streams");
  }
  ASSERT_EQ(active, 2);
  const PutOutcome third = PutChunk(*hog, RandomTestChunk(rng, 4096));
  EXPECT_EQ(third.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(third.status.error_message().find("max_streams_per_client=2"), std::string::npos)
      << third.status.error_message();
  // Another client still gets its streams.
  auto fair = as("fair.token");
  const TestChunk mine = RandomTestChunk(rng, 256 << 10);
  EXPECT_TRUE(PutChunk(*fair, mine).status.ok());
  EXPECT_EQ(RawGet(*fair, mine.key).stored, mine.stored());
  for (auto& context : contexts) context->TryCancel();
}

// A bf16 chunk whose values are all finite, signed with `mac` when given; with `nan_at`
// >= 0, that value is a NaN.
TestChunk FiniteChunk(std::mt19937_64& rng, size_t payload_bytes, const ChunkMac* mac, int64_t nan_at = -1) {
  TestChunk chunk = RandomTestChunk(rng, payload_bytes);
  for (size_t i = 0; i + 1 < chunk.payload.size(); i += 2) {
    const uint16_t value = static_cast<uint16_t>((rng() & 0x807F) | 0x3F00);  // |v| in [0.5, 1)
    std::memcpy(chunk.payload.data() + i, &value, 2);
  }
  if (nan_at >= 0) {
    const uint16_t nan = 0x7FC0;
    std::memcpy(chunk.payload.data() + 2 * (nan_at % (chunk.payload.size() / 2)), &nan, 2);
  }
  chunk.header = MakeChunkHeader(chunk.key, chunk.fingerprint, chunk.header.layout, chunk.payload);
  if (mac != nullptr) {
    std::vector<std::string_view> pieces{chunk.payload};
    chunk.header.mac = mac->Sign(chunk.header, pieces);
  }
  return chunk;
}

struct ReportOutcome {
  grpc::Status status;
  bool deleted = false;
};
ReportOutcome Report(v1::KvCache::Stub& stub, const TestChunk& chunk, const std::string& reason) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ReportInvalidRequest request;
  *request.mutable_key() = ToProto(chunk.key);
  request.set_header(EncodeChunkHeader(chunk.header));
  request.set_reason(reason);
  v1::ReportInvalidResponse response;
  ReportOutcome out;
  out.status = stub.ReportInvalid(&context, request, &response);
  out.deleted = response.deleted();
  return out;
}

TEST_F(CacheServerSecurityTest, WithTheFleetKeyForgedAndPoisonedChunksAreNeverStoredAndGoodOnesSurviveReports) {
  const std::string key_file = certs_.dir + "/chunk.key";
  std::ofstream(key_file) << std::string(48, 'q') << "\n";
  const ChunkMac fleet(std::string(48, 'q'));
  const ChunkMac stranger(std::string(48, 'z'));
  auto server = StartSecure({"--chunk-mac-key-file", key_file});
  auto worker = SecureStub(server->address(), As(certs_.worker_token));
  std::mt19937_64 rng(FreshSeed());

  const TestChunk unsigned_chunk = FiniteChunk(rng, 128 << 10, nullptr);
  const TestChunk foreign = FiniteChunk(rng, 128 << 10, &stranger);
  const TestChunk poisoned = FiniteChunk(rng, 128 << 10, &fleet, static_cast<int64_t>(rng() % 1000));
  const TestChunk good = FiniteChunk(rng, 128 << 10, &fleet);
  for (const TestChunk* bad : {&unsigned_chunk, &foreign, &poisoned}) {
    EXPECT_EQ(PutChunk(*worker, *bad).status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    bool found = true;
    ASSERT_TRUE(LookupStatus(*worker, bad->key, &found).ok());
    EXPECT_FALSE(found);
  }
  ASSERT_TRUE(PutChunk(*worker, good).status.ok());
  // A report against a good chunk (a confused or malicious worker) deletes nothing.
  const ReportOutcome report = Report(*worker, good, "mac");
  ASSERT_TRUE(report.status.ok()) << report.status.error_message();
  EXPECT_FALSE(report.deleted);
  EXPECT_EQ(RawGet(*worker, good.key).stored, good.stored());
  // Only workers may report.
  auto client = SecureStub(server->address(), As(certs_.client_token));
  EXPECT_EQ(Report(*client, good, "mac").status.error_code(), grpc::StatusCode::PERMISSION_DENIED);

  const auto [code, page] = ScrapeMetrics(server->metrics_address(), certs_, &certs_, certs_.Token(certs_.admin_token));
  ASSERT_EQ(code, 200);
  EXPECT_EQ(Metric(page, "lazykv_cache_rejected_total{reason=\"bad_mac\"}"), 2);
  EXPECT_EQ(Metric(page, "lazykv_cache_rejected_total{reason=\"non_finite\"}"), 1);
  EXPECT_EQ(Metric(page, "lazykv_cache_invalid_reports_total{outcome=\"verified_good\"}"), 1);
}

TEST_F(CacheServerSecurityTest, WithoutTheKeyAReportDropsExactlyTheRefusedVersion) {
  auto server = StartSecure();
  auto worker = SecureStub(server->address(), As(certs_.worker_token));
  std::mt19937_64 rng(FreshSeed());
  const ChunkMac stranger(std::string(40, 's'));
  const TestChunk forged = FiniteChunk(rng, 64 << 10, &stranger);
  const TestChunk poisoned = FiniteChunk(rng, 64 << 10, nullptr, 7);
  const TestChunk good = FiniteChunk(rng, 64 << 10, nullptr);
  for (const TestChunk* chunk : {&forged, &poisoned, &good}) ASSERT_TRUE(PutChunk(*worker, *chunk).status.ok());

  // A report naming another version of the chunk (another header) changes nothing.
  TestChunk other_version = forged;
  other_version.header.payload_checksum ^= 1;
  EXPECT_FALSE(Report(*worker, other_version, "mac").deleted);
  // The MAC failure it cannot check is taken on the worker's word; the values it checks.
  EXPECT_TRUE(Report(*worker, forged, "mac").deleted);
  EXPECT_TRUE(Report(*worker, poisoned, "non_finite").deleted);
  EXPECT_FALSE(Report(*worker, good, "non_finite").deleted);
  // A checksum the server finds good in its own copy was broken in transit: kept.
  EXPECT_FALSE(Report(*worker, good, "checksum").deleted);
  EXPECT_EQ(Report(*worker, good, "bogus").status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  bool found = false;
  for (const auto& [chunk, stays] : {std::pair{&forged, false}, {&poisoned, false}, {&good, true}}) {
    ASSERT_TRUE(LookupStatus(*worker, chunk->key, &found).ok());
    EXPECT_EQ(found, stays);
  }
}

TEST_F(CacheServerSecurityTest, ALeaseLivesWhileItsHolderRenewsItAndIsNoOneElsesToUse) {
  // A second worker with its own token: the lease binds to the caller, not to its id.
  const std::string other_token = certs_.dir + "/worker2.token";
  std::ofstream(other_token) << "feedfacefeedfacefeedfacefeedface\n";
  std::ofstream(certs_.tokens, std::ios::app) << "feedfacefeedfacefeedfacefeedface worker-2 worker\n";
  auto server = StartSecure();
  auto holder = SecureStub(server->address(), As(certs_.worker_token));
  auto other = SecureStub(server->address(), As(other_token));
  std::mt19937_64 rng(FreshSeed());
  const TestChunk chunk = RandomTestChunk(rng, 64 << 10);
  const Hash128 key = chunk.key;
  const uint32_t ttl_ms = 400 * SlowdownFactor();
  auto lease = [&](v1::KvCache::Stub& stub) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::LeaseRequest request;
    *request.mutable_key() = ToProto(key);
    request.set_ttl_ms(ttl_ms);
    v1::LeaseResponse response;
    EXPECT_TRUE(stub.Lease(&context, request, &response).ok());
    return response;
  };
  auto renew = [&](v1::KvCache::Stub& stub, uint64_t lease_id) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::RenewLeaseRequest request;
    *request.mutable_key() = ToProto(key);
    request.set_lease_id(lease_id);
    request.set_ttl_ms(ttl_ms);
    v1::RenewLeaseResponse response;
    return stub.RenewLease(&context, request, &response).error_code();
  };
  auto release = [&](v1::KvCache::Stub& stub, uint64_t lease_id) {
    grpc::ClientContext context;
    v1::ReleaseLeaseRequest request;
    *request.mutable_key() = ToProto(key);
    request.set_lease_id(lease_id);
    v1::ReleaseLeaseResponse response;
    return stub.ReleaseLease(&context, request, &response).error_code();
  };
  const v1::LeaseResponse granted = lease(*holder);
  ASSERT_EQ(granted.outcome(), v1::LeaseResponse::GRANTED);
  const v1::LeaseResponse held = lease(*other);
  EXPECT_EQ(held.outcome(), v1::LeaseResponse::HELD);
  EXPECT_EQ(held.lease_id(), 0u);  // the holder's id is not given away
  for (int i = 0; i < 8; ++i) {  // three TTLs
    std::this_thread::sleep_for(std::chrono::milliseconds(ttl_ms / 3));
    EXPECT_EQ(renew(*holder, granted.lease_id()), grpc::StatusCode::OK);
  }
  EXPECT_EQ(lease(*other).outcome(), v1::LeaseResponse::HELD);
  // Even knowing the id, another caller can neither renew, release nor publish under it.
  EXPECT_EQ(renew(*other, granted.lease_id()), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(release(*other, granted.lease_id()), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(RawPut(*other, chunk.key, chunk.fingerprint, EncodeChunkHeader(chunk.header), chunk.payload,
                   granted.lease_id())
                .status.error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  auto client = SecureStub(server->address(), As(certs_.client_token));
  EXPECT_EQ(renew(*client, granted.lease_id()), grpc::StatusCode::PERMISSION_DENIED);
  // The holder stops renewing (it crashed): within a TTL the lease is another's.
  std::this_thread::sleep_for(std::chrono::milliseconds(ttl_ms + ttl_ms / 4));
  const v1::LeaseResponse taken = lease(*other);
  EXPECT_EQ(taken.outcome(), v1::LeaseResponse::GRANTED);
  EXPECT_NE(taken.lease_id(), granted.lease_id());
  EXPECT_EQ(renew(*holder, granted.lease_id()), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(RawPut(*other, chunk.key, chunk.fingerprint, EncodeChunkHeader(chunk.header), chunk.payload,
                     taken.lease_id())
                  .status.ok());
}

}  // namespace
}  // namespace lazykv::testing
