// DocumentTokenCache: every answer is the tokenizer's own (a counting tokenizer written here,
// and the Llama 3 tokenizer on random English-like texts); a text seen again is not tokenized
// again; the least recently used entry goes first and the bytes held stay within the budget; a
// text too large for an eighth of it is never kept; texts whose keys collide still get their
// own tokens; and threads sharing the cache all get exact answers.
#include "worker/tokenizer/document_token_cache.h"

#include <atomic>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace lazykv {
namespace {

using testing::FreshSeed;

// Each byte a token (its value plus the text's length, so that equal prefixes of different
// texts differ), and a count of Encode calls.
class CountingTokenizer : public Tokenizer {
 public:
  std::vector<int32_t> Encode(std::string_view text) const override {
    calls.fetch_add(1);
    std::vector<int32_t> ids;
    for (unsigned char c : text) ids.push_back(static_cast<int32_t>(c) + static_cast<int32_t>(text.size()));
    return ids;
  }
  std::string Decode(std::span<const int32_t>) const override { return ""; }
  int vocab_size() const override { return 1 << 20; }
  mutable std::atomic<int> calls{0};
};

std::string RandomText(std::mt19937_64& rng, size_t bytes) {
  static const char* kWords[] = {"the", "llama", "crossed", "Andes", "at", "dawn", "and", "river", "caf\xc3\xa9", "."};
  std::string text;
  while (text.size() < bytes) {
    text += kWords[rng() % 10];
    text += rng() % 7 == 0 ? "\n" : " ";
  }
  return text;
}

TEST(DocumentTokenCacheTest, ASecondEncodeOfATextIsServedFromTheCache) {
  CountingTokenizer tokenizer;
  int hits = 0, misses = 0;
  DocumentTokenCache cache(&tokenizer, 1 << 20, [&](bool hit) { ++(hit ? hits : misses); });
  const std::string a = "a document about llamas", b = "another document";
  EXPECT_EQ(cache.Encode(a), tokenizer.Encode(a));
  EXPECT_EQ(tokenizer.calls, 2);  // the cache's and the test's own
  EXPECT_EQ(cache.Encode(a), tokenizer.Encode(a));
  EXPECT_EQ(tokenizer.calls, 3) << "the second Encode came from the cache";
  EXPECT_EQ(cache.Encode(b), tokenizer.Encode(b));
  EXPECT_EQ(tokenizer.calls, 5);
  EXPECT_EQ(hits, 1);
  EXPECT_EQ(misses, 2);
  const DocumentTokenCache::Stats s = cache.stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 2u);
  EXPECT_EQ(s.entries, 2u);
  EXPECT_EQ(s.bytes,
            DocumentTokenCache::EntryBytes(a.size(), a.size()) + DocumentTokenCache::EntryBytes(b.size(), b.size()));
}

TEST(DocumentTokenCacheTest, TheLeastRecentlyUsedGoesFirstAndTheBytesStayWithinTheBudget) {
  CountingTokenizer tokenizer;
  const size_t entry = DocumentTokenCache::EntryBytes(100, 100);
  DocumentTokenCache cache(&tokenizer, 8 * entry + entry / 2);  // room for 8 texts of 100 bytes
  std::vector<std::string> texts;
  for (int i = 0; i < 9; ++i) texts.push_back(std::string(99, static_cast<char>('a' + i)) + "!");
  for (int i = 0; i < 8; ++i) cache.Encode(texts[i]);
  cache.Encode(texts[0]);  // now the most recent: texts[1] is the least
  cache.Encode(texts[8]);  // evicts texts[1]
  EXPECT_EQ(cache.stats().evictions, 1u);
  EXPECT_LE(cache.stats().bytes, 8 * entry + entry / 2);
  EXPECT_EQ(cache.stats().entries, 8u);
  const int before = tokenizer.calls;
  cache.Encode(texts[0]);
  cache.Encode(texts[2]);
  EXPECT_EQ(tokenizer.calls, before) << "kept: texts 0 and 2";
  cache.Encode(texts[1]);
  EXPECT_EQ(tokenizer.calls, before + 1) << "texts[1] was evicted";
}

