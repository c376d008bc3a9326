// The Hugging Face tokenizer.json byte-level BPE tokenizer against the Llama 3 reference
// vectors (../shared/tokenizers/llama3, made by transformers.js and cross-checked with
// Hugging Face's Rust tokenizers; see PROVENANCE.txt there): every text's ids, with and
// without BOS, and every decode. Then random text round trips, the merge and added-token
// rules on a small hand-made vocabulary, and refusals of tokenizer.json files it does not
// implement.
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"
#include "worker/tokenizer/tokenizer.h"

namespace lazykv::testing {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int32_t kBos = 128000;  // <|begin_of_text|>: what the engine prepends (config.json's bos_token_id)

// The WHATWG / "maximal subpart" lossy UTF-8 decoding the reference applies (TextDecoder,
// Rust's from_utf8_lossy): each maximal prefix of a well-formed sequence that cannot be
// completed becomes one U+FFFD.
std::string Lossy(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<uint8_t>(s[i]);
    size_t need = 0;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b < 0x80) {
      out.push_back(s[i++]);
      continue;
    }
    if (b >= 0xC2 && b <= 0xDF) need = 2;
    if (b >= 0xE0 && b <= 0xEF) need = 3, lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
    if (b >= 0xF0 && b <= 0xF4) need = 4, lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
    size_t k = 1;
    while (need > 0 && k < need && i + k < s.size()) {
      const auto c = static_cast<uint8_t>(s[i + k]);
      if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) break;
      ++k;
    }
    if (need > 0 && k == need) {
      out.append(s.substr(i, k));
    } else {
      out += "\xEF\xBF\xBD";
    }
    i += k;
  }
  return out;
}

class Llama3Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = Llama3TokenizerDir();
    tokenizer_ = Llama3Tokenizer();
  }
  void SetUp() override {
    if (dir_.empty()) GTEST_SKIP() << "no ../shared/tokenizers/llama3";
    ASSERT_NE(tokenizer_, nullptr) << "tokenizer.json did not load";
  }

  static std::string dir_;
  static const Tokenizer* tokenizer_;
};
std::string Llama3Test::dir_;
const Tokenizer* Llama3Test::tokenizer_ = nullptr;

std::vector<int32_t> Ids(const json& j) { return j.get<std::vector<int32_t>>(); }

TEST_F(Llama3Test, MatchesEveryReferenceVector) {
  const Tokenizer& tok = *tokenizer_;
  EXPECT_EQ(tok.vocab_size(), 128256);
  EXPECT_EQ(tok.Encode("<|begin_of_text|>"), std::vector<int32_t>{kBos});
  const auto vectors = ReadJsonLines(dir_ + "/vectors.jsonl");
  ASSERT_EQ(vectors.size(), 225u);
  int equal = 0;
  for (const json& v : vectors) {
    SCOPED_TRACE(v["name"].get<std::string>());
    const std::string text = v["text"];
    const auto ids = tok.Encode(text);
    EXPECT_EQ(ids, Ids(v["ids"]));
    std::vector<int32_t> with_bos = {kBos};
    with_bos.insert(with_bos.end(), ids.begin(), ids.end());
    EXPECT_EQ(with_bos, Ids(v["ids_with_bos"]));
    EXPECT_EQ(tok.Decode(Ids(v["ids"])), v["decoded"].get<std::string>());
    EXPECT_EQ(tok.Decode(Ids(v["ids_with_bos"])), v["decoded_with_bos"].get<std::string>());
    EXPECT_EQ(tok.Decode(ids), text);
    equal += ids == Ids(v["ids"]) && tok.Decode(Ids(v["ids"])) == v["decoded"].get<std::string>();
  }
  EXPECT_EQ(equal, 225);
}

