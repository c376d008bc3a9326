// Stand-in text for a trace's document, for replays that send documents as text (the way an
// OpenAI-API client must): English-like words drawn from the document's id, so that the same
// document is the same text in every request and every run. About 4.6 bytes a Llama 3 token.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/splitmix64.h"

namespace lazykv {

inline std::string DocumentText(int document_id, size_t bytes) {
  static const char* const kWords[] = {"Once",  "upon",  "a",     "time",    "there", "was",        "little", "girl",
                                       "named", "Lily",  "She",   "loved",   "to",    "play",       "with",   "her",
                                       "red",   "ball",  "in",    "the",     "park",  "One",        "day",    "saw",
                                       "big",   "dog",   "and",   "said",    "Hello", "happy",      "mom",    "smiled",
                                       "river", "Andes", "llama", "crossed", "dawn",  "caf\xc3\xa9"};
  constexpr uint64_t kWordCount = sizeof(kWords) / sizeof(kWords[0]);
  uint64_t state = 0x6c617a796b76ULL ^ (static_cast<uint64_t>(document_id) * 0x9E3779B97F4A7C15ULL);
  std::string text = "Document " + std::to_string(document_id) + ".";
  while (text.size() < bytes) {
    const uint64_t r = SplitMix64(state);
    text += r % 16 == 0 ? "\n" : " ";
    text += kWords[(r >> 8) % kWordCount];
    if ((r >> 32) % 12 == 0) text += ".";
  }
  return text;
}

}  // namespace lazykv
