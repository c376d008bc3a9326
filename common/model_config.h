// Architecture of a Llama-family model: everything the kernels and the engine need
// to know about a checkpoint, independent of where its weights came from.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/chunk_key.h"

namespace lazykv {

enum class RopeStyle {
  kInterleaved,  // pairs (2i, 2i+1): llama2.c checkpoints
  kRotateHalf,   // pairs (i, i + d/2): Hugging Face Llama checkpoints
};

struct RopeConfig {
  RopeStyle style = RopeStyle::kInterleaved;
  double theta = 10000.0;
  // Llama-3 frequency scaling ("rope_type": "llama3").
  bool llama3_scaling = false;
  double scaling_factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_position = 8192.0;
};

// Inverse frequencies theta_i for i in [0, head_dim/2), in double precision so that
// p * theta_i stays exact enough at large positions (DESIGN.md section 2).
std::vector<double> RopeInverseFrequencies(const RopeConfig& rope, int head_dim);

struct ModelConfig {
  std::string name;  // where it came from, for messages
  int dim = 0;
  int hidden_dim = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int vocab_size = 0;
  int max_seq_len = 0;
  float norm_eps = 1e-5f;
  RopeConfig rope;
  bool shared_classifier = true;
  int bos_id = 1;
  int eos_id = 2;
  // More ids that end a reply as eos_id does: config.json's eos_token_id list past its
  // first, and generation_config.json's (Llama 3 Instruct ends a turn with <|eot_id|>).
  std::vector<int> other_eos_ids;
  bool IsEndOfSequence(int id) const;

  int q_dim() const { return n_heads * head_dim; }
  int kv_dim() const { return n_kv_heads * head_dim; }
  int group_size() const { return n_heads / n_kv_heads; }

  // Checks that the shape is self-consistent and within sane bounds.
  absl::Status Validate() const;
  // Adds the architecture (not the name) to a fingerprint.
  void HashInto(Hasher128& hasher) const;
};

}  // namespace lazykv
