// The text of a reply as it is generated, for every streaming front end (the gRPC
// Generate call, the OpenAI-compatible HTTP API, the lazykv CLI): deltas that never split
// a UTF-8 character, never show the possible beginning of a stop string, and end before
// the first stop string.
//
// Policy, checked against stream_vectors.jsonl of the Llama 3 tokenizer test data: the
// decoded bytes are buffered; after each token the longest prefix that does not end in an
// unfinished character (a proper prefix of a well-formed one) is released. Bytes that can
// never become a character are released at once as U+FFFD, one per maximal subpart; a
// special token's text releases what was held before it; Flush releases the rest lossily.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "worker/tokenizer/tokenizer.h"

namespace lazykv {

// Not thread-safe: one per request, used by the thread that streams it.
class TextStream {
 public:
  // How many tokens before each new one are decoded with it (a leading space depends on
  // them); `context` is what precedes the reply (prompt tokens), at most this many used.
  static constexpr size_t kContextTokens = 8;

  // `tokenizer` must outlive the stream.
  TextStream(const Tokenizer& tokenizer, std::vector<int32_t> context, std::vector<std::string> stops);

  // Adds a token; returns the text that can be shown now. Sets stopped() when a stop
  // string has appeared (the text before it has been returned; nothing after it ever is).
  std::string Add(int32_t token);
  // Whatever was held back, once no token follows (lossy: an unfinished character is U+FFFD).
  std::string Flush();
  bool stopped() const { return stopped_; }
  // The stop string that ended the text, when stopped().
  const std::string& matched_stop() const { return matched_stop_; }

 private:
  std::string Take(size_t upto);

  const Tokenizer& tokenizer_;
  std::vector<int32_t> recent_;  // the last kContextTokens tokens, context then reply
  std::vector<std::string> stops_;
  std::string text_;  // the reply's bytes so far
  size_t hold_back_ = 0;
  size_t sent_ = 0;  // bytes of text_ already returned
  bool stopped_ = false;
  std::string matched_stop_;
};

// A whole reply's text as a client of a stream sees it: every delta and the flush (valid
// UTF-8, each ill-formed sequence one U+FFFD). For outputs that are not streamed.
std::string ReplyText(const Tokenizer& tokenizer, std::vector<int32_t> context, std::span<const int32_t> reply);

}  // namespace lazykv