// The same file with ignore_merges off: plain merges, which the reference recorded where
// they differ (" việc" -> 3 tokens instead of 1); everywhere else the ids are unchanged.
TEST_F(Llama3Test, MergesAloneMatchTheReferenceWithoutIgnoreMerges) {
  std::ifstream in(dir_ + "/tokenizer.json");
  json file = json::parse(in);
  ASSERT_TRUE(file["model"]["ignore_merges"].get<bool>());
  file["model"]["ignore_merges"] = false;
  const fs::path path = fs::temp_directory_path() / ("hf_no_ignore_merges_" + std::to_string(FreshSeed()) + ".json");
  std::ofstream(path) << file.dump();
  auto plain = LoadTokenizer(path.string());
  fs::remove(path);
  ASSERT_TRUE(plain.ok()) << plain.status();
  int differing = 0;
  for (const json& v : ReadJsonLines(dir_ + "/vectors.jsonl")) {
    SCOPED_TRACE(v["name"].get<std::string>());
    const json& expected = v.contains("ids_without_ignore_merges") ? v["ids_without_ignore_merges"] : v["ids"];
    differing += v.contains("ids_without_ignore_merges");
    EXPECT_EQ((*plain)->Encode(v["text"].get<std::string>()), Ids(expected));
  }
  EXPECT_EQ(differing, 8);
}

TEST_F(Llama3Test, MatchesTheChatVectors) {
  const auto chats = ReadJsonLines(dir_ + "/chat_vectors.jsonl");
  ASSERT_EQ(chats.size(), 12u);
  for (const json& c : chats) {
    SCOPED_TRACE(c["name"].get<std::string>());
    EXPECT_EQ(tokenizer_->Encode(c["rendered"].get<std::string>()), Ids(c["ids"]));
    EXPECT_EQ(tokenizer_->Decode(Ids(c["ids"])), c["decoded"].get<std::string>());
  }
}

// Decode gives the tokens' raw bytes; decoded lossily (as the reference's decode does) they
// equal the reference for partial characters, special tokens and malformed streams.
TEST_F(Llama3Test, DecodesPartialCharactersAsTheReferenceDoes) {
  const auto lines = ReadJsonLines(dir_ + "/stream_vectors.jsonl");
  ASSERT_EQ(lines.size(), 169u);
  for (const json& s : lines) {
    const std::string kind = s["kind"];
    if (kind == "single_token") {
      SCOPED_TRACE(s["id"].get<int>());
      const std::vector<int32_t> id = {s["id"].get<int32_t>()};
      EXPECT_EQ(Lossy(tokenizer_->Decode(id)), s["decoded_lossy"].get<std::string>());
      std::string hex;
      for (char c : tokenizer_->Decode(id)) {
        char buf[4];
        std::snprintf(buf, sizeof(buf), hex.empty() ? "%02x" : " %02x", static_cast<uint8_t>(c));
        hex += buf;
      }
      EXPECT_EQ(hex, s["bytes_hex"].get<std::string>());
    } else if (kind == "sequence") {
      SCOPED_TRACE(s["name"].get<std::string>());
      const auto ids = Ids(s["ids"]);
      EXPECT_EQ(tokenizer_->Encode(s["text"].get<std::string>()), ids);
      EXPECT_EQ(tokenizer_->Decode(ids), s["text"].get<std::string>());
      for (size_t i = 0; i < ids.size(); ++i) {
        EXPECT_EQ(Lossy(tokenizer_->Decode(std::span(ids).first(i + 1))),
                  s["prefix_decodes_lossy"][i].get<std::string>());
        // Byte-level decoding is concatenation: a token's continuation is its own bytes.
        EXPECT_EQ(DecodeContinuation(*tokenizer_, std::span(ids).first(i), std::span(ids).subspan(i, 1)),
                  tokenizer_->Decode(std::span(ids).subspan(i, 1)));
      }
    } else {
      SCOPED_TRACE(s["name"].get<std::string>());
      EXPECT_EQ(Lossy(tokenizer_->Decode(Ids(s["ids"]))), s["full_decode_lossy"].get<std::string>());
    }
  }
}

void AppendUtf8(char32_t c, std::string& out) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

