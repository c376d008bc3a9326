// How far the disk tier's directory exceeds its byte cap (issue: the disk cap in bytes on
// disk). Puts `--multiple` times the cap of random chunks through a DiskTier and, after
// every put, measures the directory as `du -sb` would (every file's size: SST and blob
// files, WAL, MANIFEST, LOG), against the tier's own count of stored bytes.
//
//   disk_cap_bench [--cap BYTES] [--chunk BYTES] [--multiple N] [--dir DIR] [--compact-every N]
//
// Prints the largest and final ratio of the directory to the cap, and where the bytes were.
#include <filesystem>
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

// Bytes per kind of file under `dir` (what du counts, at byte granularity).
std::map<std::string, uint64_t> DirectoryBytes(const std::string& dir) {
  std::map<std::string, uint64_t> by_kind;
  std::error_code error;  // files come and go under RocksDB's background jobs
  for (const auto& entry : fs::recursive_directory_iterator(dir, error)) {
    if (!entry.is_regular_file(error)) continue;
    const uint64_t size = entry.file_size(error);
    if (error) continue;
    const std::string name = entry.path().filename().string();
    std::string kind = "other";
    if (name.ends_with(".blob")) kind = "blob";
    else if (name.ends_with(".sst")) kind = "sst";
    else if (name.ends_with(".log")) kind = "wal";
    else if (name.starts_with("LOG")) kind = "info-log";
    else if (name.starts_with("MANIFEST")) kind = "manifest";
    by_kind[kind] += size;
  }
  return by_kind;
}

uint64_t Total(const std::map<std::string, uint64_t>& by_kind) {
  uint64_t total = 0;
  for (const auto& [kind, bytes] : by_kind) total += bytes;
  return total;
}

int Run(int argc, char** argv) {
  uint64_t cap = 16 << 20, chunk_bytes = 1 << 20;
  int multiple = 10;
  std::string dir = (fs::temp_directory_path() / "lazykv_disk_cap_bench").string();
  FlagParser parser("usage: disk_cap_bench [--cap BYTES] [--chunk BYTES] [--multiple N] [--dir DIR]\n");
  parser.AddByteSize("--cap", &cap);
  parser.AddByteSize("--chunk", &chunk_bytes);
  parser.AddInt("--multiple", &multiple);
  parser.AddString("--dir", &dir);
  if (absl::Status s = parser.Parse(argc, argv); !s.ok()) return ExitForFlagError(s, "disk_cap_bench");
  fs::remove_all(dir);
  auto tier = DiskTier::Open(DiskTierOptions{.path = dir, .capacity_bytes = cap});
  if (!tier.ok()) {
    std::cerr << tier.status() << "\n";
    return 1;
  }
  std::mt19937_64 rng(1);
  const ChunkLayout layout{.num_layers = 2, .n_kv_heads = 1, .head_dim = 256, .num_tokens = 1, .anchor_tokens = 1,
                           .dtype = KvDtype::kBf16};
  ChunkLayout sized = layout;
  sized.num_tokens = static_cast<uint32_t>(std::max<uint64_t>(1, chunk_bytes / (2 * layout.num_layers * layout.row_bytes())));
  std::string payload(sized.payload_bytes(), '\0');
  const uint64_t puts = cap * multiple / (kChunkHeaderBytes + payload.size());
  double worst = 0;
  uint64_t worst_at = 0;
  std::map<std::string, uint64_t> worst_split;
  for (uint64_t i = 0; i < puts; ++i) {
    for (size_t b = 0; b < payload.size(); b += 8) {
      const uint64_t word = rng();
      std::memcpy(payload.data() + b, &word, std::min<size_t>(8, payload.size() - b));
    }
    const Hash128 key{rng(), rng()};
    const std::string header = EncodeChunkHeader(MakeChunkHeader(key, Hash128{1, 1}, sized, payload));
    auto put = (*tier)->Put(key, {header, payload}, header.size() + payload.size());
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
  return 0;
}

}  // namespace
}  // namespace lazykv::cache

int main(int argc, char** argv) { return lazykv::cache::Run(argc, argv); }
