#include "tests/cache_server/cache_test_util.h"

#include <cstdlib>

#include <filesystem>

#include "common/chunk_wire.h"
#include "common/grpc_util.h"
#include "tests/test_util.h"

namespace lazykv::testing {

TestChunk RandomTestChunk(std::mt19937_64& rng, size_t payload_bytes) {
  ChunkLayout layout{
      .num_layers = 2, .n_kv_heads = 2, .head_dim = 64, .num_tokens = 1, .anchor_tokens = 1, .dtype = KvDtype::kBf16};
  layout.num_tokens =
      static_cast<uint32_t>(std::max<size_t>(1, payload_bytes / (2 * layout.num_layers * layout.row_bytes())));
  TestChunk chunk;
  chunk.key = Hash128{rng(), rng()};
  chunk.fingerprint = Hash128{rng(), rng()};
  chunk.payload.resize(layout.payload_bytes());
  for (size_t i = 0; i < chunk.payload.size(); i += 8) {
    const uint64_t word = rng();
    std::memcpy(chunk.payload.data() + i, &word, std::min<size_t>(8, chunk.payload.size() - i));
  }
  chunk.header = MakeChunkHeader(chunk.key, chunk.fingerprint, layout, chunk.payload);
  return chunk;
}

std::string TempDir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / (name + "_" + std::to_string(FreshSeed()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

std::unique_ptr<ServerProcess> StartCacheServer(const std::string& data_dir, std::vector<std::string> flags) {
  std::vector<std::string> args = {"--listen", "127.0.0.1:0", "--data-dir", data_dir + "/db"};
  args.insert(args.end(), flags.begin(), flags.end());
  // $LAZYKV_CACHE_SERVER where the build's path is not there (a test bundled for a GPU machine).
  const char* binary = std::getenv("LAZYKV_CACHE_SERVER");
  return std::make_unique<ServerProcess>(binary != nullptr && *binary != '\0' ? binary : LAZYKV_CACHE_SERVER, args,
                                         data_dir + "/server.log");
}

std::unique_ptr<v1::KvCache::Stub> CacheStub(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  return v1::KvCache::NewStub(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
}

PutOutcome RawPut(v1::KvCache::Stub& stub, const Hash128& key, const Hash128& fingerprint, const std::string& header,
                  const std::string& payload, uint64_t lease_id, size_t slice) {
  PutOutcome out;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  out.status = PutChunkSlices(stub, &context, ToProto(key), ToProto(fingerprint), lease_id, header, payload, slice,
                              &out.response);
  return out;
}

PutOutcome PutChunk(v1::KvCache::Stub& stub, const TestChunk& chunk) {
  return RawPut(stub, chunk.key, chunk.fingerprint, EncodeChunkHeader(chunk.header), chunk.payload);
}

GetOutcome RawGet(v1::KvCache::Stub& stub, const Hash128& key) {
  GetOutcome out;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::GetRequest request;
  *request.mutable_key() = ToProto(key);
  auto reader = stub.Get(&context, request);
  v1::GetResponse message;
  bool first = true;
  while (reader->Read(&message)) {
    if (first) out.tier = message.tier();
    first = false;
    out.stored += message.header();
    out.stored += message.data();
  }
  out.status = reader->Finish();
  return out;
}

bool ReachesTier(v1::KvCache::Stub& stub, const Hash128& key, v1::Tier tier, std::chrono::milliseconds limit) {
  return Eventually(
      [&] {
        grpc::ClientContext context;
        v1::LookupRequest request;
        *request.add_keys() = ToProto(key);
        v1::LookupResponse response;
        return stub.Lookup(&context, request, &response).ok() && response.results_size() == 1 &&
               response.results(0).found() && response.results(0).tier() == tier;
      },
      limit);
}

void CacheServerTest::SetUp() {
  seed_ = FreshSeed();
  rng_.seed(seed_);
  dir_ = TempDir(name_);
}

void CacheServerTest::TearDown() {
  server_.reset();
  if (!dir_.empty()) std::filesystem::remove_all(dir_);
}

bool CacheServerTest::StartServer(std::vector<std::string> flags) {
  server_ = StartCacheServer(dir_, std::move(flags));
  EXPECT_TRUE(server_->started()) << server_->first_line();
  if (!server_->started()) return false;
  stub_ = CacheStub(server_->address());
  return true;
}

v1::StatsResponse Stats(v1::KvCache::Stub& stub) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::StatsResponse response;
  (void)stub.Stats(&context, v1::StatsRequest(), &response);
  return response;
}

double Metric(const std::string& page, const std::string& series) {
  for (size_t at = page.find(series); at != std::string::npos; at = page.find(series, at + 1)) {
    if ((at == 0 || page[at - 1] == '\n') && page[at + series.size()] == ' ') {
      return std::stod(page.substr(at + series.size() + 1));
    }
  }
  return -1;
}

}  // namespace lazykv::testing