// Random text from many kinds of characters, some runs of one kind (long words, long
// whitespace), and pieces of special-token syntax.
std::string RandomText(std::mt19937_64& rng, size_t chars) {
  struct Range {
    char32_t lo, hi;
  };
  static const std::vector<Range> kRanges = {
      {'a', 'z'},         {'A', 'Z'},          {'0', '9'},         {' ', ' '},         {'!', '/'},
      {':', '@'},         {'\t', '\r'},        {0x00, 0x1F},       {0x7F, 0x7F},       {0x80, 0x9F},
      {0xA0, 0xFF},       {0x100, 0x17F},      {0x300, 0x36F},     {0x370, 0x3FF},     {0x400, 0x4FF},
      {0x5D0, 0x5EA},     {0x600, 0x6FF},      {0x900, 0x97F},     {0xE00, 0xE7F},     {0x1100, 0x11FF},
      {0x180E, 0x180E},   {0x2000, 0x200F},    {0x2028, 0x202F},   {0x205F, 0x206F},   {0x3000, 0x303F},
      {0x3040, 0x30FF},   {0x4E00, 0x9FFF},    {0xAC00, 0xD7A3},   {0xFE00, 0xFE0F},   {0xFEFF, 0xFEFF},
      {0xFFF0, 0xFFFD},   {0x1F300, 0x1F6FF},  {0x1F900, 0x1F9FF}, {0x1F1E6, 0x1F1FF}, {0x20000, 0x2A6DF},
      {0xE0000, 0xE007F}, {0x10FFF0, 0x10FFFF}};
  static const std::vector<std::string> kSnippets = {
      "<|",           "|>",      "<|eot_id|>", "<|begin_of_text|>",         "'s", "'LL", "\r\n", "\n\n\n", "    ",
      "\xE2\x80\x8D", "1234567", "...",        "<|reserved_special_token_9"};
  std::string out;
  while (out.size() < chars) {
    const auto pick = rng() % 8;
    if (pick == 0) {
      out += kSnippets[rng() % kSnippets.size()];
      continue;
    }
    const Range r = kRanges[rng() % kRanges.size()];
    const int run = pick == 1 ? static_cast<int>(rng() % 40) + 1 : 1;
    for (int i = 0; i < run; ++i) {
      char32_t c = r.lo + static_cast<char32_t>(rng() % (r.hi - r.lo + 1));
      if (c >= 0xD800 && c <= 0xDFFF) c = 'x';
      AppendUtf8(c, out);
    }
  }
  return out;
}

TEST_F(Llama3Test, RandomTextRoundTrips) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 300; ++round) {
    const std::string text = RandomText(rng, 1 + rng() % 400);
    const auto ids = tokenizer_->Encode(text);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tokenizer_->vocab_size()) << id;
    ASSERT_EQ(tokenizer_->Decode(ids), text) << "round " << round;
  }
  // Bytes that are not UTF-8 at all still round-trip (each stray byte a word of its own).
  for (int round = 0; round < 100; ++round) {
    std::string bytes(rng() % 64, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    ASSERT_EQ(tokenizer_->Decode(tokenizer_->Encode(bytes)), bytes);
  }
  EXPECT_TRUE(tokenizer_->Encode("").empty());
  EXPECT_EQ(tokenizer_->Decode(std::vector<int32_t>{-1, 128256, 1 << 30}), "");
}

TEST_F(Llama3Test, LongRunsStayLinearAndRoundTrip) {
  for (const std::string& unit : {std::string(" "), std::string("\n"), std::string(" \n"), std::string("\xE4\xB8\xAD"),
                                  std::string("="), std::string("7"), std::string("a")}) {
    std::string text;
    while (text.size() < 300000) text += unit;
    const auto ids = tokenizer_->Encode(text);
    EXPECT_EQ(tokenizer_->Decode(ids), text);
  }
}

TEST_F(Llama3Test, ConcurrentEncodesAgree) {
  const auto vectors = ReadJsonLines(dir_ + "/vectors.jsonl");
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int rep = 0; rep < 3; ++rep) {
        for (const json& v : vectors) mismatches += tokenizer_->Encode(v["text"].get<std::string>()) != Ids(v["ids"]);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST_F(Llama3Test, LoadsFromAModelDirectory) {
  auto from_dir = LoadTokenizer(dir_);
  ASSERT_TRUE(from_dir.ok()) << from_dir.status();
  EXPECT_EQ((*from_dir)->Encode("Hello world"), (std::vector<int32_t>{9906, 1917}));
  auto hf = LoadHfTokenizer(dir_);
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ((*hf)->vocab_size(), 128256);
}

// ---- A small hand-made byte-level vocabulary: the rules, and what is refused.

// GPT-2's bytes_to_unicode, written independently of the code under test.
std::string Spell(uint8_t b) {
  const bool self = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
  char32_t c = b;
  if (!self) {
    int n = 0;
    for (int x = 0; x < b; ++x) n += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174);
    c = 256 + n;
  }
  std::string out;
  AppendUtf8(c, out);
  return out;
}

