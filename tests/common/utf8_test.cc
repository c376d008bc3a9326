// UTF-8 helpers against a reference built another way: every valid encoding is produced
// by encoding each Unicode scalar value (so overlongs, surrogates and values past
// U+10FFFF never appear), and random byte strings are judged against that set.
#include "common/utf8.h"

#include <gtest/gtest.h>

#include <random>
#include <unordered_set>

#include "tests/test_util.h"

namespace lazykv {
namespace {

std::string Encode(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

struct Reference {
  std::unordered_set<std::string> whole;    // every valid encoding of length >= 2
  std::unordered_set<std::string> partial;  // every strict, non-empty prefix of one
  Reference() {
    for (uint32_t cp = 0x80; cp <= 0x10FFFF; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      const std::string e = Encode(cp);
      whole.insert(e);
      for (size_t n = 1; n < e.size(); ++n) partial.insert(e.substr(0, n));
    }
  }
  // Greedy decoding: the longest valid character at each position, else one U+FFFD for
  // the longest strict prefix of some valid character there (at least one byte).
  std::string Sanitize(std::string_view text) const {
    std::string out;
    for (size_t i = 0; i < text.size();) {
      size_t taken = 0;
      if (static_cast<unsigned char>(text[i]) < 0x80) taken = 1;
      for (size_t n = 2; n <= 4 && i + n <= text.size() && taken == 0; ++n) {
        if (whole.contains(std::string(text.substr(i, n)))) taken = n;
      }
      if (taken == 0) {
        size_t skipped = 1;
        for (size_t n = 1; n <= 3 && i + n <= text.size(); ++n) {
          if (partial.contains(std::string(text.substr(i, n)))) skipped = n;
        }
        out += "\xEF\xBF\xBD";
        i += skipped;
      } else {
        out += text.substr(i, taken);
        i += taken;
      }
    }
    return out;
  }
  size_t CompletePrefix(std::string_view text) const {
    for (size_t back = 3; back >= 1; --back) {
      if (back <= text.size() && partial.contains(std::string(text.substr(text.size() - back)))) {
        return text.size() - back;
      }
    }
    return text.size();
  }
};

const Reference& Ref() {
  static const Reference* reference = new Reference();
  return *reference;
}

TEST(Utf8, KnownCases) {
  EXPECT_EQ(CompleteUtf8Prefix("ab\xE2\x82"), 2u);      // the start of a Euro sign
  EXPECT_EQ(CompleteUtf8Prefix("ab\xE2\x82\xAC"), 5u);  // the whole Euro sign
  EXPECT_EQ(CompleteUtf8Prefix("ab\xC0"), 3u);          // never a lead byte: nothing to wait for
  EXPECT_EQ(CompleteUtf8Prefix("\xED\xA0"), 2u);        // a surrogate's start can never complete
  EXPECT_EQ(SanitizeUtf8("a\xFF"
                         "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(SanitizeUtf8("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
  EXPECT_EQ(SanitizeUtf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // an overlong '/'
  // A character cut short is one replacement, whatever its length so far.
  EXPECT_EQ(SanitizeUtf8("\xF0\x9F\xA6"
                         "b"),
            "\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(SanitizeUtf8("\xE2\x82\xE2\x82\xAC"), "\xEF\xBF\xBD\xE2\x82\xAC");
  EXPECT_EQ(SanitizeUtf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate: no subpart
}

TEST(Utf8, MatchesTheEncodingSetOnRandomBytes) {
  const uint64_t seed = testing::FreshSeed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  const std::vector<std::string> pieces = {
      "a", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80", "\xED\x9F\xBF", "\xF4\x8F\xBF\xBF"};
  for (int trial = 0; trial < 20000; ++trial) {
    std::string text;
    const int n = static_cast<int>(rng() % 10);
    for (int i = 0; i < n; ++i) {
      // Mostly valid characters, cut anywhere, with random bytes between.
      if (rng() % 3 == 0) {
        text += static_cast<char>(rng() % 256);
      } else {
        const std::string& p = pieces[rng() % pieces.size()];
        text += rng() % 4 == 0 ? p.substr(0, 1 + rng() % p.size()) : p;
      }
    }
    ASSERT_EQ(SanitizeUtf8(text), Ref().Sanitize(text)) << ::testing::PrintToString(text);
    ASSERT_EQ(CompleteUtf8Prefix(text), Ref().CompletePrefix(text)) << ::testing::PrintToString(text);
  }
}

}  // namespace
}  // namespace lazykv
