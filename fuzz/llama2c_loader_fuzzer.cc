// llama2c_loader_fuzzer: the llama2.c checkpoint loader (worker/model/llama2c_loader.h,
// LoadLlama2cCheckpoint), which takes a path: each input is written to a scratch file and
// loaded.
//
// Each input is used twice:
// - raw: the bytes are the file;
// - structured: the input picks a header (small dimensions, or any int32 in one field) and
//   the file is built at exactly the size that header implies (computed here, from
//   llama2.c's layout), give or take a few bytes, so that loading gets past the size check.
// Invariants (abort on violation):
// - loading never allocates much more than the file holds (libFuzzer's -malloc_limit_mb,
//   which defaults to -rss_limit_mb, catches a header that makes it allocate gigabytes);
// - a loaded model's shape is valid and its tensors have the sizes the shape implies;
//   the file is exactly the size the header implies, and the embedding holds the file's
//   first floats after the header;
// - a file whose size differs from what its header implies is refused.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstring>
#include <optional>
#include <string>

#include "fuzz/fuzz_util.h"
#include "worker/model/llama2c_loader.h"

namespace {

using namespace lazykv;

constexpr size_t kHeaderBytes = 7 * sizeof(int32_t);
constexpr size_t kMaxFileBytes = 1 << 20;   // inputs are far smaller
constexpr size_t kMaxBuiltBytes = 1 << 18;  // a generated file (larger ones only slow the fuzzer)

// The file size a llama2.c version-0 header implies (run.c's memory_map_weights), or
// nullopt when it is not a shape worth building.
std::optional<uint64_t> ImpliedBytes(const int32_t h[7]) {
  const int64_t dim = h[0], hidden = h[1], layers = h[2], heads = h[3], kv_heads = h[4], seq = h[6];
  const int64_t vocab = h[5] < 0 ? -static_cast<int64_t>(h[5]) : h[5];
  if (dim <= 0 || hidden <= 0 || layers <= 0 || heads <= 0 || kv_heads <= 0 || vocab <= 0 || seq <= 0) {
    return std::nullopt;
  }
  if (dim > 4096 || hidden > 4096 || layers > 64 || heads > 64 || kv_heads > 64 || vocab > 65536 || seq > 4096) {
    return std::nullopt;
  }
  const int64_t head = dim / heads, kv_dim = kv_heads * head;
  int64_t floats = vocab * dim;                                // token embedding
  floats += layers * (dim + dim * dim + 2 * dim * kv_dim + dim * dim + dim + 3 * dim * hidden);
  floats += dim + seq * head;                                  // final norm, freq_cis real and imaginary halves
  if (h[5] < 0) floats += vocab * dim;                         // an unshared classifier
  return kHeaderBytes + static_cast<uint64_t>(floats) * 4;
}

void Load(const std::string& bytes, std::optional<uint64_t> implied) {
  static const std::string path = fuzz::ScratchDir() + "/model.bin";
  fuzz::WriteFile(path, bytes);
  const absl::StatusOr<ModelWeights> w = LoadLlama2cCheckpoint(path);
  if (!w.ok()) {
    FUZZ_CHECK(!w.status().message().empty());
    return;
  }
  const ModelConfig& c = w->config;
  FUZZ_CHECK(c.Validate().ok());
  FUZZ_CHECK(c.head_dim * c.n_heads == c.dim);
  FUZZ_CHECK(w->layers.size() == static_cast<size_t>(c.n_layers));
  ForEachTensor(*w, [&](const std::string&, const std::vector<float>& t, size_t n) { FUZZ_CHECK(t.size() == n); });
  int32_t h[7];
  std::memcpy(h, bytes.data(), kHeaderBytes);
  const std::optional<uint64_t> expected = ImpliedBytes(h);
  if (expected) FUZZ_CHECK(*expected == bytes.size());
  if (implied) FUZZ_CHECK(*implied == bytes.size());
  FUZZ_CHECK(std::memcmp(w->embedding.data(), bytes.data() + kHeaderBytes, w->embedding.size() * 4) == 0);
}

// Mostly small; sometimes a power of two (large shapes that divide evenly) or any int32.
int32_t Dim(FuzzedDataProvider& in, int32_t max) {
  switch (in.ConsumeIntegralInRange<int>(0, 15)) {
    case 0: return in.ConsumeIntegral<int32_t>();
    case 1: return int32_t{1} << in.ConsumeIntegralInRange<int>(0, 30);
    default: return in.ConsumeIntegralInRange<int32_t>(1, max);
  }
}

void Structured(FuzzedDataProvider& in) {
  int32_t h[7];
  h[0] = Dim(in, 16);    // dim
  h[1] = Dim(in, 32);    // hidden_dim
  h[2] = Dim(in, 3);     // n_layers
  h[3] = Dim(in, 4);     // n_heads
  h[4] = Dim(in, 4);     // n_kv_heads
  h[5] = Dim(in, 300);   // vocab_size (negative: an unshared classifier)
  if (in.ConsumeBool()) h[5] = static_cast<int32_t>(0u - static_cast<uint32_t>(h[5]));  // INT_MIN stays
  h[6] = Dim(in, 16);    // seq_len
  const int delta = in.ConsumeIntegralInRange<int>(-8, 8) * (in.ConsumeBool() ? 1 : 4);
  const std::string fill = in.ConsumeRandomLengthString(64);
  const std::optional<uint64_t> implied = ImpliedBytes(h);
  uint64_t size = implied.value_or(kHeaderBytes + 64);
  if (static_cast<int64_t>(size) + delta < 0 || size + delta > kMaxBuiltBytes) return;
  size += delta;
  std::string bytes(size, '\0');
  std::memcpy(bytes.data(), h, std::min<uint64_t>(size, kHeaderBytes));
  for (size_t i = kHeaderBytes; !fill.empty() && i < size; ++i) bytes[i] = fill[i % fill.size()];
  Load(bytes, delta == 0 ? implied : std::nullopt);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxFileBytes) return 0;
  Load(std::string(reinterpret_cast<const char*>(data), size), std::nullopt);
  FuzzedDataProvider in(data, size);
  Structured(in);
  return 0;
}