const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

json SmallTokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[Spell(static_cast<uint8_t>(b))] = b;
  vocab["aa"] = 256;
  vocab[Spell(' ') + "t"] = 257;
  vocab[Spell(' ') + "th"] = 258;
  vocab["ab"] = 259;
  vocab["abab"] = 260;
  vocab["aab"] = 261;
  json merges = json::array({"a a", Spell(' ') + " t", Spell(' ') + "t h", "a b", "ab ab", "a ab"});
  return json{{"version", "1.0"},
              {"truncation", nullptr},
              {"padding", nullptr},
              {"added_tokens", json::array({json{{"id", 300},
                                                 {"content", "<a>"},
                                                 {"special", true},
                                                 {"lstrip", false},
                                                 {"rstrip", false},
                                                 {"single_word", false},
                                                 {"normalized", false}},
                                            json{{"id", 301},
                                                 {"content", "<ab>"},
                                                 {"special", true},
                                                 {"lstrip", false},
                                                 {"rstrip", false},
                                                 {"single_word", false},
                                                 {"normalized", false}}})},
              {"normalizer", nullptr},
              {"pre_tokenizer", json{{"type", "Sequence"},
                                     {"pretokenizers", json::array({json{{"type", "Split"},
                                                                         {"pattern", json{{"Regex", kLlama3Regex}}},
                                                                         {"behavior", "Isolated"},
                                                                         {"invert", false}},
                                                                    json{{"type", "ByteLevel"},
                                                                         {"add_prefix_space", false},
                                                                         {"trim_offsets", true},
                                                                         {"use_regex", false}}})}}},
              {"post_processor", json{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}}},
              {"decoder", json{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}}},
              {"model", json{{"type", "BPE"},
                             {"dropout", nullptr},
                             {"unk_token", nullptr},
                             {"continuing_subword_prefix", nullptr},
                             {"end_of_word_suffix", nullptr},
                             {"fuse_unk", false},
                             {"byte_fallback", false},
                             {"ignore_merges", false},
                             {"vocab", vocab},
                             {"merges", merges}}}};
}

class SmallTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("hf_tok_" + std::to_string(FreshSeed()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& text, const std::string& name = "tokenizer.json") {
    const fs::path path = dir_ / name;
    std::ofstream(path, std::ios::binary) << text;
    return path.string();
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const json& file) { return LoadTokenizer(Write(file.dump())); }

  fs::path dir_;
};

TEST_F(SmallTokenizerTest, MergesByRankLeftmostFirst) {
  auto tok = Load(SmallTokenizer());
  ASSERT_TRUE(tok.ok()) << tok.status();
  const Tokenizer& t = **tok;
  EXPECT_EQ(t.vocab_size(), 302);
  EXPECT_EQ(t.Encode("aaa"), (std::vector<int32_t>{256, 'a'}));  // (a,a) at 0 before (a,a) at 1
  EXPECT_EQ(t.Encode("aab"), (std::vector<int32_t>{256, 'b'}));  // rank 0 (a,a) beats rank 3 (a,b)
  EXPECT_EQ(t.Encode("abab"), (std::vector<int32_t>{260}));      // a b, a b, then ab ab
  EXPECT_EQ(t.Encode("x th"), (std::vector<int32_t>{'x', 258}));
  // 40 and 200 'a's: the heap path for long words gives the short path's answer.
  EXPECT_EQ(t.Encode(std::string(40, 'a')), std::vector<int32_t>(20, 256));
  EXPECT_EQ(t.Encode(std::string(201, 'a')), [] {
    std::vector<int32_t> ids(100, 256);
    ids.push_back('a');
    return ids;
  }());
  // Bytes outside the printable range map through the byte alphabet.
  EXPECT_EQ(t.Encode(std::string("\0\xff", 2)), (std::vector<int32_t>{0, 255}));
  EXPECT_EQ(t.Decode(std::vector<int32_t>{258, 0, 255, 280}), std::string(" th\0\xff", 5));  // 280: no token
}

