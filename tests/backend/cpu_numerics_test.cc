// The CPU backend's GPU-like numerics (CpuNumerics::kBf16LikeCuda) against a one-layer
// forward pass written out here with explicit bf16 rounding at the CUDA backend's points:
// equal logits and pool contents with every point, measurably different without any one
// of them; fp32 (the default) against the same pass with no rounding at all. Also: the
// bf16 rounding itself (nearest, ties to even), block copies, and bf16 chunk payloads.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "gtest/gtest.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/dense_ops.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/rope.h"
#include "tests/test_util.h"
#include "worker/backend/cpu_backend.h"
#include "worker/model/synthetic_model.h"

namespace lazykv::testing {
namespace {

TEST(Bf16Test, RoundsToNearestTiesToEven) {
  const float one = 1.0f, ulp = std::ldexp(1.0f, -7);                             // bf16 has 7 fraction bits
  EXPECT_EQ(cpu::RoundToBf16(one + ulp / 2), one);                                // tie, even below
  EXPECT_EQ(cpu::RoundToBf16(one + 3 * ulp / 2), one + 2 * ulp);                  // tie, even above
  EXPECT_EQ(cpu::RoundToBf16(one + ulp / 2 + std::ldexp(1.0f, -20)), one + ulp);  // past the tie
  EXPECT_EQ(cpu::RoundToBf16(-(one + 3 * ulp / 2)), -(one + 2 * ulp));
  EXPECT_EQ(cpu::RoundToBf16(std::numeric_limits<float>::max()), std::numeric_limits<float>::infinity());
  EXPECT_EQ(cpu::RoundToBf16(-std::numeric_limits<float>::infinity()), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(cpu::FloatToBf16Bits(std::numeric_limits<float>::quiet_NaN()), 0x7fff);
  EXPECT_EQ(cpu::FloatToBf16Bits(-0.0f), 0x8000);

  // Random floats of every magnitude: the result is a bf16 value, one of the two around
  // the input, and the nearer one.
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<uint32_t> bits(0, 0x7f7effffu);  // finite, rounding to finite, non-negative
  for (int i = 0; i < 100000; ++i) {
    const uint32_t u = bits(rng);
    const float f = std::bit_cast<float>(u);
    const float r = cpu::RoundToBf16(f);
    const uint32_t truncated = u & 0xffff0000u;
    const float below = std::bit_cast<float>(truncated), above = std::bit_cast<float>(truncated + 0x10000u);
    ASSERT_EQ(std::bit_cast<uint32_t>(r) & 0xffffu, 0u) << f;
    ASSERT_TRUE(r == below || r == above) << f;
    const double d_r = std::abs(static_cast<double>(r) - f);
    const double d_other = std::abs(static_cast<double>(r == below ? above : below) - f);
    ASSERT_LE(d_r, d_other) << f;
    ASSERT_EQ(cpu::RoundToBf16(-f), -r);
  }
}

// The CUDA backend's rounding points, each switchable for the reference below.
enum Point : unsigned {
  kWeights = 1u << 0,
  kAttnNormOut = 1u << 1,
  kKeys = 1u << 2,
  kValues = 1u << 3,
  kAttnOut = 1u << 4,
  kFfnNormOut = 1u << 5,
  kSwiGluOut = 1u << 6,
  kFinalNormOut = 1u << 7,
};
constexpr unsigned kAllPoints = (1u << 8) - 1;
constexpr const char* kPointNames[] = {"weights",       "attention norm output", "keys",
                                       "values",        "attention output",      "FFN norm output",
                                       "SwiGLU output", "final norm output"};

struct Reference {
  std::vector<float> logits;                     // [tokens][vocab]
  std::vector<std::vector<float>> keys, values;  // per layer [tokens][kv_dim], as stored
};

// The forward pass over `tokens` from position 0, composed from the CPU kernels as a
// straight sequence (one contiguous block, no paging, no engine), rounding each value to
// bf16 where `points` says.
Reference ForwardRoundingAt(ModelWeights w, const std::vector<int32_t>& tokens, unsigned points) {
  auto round = [&](Point p, std::vector<float>& v) {
    if (points & p) cpu::RoundToBf16(v.data(), v.size());
  };
  if (points & kWeights) {
    ForEachTensor(w, [](const std::string& name, std::vector<float>& t, size_t) {
      if (!name.ends_with("norm")) cpu::RoundToBf16(t.data(), t.size());
    });
  }
  const ModelConfig& c = w.config;
  const int n = static_cast<int>(tokens.size());
  const size_t dim = c.dim, kv_dim = c.kv_dim(), q_dim = c.q_dim(), hidden = c.hidden_dim;
  const cpu::RopeTable rope(c.rope, c.head_dim);
  std::vector<float> x(n * dim), xb(n * dim), q(n * q_dim), attn(n * q_dim), o(n * dim), gate(n * hidden),
      up(n * hidden);
  std::vector<int32_t> positions(n);
  for (int i = 0; i < n; ++i) {
    positions[i] = i;
    std::copy_n(&w.embedding[tokens[i] * dim], dim, &x[i * dim]);
  }
  const KvBlockRef whole{0, n, 0};
  Reference ref;
  for (const LayerWeights& lw : w.layers) {
    std::vector<float> k(n * kv_dim), v(n * kv_dim);
    cpu::RmsNorm(x.data(), lw.attn_norm.data(), n, dim, c.norm_eps, xb.data());
    round(kAttnNormOut, xb);
    cpu::MatmulTransposed(xb.data(), n, dim, lw.wq.data(), q_dim, q.data());
    cpu::MatmulTransposed(xb.data(), n, dim, lw.wk.data(), kv_dim, k.data());
    cpu::MatmulTransposed(xb.data(), n, dim, lw.wv.data(), kv_dim, v.data());
    for (int i = 0; i < n; ++i) rope.RotateHeads(&k[i * kv_dim], c.n_kv_heads, i);
    round(kKeys, k);
    round(kValues, v);
    const cpu::KvLayerView view{k.data(), v.data(), 1, n, c.n_kv_heads, c.head_dim};
    cpu::LazyPagedAttention(q.data(), positions.data(), n, c.n_heads, {&whole, 1}, view, rope, attn.data());
    round(kAttnOut, attn);
    cpu::MatmulTransposed(attn.data(), n, q_dim, lw.wo.data(), dim, o.data());
    cpu::AddInPlace(x.data(), o.data(), x.size());
    cpu::RmsNorm(x.data(), lw.ffn_norm.data(), n, dim, c.norm_eps, xb.data());
    round(kFfnNormOut, xb);
    cpu::MatmulTransposed(xb.data(), n, dim, lw.w_gate.data(), hidden, gate.data());
    cpu::MatmulTransposed(xb.data(), n, dim, lw.w_up.data(), hidden, up.data());
    cpu::SwiGlu(gate.data(), up.data(), gate.size());
    round(kSwiGluOut, gate);
    cpu::MatmulTransposed(gate.data(), n, hidden, lw.w_down.data(), dim, o.data());
    cpu::AddInPlace(x.data(), o.data(), x.size());
    ref.keys.push_back(std::move(k));
    ref.values.push_back(std::move(v));
  }
  cpu::RmsNorm(x.data(), w.final_norm.data(), n, dim, c.norm_eps, xb.data());
  round(kFinalNormOut, xb);
  ref.logits.resize(n * static_cast<size_t>(c.vocab_size));
  cpu::MatmulTransposed(xb.data(), n, dim, w.output_matrix().data(), c.vocab_size, ref.logits.data());
  return ref;
}

// What a backend computes over `tokens`: all but the last as one prefill step into
// scattered blocks, the last as a decode step; the logits of every token, and the pool's
// K and V as a chunk payload decoded to floats ([layer][K|V][token][kv_dim]).
struct BackendRun {
  std::vector<float> logits;
  std::vector<float> kv;
};

BackendRun RunBackend(Backend& backend, const std::vector<int32_t>& tokens, std::mt19937_64& rng) {
  const int n = static_cast<int>(tokens.size()), bs = backend.block_size();
  std::vector<int32_t> ids(backend.num_blocks());
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<KvBlockRef> blocks;
  for (int t = 0; t < n; t += bs) blocks.push_back({ids[blocks.size()], std::min(bs, n - t), 0});
  std::vector<KvBlockRef> prefix = blocks;  // the table before the last token
  if (--prefix.back().num_tokens == 0) prefix.pop_back();
  BackendRun run;
  const std::vector<int32_t> head(tokens.begin(), tokens.end() - 1);
  const SequenceStep prefill{head, prefix, LogitsWanted::kAll};
  const SequenceStep decode{{&tokens.back(), 1}, blocks, LogitsWanted::kLast};
  std::vector<std::vector<float>> logits;
  EXPECT_TRUE(backend.Forward({&prefill, 1}, &logits).ok());
  run.logits = logits[0];
  EXPECT_TRUE(backend.Forward({&decode, 1}, &logits).ok());
  run.logits.insert(run.logits.end(), logits[0].begin(), logits[0].end());
  std::string payload;
  EXPECT_TRUE(backend.ExportChunk(blocks, &payload).ok());
  if (backend.kv_dtype() == "bf16") {
    run.kv.resize(payload.size() / 2);
    for (size_t i = 0; i < run.kv.size(); ++i) {
      uint16_t bits;
      std::memcpy(&bits, payload.data() + 2 * i, 2);
      run.kv[i] = cpu::Bf16BitsToFloat(bits);
    }
  } else {
    run.kv.resize(payload.size() / 4);
    std::memcpy(run.kv.data(), payload.data(), payload.size());
  }
  return run;
}

std::vector<float> PayloadOrder(const Reference& ref) {
  std::vector<float> kv;
  for (size_t l = 0; l < ref.keys.size(); ++l) {
    kv.insert(kv.end(), ref.keys[l].begin(), ref.keys[l].end());
    kv.insert(kv.end(), ref.values[l].begin(), ref.values[l].end());
  }
  return kv;
}

ModelConfig OneLayer(const std::string& name) {
  ModelConfig config = *SyntheticConfig(name);
  config.n_layers = 1;
  return config;
}

std::unique_ptr<Backend> MakeBackend(const ModelWeights& weights, CpuNumerics numerics) {
  auto backend = CreateCpuBackend(weights, 16, 32, CpuBackendOptions{.numerics = numerics});
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? *std::move(backend) : nullptr;
}

// Fresh weights and tokens per model variant (interleaved RoPE with a shared classifier,
// rotate-half with its own, Llama-3 scaling with GQA 4:1).
TEST(CpuNumericsTest, Bf16LikeCudaRoundsExactlyAtTheCudaBackendsPoints) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (const std::string name : {"tiny", "tiny-hf", "tiny-llama3"}) {
    SCOPED_TRACE(name);
    const ModelConfig config = OneLayer(name);
    const ModelWeights weights = MakeSyntheticWeights(config, rng());
    const std::vector<int32_t> tokens =
        RandomTokens(rng, std::uniform_int_distribution<int>(24, 70)(rng), config.vocab_size);
    auto gpu_like = MakeBackend(weights, CpuNumerics::kBf16LikeCuda);
    ASSERT_NE(gpu_like, nullptr);
    EXPECT_EQ(gpu_like->kv_dtype(), "bf16");
    const BackendRun run = RunBackend(*gpu_like, tokens, rng);
    const Reference ref = ForwardRoundingAt(weights, tokens, kAllPoints);
    // The same arithmetic in the same order: equal up to nothing, 1e-6 allowed.
    EXPECT_LE(RelativeError(run.logits, ref.logits), 1e-6);
    EXPECT_LE(RelativeError(run.kv, PayloadOrder(ref)), 1e-6);
    // Each point matters: leaving any one out changes the logits by far more.
    double smallest = 1;
    for (int p = 0; p < 8; ++p) {
      const Reference without = ForwardRoundingAt(weights, tokens, kAllPoints & ~(1u << p));
      const double error = RelativeError(run.logits, without.logits);
      EXPECT_GT(error, 1e-5) << "without rounding the " << kPointNames[p];
      smallest = std::min(smallest, error);
    }
    // The mode against plain fp32: a bf16-sized difference, not more.
    const Reference fp32 = ForwardRoundingAt(weights, tokens, 0);
    const double difference = RelativeError(run.logits, fp32.logits);
    EXPECT_GT(difference, 1e-4);
    EXPECT_LT(difference, 3e-2);
    std::printf(
        "%s: GPU-like numerics vs explicit rounding %.1e, without one of the points at least %.1e, vs fp32 "
        "%.1e\n",
        name.c_str(), RelativeError(run.logits, ref.logits), smallest, difference);
  }
}

TEST(CpuNumericsTest, Fp32DefaultRoundsNowhere) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const ModelConfig config = OneLayer("tiny-hf");
  const ModelWeights weights = MakeSyntheticWeights(config, rng());
  const std::vector<int32_t> tokens =
      RandomTokens(rng, std::uniform_int_distribution<int>(24, 70)(rng), config.vocab_size);
  auto backend = CreateCpuBackend(weights, 16, 32);  // default options
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->kv_dtype(), "fp32");
  const BackendRun run = RunBackend(**backend, tokens, rng);
  const Reference ref = ForwardRoundingAt(weights, tokens, 0);
  EXPECT_LE(RelativeError(run.logits, ref.logits), 1e-6);
  EXPECT_LE(RelativeError(run.kv, PayloadOrder(ref)), 1e-6);
  size_t off_grid = 0;  // fp32 KV: nearly every value has bits below bf16's
  for (float v : run.kv) off_grid += cpu::RoundToBf16(v) != v;
  EXPECT_GT(off_grid, run.kv.size() * 9 / 10);
  // And the plain double-precision forward pass agrees to fp32 accuracy.
  const auto naive = NaiveForward(weights, tokens);
  for (size_t t = 0; t < tokens.size(); ++t) {
    const std::vector<float> row(run.logits.begin() + t * config.vocab_size,
                                 run.logits.begin() + (t + 1) * config.vocab_size);
    EXPECT_LT(RelativeError(row, naive[t]), 1e-4) << "token " << t;
  }
}

