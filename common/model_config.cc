#include "common/model_config.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "absl/strings/str_format.h"

namespace lazykv {

std::vector<double> RopeInverseFrequencies(const RopeConfig& rope, int head_dim) {
  std::vector<double> inv(head_dim / 2);
  for (int i = 0; i < head_dim / 2; ++i) {
    inv[i] = std::pow(rope.theta, -2.0 * i / head_dim);
  }
  if (!rope.llama3_scaling) return inv;
  // Llama 3.1 scaling: keep high frequencies, divide low ones by the factor, blend between.
  const double low_freq_wavelen = rope.original_max_position / rope.low_freq_factor;
  const double high_freq_wavelen = rope.original_max_position / rope.high_freq_factor;
  for (double& f : inv) {
    const double wavelen = 2.0 * std::numbers::pi / f;
    if (wavelen < high_freq_wavelen) continue;
    if (wavelen > low_freq_wavelen) {
      f /= rope.scaling_factor;
    } else {
      const double smooth = (rope.original_max_position / wavelen - rope.low_freq_factor) /
                            (rope.high_freq_factor - rope.low_freq_factor);
      f = (1.0 - smooth) * f / rope.scaling_factor + smooth * f;
    }
  }
  return inv;
}

bool ModelConfig::IsEndOfSequence(int id) const {
  return id == eos_id || std::find(other_eos_ids.begin(), other_eos_ids.end(), id) != other_eos_ids.end();
}

absl::Status ModelConfig::Validate() const {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrFormat("model %s: %s", name, what));
  };
  constexpr int kMaxDim = 1 << 16;
  if (dim <= 0 || dim > kMaxDim) return bad(absl::StrFormat("dim %d out of range [1, %d]", dim, kMaxDim));
  if (hidden_dim <= 0 || hidden_dim > 4 * kMaxDim)
    return bad(absl::StrFormat("hidden_dim %d out of range", hidden_dim));
  if (n_layers <= 0 || n_layers > 1024) return bad(absl::StrFormat("n_layers %d out of range [1, 1024]", n_layers));
  if (n_heads <= 0 || n_heads > 1024) return bad(absl::StrFormat("n_heads %d out of range", n_heads));
  if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0)
    return bad(absl::StrFormat("n_kv_heads %d must divide n_heads %d", n_kv_heads, n_heads));
  if (head_dim <= 0 || head_dim % 2 != 0 || head_dim > 1024)
    return bad(absl::StrFormat("head_dim %d must be even and at most 1024", head_dim));
  if (vocab_size <= 0 || vocab_size > (1 << 24)) return bad(absl::StrFormat("vocab_size %d out of range", vocab_size));
  if (max_seq_len <= 0) return bad(absl::StrFormat("max_seq_len %d must be positive", max_seq_len));
  if (!(norm_eps > 0)) return bad("norm_eps must be positive");
  if (!(rope.theta > 1)) return bad("rope theta must be greater than 1");
  if (rope.llama3_scaling && !(rope.high_freq_factor > rope.low_freq_factor && rope.scaling_factor > 0))
    return bad("llama3 rope scaling needs high_freq_factor > low_freq_factor and factor > 0");
  if (bos_id < 0 || bos_id >= vocab_size) return bad(absl::StrFormat("bos_id %d outside the vocabulary", bos_id));
  if (eos_id < 0 || eos_id >= vocab_size) return bad(absl::StrFormat("eos_id %d outside the vocabulary", eos_id));
  for (int id : other_eos_ids) {
    if (id < 0 || id >= vocab_size) return bad(absl::StrFormat("eos_token_id %d outside the vocabulary", id));
  }
  return absl::OkStatus();
}

void ModelConfig::HashInto(Hasher128& hasher) const {
  hasher.AddString("lazykv.model_config.v1");
  for (int v : {dim, hidden_dim, n_layers, n_heads, n_kv_heads, head_dim, vocab_size, bos_id, eos_id}) {
    hasher.AddU64(static_cast<uint64_t>(v));
  }
  hasher.AddRaw(&norm_eps, sizeof(norm_eps));
  hasher.AddU64(rope.style == RopeStyle::kInterleaved ? 0 : 1);
  hasher.AddU64(shared_classifier ? 1 : 0);
  hasher.AddU64(rope.llama3_scaling ? 1 : 0);
  for (double v :
       {rope.theta, rope.scaling_factor, rope.low_freq_factor, rope.high_freq_factor, rope.original_max_position}) {
    hasher.AddRaw(&v, sizeof(v));
  }
}

}  // namespace lazykv
