// The piece copy kernel through the backend's planner (worker/backend/cuda_copy_pieces.h):
// random payloads in shuffled pages of pinned memory (cudaMallocHost, and malloc'd memory
// page-locked with cudaHostRegister as the cache tier's arenas are, read-only as a worker
// maps a cache server's arena), gathered into one device range with the value check and
// scattered back; against the bytes themselves and the CPU value check
// (common/chunk_values.h). Device memory, pieces the device cannot address, and pieces in
// a few long runs are left to the copy engines.
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cache_server/pinned_memory.h"
#include "common/chunk_values.h"
#include "common/device_mapped_regions.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/piece_copy.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/test_util.h"
#include "worker/backend/cuda_copy_pieces.h"

namespace lazykv {
namespace {

using cuda_backend::EnqueueKernelCopy;
using cuda_backend::KernelCopyPlan;
using cuda_backend::KernelCopySegmentsBound;
using cuda_backend::PlanKernelCopy;
using testing::FreshSeed;
using testing::HaveGpu;

uint64_t CpuFirstBad(cuda::Element element, const std::string& bytes) {
  const std::string_view piece(bytes);
  const KvDtype dtype = element == cuda::Element::kBf16 ? KvDtype::kBf16 : KvDtype::kFp32;
  const absl::Status s = CheckPayloadFinite(dtype, std::span<const std::string_view>(&piece, 1));
  if (s.ok()) return std::numeric_limits<uint64_t>::max();
  const std::string message(s.message());
  return std::stoull(message.substr(message.rfind(' ') + 1));
}

// Random bits that are finite values (exponent below all-ones), with 0-3 non-finite ones
// planted at random elements.
std::string RandomPayload(cuda::Element element, size_t elements, std::mt19937_64& rng) {
  const size_t size = cuda::ElementBytes(element);
  std::string out(elements * size, '\0');
  for (size_t i = 0; i < elements; ++i) {
    const uint32_t bits = static_cast<uint32_t>(rng()) & (size == 2 ? 0xBF7Fu : 0xBF7FFFFFu);
    std::memcpy(out.data() + i * size, &bits, size);
  }
  const int planted = static_cast<int>(rng() % 4);
  for (int p = 0; p < planted; ++p) {
    const uint32_t nan = size == 2 ? 0x7FC0u | (rng() & 1) : 0x7F800000u | (rng() & 0x7FFFFF);
    std::memcpy(out.data() + (rng() % elements) * size, &nan, size);
  }
  return out;
}

// `bytes` as shuffled pages of `page` bytes in `base` (room for all), the first piece
// starting `first_offset` (less than `page`) into its page. Returns the pieces in payload
// order, none right after the one before.
std::vector<std::string_view> ShuffledPieces(char* base, uint64_t bytes, uint64_t page, uint64_t first_offset,
                                             std::mt19937_64& rng) {
  const uint64_t pages = (bytes + first_offset + page - 1) / page;
  std::vector<uint64_t> slot(pages);
  std::iota(slot.begin(), slot.end(), 0);
  std::shuffle(slot.begin(), slot.end(), rng);
  for (size_t i = 0; i + 1 < pages; ++i) {  // no piece right after the one before (one run)
    if (slot[i] + 1 == slot[i + 1]) std::swap(slot[i + 1], slot[(i + 2) % pages]);
  }
  std::vector<std::string_view> pieces;
  for (uint64_t at = 0, p = 0, n = page - first_offset; at < bytes; at += n, n = page, ++p) {
    n = std::min(n, bytes - at);
    pieces.emplace_back(base + slot[p] * page + (p == 0 ? first_offset : 0), n);
  }
  return pieces;
}

// kTierPinned: pinned as the cache tier pins its arenas (cache::PinHostMemory), so the
// planner finds it in the registry instead of asking the driver per piece.
enum class Memory { kMallocHost, kRegistered, kRegisteredReadOnly, kDevice, kTierPinned };

const char* Name(Memory m) {
  switch (m) {
    case Memory::kMallocHost:
      return "cudaMallocHost";
    case Memory::kRegistered:
      return "cudaHostRegister";
    case Memory::kRegisteredReadOnly:
      return "cudaHostRegister read-only";
    case Memory::kDevice:
      return "device";
    case Memory::kTierPinned:
      return "cache::PinHostMemory";
  }
  return "?";
}

TEST(CudaPieceCopyTest, GathersWithTheValueCheckAndScattersExactly) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  int device = 0;
  CUDA_OK(cudaGetDevice(&device));
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int kernel_trials = 0;
  int inline_trials = 0, table_trials = 0;  // the segments in the launch itself, or uploaded first
  for (int trial = 0; trial < 50; ++trial) {
    const Memory memory = static_cast<Memory>(trial % 5);
    const cuda::Element element = rng() % 2 == 0 ? cuda::Element::kBf16 : cuda::Element::kFp32;
    // One trial in five in pages of 16-64 bytes: more segments than a launch carries
    // (kInlineCopySegments), so their table is uploaded; the rest mostly fewer.
    const bool tiny_pages = trial % 10 == 7 || trial % 10 == 9;
    const size_t elements = tiny_pages ? 20000 + rng() % 20000 : 1 + rng() % (trial < 45 ? 200000 : 4000000);
    const uint64_t page = 16 * (1 + rng() % (tiny_pages ? 4 : elements < 20000 ? 64 : 16384));  // 16 B to 256 KiB
    const std::string payload = RandomPayload(element, elements, rng);
    const uint64_t first_offset = 16 * (rng() % std::min<uint64_t>(9, page / 16));  // within the first page
    const uint64_t region = ((payload.size() + first_offset + page - 1) / page) * page;
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ", " << Name(memory) << ", " << cuda::ElementName(element)
                                      << ", " << payload.size() << " bytes in pages of " << page);
    char* base = nullptr;
    char* host_base = nullptr;  // where the test writes the source (the region itself, or a host twin)
    if (memory == Memory::kMallocHost) {
      CUDA_OK(cudaMallocHost(&base, region));
      host_base = base;
    } else if (memory == Memory::kDevice) {
      CUDA_OK(cudaMalloc(&base, region));
      host_base = static_cast<char*>(std::malloc(region));
    } else {
      base = static_cast<char*>(std::aligned_alloc(4096, (region + 4095) / 4096 * 4096));
      host_base = base;
    }
    const std::vector<std::string_view> pieces = ShuffledPieces(base, payload.size(), page, first_offset, rng);
    for (size_t i = 0, at = 0; i < pieces.size(); at += pieces[i].size(), ++i) {
      std::memcpy(host_base + (pieces[i].data() - base), payload.data() + at, pieces[i].size());
    }
    if (memory == Memory::kDevice) {
      CUDA_OK(cudaMemcpy(base, host_base, region, cudaMemcpyHostToDevice));
    }
    const unsigned flags = memory == Memory::kRegisteredReadOnly ? cudaHostRegisterPortable | cudaHostRegisterReadOnly
                                                                 : cudaHostRegisterPortable;
    const bool registered = memory == Memory::kRegistered || memory == Memory::kRegisteredReadOnly;
    if (registered) {
      CUDA_OK(cudaHostRegister(base, (region + 4095) / 4096 * 4096, flags));
    }
    if (memory == Memory::kTierPinned) {
      ASSERT_TRUE(cache::PinHostMemory(base, (region + 4095) / 4096 * 4096));
      ASSERT_TRUE(FindDeviceMappedRegion(base, region).has_value());
    }