// A block copy (the block baseline's materialize) re-rotates bf16 keys and rounds them
// again, as the GPU's materialize kernel does; values are copied bit for bit.
TEST(CpuNumericsTest, BlockCopiesRoundTheRotatedKeys) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const ModelConfig config = OneLayer("tiny");
  const ModelWeights weights = MakeSyntheticWeights(config, rng());
  auto backend = MakeBackend(weights, CpuNumerics::kBf16LikeCuda);
  ASSERT_NE(backend, nullptr);
  const std::vector<int32_t> tokens = RandomTokens(rng, 16, config.vocab_size);
  const std::vector<KvBlockRef> src = {{5, 16, 0}}, dst = {{9, 16, 0}};
  const SequenceStep step{tokens, src, LogitsWanted::kNone};
  std::vector<std::vector<float>> unused;
  ASSERT_TRUE(backend->Forward({&step, 1}, &unused).ok());
  const int32_t delta = std::uniform_int_distribution<int32_t>(1, 100000)(rng);
  ASSERT_TRUE(backend->CopyBlocksRotated(std::vector<BlockCopy>{{5, 9, 16, delta}}).ok());
  std::string before, after;
  ASSERT_TRUE(backend->ExportChunk(src, &before).ok());
  ASSERT_TRUE(backend->ExportChunk(dst, &after).ok());
  ASSERT_EQ(before.size(), after.size());
  const size_t kv_dim = config.kv_dim(), plane = 16 * kv_dim;  // values per K or V plane
  std::vector<float> k(plane), k_copy(plane);
  for (size_t i = 0; i < plane; ++i) {
    uint16_t a, b;
    std::memcpy(&a, before.data() + 2 * i, 2);
    std::memcpy(&b, after.data() + 2 * i, 2);
    k[i] = cpu::Bf16BitsToFloat(a);
    k_copy[i] = cpu::Bf16BitsToFloat(b);
  }
  const cpu::RopeTable rope(config.rope, config.head_dim);
  for (size_t t = 0; t < 16; ++t) rope.RotateHeads(&k[t * kv_dim], config.n_kv_heads, delta);
  std::vector<float> expected = k;
  cpu::RoundToBf16(expected.data(), expected.size());
  EXPECT_EQ(k_copy, expected);
  EXPECT_NE(k, expected);  // the rotation alone leaves the bf16 grid
  EXPECT_EQ(before.substr(2 * plane), after.substr(2 * plane));
}

