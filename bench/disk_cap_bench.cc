// How far the disk tier's directory exceeds its byte cap (issue 21: the disk cap in bytes on
// disk). Puts `--multiple` times the cap of random chunks through a DiskTier and, after
// every put, measures the directory as `du -sb` would (every file's size) and as `du -s`
// would (allocated blocks), against the cap and the tier's own count of stored bytes.
// Also reports write amplification (bytes this process wrote, from /proc/self/io, over the
// bytes put) and put throughput (time in Put only).
//
//   disk_cap_bench [--cap BYTES] [--chunk BYTES] [--multiple N] [--dir DIR] [--region BYTES]
//
// Prints the largest and final ratio of the directory to the cap, and where the bytes were.
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>

#include "absl/strings/str_format.h"
#include "cache_server/disk_tier.h"
#include "common/byte_size.h"
#include "common/chunk_codec.h"
#include "common/flag_parser.h"

namespace lazykv::cache {
namespace {

namespace fs = std::filesystem;

// Bytes per kind of file under `dir`, the larger of size and allocated blocks of each file
// (`du -sb` counts sizes, `du -s` blocks; a preallocated file has both equal).
std::map<std::string, uint64_t> DirectoryBytes(const std::string& dir) {
  std::map<std::string, uint64_t> by_kind;
  std::error_code error;  // files come and go under RocksDB's background jobs
  for (const auto& entry : fs::recursive_directory_iterator(dir, error)) {
    struct stat st;
    if (lstat(entry.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    const uint64_t size = std::max<uint64_t>(st.st_size, static_cast<uint64_t>(st.st_blocks) * 512);
    const std::string name = entry.path().filename().string();
    std::string kind = "other";
    if (name == "values")
      kind = "values";
    else if (name.ends_with(".blob"))
      kind = "blob";
    else if (name.ends_with(".sst"))
      kind = "sst";
    else if (name.ends_with(".log"))
      kind = "wal";
    else if (name.starts_with("LOG"))
      kind = "info-log";
    else if (name.starts_with("MANIFEST"))
      kind = "manifest";
    by_kind[kind] += size;
  }
  return by_kind;
}

uint64_t Total(const std::map<std::string, uint64_t>& by_kind) {
  uint64_t total = 0;
  for (const auto& [kind, bytes] : by_kind) total += bytes;
  return total;
}

// A field of /proc/self/io (wchar: bytes passed to write calls; write_bytes: bytes the
// process caused to be sent to storage).
uint64_t ProcIo(const std::string& field) {
  std::ifstream in("/proc/self/io");
  std::string name;
  uint64_t value = 0;
  while (in >> name >> value) {
    if (name == field + ":") return value;
  }
  return 0;
}

int Run(int argc, char** argv) {
  uint64_t cap = 16 << 20, chunk_bytes = 1 << 20;
  int multiple = 10;
  std::string dir = (fs::temp_directory_path() / "lazykv_disk_cap_bench").string();
  FlagParser parser(
      "usage: disk_cap_bench [--cap BYTES] [--chunk BYTES] [--multiple N] [--dir DIR] [--region BYTES]\n");
  parser.AddByteSize("--cap", &cap);
  parser.AddByteSize("--chunk", &chunk_bytes);
  parser.AddInt("--multiple", &multiple);
  parser.AddString("--dir", &dir);
  uint64_t region = 32ull << 20;
  parser.AddByteSize("--region", &region);
  if (absl::Status s = parser.Parse(argc, argv); !s.ok()) return ExitForFlagError(s, "disk_cap_bench");
  fs::remove_all(dir);
  auto tier = DiskTier::Open(
      DiskTierOptions{.path = dir, .capacity_bytes = cap, .region_bytes = region, .scrub_bytes_per_second = 0});
  if (!tier.ok()) {
    std::cerr << tier.status() << "\n";
    return 1;
  }
  std::mt19937_64 rng(1);
  const ChunkLayout layout{
      .num_layers = 2, .n_kv_heads = 1, .head_dim = 256, .num_tokens = 1, .anchor_tokens = 1, .dtype = KvDtype::kBf16};
  ChunkLayout sized = layout;
  sized.num_tokens =
      static_cast<uint32_t>(std::max<uint64_t>(1, chunk_bytes / (2 * layout.num_layers * layout.row_bytes())));
  std::string payload(sized.payload_bytes(), '\0');
  const uint64_t puts = cap * multiple / (kChunkHeaderBytes + payload.size());
  double worst = 0;
  uint64_t worst_at = 0;
  std::map<std::string, uint64_t> worst_split;
  const uint64_t wchar_before = ProcIo("wchar"), storage_before = ProcIo("write_bytes");
  std::chrono::steady_clock::duration in_put{0};
  for (uint64_t i = 0; i < puts; ++i) {
    for (size_t b = 0; b < payload.size(); b += 8) {
      const uint64_t word = rng();
      std::memcpy(payload.data() + b, &word, std::min<size_t>(8, payload.size() - b));
    }
    const Hash128 key{rng(), rng()};
    const std::string header = EncodeChunkHeader(MakeChunkHeader(key, Hash128{1, 1}, sized, payload));
    const auto start = std::chrono::steady_clock::now();
    auto put = (*tier)->Put(key, {header, payload}, header.size() + payload.size());
    in_put += std::chrono::steady_clock::now() - start;
    if (!put.ok()) {
      std::cerr << "put " << i << ": " << put.status() << "\n";
      return 1;
    }
    const auto split = DirectoryBytes(dir);
    const double ratio = static_cast<double>(Total(split)) / static_cast<double>(cap);
    if (ratio > worst) {
      worst = ratio;
      worst_at = i;
      worst_split = split;
    }
  }
  const double put_bytes = static_cast<double>(puts * (kChunkHeaderBytes + payload.size()));
  const double wchar = static_cast<double>(ProcIo("wchar") - wchar_before);
  const double storage = static_cast<double>(ProcIo("write_bytes") - storage_before);
  const auto final_split = DirectoryBytes(dir);
  auto describe = [](const std::map<std::string, uint64_t>& split) {
    std::string out;
    for (const auto& [kind, bytes] : split) out += absl::StrFormat(" %s %s", kind, FormatByteSize(bytes));
    return out;
  };
  std::cout << absl::StrFormat("cap %s, %d puts of %s (%.0fx the cap); the tier counts %s stored\n",
                               FormatByteSize(cap), puts, FormatByteSize(kChunkHeaderBytes + payload.size()),
                               static_cast<double>(puts * (kChunkHeaderBytes + payload.size())) / cap,
                               FormatByteSize((*tier)->used_bytes()));
  std::cout << absl::StrFormat("directory at its largest: %.2fx the cap (after put %d):%s\n", worst, worst_at,
                               describe(worst_split));
  std::cout << absl::StrFormat("directory at the end:     %.2fx the cap:%s\n",
                               static_cast<double>(Total(final_split)) / cap, describe(final_split));
  const DiskTierStats st = (*tier)->stats();
  std::cout << absl::StrFormat("value file %s in %d regions of %s; %d regions reused, %d chunks evicted\n",
                               FormatByteSize(st.value_file_bytes), st.regions, FormatByteSize(st.region_bytes),
                               st.regions_reused, st.chunks_evicted);
  std::cout << absl::StrFormat("write amplification: %.3f (write calls), %.3f (to storage); put %.0f MB/s\n",
                               wchar / put_bytes, storage / put_bytes,
                               put_bytes / 1e6 / std::chrono::duration<double>(in_put).count());
  return 0;
}

}  // namespace
}  // namespace lazykv::cache

int main(int argc, char** argv) { return lazykv::cache::Run(argc, argv); }
