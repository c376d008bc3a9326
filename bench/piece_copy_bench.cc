// The piece copy kernel (kernels/cuda/piece_copy.h) against the copy engines, for a 64 MiB
// chunk in shuffled 256 KiB pinned pages (as the cache tier's host arenas hold it): host to
// device (an import) and device to host (an export), each against one pinned cudaMemcpy of
// the same bytes and against the batched cudaMemcpyBatchAsync of the pages that the chunk
// transfer used before, in the same run; over a grid of launch shapes. Also: pages of
// malloc'd memory pinned as the cache tier pins its arenas (cache::PinHostMemory, planned
// through the backend's PlanKernelCopy and its registry), the cost of asking the driver
// where a piece lives, and a device-to-device copy with the value check fused
// against a cudaMemcpy then the separate check. Times are wall clock from the plan to the
// stream's end, medians; every variant's bytes are compared with the source.
//
//   piece_copy_bench [--reps N] [--bytes BYTES]
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "bench/cuda_bench_util.h"
#include "bench/shuffled_pages.h"
#include "bench/wall_timing.h"
#include "cache_server/pinned_memory.h"
#include "common/flag_parser.h"
#include "kernels/cuda/finite_check.h"
#include "kernels/cuda/piece_copy.h"
#include "kernels/cuda/piece_copy_plan.h"
#include "worker/backend/cuda_copy_pieces.h"

namespace lazykv {
namespace {

using Clock = std::chrono::steady_clock;

template <typename Fn>
double MedianWallMs(Fn&& fn, int reps) {
  return bench::MedianSeconds(fn, reps) * 1e3;
}

struct Pages {
  char* base = nullptr;
  std::vector<std::string_view> pieces;
};

// `bytes` in shuffled `page`-byte pages of `base` behind a chunk header's 128 bytes, as the
// cache tier's arena holds a chunk (bench/shuffled_pages.h).
Pages ShuffledPages(char* base, uint64_t bytes, uint64_t page, std::mt19937_64& rng) {
  Pages pages{base, {}};
  for (const auto& [offset, n] : bench::ShuffledPageLayout(bytes, page, 128, rng)) {
    pages.pieces.emplace_back(base + offset, n);
  }
  return pages;
}

int Main(int argc, char** argv) {
  FlagParser flags("usage: piece_copy_bench [--reps N] [--bytes BYTES (a multiple of 16)]\n");
  int reps = 30;
  uint64_t bytes = 64ull << 20;
  flags.AddInt("--reps", &reps);
  flags.AddByteSize("--bytes", &bytes);
  if (absl::Status s = flags.Parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return absl::IsCancelled(s) ? 0 : 2;
  }
  if (bytes == 0 || bytes % 16 != 0) {
    std::fprintf(stderr, "--bytes: %llu is not a positive multiple of 16\n", static_cast<unsigned long long>(bytes));
    return 2;
  }
  const uint64_t page = 256 << 10;
  std::mt19937_64 rng(7);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);

  // The source values: bf16 bits that are all finite.
  std::vector<uint16_t> values(bytes / 2);
  for (auto& v : values) v = static_cast<uint16_t>(rng() & 0x3FFF);
  const char* source = reinterpret_cast<const char*>(values.data());

  const uint64_t region = ((bytes + 128 + page - 1) / page) * page;
  char* pinned = nullptr;
  CHECK_CUDA(cudaMallocHost(&pinned, region));
  char* registered = static_cast<char*>(std::aligned_alloc(4096, region));
  if (!cache::PinHostMemory(registered, region)) {  // as the cache tier pins its arenas
    std::fprintf(stderr, "could not pin\n");
    return 1;
  }
  char* device = nullptr;
  char* device2 = nullptr;
  CHECK_CUDA(cudaMalloc(&device, bytes));
  CHECK_CUDA(cudaMalloc(&device2, bytes));
  cuda::CopySegment* table = nullptr;  // room for the finest plan: one segment per 16 bytes
  CHECK_CUDA(cudaMalloc(&table, bytes / 16 * sizeof(cuda::CopySegment) + sizeof(cuda::CopySegment)));
  unsigned long long* first_bad = nullptr;
  CHECK_CUDA(cudaMalloc(&first_bad, sizeof(*first_bad)));