    char* range = nullptr;
    cuda::CopySegment* table = nullptr;
    unsigned long long* first_bad = nullptr;
    CUDA_OK(cudaMalloc(&range, payload.size() + 64));
    CUDA_OK(cudaMemset(range, 0, payload.size() + 64));
    CUDA_OK(cudaMalloc(&table, std::max<size_t>(1, KernelCopySegmentsBound(pieces)) * sizeof(cuda::CopySegment)));
    CUDA_OK(cudaMalloc(&first_bad, sizeof(*first_bad)));
    const std::optional<KernelCopyPlan> gather = PlanKernelCopy(pieces, range, /*to_contiguous=*/true);
    // Host memory in one page goes by the copy engines; device memory by the kernel always.
    const bool want_kernel = memory == Memory::kDevice || pieces.size() > 1;
    ASSERT_EQ(gather.has_value(), want_kernel) << pieces.size() << " pieces";
    if (!want_kernel) {
      cudaFree(range);
      cudaFree(table);
      cudaFree(first_bad);
      if (memory == Memory::kDevice) {
        cudaFree(base);
        std::free(host_base);
      } else {
        if (registered) cudaHostUnregister(base);
        if (memory == Memory::kTierPinned) cache::UnpinHostMemory(base);
        if (memory == Memory::kMallocHost) cudaFreeHost(base);
        if (registered || memory == Memory::kTierPinned) std::free(base);
      }
      continue;
    }
    ++kernel_trials;
    ++(gather->segments.size() <= static_cast<size_t>(cuda::kInlineCopySegments) ? inline_trials : table_trials);
    EXPECT_LE(gather->segments.size(), KernelCopySegmentsBound(pieces));
    ASSERT_TRUE(EnqueueKernelCopy(*gather, table, element, first_bad, stream).ok());
    CUDA_OK(cudaStreamSynchronize(stream));
    std::string back(payload.size() + 64, '\1');
    CUDA_OK(cudaMemcpy(back.data(), range, back.size(), cudaMemcpyDeviceToHost));
    EXPECT_TRUE(back.compare(0, payload.size(), payload) == 0) << "gathered bytes differ";
    EXPECT_EQ(back.substr(payload.size()), std::string(64, '\0')) << "wrote past the range";
    unsigned long long bad = 0;
    CUDA_OK(cudaMemcpy(&bad, first_bad, sizeof(bad), cudaMemcpyDeviceToHost));
    EXPECT_EQ(bad, CpuFirstBad(element, payload));

