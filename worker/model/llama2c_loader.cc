#include "worker/model/llama2c_loader.h"

#include <cstring>

#include "absl/strings/str_format.h"
#include "common/mapped_file.h"
#include "common/status_macros.h"

namespace lazykv {
namespace {

constexpr size_t kHeaderBytes = 7 * sizeof(int32_t);
constexpr uint32_t kVersionedMagic = 0x616b3432;  // "ak42": llama2.c export versions 1 and 2

}  // namespace

absl::StatusOr<ModelWeights> LoadLlama2cCheckpoint(const std::string& path) {
  ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  auto bad = [&](const std::string& what) { return absl::InvalidArgumentError(absl::StrFormat("%s: %s", path, what)); };
  if (file.size() < kHeaderBytes) {
    return bad(absl::StrFormat("truncated: %d bytes, a llama2.c header needs %d", file.size(), kHeaderBytes));
  }
  int32_t header[7];
  std::memcpy(header, file.bytes().data(), kHeaderBytes);
  if (static_cast<uint32_t>(header[0]) == kVersionedMagic) {
    return bad(
        absl::StrFormat("llama2.c export version %d (magic 'ak42') is not supported; "
                        "only the legacy version-0 format is",
                        header[1]));
  }
  ModelConfig c;
  c.name = path;
  c.dim = header[0];
  c.hidden_dim = header[1];
  c.n_layers = header[2];
  c.n_heads = header[3];
  c.n_kv_heads = header[4];
  c.shared_classifier = header[5] > 0;
  c.vocab_size = header[5] > 0 ? header[5] : -static_cast<int64_t>(header[5]);
  c.max_seq_len = header[6];
  c.head_dim = c.n_heads > 0 ? c.dim / c.n_heads : 0;
  c.rope.style = RopeStyle::kInterleaved;
  c.rope.theta = 10000.0;
  c.norm_eps = 1e-5f;
  c.bos_id = 1;
  c.eos_id = 2;
  if (c.n_heads > 0 && c.dim % c.n_heads != 0) {
    return bad(absl::StrFormat("bad header: dim %d is not a multiple of n_heads %d", c.dim, c.n_heads));
  }
  if (absl::Status s = c.Validate(); !s.ok()) return bad(absl::StrCat("bad header: ", s.message()));
  if (c.max_seq_len > (1 << 24)) return bad(absl::StrFormat("bad header: seq_len %d out of range", c.max_seq_len));

  // The file holds every tensor the header implies and two RoPE tables. Its size is
  // checked before anything is allocated: a header alone must not make the loader
  // allocate (and zero) what it claims, up to terabytes.
  const size_t rope_table = static_cast<size_t>(c.max_seq_len) * c.head_dim / 2;
  size_t expected_floats = 2 * rope_table;
  ModelWeights shape;  // no tensor allocated: only the config and the layer count
  shape.config = c;
  shape.layers.resize(c.n_layers);
  ForEachTensor(shape, [&](const std::string&, const std::vector<float>&, size_t n) { expected_floats += n; });
  const size_t expected_bytes = kHeaderBytes + expected_floats * sizeof(float);
  if (file.size() != expected_bytes) {
    return bad(
        absl::StrFormat("%s: file has %d bytes, the header (dim %d, hidden %d, layers %d, heads %d, "
                        "kv_heads %d, vocab %d, seq_len %d) implies %d",
                        file.size() < expected_bytes ? "truncated" : "trailing data", file.size(), c.dim, c.hidden_dim,
                        c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.max_seq_len, expected_bytes));
  }

  ModelWeights w = AllocateWeights(c);
  // The file stores each kind of tensor for all layers together, in this order.
  const uint8_t* cursor = file.bytes().data() + kHeaderBytes;
  auto take = [&](std::vector<float>& dst) {
    std::memcpy(dst.data(), cursor, dst.size() * sizeof(float));
    cursor += dst.size() * sizeof(float);
  };
  auto take_per_layer = [&](std::vector<float> LayerWeights::*member) {
    for (LayerWeights& layer : w.layers) take(layer.*member);
  };
  take(w.embedding);
  take_per_layer(&LayerWeights::attn_norm);
  take_per_layer(&LayerWeights::wq);
  take_per_layer(&LayerWeights::wk);
  take_per_layer(&LayerWeights::wv);
  take_per_layer(&LayerWeights::wo);
  take_per_layer(&LayerWeights::ffn_norm);
  take_per_layer(&LayerWeights::w_gate);
  take_per_layer(&LayerWeights::w_down);
  take_per_layer(&LayerWeights::w_up);
  take(w.final_norm);
  cursor += 2 * rope_table * sizeof(float);  // precomputed freq_cis tables: we compute our own
  if (!c.shared_classifier) take(w.classifier);
  w.content_hash = HashWeights(w);
  return w;
}

}  // namespace lazykv
