// Tokenizer throughput: the llama2.c BPE (heap-driven merges) against SentencePiece's BPE
// on the same vocabulary (tok32000.bin and tok32000.model, the stories15M tokenizer) in the
// same run, on English-like text of growing size: MB/s should stay flat as the text grows
// (linear-ish), where run.c's scan per merge grew quadratically.
// Then the Hugging Face tokenizer.json byte-level BPE (Llama 3, ../shared/tokenizers/llama3)
// on the same English-like text and on the reference vectors' long documents (an English
// essay; all nine: prose, Markdown, C++, Python, HTML, JSON, a CSV log, several languages)
// repeated to --max-bytes. The target is >= 10 MB/s on one core for English.
// Last, a RAG request's document texts (8 of 100 documents of ~512 tokens, Zipf s = 1.1, as
// lazykv-bench's trace draws them) tokenized as a worker's handler does, with and without the
// DocumentTokenCache, alternated request by request (either first every other request): the time
// each request spends there.
// usage: tokenizer_bench [--models DIR] [--hf DIR|tokenizer.json] [--max-bytes N] [--seed S]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "bench/load_stats.h"
#include "common/flag_parser.h"
#include "common/zipf.h"
#include "nlohmann/json.hpp"
#include "worker/tokenizer/document_token_cache.h"
#include "worker/tokenizer/tokenizer.h"

