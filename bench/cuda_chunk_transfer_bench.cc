// cuda_backend_bench's transfer part (see its file comment, items 1 and 2): the ceilings
// (pinned host <-> device memcpy, a device-to-device copy), a 512-token chunk of the model
// imported and exported between pool blocks and shuffled pinned 256 KiB pages against the
// memcpy of the same bytes in the same run (one at a time, paired, and streamed as the
// pipeline runs a burst), and the block baseline's materialize against a device copy.
#include "bench/cuda_chunk_transfer_bench.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/cuda_bench_util.h"
#include "bench/shuffled_pages.h"
#include "bench/wall_timing.h"
#include "cache_server/pinned_memory.h"
#include "common/chunk_codec.h"

namespace lazykv::bench {

double ChunkTransferBench(Backend& backend) {
  const ModelConfig& c = backend.config();
  const int tokens = 512, bs = backend.block_size();
  const ChunkLayout layout = MakeChunkLayout(c, KvDtype::kBf16, tokens, 1);
  const size_t bytes = layout.payload_bytes();
  char* pinned = nullptr;
  CHECK_CUDA(cudaMallocHost(&pinned, bytes));
  std::mt19937_64 rng(7);
  for (size_t i = 0; i < bytes; i += 8) {
    const uint64_t r = rng() & 0x3f7f3f7f3f7f3f7fULL;  // finite bf16 values
    std::memcpy(pinned + i, &r, std::min<size_t>(8, bytes - i));
  }
  std::string pageable(pinned, bytes);
  // Blocks scattered over the pool, as a fetched chunk would get them.
  std::vector<int32_t> ids(backend.num_blocks());
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<KvBlockRef> blocks;
  for (int t = 0; t < tokens; t += bs) blocks.push_back(KvBlockRef{ids[blocks.size()], std::min(bs, tokens - t), 0});

  void* device = nullptr;
  CHECK_CUDA(cudaMalloc(&device, bytes));
  char* pinned_out = nullptr;
  CHECK_CUDA(cudaMallocHost(&pinned_out, bytes));
  auto h2d = [&] { CHECK_CUDA(cudaMemcpy(device, pinned, bytes, cudaMemcpyHostToDevice)); };
  auto d2h = [&] { CHECK_CUDA(cudaMemcpy(pinned_out, device, bytes, cudaMemcpyDeviceToHost)); };
  const double memcpy_s = MedianSeconds(h2d, 30);
  const double d2h_s = MedianSeconds(d2h, 30);
  // The payload as the embedded tier holds it: 256 KiB pinned pages, the first one shared
  // with the 128-byte chunk header.
  // The pages lie in the arena in no particular order (its free list), so the pieces are
  // taken from shuffled page slots of one pinned region: none is adjacent to the next.
  const size_t page = 256 << 10;
  const size_t num_pages = (bytes + kChunkHeaderBytes + page - 1) / page;
  // Pinned as the tier pins its arena (cache::PinHostMemory), which the chunk transfer
  // finds in its registry of mapped regions.
  char* in_pages = static_cast<char*>(std::aligned_alloc(4096, num_pages * page));
  char* out_pages = static_cast<char*>(std::aligned_alloc(4096, num_pages * page));
  if (!cache::PinHostMemory(in_pages, num_pages * page) || !cache::PinHostMemory(out_pages, num_pages * page)) {
    std::fprintf(stderr, "could not pin the pages\n");
    std::exit(1);
  }
  std::vector<std::string_view> in_pieces;
  MutablePieces out_pieces;
  uint64_t at = 0;
  for (const auto& [offset, n] : bench::ShuffledPageLayout(bytes, page, kChunkHeaderBytes, rng)) {
    std::memcpy(in_pages + offset, pinned + at, n);
    in_pieces.emplace_back(in_pages + offset, n);
    out_pieces.emplace_back(out_pages + offset, n);
    at += n;
  }
  const ChunkBytes paged(in_pieces, nullptr);
  double enqueue_import_s = 0;
  std::vector<double> stage_s;  // StageChunk alone (the H2D copy into device staging)
  auto import_paged = [&] {
    const auto stage_start = std::chrono::steady_clock::now();
    auto staged = backend.StageChunk(paged, {.check_finite = true});  // a pipeline thread's part
    stage_s.push_back(Seconds(stage_start));
    if (!staged.ok()) {
      std::fprintf(stderr, "StageChunk: %s\n", staged.status().ToString().c_str());
      std::exit(1);
    }
    const auto start = std::chrono::steady_clock::now();
    const absl::Status s = backend.ImportStaged(*std::move(staged), blocks);  // the scheduling thread's part
    enqueue_import_s = std::max(enqueue_import_s, Seconds(start));
    if (!s.ok()) {
      std::fprintf(stderr, "ImportStaged: %s\n", s.ToString().c_str());
      std::exit(1);
    }
    CHECK_CUDA(cudaDeviceSynchronize());  // the scatter done
  };
  const double import_s = MedianSeconds(import_paged, 30);
  std::nth_element(stage_s.begin(), stage_s.begin() + stage_s.size() / 2, stage_s.end());
  const double stage_median_s = stage_s[stage_s.size() / 2];
  const Paired import_paired = PairedMedians(h2d, import_paged, 40);
  double enqueue_capture_s = 0;
  auto export_paged = [&] {
    const auto start = std::chrono::steady_clock::now();
    auto captured = backend.CaptureChunk(blocks);  // the scheduling thread's part
    enqueue_capture_s = std::max(enqueue_capture_s, Seconds(start));
    CheckOk(captured.status(), "CaptureChunk");
    CheckOk((*captured)->CopyTo(out_pieces), "CopyTo");  // a publisher thread's part
  };
  // Streamed, as the chunk pipeline imports a burst: 8 chunks staged two at a time (its
  // gate's width) by two threads, each imported on this thread as it arrives, against 8
  // pinned memcpys of the same bytes back to back.
  constexpr int kStreamed = 8;
  auto import_streamed = [&] {
    std::mutex mu;
    std::condition_variable ready_cv;
    std::vector<std::unique_ptr<StagedChunk>> ready;
    std::vector<std::thread> stagers;
    for (int t = 0; t < 2; ++t) {
      stagers.emplace_back([&, t] {
        for (int c = t; c < kStreamed; c += 2) {
          auto staged = backend.StageChunk(paged, {.check_finite = true});
          CheckOk(staged.status(), "StageChunk");
          std::lock_guard<std::mutex> lock(mu);
          ready.push_back(*std::move(staged));
          ready_cv.notify_one();
        }
      });
    }
    for (int imported = 0; imported < kStreamed; ++imported) {
      std::unique_ptr<StagedChunk> next;
      {
        std::unique_lock<std::mutex> lock(mu);
        ready_cv.wait(lock, [&] { return !ready.empty(); });
        next = std::move(ready.back());
        ready.pop_back();
      }
      CheckOk(backend.ImportStaged(std::move(next), blocks), "ImportStaged");
    }
    for (std::thread& t : stagers) t.join();
    CHECK_CUDA(cudaDeviceSynchronize());
  };
  auto h2d_streamed = [&] {
    for (int c = 0; c < kStreamed; ++c) CHECK_CUDA(cudaMemcpyAsync(device, pinned, bytes, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaDeviceSynchronize());
  };
  const Paired streamed = PairedMedians(h2d_streamed, import_streamed, 10);
  const double export_s = MedianSeconds(export_paged, 30);
  const Paired export_paired = PairedMedians(d2h, export_paged, 40);
  bool same = true;
  for (size_t i = 0, at = 0; i < out_pieces.size(); at += out_pieces[i].size(), ++i) {
    same = same && std::memcmp(out_pieces[i].data(), pinned + at, out_pieces[i].size()) == 0;
  }
  const double memcpy2_s = MedianSeconds(h2d, 30);
  const double d2h2_s = MedianSeconds(d2h, 30);
  const double pageable_s = MedianSeconds(
      [&] {
        CheckOk(backend.ImportChunk(pageable, blocks), "ImportChunk");
        CHECK_CUDA(cudaDeviceSynchronize());
      },
      10);
  std::string exported;
  const double export_string_s =
      MedianSeconds([&] { CheckOk(backend.ExportChunk(blocks, &exported), "ExportChunk"); }, 10);
  const bool same_string = exported.size() == bytes && std::memcmp(exported.data(), pinned, bytes) == 0;
  // Device-to-device ceiling: 1 GiB copy, bytes read plus written.
  const size_t big = 1ull << 30;
  void *a = nullptr, *b = nullptr;
  CHECK_CUDA(cudaMalloc(&a, big));
  CHECK_CUDA(cudaMalloc(&b, big));
  CHECK_CUDA(cudaMemset(a, 1, big));
  const double d2d_s = MedianSeconds(
      [&] {
        CHECK_CUDA(cudaMemcpy(b, a, big, cudaMemcpyDeviceToDevice));
        CHECK_CUDA(cudaDeviceSynchronize());
      },
      20);
  // The block baseline's materialize (CopyBlocksRotated: keys re-rotated, values copied)
  // of the chunk's blocks into fresh blocks, against a device copy of the same bytes,
  // timed in alternation.
  std::vector<BlockCopy> copies;
  for (size_t i = 0; i < blocks.size(); ++i) {
    copies.push_back(BlockCopy{blocks[i].block, ids[blocks.size() + i], blocks[i].num_tokens, 1000});
  }
  const Paired materialize = PairedMedians(
      [&] {
        CHECK_CUDA(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
        CHECK_CUDA(cudaDeviceSynchronize());
      },
      [&] {
        CheckOk(backend.CopyBlocksRotated(copies), "CopyBlocksRotated");
        CHECK_CUDA(cudaDeviceSynchronize());
      },
      40);
  const double gb = bytes / 1e9;
  const double memcpy_best = std::min(memcpy_s, memcpy2_s);
  const double d2h_best = std::min(d2h_s, d2h2_s);
  std::printf("ceiling: device-to-device copy %.0f GB/s (read + write, 1 GiB)\n", 2 * big / 1e9 / d2d_s);
  std::printf(
      "materialize (block's copy, keys re-rotated) of the chunk: %.3f ms, %.0f GB/s read + write; a device copy of "
      "the same bytes %.3f ms, %.0f GB/s; materialize at %.1f%% of the copy (paired medians, 40 pairs)\n",
      materialize.candidate_s * 1e3, 2 * bytes / 1e9 / materialize.candidate_s, materialize.baseline_s * 1e3,
      2 * bytes / 1e9 / materialize.baseline_s, 100.0 * materialize.ratio);
  std::printf("chunk: %d tokens, %d layers, %d KV heads, head dim %d, bf16, %d-token blocks: %.1f MiB in %zu blocks\n",
              tokens, c.n_layers, c.n_kv_heads, c.head_dim, bs, bytes / 1048576.0, blocks.size());
  std::printf("pinned cudaMemcpy H2D      %8.3f ms %7.2f GB/s (before), %7.2f GB/s (after)\n", memcpy_s * 1e3,
              gb / memcpy_s, gb / memcpy2_s);
  std::printf("pinned cudaMemcpy D2H      %8.3f ms %7.2f GB/s (before), %7.2f GB/s (after)\n", d2h_s * 1e3, gb / d2h_s,
              gb / d2h2_s);
  std::printf(
      "import: StageChunk from %zu pinned 256 KiB pieces + ImportStaged %8.3f ms %7.2f GB/s = %.1f%% of the best "
      "pinned H2D memcpy (floor 85%%); ImportStaged on the calling thread at most %.3f ms; StageChunk alone "
      "%.3f ms (%.1f%%)\n",
      in_pieces.size(), import_s * 1e3, gb / import_s, 100.0 * memcpy_best / import_s, enqueue_import_s * 1e3,
      stage_median_s * 1e3, 100.0 * memcpy_best / stage_median_s);
  std::printf(
      "export: CaptureChunk + CopyTo into %zu pinned 256 KiB pieces %8.3f ms %7.2f GB/s = %.1f%% of the best "
      "pinned D2H memcpy (floor 85%%); CaptureChunk on the calling thread at most %.3f ms; round trip %s\n",
      out_pieces.size(), export_s * 1e3, gb / export_s, 100.0 * d2h_best / export_s, enqueue_capture_s * 1e3,
      same ? "exact" : "DIFFERS");
  std::printf(
      "paired with the memcpy in alternation (40 pairs): import %.3f ms vs H2D %.3f ms, median ratio %.1f%%; "
      "export %.3f ms vs D2H %.3f ms, median ratio %.1f%% (floor 85%%)\n",
      import_paired.candidate_s * 1e3, import_paired.baseline_s * 1e3, 100.0 * import_paired.ratio,
      export_paired.candidate_s * 1e3, export_paired.baseline_s * 1e3, 100.0 * export_paired.ratio);
  std::printf(
      "import streamed (%d chunks, two stagings in flight, each imported as it lands): %.3f ms vs %d pinned H2D "
      "memcpys %.3f ms, median ratio %.1f%% (10 pairs)\n",
      kStreamed, streamed.candidate_s * 1e3, kStreamed, streamed.baseline_s * 1e3, 100.0 * streamed.ratio);
  std::printf(
      "import from one pageable string %8.3f ms %7.2f GB/s; export to a string %8.3f ms %7.2f GB/s; round trip %s\n",
      pageable_s * 1e3, gb / pageable_s, export_string_s * 1e3, gb / export_string_s,
      same_string ? "exact" : "DIFFERS");
  cudaFreeHost(pinned_out);
  cache::UnpinHostMemory(in_pages);
  cache::UnpinHostMemory(out_pages);
  std::free(in_pages);
  std::free(out_pages);
  cudaFree(a);
  cudaFree(b);
  cudaFree(device);
  cudaFreeHost(pinned);
  return 2 * big / 1e9 / d2d_s;  // HBM traffic rate of the copy (read + write)
}

}  // namespace lazykv::bench