TEST(DocumentTokenCacheTest, ATextOverAnEighthOfTheBudgetIsNotKept) {
  CountingTokenizer tokenizer;
  DocumentTokenCache cache(&tokenizer, 8000);
  const std::string big(1000, 'x');  // 1000 + 4000 + overhead bytes > 1000
  EXPECT_EQ(cache.Encode(big), tokenizer.Encode(big));
  EXPECT_EQ(cache.Encode(big).size(), 1000u);
  EXPECT_EQ(tokenizer.calls, 3) << "encoded each time";
  EXPECT_EQ(cache.stats().entries, 0u);
  EXPECT_EQ(cache.stats().bytes, 0u);
}

TEST(DocumentTokenCacheTest, TextsWhoseKeysCollideGetTheirOwnTokens) {
  CountingTokenizer tokenizer;
  DocumentTokenCache cache(&tokenizer, 1 << 20, {}, [](std::string_view) { return absl::uint128(7); });
  std::mt19937_64 rng(FreshSeed());
  std::vector<std::string> texts;
  for (int i = 0; i < 6; ++i) texts.push_back(RandomText(rng, 50 + i * 17));
  for (int round = 0; round < 3; ++round) {
    for (const std::string& t : texts) EXPECT_EQ(cache.Encode(t), tokenizer.Encode(t));
  }
  EXPECT_EQ(cache.stats().hits, 0u) << "each text displaced the last: no entry matched another text";
  EXPECT_EQ(cache.stats().entries, 1u);
  EXPECT_EQ(cache.Encode(texts.back()), tokenizer.Encode(texts.back()));
  EXPECT_EQ(cache.stats().hits, 1u) << "the entry's own text";
}

TEST(DocumentTokenCacheTest, ThreadsSharingTheCacheGetExactAnswers) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  CountingTokenizer tokenizer;
  std::mt19937_64 rng(seed);
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> want;
  for (int i = 0; i < 24; ++i) {
    texts.push_back(RandomText(rng, 40 + rng() % 400));
    want.push_back(tokenizer.Encode(texts.back()));
  }
  // Room for about half of them: hits, misses and evictions race.
  DocumentTokenCache cache(&tokenizer, 12 * DocumentTokenCache::EntryBytes(240, 240));
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 local(seed + t);
      for (int i = 0; i < 2000; ++i) {
        const size_t k = local() % texts.size();
        if (cache.Encode(texts[k]) != want[k]) wrong.fetch_add(1);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  const DocumentTokenCache::Stats s = cache.stats();
  EXPECT_EQ(s.hits + s.misses, 8000u);
  EXPECT_GT(s.hits, 0u);
  EXPECT_GT(s.evictions, 0u);
  EXPECT_LE(s.bytes, 12 * DocumentTokenCache::EntryBytes(240, 240));
}

TEST(DocumentTokenCacheTest, Llama3TokensFromTheCacheAreTheTokenizers) {
  const Tokenizer* llama3 = testing::Llama3Tokenizer();
  if (llama3 == nullptr) GTEST_SKIP() << "no ../shared/tokenizers/llama3";
  DocumentTokenCache cache(llama3, 16 << 20);
  std::mt19937_64 rng(FreshSeed());
  for (int i = 0; i < 20; ++i) {
    const std::string text = RandomText(rng, 200 + rng() % 3000);
    const std::vector<int32_t> want = llama3->Encode(text);
    EXPECT_EQ(cache.Encode(text), want);
    EXPECT_EQ(cache.Encode(text), want) << "from the cache";
  }
  EXPECT_EQ(cache.stats().hits, 20u);
}

}  // namespace
}  // namespace lazykv