  auto fill = [&](const Pages& pages) {
    uint64_t at = 0;
    for (std::string_view p : pages.pieces) {
      std::memcpy(const_cast<char*>(p.data()), source + at, p.size());
      at += p.size();
    }
  };
  auto same_pieces = [&](const Pages& pages) {
    uint64_t at = 0;
    for (std::string_view p : pages.pieces) {
      if (std::memcmp(p.data(), source + at, p.size()) != 0) return false;
      at += p.size();
    }
    return true;
  };
  std::vector<char> readback(bytes);
  auto same_device = [&](const char* d) {
    CHECK_CUDA(cudaMemcpy(readback.data(), d, bytes, cudaMemcpyDeviceToHost));
    return std::memcmp(readback.data(), source, bytes) == 0;
  };
  bool all_exact = true;
  auto report = [&](const char* what, double ms, double ceiling_ms, bool exact) {
    all_exact = all_exact && exact;
    std::printf("%-58s %8.3f ms %7.2f GB/s %6.1f%% %s\n", what, ms, bytes / 1e6 / ms, 100.0 * ceiling_ms / ms,
                exact ? "exact" : "DIFFERS");
  };

  // Timed first, then checked (the check reads what the last run wrote).
  auto measure = [&](const char* what, auto&& fn, double ceiling_ms, auto&& exact) {
    const double ms = MedianWallMs(fn, reps);
    report(what, ms, ceiling_ms, exact());
  };

  const Pages in_pinned = ShuffledPages(pinned, bytes, page, rng);
  const Pages in_registered = ShuffledPages(registered, bytes, page, rng);
  fill(in_pinned);
  fill(in_registered);
  char* flat = nullptr;
  CHECK_CUDA(cudaMallocHost(&flat, bytes));
  std::memcpy(flat, source, bytes);

  // Ceilings.
  const double h2d_ms = MedianWallMs(
      [&] {
        CHECK_CUDA(cudaMemcpyAsync(device, flat, bytes, cudaMemcpyHostToDevice, stream));
        CHECK_CUDA(cudaStreamSynchronize(stream));
      },
      reps);
  const double d2h_ms = MedianWallMs(
      [&] {
        CHECK_CUDA(cudaMemcpyAsync(flat, device, bytes, cudaMemcpyDeviceToHost, stream));
        CHECK_CUDA(cudaStreamSynchronize(stream));
      },
      reps);
  std::printf("%zu pieces; the ceilings: one pinned cudaMemcpy\n", in_pinned.pieces.size());
  report("H2D one pinned cudaMemcpy (ceiling)", h2d_ms, h2d_ms, same_device(device));

  auto batch = [&](const Pages& pages, bool to_device, char* d) {
    if (!cuda_backend::CopyPiecesContiguous(pages.pieces, d, to_device, stream, "batch").ok()) std::exit(1);
    CHECK_CUDA(cudaStreamSynchronize(stream));
  };
  auto kernel = [&](const Pages& pages, bool to_device, char* d, cuda::PieceCopyLaunch launch, bool check) {
    auto plan = cuda::PlanCopySegments(pages.pieces, reinterpret_cast<uint64_t>(d), to_device);
    if (!plan) std::exit(1);
    CHECK_CUDA(
        cudaMemcpyAsync(table, plan->data(), plan->size() * sizeof(cuda::CopySegment), cudaMemcpyHostToDevice, stream));
    CHECK_CUDA(cuda::LaunchPieceCopy(table, static_cast<int>(plan->size()), cuda::Element::kBf16,
                                     check ? first_bad : nullptr, stream, launch));
    if (check) {
      unsigned long long bad = 0;
      CHECK_CUDA(cudaMemcpyAsync(&bad, first_bad, sizeof(bad), cudaMemcpyDeviceToHost, stream));
      CHECK_CUDA(cudaStreamSynchronize(stream));
      if (bad != ~0ull) std::exit(1);
    } else {
      CHECK_CUDA(cudaStreamSynchronize(stream));
    }
  };

