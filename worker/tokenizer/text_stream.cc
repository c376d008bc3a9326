#include "worker/tokenizer/text_stream.h"

#include <algorithm>

#include "common/utf8.h"

namespace lazykv {

TextStream::TextStream(const Tokenizer& tokenizer, std::vector<int32_t> context, std::vector<std::string> stops)
    : tokenizer_(tokenizer), stops_(std::move(stops)) {
  const size_t keep = std::min(context.size(), kContextTokens);
  recent_.assign(context.end() - keep, context.end());
  for (const std::string& stop : stops_) hold_back_ = std::max(hold_back_, stop.empty() ? 0 : stop.size() - 1);
}

std::string TextStream::Add(int32_t token) {
  if (stopped_) return "";
  // Each token's text given the few tokens before it, so a long reply is decoded once,
  // not once per token.
  text_ += DecodeContinuation(tokenizer_, recent_, {&token, 1});
  recent_.push_back(token);
  if (recent_.size() > kContextTokens) recent_.erase(recent_.begin());
  size_t stop_at = std::string::npos;
  const size_t search_from = sent_ > hold_back_ ? sent_ - hold_back_ : 0;
  for (const std::string& stop : stops_) {
    if (stop.empty()) continue;
    const size_t at = text_.find(stop, search_from);
    if (at < stop_at) {
      stop_at = at;
      matched_stop_ = stop;
    }
  }
  if (stop_at != std::string::npos) {
    stopped_ = true;
    return Take(std::max(stop_at, sent_));
  }
  const size_t safe = text_.size() > hold_back_ ? text_.size() - hold_back_ : 0;
  return Take(std::max(sent_, CompleteUtf8Prefix(std::string_view(text_).substr(0, safe))));
}

std::string TextStream::Flush() {
  if (stopped_) return "";
  return Take(text_.size());
}

std::string ReplyText(const Tokenizer& tokenizer, std::vector<int32_t> context, std::span<const int32_t> reply) {
  TextStream stream(tokenizer, std::move(context), {});
  std::string text;
  for (int32_t token : reply) text += stream.Add(token);
  return text + stream.Flush();
}

std::string TextStream::Take(size_t upto) {
  upto = std::min(upto, text_.size());
  if (upto <= sent_) return "";
  std::string piece = SanitizeUtf8(std::string_view(text_).substr(sent_, upto - sent_));
  sent_ = upto;
  return piece;
}

}  // namespace lazykv