    // Scatter fresh bytes (of any count: the last piece one byte short) back into the
    // pieces, unchecked; bytes between the pieces stay as they were. The kernel writes only
    // into registered writable regions (the tier's arenas): the driver cannot tell
    // read-only pinned memory apart, and a write there is a fault.
    std::vector<std::string_view> out = pieces;
    out.back() = out.back().substr(0, out.back().size() - 1);
    const std::optional<KernelCopyPlan> scatter = PlanKernelCopy(out, range, /*to_contiguous=*/false);
    ASSERT_EQ(scatter.has_value(), memory == Memory::kTierPinned);
    if (scatter) {
      std::string fresh(payload.size() - 1, '\0');
      for (char& c : fresh) c = static_cast<char>(rng());
      CUDA_OK(cudaMemcpy(range, fresh.data(), fresh.size(), cudaMemcpyHostToDevice));
      std::string expected(base, region);
      for (size_t i = 0, at = 0; i < out.size(); at += out[i].size(), ++i) {
        expected.replace(out[i].data() - base, out[i].size(), fresh.substr(at, out[i].size()));
      }
      ASSERT_TRUE(EnqueueKernelCopy(*scatter, table, element, nullptr, stream).ok());
      CUDA_OK(cudaStreamSynchronize(stream));
      EXPECT_TRUE(std::string(base, region) == expected) << "scattered bytes differ";
    }
    cudaFree(range);
    cudaFree(table);
    cudaFree(first_bad);
    if (registered) {
      CUDA_OK(cudaHostUnregister(base));
    }
    if (memory == Memory::kTierPinned) {
      cache::UnpinHostMemory(base);
      EXPECT_FALSE(FindDeviceMappedRegion(base, region).has_value());
    }
    if (memory == Memory::kMallocHost) cudaFreeHost(base);
    if (memory == Memory::kDevice) {
      cudaFree(base);
      std::free(host_base);
    }
    if (registered || memory == Memory::kTierPinned) std::free(base);
  }
  cudaStreamDestroy(stream);
  EXPECT_GE(kernel_trials, 30);  // the kernel, not the fallback, is what this test checks
  EXPECT_GE(inline_trials, 3);
  EXPECT_GE(table_trials, 3);
}