  CHECK_CUDA(cudaMemset(device, 0, bytes));
  measure(
      "H2D batched cudaMemcpyBatchAsync of the pages (before)", [&] { batch(in_pinned, true, device); }, h2d_ms,
      [&] { return same_device(device); });
  const int sms = prop.multiProcessorCount;
  for (int ctas : {8, 16, 32, 64, sms, 2 * sms}) {
    for (int threads : {256, 512, 1024}) {
      CHECK_CUDA(cudaMemset(device, 0, bytes));
      const cuda::PieceCopyLaunch launch{.max_ctas = ctas, .threads = threads};
      const double ms = MedianWallMs([&] { kernel(in_pinned, true, device, launch, true); }, reps);
      char what[96];
      std::snprintf(what, sizeof(what), "H2D kernel + check, %d CTAs x %d threads", ctas, threads);
      report(what, ms, h2d_ms, same_device(device));
    }
  }
  CHECK_CUDA(cudaMemset(device, 0, bytes));
  measure(
      "H2D kernel no check, 32 x 512",
      [&] { kernel(in_pinned, true, device, {.max_ctas = 32, .threads = 512}, false); }, h2d_ms,
      [&] { return same_device(device); });
  CHECK_CUDA(cudaMemset(device, 0, bytes));
  measure(
      "H2D kernel + check from tier-pinned pages, 32 x 512",
      [&] { kernel(in_registered, true, device, {.max_ctas = 32, .threads = 512}, true); }, h2d_ms,
      [&] { return same_device(device); });
  CHECK_CUDA(cudaMemset(device, 0, bytes));
  measure(
      "H2D batched from tier-pinned pages", [&] { batch(in_registered, true, device); }, h2d_ms,
      [&] { return same_device(device); });
  // The backend's own path (PlanKernelCopy: the registry or a driver query per piece, its
  // launch shape), as StageChunk takes it.
  auto product = [&](const Pages& pages, bool to_device, char* d, bool check) {
    auto plan = cuda_backend::PlanKernelCopy(pages.pieces, d, to_device);
    if (!plan) std::exit(1);
    if (!cuda_backend::EnqueueKernelCopy(*plan, table, cuda::Element::kBf16, check ? first_bad : nullptr, stream)
             .ok()) {
      std::exit(1);
    }
    CHECK_CUDA(cudaStreamSynchronize(stream));
  };
  for (const auto& [what, pages] : {std::pair{"H2D backend path + check, cudaMallocHost pages", &in_pinned},
                                    std::pair{"H2D backend path + check, tier-pinned pages", &in_registered}}) {
    CHECK_CUDA(cudaMemset(device, 0, bytes));
    measure(
        what, [&] { product(*pages, true, device, true); }, h2d_ms, [&] { return same_device(device); });
    const auto plan_start = Clock::now();
    for (int i = 0; i < 20; ++i) {
      if (!cuda_backend::PlanKernelCopy(pages->pieces, device, true)) std::exit(1);
    }
    std::printf("  its plan: %.1f us\n",
                std::chrono::duration<double, std::micro>(Clock::now() - plan_start).count() / 20);
  }