// Words of a's and b's (one pre-token each), short and long (the two merge paths), against
// BPE written plainly: merge the lowest-ranked adjacent pair, the leftmost of equals, repeat.
TEST_F(SmallTokenizerTest, RandomWordsMergeAsThePlainAlgorithm) {
  const json file = SmallTokenizer();
  auto tok = Load(file);
  ASSERT_TRUE(tok.ok()) << tok.status();
  std::vector<std::pair<std::string, std::string>> merges;
  for (const json& m : file["model"]["merges"]) {
    const std::string s = m;
    merges.emplace_back(s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1));
  }
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 500; ++round) {
    std::string word(1 + rng() % 150, 'a');
    for (char& c : word) c = rng() % 3 == 0 ? 'b' : 'a';
    std::vector<std::string> symbols;
    for (char c : word) symbols.emplace_back(1, c);
    for (;;) {
      size_t best_rank = merges.size(), best = 0;
      for (size_t i = 0; i + 1 < symbols.size(); ++i) {
        for (size_t r = 0; r < best_rank; ++r) {
          if (merges[r].first == symbols[i] && merges[r].second == symbols[i + 1]) {
            best_rank = r;
            best = i;
            break;
          }
        }
      }
      if (best_rank == merges.size()) break;
      symbols[best] += symbols[best + 1];
      symbols.erase(symbols.begin() + best + 1);
    }
    std::vector<int32_t> expected;
    for (const std::string& s : symbols) expected.push_back(file["model"]["vocab"][s].get<int32_t>());
    ASSERT_EQ((*tok)->Encode(word), expected) << word;
  }
}

TEST_F(SmallTokenizerTest, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
  json file = SmallTokenizer();
  EXPECT_EQ((*Load(file))->Encode("aab"), (std::vector<int32_t>{256, 'b'}));
  file["model"]["ignore_merges"] = true;
  EXPECT_EQ((*Load(file))->Encode("aab"), (std::vector<int32_t>{261}));
}

TEST_F(SmallTokenizerTest, AddedTokensMatchLeftmostLongestInRawText) {
  auto tok = Load(SmallTokenizer());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->Encode("x<ab>y<a>"), (std::vector<int32_t>{'x', 301, 'y', 300}));
  EXPECT_EQ((*tok)->Encode("<a<a>>"), (std::vector<int32_t>{'<', 'a', 300, '>'}));
  EXPECT_EQ((*tok)->Decode(std::vector<int32_t>{'x', 301, 300}), "x<ab><a>");
}

TEST_F(SmallTokenizerTest, Gpt2StyleByteLevelPreTokenizerSplitsWithItsOwnRegex) {
  json file = SmallTokenizer();
  file["pre_tokenizer"] = json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  // The first merge joins a word to the space after it, which the regex never lets happen.
  std::string a_space = "a";
  a_space += Spell(' ');
  file["model"]["merges"].insert(file["model"]["merges"].begin(), "a " + a_space.substr(1));
  file["model"]["vocab"][a_space] = 262;
  auto tok = Load(file);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->Encode("a th"), (std::vector<int32_t>{'a', 258}));
  file["pre_tokenizer"]["use_regex"] = false;  // no split at all: one word
  EXPECT_EQ((*Load(file))->Encode("a th"), (std::vector<int32_t>{262, 't', 'h'}));
}