// bf16 payloads: half the fp32 size, back into other blocks bit for bit; the fingerprint
// is the CUDA backend's (same weights, bf16 KV), not the fp32 backend's.
TEST(CpuNumericsTest, ChunksAreBf16) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const ModelConfig config = OneLayer("tiny-llama3");
  const ModelWeights weights = MakeSyntheticWeights(config, rng());
  auto gpu_like = MakeBackend(weights, CpuNumerics::kBf16LikeCuda);
  auto fp32 = MakeBackend(weights, CpuNumerics::kFp32);
  ASSERT_TRUE(gpu_like && fp32);
  EXPECT_EQ(gpu_like->model_fingerprint(), MakeModelFingerprint(weights.content_hash, "bf16"));
  EXPECT_NE(gpu_like->model_fingerprint(), fp32->model_fingerprint());
  EXPECT_EQ(gpu_like->kv_bytes_per_block(), fp32->kv_bytes_per_block());  // the pool is fp32 in both
  const std::vector<int32_t> tokens = RandomTokens(rng, 37, config.vocab_size);
  const std::vector<KvBlockRef> blocks = {{3, 16, 0}, {7, 16, 0}, {1, 5, 0}};
  const SequenceStep step{tokens, blocks, LogitsWanted::kNone};
  std::vector<std::vector<float>> unused;
  ASSERT_TRUE(gpu_like->Forward({&step, 1}, &unused).ok());
  ASSERT_TRUE(fp32->Forward({&step, 1}, &unused).ok());
  std::string payload, fp32_payload, again;
  ASSERT_TRUE(gpu_like->ExportChunk(blocks, &payload).ok());
  ASSERT_TRUE(fp32->ExportChunk(blocks, &fp32_payload).ok());
  EXPECT_EQ(payload.size() * 2, fp32_payload.size());
  const std::vector<KvBlockRef> other = {{30, 16, 0}, {12, 16, 0}, {0, 5, 0}};
  ASSERT_TRUE(gpu_like->ImportChunk(payload, other).ok());
  ASSERT_TRUE(gpu_like->ExportChunk(other, &again).ok());
  EXPECT_TRUE(again == payload);
  EXPECT_FALSE(gpu_like->ImportChunk(fp32_payload, other).ok());  // an fp32 payload does not fit
}

}  // namespace
}  // namespace lazykv::testing
