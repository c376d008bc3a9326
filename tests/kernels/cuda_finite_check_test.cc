// The device value check against the CPU one (common/chunk_values.h) on random payloads:
// random finite values with infinities and NaNs planted at random places (in vectors, in
// the tail after the last whole vector, at the first and last element), aligned and
// misaligned, bf16 and fp32.
#include <cuda_runtime.h>

#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/chunk_values.h"
#include "gtest/gtest.h"
#include "kernels/cuda/finite_check.h"
#include "tests/kernels/cuda_test_util.h"

namespace lazykv {
namespace {

using testing::HaveGpu;

// What the CPU check says, as the byte offset the device check reports.
uint64_t CpuFirstBad(KvDtype dtype, const std::string& bytes) {
  const std::string_view piece(bytes);
  const absl::Status s = CheckPayloadFinite(dtype, std::span<const std::string_view>(&piece, 1));
  if (s.ok()) return std::numeric_limits<uint64_t>::max();
  const std::string message(s.message());
  return std::stoull(message.substr(message.rfind(' ') + 1));
}

std::string RandomPayload(cuda::Element element, size_t elements, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::string out(elements * cuda::ElementBytes(element), '\0');
  for (size_t i = 0; i < elements; ++i) {
    const float v = normal(rng);
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    if (element == cuda::Element::kBf16) {
      const uint16_t top = static_cast<uint16_t>(bits >> 16);
      std::memcpy(out.data() + 2 * i, &top, 2);
    } else {
      std::memcpy(out.data() + 4 * i, &bits, 4);
    }
  }
  return out;
}

void Plant(cuda::Element element, size_t index, std::mt19937_64& rng, std::string* payload) {
  // +inf, -inf, a quiet NaN, a NaN with a payload: all have all-ones exponents.
  const uint32_t fp32[] = {0x7F800000u, 0xFF800000u, 0x7FC00000u, 0x7F800001u | (static_cast<uint32_t>(rng()) & 0x3FFFFF)};
  const uint32_t pick = fp32[rng() % 4];
  if (element == cuda::Element::kBf16) {
    uint16_t top = static_cast<uint16_t>(pick >> 16);
    if ((top & 0x7F) == 0 && (pick & 0xFFFF) != 0) top |= 1;  // keep a NaN a NaN after truncation
    std::memcpy(payload->data() + 2 * index, &top, 2);
  } else {
    std::memcpy(payload->data() + 4 * index, &pick, 4);
  }
}

uint64_t DeviceFirstBad(cuda::Element element, const std::string& payload, size_t misalign) {
  char* device = nullptr;
  unsigned long long* first_bad = nullptr;
  EXPECT_EQ(cudaMalloc(&device, payload.size() + 16), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&first_bad, sizeof(*first_bad)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(device + misalign, payload.data(), payload.size(), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cuda::LaunchFindNonFinite(device + misalign, payload.size(), element, first_bad, nullptr), cudaSuccess);
  unsigned long long out = 0;
  EXPECT_EQ(cudaMemcpy(&out, first_bad, sizeof(out), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(device);
  cudaFree(first_bad);
  return out;
}

TEST(CudaFiniteCheckTest, MatchesTheCpuCheckOnRandomPayloads) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  std::mt19937_64 rng(std::random_device{}());
  for (int trial = 0; trial < 200; ++trial) {
    const cuda::Element element = trial % 2 == 0 ? cuda::Element::kBf16 : cuda::Element::kFp32;
    const KvDtype dtype = element == cuda::Element::kBf16 ? KvDtype::kBf16 : KvDtype::kFp32;
    // Sizes from a few elements (all tail) to past a whole grid's stride.
    const size_t elements = trial < 20 ? 1 + rng() % 9 : 1 + rng() % (trial < 190 ? 40000 : 3000000);
    std::string payload = RandomPayload(element, elements, rng);
    const int planted = static_cast<int>(rng() % 4);
    for (int p = 0; p < planted; ++p) {
      const size_t where = rng() % 3 == 0 ? (rng() % 2 == 0 ? 0 : elements - 1) : rng() % elements;
      Plant(element, where, rng, &payload);
    }
    // Aligned (the vector path plus a tail) or misaligned by one element (elementwise).
    const size_t misalign = rng() % 3 == 0 ? cuda::ElementBytes(element) : 0;
    const uint64_t want = CpuFirstBad(dtype, payload);
    EXPECT_EQ(DeviceFirstBad(element, payload, misalign), want)
        << cuda::ElementName(element) << ", " << elements << " elements, " << planted << " planted, misaligned "
        << misalign;
    if (planted > 0) {
      EXPECT_NE(want, std::numeric_limits<uint64_t>::max());
    }
  }
}

TEST(CudaFiniteCheckTest, RefusesBadArguments) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  unsigned long long* first_bad = nullptr;
  ASSERT_EQ(cudaMalloc(&first_bad, sizeof(*first_bad)), cudaSuccess);
  char* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, 64), cudaSuccess);
  EXPECT_EQ(cuda::LaunchFindNonFinite(device, 3, cuda::Element::kBf16, first_bad, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchFindNonFinite(device + 2, 8, cuda::Element::kFp32, first_bad, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchFindNonFinite(device, 8, cuda::Element::kFp32, nullptr, nullptr), cudaErrorInvalidValue);
  // Nothing to check: all finite.
  EXPECT_EQ(cuda::LaunchFindNonFinite(device, 0, cuda::Element::kFp32, first_bad, nullptr), cudaSuccess);
  unsigned long long out = 0;
  ASSERT_EQ(cudaMemcpy(&out, first_bad, sizeof(out), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(out, std::numeric_limits<unsigned long long>::max());
  cudaFree(device);
  cudaFree(first_bad);
}

}  // namespace
}  // namespace lazykv