TEST_F(SmallTokenizerTest, LoadTokenizerFindsTokenizerJsonInADirectory) {
  Write(SmallTokenizer().dump());
  auto tok = LoadTokenizer(dir_.string());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 302);
  fs::remove(dir_ / "tokenizer.json");
  EXPECT_EQ(LoadTokenizer(dir_.string()).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SmallTokenizerTest, RefusesWhatItDoesNotImplement) {
  struct Case {
    std::string what;
    std::function<void(json&)> edit;
    std::string field;  // the error names it
  };
  const std::vector<Case> cases = {
      {"WordPiece model", [](json& f) { f["model"]["type"] = "WordPiece"; }, "model.type"},
      {"no model type", [](json& f) { f["model"].erase("type"); }, "model.type"},
      {"NFC normalizer",
       [](json& f) {
         f["normalizer"] = json{{"type", "NFC"}};
       },
       "normalizer.type"},
      {"Metaspace pre-tokenizer",
       [](json& f) {
         f["pre_tokenizer"] = json{{"type", "Metaspace"}};
       },
       "pre_tokenizer.type"},
      {"no pre-tokenizer", [](json& f) { f["pre_tokenizer"] = nullptr; }, "pre_tokenizer"},
      {"Split behavior Removed", [](json& f) { f["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; },
       "pre_tokenizer.pretokenizers[0].behavior"},
      {"inverted Split", [](json& f) { f["pre_tokenizer"]["pretokenizers"][0]["invert"] = true; },
       "pre_tokenizer.pretokenizers[0].invert"},
      {"String pattern",
       [](json& f) {
         f["pre_tokenizer"]["pretokenizers"][0]["pattern"] = json{{"String", " "}};
       },
       "pre_tokenizer.pretokenizers[0].pattern"},
      {"bad regex", [](json& f) { f["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(a"; },
       "pre_tokenizer.pretokenizers[0].pattern.Regex"},
      {"prefix space", [](json& f) { f["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true; },
       "pre_tokenizer.pretokenizers[1].add_prefix_space"},
      {"no ByteLevel step", [](json& f) { f["pre_tokenizer"]["pretokenizers"].erase(1); }, "pre_tokenizer"},
      {"Metaspace decoder",
       [](json& f) {
         f["decoder"] = json{{"type", "Metaspace"}};
       },
       "decoder.type"},
      {"dropout", [](json& f) { f["model"]["dropout"] = 0.1; }, "model.dropout"},
      {"subword prefix", [](json& f) { f["model"]["continuing_subword_prefix"] = "##"; },
       "model.continuing_subword_prefix"},
      {"missing byte", [](json& f) { f["model"]["vocab"].erase(Spell(0x41)); }, "model.vocab"},
      {"duplicate id", [](json& f) { f["model"]["vocab"]["zz"] = 5; }, "model.vocab"},
      {"negative id", [](json& f) { f["model"]["vocab"]["zz"] = -1; }, "model.vocab"},
      {"merge of unknown token", [](json& f) { f["model"]["merges"].push_back("q zz"); }, "model.merges[6]"},
      {"merge result not in vocab", [](json& f) { f["model"]["merges"].push_back("b b"); }, "model.merges[6]"},
      {"malformed merge", [](json& f) { f["model"]["merges"].push_back("a b c"); }, "model.merges[6]"},
      {"merges not an array", [](json& f) { f["model"]["merges"] = 3; }, "model.merges"},
      {"lstrip", [](json& f) { f["added_tokens"][1]["lstrip"] = true; }, "added_tokens[1].lstrip"},
      {"single_word", [](json& f) { f["added_tokens"][0]["single_word"] = true; }, "added_tokens[0].single_word"},
      {"empty added token", [](json& f) { f["added_tokens"][0]["content"] = ""; }, "added_tokens[0].content"},
      {"added token id", [](json& f) { f["added_tokens"][0]["id"] = "x"; }, "added_tokens[0].id"},
      {"vocab of the wrong type", [](json& f) { f["model"]["vocab"] = json::array(); }, "model.vocab"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    json file = SmallTokenizer();
    c.edit(file);
    auto tok = Load(file);
    ASSERT_FALSE(tok.ok());
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument) << tok.status();
    EXPECT_NE(tok.status().message().find(": " + c.field + ":"), std::string::npos) << tok.status();
    EXPECT_NE(tok.status().message().find("tokenizer.json"), std::string::npos) << tok.status();
  }
  const std::string good = SmallTokenizer().dump();
  for (const std::string& text :
       {std::string("not json"), good.substr(0, good.size() / 2), std::string("[1, 2]"), std::string("")}) {
    auto tok = LoadTokenizer(Write(text));
    ASSERT_FALSE(tok.ok());
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument) << tok.status();
  }
  EXPECT_FALSE(LoadTokenizer((dir_ / "absent.json").string()).ok());
}

}  // namespace
}  // namespace lazykv::testing