  // A read-only pinned mapping, as a worker pins its view of a cache server's arena.
  char* read_only = static_cast<char*>(std::aligned_alloc(4096, region));
  const Pages in_read_only = ShuffledPages(read_only, bytes, page, rng);
  fill(in_read_only);
  if (!cache::PinHostMemoryReadOnly(read_only, region)) {
    std::fprintf(stderr, "could not pin read-only\n");
    return 1;
  }
  CHECK_CUDA(cudaMemset(device, 0, bytes));
  measure(
      "H2D backend path + check, read-only pinned pages", [&] { product(in_read_only, true, device, true); }, h2d_ms,
      [&] { return same_device(device); });
  CHECK_CUDA(cudaMemset(device, 0, bytes));
  measure(
      "H2D batched from read-only pinned pages", [&] { batch(in_read_only, true, device); }, h2d_ms,
      [&] { return same_device(device); });
  // Two chunks at once on two streams (the pipeline stages two at a time), each against
  // two pinned memcpys on two streams.
  cudaStream_t second_stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&second_stream, cudaStreamNonBlocking));
  cuda::CopySegment* second_table = nullptr;
  CHECK_CUDA(cudaMalloc(&second_table, bytes / 16 * sizeof(cuda::CopySegment) + sizeof(cuda::CopySegment)));
  const double h2d_x2_ms = MedianWallMs(
      [&] {
        CHECK_CUDA(cudaMemcpyAsync(device, flat, bytes, cudaMemcpyHostToDevice, stream));
        CHECK_CUDA(cudaMemcpyAsync(device2, flat, bytes, cudaMemcpyHostToDevice, second_stream));
        CHECK_CUDA(cudaStreamSynchronize(stream));
        CHECK_CUDA(cudaStreamSynchronize(second_stream));
      },
      reps);
  report("H2D two pinned cudaMemcpys on two streams (ceiling)", h2d_x2_ms, h2d_x2_ms, true);
  for (const auto& [what, pages] : {std::pair{"H2D two at once, backend path, read-only pinned", &in_read_only},
                                    std::pair{"H2D two at once, backend path, tier-pinned", &in_registered}}) {
    measure(
        what,
        [&] {
          auto plan = cuda_backend::PlanKernelCopy(pages->pieces, device, true);
          auto plan2 = cuda_backend::PlanKernelCopy(pages->pieces, device2, true);
          if (!plan || !plan2) std::exit(1);
          if (!cuda_backend::EnqueueKernelCopy(*plan, table, cuda::Element::kBf16, first_bad, stream).ok() ||
              !cuda_backend::EnqueueKernelCopy(*plan2, second_table, cuda::Element::kBf16, nullptr, second_stream)
                   .ok()) {
            std::exit(1);
          }
          CHECK_CUDA(cudaStreamSynchronize(stream));
          CHECK_CUDA(cudaStreamSynchronize(second_stream));
        },
        h2d_x2_ms, [&] { return same_device(device) && same_device(device2); });
  }
  measure(
      "H2D two at once, batched, read-only pinned",
      [&] {
        if (!cuda_backend::CopyPiecesContiguous(in_read_only.pieces, device, true, stream, "batch").ok() ||
            !cuda_backend::CopyPiecesContiguous(in_read_only.pieces, device2, true, second_stream, "batch").ok()) {
          std::exit(1);
        }
        CHECK_CUDA(cudaStreamSynchronize(stream));
        CHECK_CUDA(cudaStreamSynchronize(second_stream));
      },
      h2d_x2_ms, [&] { return same_device(device) && same_device(device2); });

  // The host memory's kind: the kernel's loads go through the GPU's page tables, one entry
  // per host page, where the copy engines take physical page lists. Anonymous memory with
  // 4 KiB pages and with transparent huge pages, and a memfd mapped shared (a cache
  // server's arena; its read-only view as a worker maps it), pinned as the tier pins them.
  {
    std::string thp;
    for (const char* f :
         {"/sys/kernel/mm/transparent_hugepage/enabled", "/sys/kernel/mm/transparent_hugepage/shmem_enabled"}) {
      std::FILE* in = std::fopen(f, "r");
      char line[256] = "?";
      if (in != nullptr) {
        if (std::fgets(line, sizeof(line), in) == nullptr) line[0] = 0;
        std::fclose(in);
      }
      thp += std::string(f) + ": " + line;
    }
    std::printf("%s", thp.c_str());
  }
  struct Kind {
    const char* name;
    char* base;
    bool read_only;
  };
  std::vector<Kind> kinds;
  auto anonymous = [&](int advice) {
    void* m = mmap(nullptr, region, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) std::exit(1);
    madvise(m, region, advice);
    return static_cast<char*>(m);
  };
  kinds.push_back({"anonymous, 4 KiB pages (MADV_NOHUGEPAGE)", anonymous(MADV_NOHUGEPAGE), false});
  kinds.push_back({"anonymous, huge pages asked (MADV_HUGEPAGE)", anonymous(MADV_HUGEPAGE), false});
  const int fd = memfd_create("piece-copy-bench", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(region)) != 0) std::exit(1);
  char* shared_rw = static_cast<char*>(mmap(nullptr, region, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  char* shared_ro = static_cast<char*>(mmap(nullptr, region, PROT_READ, MAP_SHARED, fd, 0));
  if (shared_rw == MAP_FAILED || shared_ro == MAP_FAILED) std::exit(1);
  kinds.push_back({"memfd, shared (a cache server's arena)", shared_rw, false});
  std::vector<Pages> kind_pages;
  for (Kind& k : kinds) {
    kind_pages.push_back(ShuffledPages(k.base, bytes, page, rng));
    fill(kind_pages.back());
  }
  // The worker's read-only view of the same memfd: the same page slots as the shared one.
  Pages view = kind_pages.back();
  for (std::string_view& p : view.pieces) p = std::string_view(shared_ro + (p.data() - shared_rw), p.size());
  kinds.push_back({"memfd, read-only view (a worker's mapping)", shared_ro, true});
  kind_pages.push_back(view);
  for (size_t i = 0; i < kinds.size(); ++i) {
    const bool pinned = kinds[i].read_only ? cache::PinHostMemoryReadOnly(kinds[i].base, region)
                                           : cache::PinHostMemory(kinds[i].base, region);
    if (!pinned) {
      std::printf("%s: could not pin\n", kinds[i].name);
      continue;
    }
    for (int round = 0; round < 2; ++round) {  // alternated, so drift falls on both
      char what[160];
      CHECK_CUDA(cudaMemset(device, 0, bytes));
      std::snprintf(what, sizeof(what), "H2D kernel + check: %s", kinds[i].name);
      measure(
          what, [&] { product(kind_pages[i], true, device, true); }, h2d_ms, [&] { return same_device(device); });
      CHECK_CUDA(cudaMemset(device, 0, bytes));
      std::snprintf(what, sizeof(what), "H2D batched:        %s", kinds[i].name);
      measure(
          what, [&] { batch(kind_pages[i], true, device); }, h2d_ms, [&] { return same_device(device); });
    }
  }
  for (size_t i = 0; i < kinds.size(); ++i) cache::UnpinHostMemory(kinds[i].base);

  // Device to host into shuffled pages (the device holds the source now).
  CHECK_CUDA(cudaMemcpy(device, source, bytes, cudaMemcpyHostToDevice));
  report("D2H one pinned cudaMemcpy (ceiling)", d2h_ms, d2h_ms, true);
  auto clear = [&](const Pages& pages) {
    for (std::string_view p : pages.pieces) std::memset(const_cast<char*>(p.data()), 0, p.size());
  };
  clear(in_pinned);
  measure(
      "D2H batched cudaMemcpyBatchAsync into the pages (before)", [&] { batch(in_pinned, false, device); }, d2h_ms,
      [&] { return same_pieces(in_pinned); });
  for (int ctas : {8, 16, 32, 64, sms, 2 * sms}) {
    for (int threads : {256, 512, 1024}) {
      clear(in_pinned);
      const cuda::PieceCopyLaunch launch{.max_ctas = ctas, .threads = threads};
      const double ms = MedianWallMs([&] { kernel(in_pinned, false, device, launch, false); }, reps);
      char what[96];
      std::snprintf(what, sizeof(what), "D2H kernel, %d CTAs x %d threads", ctas, threads);
      report(what, ms, d2h_ms, same_pieces(in_pinned));
    }
  }
  clear(in_registered);
  measure(
      "D2H kernel into tier-pinned pages, 32 x 512",
      [&] { kernel(in_registered, false, device, {.max_ctas = 32, .threads = 512}, false); }, d2h_ms,
      [&] { return same_pieces(in_registered); });

  // Device to device, as a same-host CUDA IPC fetch copies and checks a chunk.
  const double d2d_ms = MedianWallMs(
      [&] {
        CHECK_CUDA(cudaMemcpyAsync(device2, device, bytes, cudaMemcpyDeviceToDevice, stream));
        CHECK_CUDA(cudaStreamSynchronize(stream));
      },
      reps);
  report("D2D one cudaMemcpy (ceiling)", d2d_ms, d2d_ms, same_device(device2));
  CHECK_CUDA(cudaMemset(device2, 0, bytes));
  measure(
      "D2D cudaMemcpy then the value check",
      [&] {
        CHECK_CUDA(cudaMemcpyAsync(device2, device, bytes, cudaMemcpyDeviceToDevice, stream));
        CHECK_CUDA(cuda::LaunchFindNonFinite(device2, bytes, cuda::Element::kBf16, first_bad, stream));
        unsigned long long bad = 0;
        CHECK_CUDA(cudaMemcpyAsync(&bad, first_bad, sizeof(bad), cudaMemcpyDeviceToHost, stream));
        CHECK_CUDA(cudaStreamSynchronize(stream));
      },
      d2d_ms, [&] { return same_device(device2); });
  const Pages device_pieces{device, {std::string_view(device, bytes)}};
  for (int ctas : {sms, 2 * sms, 4 * sms}) {
    for (int threads : {256, 512}) {
      CHECK_CUDA(cudaMemset(device2, 0, bytes));
      char what[96];
      std::snprintf(what, sizeof(what), "D2D kernel + check, %d CTAs x %d threads", ctas, threads);
      measure(
          what, [&] { kernel(device_pieces, true, device2, {.max_ctas = ctas, .threads = threads}, true); }, d2d_ms,
          [&] { return same_device(device2); });
    }
  }

  // The fetch's own path: PlanKernelCopy's device plan (a segment per SM) passed in the launch
  // itself (LaunchPieceCopyInline), no table uploaded first.
  {
    const std::vector<std::string_view> pieces = {std::string_view(device, bytes)};
    CHECK_CUDA(cudaMemset(device2, 0, bytes));
    auto plan = cuda_backend::PlanKernelCopy(pieces, device2, /*to_contiguous=*/true);
    if (!plan) std::exit(1);
    char what[96];
    std::snprintf(what, sizeof(what), "D2D PlanKernelCopy + check, answer to the stack (%zu segments%s)",
                  plan->segments.size(),
                  plan->segments.size() <= static_cast<size_t>(cuda::kInlineCopySegments) ? " in the launch" : "");
    auto run = [&](const cuda_backend::KernelCopyPlan& p, bool check) {
      CHECK_CUDA(
          cuda_backend::EnqueueKernelCopy(p, table, cuda::Element::kBf16, check ? first_bad : nullptr, stream).ok()
              ? cudaSuccess
              : cudaErrorUnknown);
      unsigned long long bad = ~0ull;
      if (check) CHECK_CUDA(cudaMemcpyAsync(&bad, first_bad, sizeof(bad), cudaMemcpyDeviceToHost, stream));
      CHECK_CUDA(cudaStreamSynchronize(stream));
      if (bad != ~0ull) std::exit(1);
    };
    measure(
        what, [&] { run(*plan, true); }, d2d_ms, [&] { return same_device(device2); });
    // The staging's way since: the answer read back through a pinned word.
    CHECK_CUDA(cudaMemset(device2, 0, bytes));
    measure(
        "D2D PlanKernelCopy + check, answer through a pinned word",
        [&] {
          CHECK_CUDA(cuda_backend::EnqueueKernelCopy(*plan, table, cuda::Element::kBf16, first_bad, stream).ok()
                         ? cudaSuccess
                         : cudaErrorUnknown);
          absl::StatusOr<unsigned long long> bad = cuda_backend::SynchronizeAndReadAnswer(first_bad, stream);
          if (!bad.ok() || *bad != ~0ull) std::exit(1);
        },
        d2d_ms, [&] { return same_device(device2); });
    CHECK_CUDA(cudaMemset(device2, 0, bytes));
    measure(
        "D2D GatherCheckedAndWait (the staging's way: the kernel publishes its answer)",
        [&] {
          absl::StatusOr<unsigned long long> bad = cuda_backend::GatherCheckedAndWait(
              pieces, device2, bytes, cuda::Element::kBf16, first_bad, table, 0, stream, "bench");
          if (!bad.ok() || *bad != ~0ull) std::exit(1);
        },
        d2d_ms, [&] { return same_device(device2); });
    CHECK_CUDA(cudaMemset(device2, 0, bytes));
    measure(
        "D2D PlanKernelCopy, no check", [&] { run(*plan, false); }, d2d_ms, [&] { return same_device(device2); });
    cuda_backend::KernelCopyPlan wide = *plan;
    wide.launch.threads = 1024;
    CHECK_CUDA(cudaMemset(device2, 0, bytes));
    measure(
        "D2D PlanKernelCopy + check, 1024 threads", [&] { run(wide, true); }, d2d_ms,
        [&] { return same_device(device2); });
  }

  // What asking the driver about each piece would cost.
  const auto start = Clock::now();
  int mapped = 0;
  for (int i = 0; i < 10; ++i) {
    for (std::string_view p : in_registered.pieces) {
      cudaPointerAttributes a{};
      CHECK_CUDA(cudaPointerGetAttributes(&a, p.data()));
      mapped += a.type == cudaMemoryTypeHost && a.devicePointer == p.data();
    }
  }
  const double per_call_us =
      std::chrono::duration<double, std::micro>(Clock::now() - start).count() / (10.0 * in_registered.pieces.size());
  std::printf("cudaPointerGetAttributes: %.3f us a call; %d of %zu registered pieces mapped at their host address\n",
              per_call_us, mapped / 10, in_registered.pieces.size());
  std::printf("%s\n", all_exact ? "all variants exact" : "SOME VARIANT DIFFERS");
  return all_exact ? 0 : 1;
}

}  // namespace
}  // namespace lazykv

int main(int argc, char** argv) { return lazykv::Main(argc, argv); }