namespace lazykv {
namespace {

std::string EnglishLikeText(size_t bytes, uint64_t seed) {
  static const std::vector<std::string> kWords = {
      "Once", "upon",   "a",        "time",    "there",        "was",        "little", "girl",  "named",
      "Lily", "She",    "loved",    "to",      "play",         "with",       "her",    "red",   "ball",
      "in",   "the",    "park",     "One",     "day",          "saw",        "big",    "dog",   "and",
      "said", "Hello",  "happy",    "friends", "together",     "because",    "wanted", "share", "toys",
      "mom",  "smiled", "everyone", "laughed", "\xe2\x80\x94", "caf\xc3\xa9"};
  std::mt19937_64 rng(seed);
  std::string text;
  while (text.size() < bytes) {
    text += kWords[rng() % kWords.size()];
    const int r = static_cast<int>(rng() % 20);
    text += r == 0 ? ". " : r == 1 ? ", " : r == 2 ? "\n" : " ";
  }
  text.resize(bytes);
  while (!text.empty() && (static_cast<uint8_t>(text.back()) & 0xC0) == 0x80) text.pop_back();  // whole code points
  return text;
}

// Best of `reps` timings of one Encode (seconds), and the token count.
std::pair<double, size_t> TimeEncode(const Tokenizer& tokenizer, const std::string& text, int reps) {
  double best = 1e30;
  size_t tokens = 0;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    tokens = tokenizer.Encode(text).size();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return {best, tokens};
}

// The text of the vectors named `names` (all long documents if empty), repeated to `bytes`.
std::string RepeatedDocuments(const std::string& vectors_path, const std::vector<std::string>& names, size_t bytes) {
  std::ifstream in(vectors_path);
  std::string docs;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const auto v = nlohmann::json::parse(line);
    const bool wanted =
        names.empty() ? v["category"] == "long_doc" : std::find(names.begin(), names.end(), v["name"]) != names.end();
    if (wanted) docs += v["text"].get<std::string>() + "\n\n";
  }
  std::string text;
  if (docs.empty()) return text;
  while (text.size() < bytes) text += docs;
  return text;
}

// Per request, its 8 documents' texts tokenized directly and through a DocumentTokenCache
// (64 MiB, from empty), alternated request by request.
void BenchDocumentTexts(const Tokenizer& tokenizer, uint64_t seed) {
  constexpr int kDocuments = 100, kPerRequest = 8, kRequests = 2000;
  std::vector<std::string> docs;
  size_t tokens = 0;
  for (int d = 0; d < kDocuments; ++d) {
    docs.push_back(EnglishLikeText(2300, seed * 1000 + d));
    tokens += tokenizer.Encode(docs.back()).size();
  }
  const ZipfSampler zipf(kDocuments, 1.1);
  uint64_t rng = seed;
  DocumentTokenCache cache(&tokenizer, 64 << 20);
  std::vector<double> direct_us, cached_us;
  size_t checksum = 0;
  for (int r = 0; r < kRequests; ++r) {
    std::vector<size_t> picked;
    while (static_cast<int>(picked.size()) < kPerRequest) {
      const size_t k = zipf.Sample(rng);
      if (std::find(picked.begin(), picked.end(), k) == picked.end()) picked.push_back(k);
    }
    auto time_direct = [&] {
      const auto start = std::chrono::steady_clock::now();
      for (size_t k : picked) checksum += tokenizer.Encode(docs[k]).size();
      direct_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
    };
    auto time_cached = [&] {
      const auto start = std::chrono::steady_clock::now();
      for (size_t k : picked) checksum -= cache.Encode(docs[k]).size();
      cached_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
    };
    // Either goes first every other request: the second finds the texts in the CPU's caches.
    if (r % 2 == 0) {
      time_direct();
      time_cached();
    } else {
      time_cached();
      time_direct();
    }
  }
  const DocumentTokenCache::Stats st = cache.stats();
  const Distribution direct = Summarize(direct_us), cached = Summarize(cached_us);
  std::printf(
      "\na RAG request's document texts (%d of %d documents, %.0f tokens each on average, Zipf 1.1, %d "
      "requests):\n",
      kPerRequest, kDocuments, static_cast<double>(tokens) / kDocuments, kRequests);
  std::printf("  tokenized each time: mean %.1f us, p50 %.1f, p90 %.1f a request\n", direct.mean, direct.p50,
              direct.p90);
  std::printf(
      "  DocumentTokenCache:  mean %.1f us, p50 %.1f, p90 %.1f a request (%.1f%% of texts from the cache; "
      "%zu entries, %.2f MB)\n",
      cached.mean, cached.p50, cached.p90, 100.0 * st.hits / (st.hits + st.misses), st.entries, st.bytes / 1e6);
  std::printf("  mean ratio %.1fx%s\n", direct.mean / cached.mean, checksum == 0 ? "" : " (TOKEN COUNTS DIFFER)");
}

void BenchHf(const std::string& path, uint64_t max_bytes, uint64_t seed) {
  const auto load_start = std::chrono::steady_clock::now();
  auto hf = LoadTokenizer(path);
  if (!hf.ok()) {
    std::printf("\nHugging Face tokenizer.json: skipped (%s)\n", hf.status().ToString().c_str());
    return;
  }
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  std::printf("\nHugging Face tokenizer.json byte-level BPE: %s (%d ids, loaded in %.2f s)\n", path.c_str(),
              (*hf)->vocab_size(), load_s);
  std::printf("%-22s %10s %10s %10s %10s\n", "text", "bytes", "tokens", "MB/s", "ms");
  auto row = [&](const std::string& name, const std::string& text) {
    if (text.empty()) return;
    const auto [s, tokens] = TimeEncode(**hf, text, text.size() <= (256u << 10) ? 5 : 3);
    std::printf("%-22s %9zuK %10zu %10.2f %10.1f\n", name.c_str(), text.size() >> 10, tokens, text.size() / 1e6 / s,
                s * 1e3);
  };
  for (size_t bytes = 16 << 10; bytes <= max_bytes; bytes *= 4) row("english-like words", EnglishLikeText(bytes, seed));
  const std::string dir = path.ends_with(".json") ? path.substr(0, path.rfind('/')) : path;
  row("essay (doc_essay_en)", RepeatedDocuments(dir + "/vectors.jsonl", {"doc_essay_en"}, max_bytes));
  row("all 9 long documents", RepeatedDocuments(dir + "/vectors.jsonl", {}, max_bytes));
  std::printf("(MB/s best of several runs, one thread)\n");
  BenchDocumentTexts(**hf, seed);
}

int Main(int argc, char** argv) {
  std::string models = LAZYKV_DEFAULT_MODELS_DIR;
  std::string hf_path;  // default: beside --models
  uint64_t max_bytes = 4 << 20, seed = 1;
  FlagParser parser("usage: tokenizer_bench [--models DIR] [--hf DIR|tokenizer.json] [--max-bytes N] [--seed S]\n");
  parser.AddString("--models", &models);
  parser.AddString("--hf", &hf_path);
  parser.AddByteSize("--max-bytes", &max_bytes);
  parser.AddUint64("--seed", &seed);
  if (absl::Status s = parser.Parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return absl::IsCancelled(s) ? 0 : 2;
  }
  if (hf_path.empty()) hf_path = (std::filesystem::path(models) / "../tokenizers/llama3").lexically_normal().string();
  auto bpe = LoadTokenizer(models + "/tok32000.bin");
  auto sp = LoadTokenizer(models + "/tok32000.model");
  if (!bpe.ok() || !sp.ok()) {
    std::fprintf(stderr, "cannot load the tokenizers: %s %s\n", bpe.status().ToString().c_str(),
                 sp.status().ToString().c_str());
    BenchHf(hf_path, max_bytes, seed);
    return 1;
  }
  std::printf("%10s %10s %14s %14s %12s %14s\n", "text", "tokens", "llama2c MB/s", "sentencepiece", "ratio",
              "llama2c ms");
  for (size_t bytes = 16 << 10; bytes <= max_bytes; bytes *= 4) {
    const std::string text = EnglishLikeText(bytes, seed);
    const int reps = bytes <= (256u << 10) ? 5 : 2;
    const auto [bpe_s, bpe_tokens] = TimeEncode(**bpe, text, reps);
    const auto [sp_s, sp_tokens] = TimeEncode(**sp, text, reps);
    const double mb = text.size() / 1e6;
    std::printf("%9zuK %10zu %14.2f %14.2f %11.2fx %14.1f\n", text.size() >> 10, bpe_tokens, mb / bpe_s, mb / sp_s,
                sp_s / bpe_s, bpe_s * 1e3);
    (void)sp_tokens;
  }
  std::printf("(MB/s best of several runs; ratio: SentencePiece's time over llama2c's, same text)\n");
  BenchHf(hf_path, max_bytes, seed);
  return 0;
}

}  // namespace
}  // namespace lazykv

int main(int argc, char** argv) { return lazykv::Main(argc, argv); }