// The staging's gather (GatherCheckedAndWait): device memory in one to four runs goes by the
// kernel that publishes its own answer; launches back to back on one thread must each find
// the answer reset (a chunk with a NaN, then a clean one, must not inherit the first's answer)
// and report the first bad offset exactly, with the bytes exact.
TEST(CudaPieceCopyTest, TheGatherThatPublishesItsAnswerResetsItEveryLaunch) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  unsigned long long* scratch = nullptr;  // the caller's answer, for a fallback path
  CUDA_OK(cudaMalloc(&scratch, sizeof(*scratch)));
  int bad_seen = 0, clean_seen = 0;
  for (int trial = 0; trial < 24; ++trial) {
    const cuda::Element element = rng() % 2 == 0 ? cuda::Element::kBf16 : cuda::Element::kFp32;
    const size_t esize = cuda::ElementBytes(element);
    const size_t elements = 1 + rng() % (trial % 3 == 0 ? 4000000 : 100000);
    std::string payload = RandomPayload(element, elements, rng);  // 0-3 non-finite values planted
    if (trial % 2 == 1) {  // every value finite, right after a launch that may have found one
      for (size_t i = 0; i < elements; ++i) {
        const uint32_t bits = static_cast<uint32_t>(rng()) & (esize == 2 ? 0xBF7Fu : 0xBF7FFFFFu);
        std::memcpy(payload.data() + i * esize, &bits, esize);
      }
    }
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ", " << payload.size() << " bytes");
    // The source in 1-4 runs of device memory, in shuffled order, with gaps between them.
    const int runs = 1 + static_cast<int>(rng() % 4);
    const uint64_t run_bytes = std::max<uint64_t>(16, (payload.size() / runs + 15) / 16 * 16);
    char* base = nullptr;
    CUDA_OK(cudaMalloc(&base, (run_bytes + 4096) * runs));
    std::vector<int> slot(runs);
    std::iota(slot.begin(), slot.end(), 0);
    std::shuffle(slot.begin(), slot.end(), rng);
    std::vector<std::string_view> pieces;
    for (int r = 0, at = 0; at < static_cast<int>(payload.size()); ++r) {
      const uint64_t n = std::min<uint64_t>(run_bytes, payload.size() - at);
      char* where = base + slot[r] * (run_bytes + 4096);
      CUDA_OK(cudaMemcpy(where, payload.data() + at, n, cudaMemcpyHostToDevice));
      pieces.emplace_back(where, n);
      at += static_cast<int>(n);
    }
    char* range = nullptr;
    CUDA_OK(cudaMalloc(&range, payload.size()));
    // The caller's scratch answer is for the fallback only: untouched when the kernel publishes.
    const unsigned long long untouched = 0x5A5A5A5A5A5A5A5Aull;
    CUDA_OK(cudaMemcpy(scratch, &untouched, sizeof(untouched), cudaMemcpyHostToDevice));
    auto bad =
        cuda_backend::GatherCheckedAndWait(pieces, range, payload.size(), element, scratch, nullptr, 0, stream, "test");
    ASSERT_TRUE(bad.ok()) << bad.status();
    EXPECT_EQ(*bad, CpuFirstBad(element, payload));
    unsigned long long after = 0;
    CUDA_OK(cudaMemcpy(&after, scratch, sizeof(after), cudaMemcpyDeviceToHost));
    if (cuda::MultiprocessorCount() + 4 <= cuda::kInlineCopySegments) {
      EXPECT_EQ(after, untouched) << "the fallback ran, not the kernel that publishes its answer";
    }
    ++(*bad == std::numeric_limits<uint64_t>::max() ? clean_seen : bad_seen);
    std::string back(payload.size(), '\0');
    CUDA_OK(cudaMemcpy(back.data(), range, back.size(), cudaMemcpyDeviceToHost));
    EXPECT_TRUE(back == payload) << "gathered bytes differ";
    cudaFree(range);
    cudaFree(base);
  }
  // The even trials plant a non-finite value 3 times in 4 (RandomPayload): at least one of 12
  // fails by chance 6e-8 of runs (3 or more did 3.8e-5).
  EXPECT_GE(bad_seen, 1);
  EXPECT_GE(clean_seen, 12);
  cudaFree(scratch);
  cudaStreamDestroy(stream);
}

