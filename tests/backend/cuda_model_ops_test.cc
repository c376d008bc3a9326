// The CUDA backend's kernels against their CPU twins, on fresh random inputs at several
// shapes, outputs poisoned (NaN) first so an unwritten element fails: embedding gather,
// residual + RMSNorm, SwiGLU, KV write (RoPE of new keys), chunk scatter/gather, synthetic
// weights, the block baseline's materialize and the cuBLASLt GEMM, each for both element
// types (bf16, and fp32 for the
// backend's fp32 mode). Skips without a GPU.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <tuple>
#include <type_traits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/dense_ops.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/materialize.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/rope_style.h"
#include "tests/kernels/cuda_paged_problem.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/test_util.h"
#include "worker/model/synthetic_model.h"

namespace lazykv::testing {
namespace {

using bf16 = __nv_bfloat16;

template <typename T>
T* Poisoned(size_t n) {
  T* d = nullptr;
  if (cudaMalloc(&d, std::max<size_t>(1, n) * sizeof(T)) != cudaSuccess) return nullptr;
  cudaMemset(d, 0xff, n * sizeof(T));  // NaN in fp32 and bf16
  return d;
}

// What storing a computed fp32 value as T costs, relative: one bf16 rounding, or fp32
// arithmetic order and the fast-math exp, rsqrt and sin.
template <typename T>
constexpr double kStoreTolerance = std::is_same_v<T, float> ? 1e-5 : 8e-3;

template <typename T>
constexpr cuda::Element kElementOf = std::is_same_v<T, float> ? cuda::Element::kFp32 : cuda::Element::kBf16;

template <typename T>
const char* Name() {
  return cuda::ElementName(kElementOf<T>);
}

std::vector<float> Normal(std::mt19937_64& rng, size_t n) {
  std::normal_distribution<float> dist;
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

#define SKIP_WITHOUT_GPU()                               \
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";              \
  const uint64_t seed = FreshSeed();                     \
  SCOPED_TRACE(::testing::Message() << "seed " << seed); \
  std::mt19937_64 rng(seed)

// T: the element type of the embedding table and of the norm's and SwiGLU's outputs.
template <typename T>
void CheckEmbeddingRmsNormSwiGlu(std::mt19937_64& rng) {
  SCOPED_TRACE(Name<T>());
  // Dims of whole float4s up to 8192 take the norm's vector kernel (4096 and 8192 at its
  // register limit), others (130, 8200) the scalar one.
  for (const auto& [rows, dim, hidden] :
       {std::tuple{1, 64, 172}, {7, 288, 768}, {33, 4096, 14336}, {2, 8192, 64}, {3, 130, 50}, {2, 8200, 64}}) {
    const int vocab = 300;
    std::vector<T> table_stored;
    std::vector<float> table;
    RandomElements(rng, static_cast<size_t>(vocab) * dim, table_stored, table);
    std::vector<int32_t> tokens = RandomTokens(rng, rows, vocab);
    float* x = Poisoned<float>(static_cast<size_t>(rows) * dim);
    T* table_d = ToDevice(table_stored);
    int32_t* tokens_d = ToDevice(tokens);
    CUDA_OK(cuda::LaunchEmbeddingGather(table_d, tokens_d, rows, dim, x, nullptr));
    std::vector<float> expected(static_cast<size_t>(rows) * dim);
    for (int r = 0; r < rows; ++r) {
      std::copy_n(&table[static_cast<size_t>(tokens[r]) * dim], dim, &expected[static_cast<size_t>(r) * dim]);
    }
    EXPECT_EQ(ToHost(x, expected.size()), expected);

    // x += residual; out = norm(x) * w.
    const std::vector<float> residual = Normal(rng, expected.size()), weight = Normal(rng, dim);
    float* residual_d = ToDevice(residual);
    float* weight_d = ToDevice(weight);
    T* out = Poisoned<T>(expected.size());
    CUDA_OK(cuda::LaunchResidualRmsNorm(x, residual_d, weight_d, rows, dim, 1e-5f, out, nullptr));
    cpu::AddInPlace(expected.data(), residual.data(), expected.size());
    std::vector<float> normed(expected.size());
    cpu::RmsNorm(expected.data(), weight.data(), rows, dim, 1e-5f, normed.data());
    EXPECT_LT(RelativeError(ToHost(x, expected.size()), expected), 1e-6);
    EXPECT_LT(RelativeError(AsFloat(ToHost(out, expected.size())), normed), kStoreTolerance<T>);

    // SwiGLU over [gate | up] rows.
    const std::vector<float> gu = Normal(rng, static_cast<size_t>(rows) * 2 * hidden);
    std::vector<float> gate(static_cast<size_t>(rows) * hidden), up(gate.size());
    for (int r = 0; r < rows; ++r) {
      for (int i = 0; i < hidden; ++i) {
        gate[static_cast<size_t>(r) * hidden + i] = gu[static_cast<size_t>(r) * 2 * hidden + i];
        up[static_cast<size_t>(r) * hidden + i] = gu[static_cast<size_t>(r) * 2 * hidden + hidden + i];
      }
    }
    cpu::SwiGlu(gate.data(), up.data(), gate.size());
    float* gu_d = ToDevice(gu);
    T* h = Poisoned<T>(gate.size());
    CUDA_OK(cuda::LaunchSwiGlu(gu_d, rows, hidden, h, nullptr));
    EXPECT_LT(RelativeError(AsFloat(ToHost(h, gate.size())), gate), kStoreTolerance<T>);

    // The output layer's row gather.
    std::vector<int32_t> picked(5);
    for (int32_t& r : picked) r = std::uniform_int_distribution<int32_t>(0, rows - 1)(rng);
    T* gathered = Poisoned<T>(picked.size() * dim);
    int32_t* picked_d = ToDevice(picked);
    CUDA_OK(cuda::LaunchGatherRows(out, picked_d, static_cast<int>(picked.size()), dim, gathered, nullptr));
    const std::vector<float> all = AsFloat(ToHost(out, expected.size()));
    std::vector<float> want;
    for (const int32_t r : picked) want.insert(want.end(), all.begin() + r * dim, all.begin() + (r + 1) * dim);
    EXPECT_EQ(AsFloat(ToHost(gathered, want.size())), want);
    CUDA_OK(cudaDeviceSynchronize());
    for (void* p : {(void*)x, (void*)table_d, (void*)tokens_d, (void*)residual_d, (void*)weight_d, (void*)out,
                    (void*)gu_d, (void*)h, (void*)gathered, (void*)picked_d}) {
      cudaFree(p);
    }
  }
}

TEST(CudaModelOpsTest, EmbeddingRmsNormSwiGlu) {
  SKIP_WITHOUT_GPU();
  CheckEmbeddingRmsNormSwiGlu<bf16>(rng);
  CheckEmbeddingRmsNormSwiGlu<float>(rng);
}

// T: the pool's element type.
template <typename T>
void CheckKvWrite(std::mt19937_64& rng) {
  SCOPED_TRACE(Name<T>());
  struct Case {
    int n_heads, n_kv_heads, head_dim, block_size;
    RopeStyle style;
  };
  // The last case's rows are not whole float4s (q copied one float at a time).
  for (const Case& c : {Case{8, 4, 8, 16, RopeStyle::kInterleaved}, Case{32, 8, 128, 16, RopeStyle::kRotateHalf},
                        Case{6, 2, 96, 7, RopeStyle::kRotateHalf}, Case{3, 1, 6, 16, RopeStyle::kInterleaved}}) {
    const RopeConfig rope = TestRope(c.style);
    const int rows = 19, num_blocks = 9, q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
    const std::vector<float> qkv = Normal(rng, static_cast<size_t>(rows) * (q_dim + 2 * kv_dim));
    std::vector<int32_t> blocks(rows), slots(rows), positions(rows);
    for (int r = 0; r < rows; ++r) {  // distinct slots, positions up to 128k
      slots[r] = r % c.block_size;
      blocks[r] = r / c.block_size;
      positions[r] = std::uniform_int_distribution<int32_t>(0, 131072)(rng);
    }
    const size_t pool = static_cast<size_t>(num_blocks) * c.block_size * kv_dim;
    cuda::KvWriteParams p;
    p.qkv = ToDevice(qkv);
    p.q_out = Poisoned<float>(static_cast<size_t>(rows) * q_dim);
    T* k_pool = Poisoned<T>(pool);
    T* v_pool = Poisoned<T>(pool);
    p.kv.k_pool = k_pool;
    p.kv.v_pool = v_pool;
    p.kv.element = kElementOf<T>;
    p.slot_blocks = ToDevice(blocks);
    p.slot_index = ToDevice(slots);
    p.rope_positions = ToDevice(positions);
    p.kv.inv_freq = ToDevice(RopeInverseFrequencies(rope, c.head_dim));
    p.rows = rows;
    p.n_heads = c.n_heads;
    p.kv.n_kv_heads = c.n_kv_heads;
    p.kv.head_dim = c.head_dim;
    p.kv.block_size = c.block_size;
    p.kv.rope_style = cuda::KernelRopeStyle(c.style);
    CUDA_OK(cuda::LaunchKvWrite(p, nullptr));
    const auto q = ToHost(p.q_out, static_cast<size_t>(rows) * q_dim);
    const auto k = AsFloat(ToHost(k_pool, pool)), v = AsFloat(ToHost(v_pool, pool));
    const cpu::RopeTable table(rope, c.head_dim);
    std::vector<float> k_got, k_want, v_got, v_want;
    for (int r = 0; r < rows; ++r) {
      const float* row = &qkv[static_cast<size_t>(r) * (q_dim + 2 * kv_dim)];
      for (int i = 0; i < q_dim; ++i) ASSERT_EQ(q[static_cast<size_t>(r) * q_dim + i], row[i]);
      std::vector<float> key(row + q_dim, row + q_dim + kv_dim);
      table.RotateHeads(key.data(), c.n_kv_heads, positions[r]);
      const size_t slot = (static_cast<size_t>(blocks[r]) * c.block_size + slots[r]) * kv_dim;
      k_want.insert(k_want.end(), key.begin(), key.end());
      k_got.insert(k_got.end(), k.begin() + slot, k.begin() + slot + kv_dim);
      v_want.insert(v_want.end(), row + q_dim + kv_dim, row + q_dim + 2 * kv_dim);
      v_got.insert(v_got.end(), v.begin() + slot, v.begin() + slot + kv_dim);
    }
    EXPECT_LT(RelativeError(k_got, k_want), kStoreTolerance<T>) << "head dim " << c.head_dim;
    if constexpr (std::is_same_v<T, float>) {
      EXPECT_EQ(v_got, v_want);
    } else {
      EXPECT_LT(RelativeError(v_got, v_want), kStoreTolerance<T>);
    }
    // Again with q rotated from row 5 on, at its own positions (not the keys'): the rows before
    // stay raw, bit for bit; the later ones match the CPU rotation (fp32 products of the same
    // exactly formed angle).
    std::vector<int32_t> q_positions(rows);
    for (int32_t& x : q_positions) x = std::uniform_int_distribution<int32_t>(0, 131072)(rng);
    const int rotated_from = 5;
    p.q_positions = ToDevice(q_positions);
    p.rotated_q_from = rotated_from;
    CUDA_OK(cudaMemset(p.q_out, 0xff, static_cast<size_t>(rows) * q_dim * sizeof(float)));
    CUDA_OK(cuda::LaunchKvWrite(p, nullptr));
    const auto q_rotated = ToHost(p.q_out, static_cast<size_t>(rows) * q_dim);
    std::vector<float> q_got, q_want;
    for (int r = 0; r < rows; ++r) {
      const float* row = &qkv[static_cast<size_t>(r) * (q_dim + 2 * kv_dim)];
      const float* got = &q_rotated[static_cast<size_t>(r) * q_dim];
      if (r < rotated_from) {
        for (int i = 0; i < q_dim; ++i) ASSERT_EQ(got[i], row[i]) << "row " << r << " is before rotated_q_from";
        continue;
      }
      std::vector<float> want(row, row + q_dim);
      table.RotateHeads(want.data(), c.n_heads, q_positions[r]);
      q_want.insert(q_want.end(), want.begin(), want.end());
      q_got.insert(q_got.end(), got, got + q_dim);
    }
    EXPECT_LT(RelativeError(q_got, q_want), 1e-5) << "q rotated at its positions, head dim " << c.head_dim;
    for (const void* ptr : {(const void*)p.qkv, (const void*)p.q_out, (const void*)p.kv.k_pool,
                            (const void*)p.kv.v_pool, (const void*)p.slot_blocks, (const void*)p.slot_index,
                            (const void*)p.rope_positions, (const void*)p.kv.inv_freq, (const void*)p.q_positions}) {
      cudaFree(const_cast<void*>(ptr));
    }
  }
}

TEST(CudaModelOpsTest, KvWriteRotatesKeysAtTheirPositions) {
  SKIP_WITHOUT_GPU();
  CheckKvWrite<bf16>(rng);
  CheckKvWrite<float>(rng);
}

// Scatter a random payload into random (partly filled) blocks of a multi-layer pool, check
// every slot against the payload, then gather it back into a poisoned payload. T: the
// element type of payload and pool.
template <typename T>
void CheckChunkScatterAndGather(std::mt19937_64& rng) {
  SCOPED_TRACE(Name<T>());
  for (const auto& [layers, kv_dim, block_size, tokens] :
       {std::tuple{5, 32, 16, 77}, {3, 1024, 16, 512}, {2, 12, 7, 30}, {4, 40, 32, 1}}) {
    const int chunk_blocks = (tokens + block_size - 1) / block_size, pool_blocks = chunk_blocks * 2 + 3;
    std::vector<int32_t> ids(pool_blocks), counts, offsets;
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.resize(chunk_blocks);
    for (int b = 0; b < chunk_blocks; ++b) {
      counts.push_back(std::min(block_size, tokens - b * block_size));
      offsets.push_back(b * block_size);
    }
    std::vector<T> payload;
    std::vector<float> payload_fp;
    RandomElements(rng, static_cast<size_t>(layers) * 2 * tokens * kv_dim, payload, payload_fp);
    const size_t layer_elems = static_cast<size_t>(pool_blocks) * block_size * kv_dim;
    cuda::KvTransferParams p;
    T* payload_d = ToDevice(payload);
    T* k_pool = Poisoned<T>(layer_elems * layers);
    T* v_pool = Poisoned<T>(layer_elems * layers);
    p.payload = payload_d;
    p.kv.k_pool = k_pool;
    p.kv.v_pool = v_pool;
    p.kv.element = kElementOf<T>;
    p.kv.block_ids = ToDevice(ids);
    p.kv.block_tokens = ToDevice(counts);
    p.token_offsets = ToDevice(offsets);
    p.num_blocks_in_chunk = chunk_blocks;
    p.chunk_tokens = tokens;
    p.kv.n_kv_heads = 1;  // the transfer sees rows of n_kv_heads * head_dim
    p.kv.head_dim = kv_dim;
    p.kv.block_size = block_size;
    p.pool_blocks = pool_blocks;
    p.first_layer = 0;
    p.num_layers = layers;
    CUDA_OK(cuda::LaunchKvTransfer(p, nullptr));
    const auto k = AsFloat(ToHost(k_pool, layer_elems * layers));
    const auto v = AsFloat(ToHost(v_pool, layer_elems * layers));
    for (int l = 0; l < layers; ++l) {
      for (int t = 0; t < tokens; ++t) {
        const size_t slot =
            l * layer_elems + (static_cast<size_t>(ids[t / block_size]) * block_size + t % block_size) * kv_dim;
        const size_t src = (static_cast<size_t>(2 * l) * tokens + t) * kv_dim;
        for (int i = 0; i < kv_dim; ++i) {
          ASSERT_EQ(k[slot + i], payload_fp[src + i]) << "layer " << l << " token " << t;
          ASSERT_EQ(v[slot + i], payload_fp[src + static_cast<size_t>(tokens) * kv_dim + i]);
        }
      }
    }
    // Gather back into a poisoned payload.
    CUDA_OK(cudaMemset(payload_d, 0xff, payload.size() * sizeof(T)));
    p.to_pool = false;
    CUDA_OK(cuda::LaunchKvTransfer(p, nullptr));
    EXPECT_EQ(AsFloat(ToHost(payload_d, payload.size())), payload_fp);
    for (const void* ptr :
         {(const void*)p.payload, (const void*)p.kv.k_pool, (const void*)p.kv.v_pool, (const void*)p.kv.block_ids,
          (const void*)p.kv.block_tokens, (const void*)p.token_offsets}) {
      cudaFree(const_cast<void*>(ptr));
    }
  }
}

TEST(CudaModelOpsTest, ChunkScatterAndGather) {
  SKIP_WITHOUT_GPU();
  CheckChunkScatterAndGather<bf16>(rng);
  CheckChunkScatterAndGather<float>(rng);
}

// The block baseline's materialize: random source blocks (some partly copied, some from a
// slot past 0, as a repaired chunk's rest of a block) re-rotated by deltas up to 128k into
// fresh blocks, against cpu::CopyBlockRotated. T: the pool's element type.
template <typename T>
void CheckMaterialize(std::mt19937_64& rng) {
  SCOPED_TRACE(Name<T>());
  for (const auto& [n_kv_heads, head_dim, block_size, style] : {std::tuple{4, 8, 16, RopeStyle::kInterleaved},
                                                                {8, 128, 16, RopeStyle::kRotateHalf},
                                                                {2, 96, 7, RopeStyle::kRotateHalf}}) {
    const int copies = 6, num_blocks = 2 * copies;
    const size_t slot_width = static_cast<size_t>(n_kv_heads) * head_dim;
    const size_t pool = num_blocks * block_size * slot_width;
    std::vector<T> k_stored, v_stored;
    std::vector<float> k, v;
    RandomElements(rng, pool, k_stored, k);
    RandomElements(rng, pool, v_stored, v);
    std::vector<int32_t> src, dst, counts, deltas, firsts;
    for (int i = 0; i < copies; ++i) {
      src.push_back(i);
      dst.push_back(copies + i);
      counts.push_back(std::uniform_int_distribution<int32_t>(1, block_size)(rng));
      deltas.push_back(std::uniform_int_distribution<int32_t>(0, 131072)(rng));
      firsts.push_back(i % 2 == 0 ? 0 : std::uniform_int_distribution<int32_t>(1, counts.back())(rng));
    }
    // Poison the destinations on both sides: slots outside a copy's range must stay untouched.
    for (size_t e = copies * block_size * slot_width; e < pool; ++e) {
      k[e] = v[e] = 7.0f;
      k_stored[e] = v_stored[e] = static_cast<T>(7.0f);
    }
    const RopeConfig rope = TestRope(style);
    const cpu::RopeTable table(rope, head_dim);
    const cpu::KvLayerView view{k.data(), v.data(), num_blocks, block_size, n_kv_heads, head_dim};
    for (int i = 0; i < copies; ++i) {
      cpu::CopyBlockRotated(view, src[i], dst[i], firsts[i], counts[i], deltas[i], table);
    }
    DeviceArena arena;
    cuda::MaterializeParams m;
    T* k_d = arena.Copy(k_stored);
    T* v_d = arena.Copy(v_stored);
    m.kv.k_pool = k_d;
    m.kv.v_pool = v_d;
    m.kv.element = kElementOf<T>;
    m.src_blocks = arena.Copy(src);
    m.dst_blocks = arena.Copy(dst);
    m.num_tokens = arena.Copy(counts);
    m.deltas = arena.Copy(deltas);
    m.first_slots = arena.Copy(firsts);
    m.kv.inv_freq = arena.Copy(RopeInverseFrequencies(rope, head_dim));
    m.num_copies = copies;
    m.kv.n_kv_heads = n_kv_heads;
    m.kv.head_dim = head_dim;
    m.kv.block_size = block_size;
    m.kv.rope_style = cuda::KernelRopeStyle(style);
    CUDA_OK(cuda::LaunchMaterialize(m, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_LT(RelativeError(AsFloat(ToHost(k_d, pool)), k), kStoreTolerance<T>) << "head dim " << head_dim;
    EXPECT_EQ(AsFloat(ToHost(v_d, pool)), v);
  }
}

TEST(CudaModelOpsTest, MaterializeRotatesCopiedKeys) {
  SKIP_WITHOUT_GPU();
  CheckMaterialize<bf16>(rng);
  CheckMaterialize<float>(rng);
}

// The GPU draws MakeSyntheticWeights' exact values (fp32 bit for bit; bf16 = their rounding).
TEST(CudaModelOpsTest, SyntheticFillMatchesCpuGenerator) {
  SKIP_WITHOUT_GPU();
  for (const std::string name : {"tiny", "tiny-llama3", "small"}) {
    const ModelConfig config = *SyntheticConfig(name);
    const ModelWeights w = MakeSyntheticWeights(config, seed);
    uint64_t index = 0;
    ForEachTensor(w, [&](const std::string& tensor, const std::vector<float>& t, size_t) {
      const SyntheticTensorDraw draw = SyntheticDrawFor(config, seed, tensor, ++index);
      float* fp = Poisoned<float>(t.size());
      bf16* bf = Poisoned<bf16>(t.size());
      ASSERT_EQ(cuda::LaunchSyntheticFill(draw.state, t.size(), draw.scale, draw.is_norm, bf, fp, nullptr),
                cudaSuccess);
      EXPECT_EQ(ToHost(fp, t.size()), t) << name << " " << tensor;
      const auto got = ToHost(bf, t.size());
      for (size_t i = 0; i < t.size(); ++i) {
        ASSERT_EQ(__bfloat162float(got[i]), __bfloat162float(__float2bfloat16(t[i]))) << tensor << "[" << i << "]";
      }
      cudaFree(fp);
      cudaFree(bf);
    });
  }
}

// T: the inputs' element type. In fp32 the product must be true fp32: TF32 (10-bit
// mantissas) would err by ~1e-3 and fail the bound.
template <typename T>
void CheckGemm(std::mt19937_64& rng) {
  SCOPED_TRACE(Name<T>());
  auto gemm = cuda::Gemm::Create(nullptr);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  const double tolerance = std::is_same_v<T, float> ? 2e-5 : 1e-4;
  for (const auto& [rows, in, out] : {std::tuple{1, 64, 128},
                                      {5, 172, 64},
                                      {17, 64, 512},
                                      {300, 4096, 1024},
                                      {1, 4096, 6144},
                                      {129, 288, 768},
                                      {3, 13, 7}}) {
    std::vector<T> x_stored, w_stored;
    std::vector<float> x, w;
    RandomElements(rng, static_cast<size_t>(rows) * in, x_stored, x);
    RandomElements(rng, static_cast<size_t>(out) * in, w_stored, w);
    std::vector<float> expected(static_cast<size_t>(rows) * out);
    cpu::MatmulTransposed(x.data(), rows, in, w.data(), out, expected.data());
    T* xd = ToDevice(x_stored);
    T* wd = ToDevice(w_stored);
    float* y = Poisoned<float>(expected.size());
    ASSERT_TRUE((*gemm)->Run(xd, rows, in, wd, out, y).ok());
    EXPECT_LT(RelativeError(ToHost(y, expected.size()), expected), tolerance) << rows << "x" << in << "x" << out;
    // beta = 1 accumulates.
    ASSERT_TRUE((*gemm)->Run(xd, rows, in, wd, out, y, 1.0f).ok());
    for (float& e : expected) e *= 2;
    EXPECT_LT(RelativeError(ToHost(y, expected.size()), expected), tolerance);
    cudaFree(xd);
    cudaFree(wd);
    cudaFree(y);
  }
}

TEST(CudaModelOpsTest, GemmMatchesCpu) {
  SKIP_WITHOUT_GPU();
  CheckGemm<bf16>(rng);
  CheckGemm<float>(rng);
}

}  // namespace
}  // namespace lazykv::testing