TEST(CudaPieceCopyTest, LeavesWhatTheKernelDoesNotDoBetterToTheCopyEngines) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  char* range = nullptr;
  CUDA_OK(cudaMalloc(&range, 1 << 20));
  char* pinned = nullptr;
  CUDA_OK(cudaMallocHost(&pinned, 1 << 16));
  using Pieces = std::vector<std::string_view>;
  // Two scattered pinned pieces: the kernel's case, to read; not to write (cudaMallocHost
  // memory is not in the registry of writable regions).
  EXPECT_TRUE(PlanKernelCopy(Pieces{{pinned + 4096, 1024}, {pinned, 1000}}, range, true).has_value());
  EXPECT_FALSE(PlanKernelCopy(Pieces{{pinned + 4096, 1024}, {pinned, 1000}}, range, false).has_value());
  // A piece running past the pinned part of its buffer into pageable memory.
  char* half_pinned = static_cast<char*>(std::aligned_alloc(4096, 2 << 16));
  CUDA_OK(cudaHostRegister(half_pinned, 1 << 16, cudaHostRegisterPortable));
  EXPECT_TRUE(PlanKernelCopy(Pieces{{half_pinned + 8192, 1024}, {half_pinned, 1024}}, range, true).has_value());
  EXPECT_FALSE(PlanKernelCopy(Pieces{{half_pinned + 8192, 1024}, {half_pinned + (1 << 16) - 512, 1024}}, range, true)
                   .has_value());
  CUDA_OK(cudaHostUnregister(half_pinned));
  std::free(half_pinned);
  // Pageable memory: the device cannot read it; nor a mix.
  std::vector<char> pageable(1 << 16);
  EXPECT_FALSE(
      PlanKernelCopy(Pieces{{pageable.data() + 4096, 1024}, {pageable.data(), 1024}}, range, true).has_value());
  EXPECT_FALSE(PlanKernelCopy(Pieces{{pinned + 4096, 1024}, {pageable.data(), 1024}}, range, true).has_value());
  // A piece misaligned (the kernel moves 16-byte vectors), or a size before the last that
  // is not a whole number of them.
  EXPECT_FALSE(PlanKernelCopy(Pieces{{pinned + 4104, 1024}, {pinned, 1024}}, range, true).has_value());
  EXPECT_FALSE(PlanKernelCopy(Pieces{{pinned + 4096, 1000}, {pinned, 1024}}, range, true).has_value());
  // One run (a single piece, or adjacent pieces), or runs averaging 1 MiB and more: the
  // copy engines are faster.
  EXPECT_FALSE(PlanKernelCopy(Pieces{{pinned, 4096}}, range, true).has_value());
  EXPECT_FALSE(PlanKernelCopy(Pieces{{pinned, 1024}, {pinned + 1024, 1000}}, range, true).has_value());
  char* big = nullptr;
  CUDA_OK(cudaMallocHost(&big, 5 << 20));
  EXPECT_FALSE(PlanKernelCopy(Pieces{{big + (3 << 20), 2 << 20}, {big, 2 << 20}}, range, true).has_value());
  cudaFreeHost(big);
  // Device memory is gathered by the kernel over every SM (the check fused), even in one run;
  // never scattered into (it may be another process's, mapped through CUDA IPC), nor mixed
  // with host pieces.
  const std::optional<KernelCopyPlan> from_device =
      PlanKernelCopy(Pieces{{range + 4096, 1024}, {range, 1024}}, range + 8192, true);
  ASSERT_TRUE(from_device.has_value());
  int sms = 0;
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  EXPECT_EQ(from_device->launch.max_ctas, sms);
  EXPECT_TRUE(PlanKernelCopy(Pieces{{range, 4096}}, range + 8192, true).has_value());
  EXPECT_FALSE(PlanKernelCopy(Pieces{{range + 4096, 1024}, {range, 1024}}, range + 8192, false).has_value());
  EXPECT_FALSE(PlanKernelCopy(Pieces{{range + 4096, 1024}, {pinned, 1024}}, range + 8192, true).has_value());
  EXPECT_FALSE(PlanKernelCopy(Pieces{{pinned + 4096, 1024}, {range, 1024}}, range + 8192, true).has_value());
  // A read-only pinned mapping (a worker's view of a cache server's arena) is read in
  // place, never written.
  char* read_only = static_cast<char*>(std::aligned_alloc(4096, 1 << 16));
  ASSERT_TRUE(cache::PinHostMemoryReadOnly(read_only, 1 << 16));
  const Pieces scattered = {{read_only + 8192, 1024}, {read_only, 1024}};
  EXPECT_TRUE(PlanKernelCopy(scattered, range, /*to_contiguous=*/true).has_value());
  EXPECT_FALSE(PlanKernelCopy(scattered, range, /*to_contiguous=*/false).has_value());
  // Nor mixed with device pieces, in either order (a registered region takes no driver query).
  EXPECT_FALSE(PlanKernelCopy(Pieces{{range + 4096, 1024}, {read_only, 1024}}, range + 8192, true).has_value());
  EXPECT_FALSE(PlanKernelCopy(Pieces{{read_only + 8192, 1024}, {range, 1024}}, range + 8192, true).has_value());
  cache::UnpinHostMemory(read_only);
  std::free(read_only);
  // The kernel's argument checks.
  cuda::CopySegment* table = nullptr;
  CUDA_OK(cudaMalloc(&table, sizeof(cuda::CopySegment)));
  EXPECT_EQ(cuda::LaunchPieceCopy(nullptr, 1, cuda::Element::kBf16, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchPieceCopy(table, 1, cuda::Element::kBf16, nullptr, nullptr, {.max_ctas = 0, .threads = 512}),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchPieceCopy(table, 1, cuda::Element::kBf16, nullptr, nullptr, {.max_ctas = 4, .threads = 100}),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchPieceCopy(table, 0, cuda::Element::kBf16, nullptr, nullptr), cudaSuccess);
  const std::vector<cuda::CopySegment> too_many(cuda::kInlineCopySegments + 1);
  EXPECT_EQ(cuda::LaunchPieceCopyInline(too_many.data(), static_cast<int>(too_many.size()), cuda::Element::kBf16,
                                        nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchPieceCopyInline(nullptr, 1, cuda::Element::kBf16, nullptr, nullptr), cudaErrorInvalidValue);
  cudaFree(table);
  cudaFreeHost(pinned);
  cudaFree(range);
}

}  // namespace
}  // namespace lazykv
