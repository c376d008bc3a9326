// The tokens of document texts seen recently, so that a popular document sent as text again
// and again is tokenized once. A RAG request's documents are most of its text (8 documents of
// 512 tokens are about 18 KB), and their byte-level BPE runs on the call's handler thread
// before the request reaches the engine, on the path of its time to first token
// (bench/results/document_tokens_2026-11-29.md). Token-id documents never come here.
//
// Exact: an entry keeps its text, and is taken only for an equal text (XXH3-128 finds the
// candidate; a collision is a miss that replaces the entry, never another text's tokens).
// Least recently used entries go first; the bytes held (texts, tokens and a fixed overhead per
// entry) stay within the budget, and a text whose entry would take over an eighth of it is
// tokenized without being kept.
//
// Thread-safe: handler threads call Encode at once. A miss tokenizes outside the lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/numeric/int128.h"
#include "common/mutex.h"
#include "worker/tokenizer/tokenizer.h"

namespace lazykv {

class DocumentTokenCache {
 public:
  // Told of every Encode's outcome (a hit, or a miss), on the caller's thread (e.g. metrics).
  using Observer = std::function<void(bool hit)>;
  // A text's key; XXH3-128 unless a test gives one that collides.
  using KeyFunction = absl::uint128 (*)(std::string_view text);

  // `tokenizer` must outlive the cache; every text is tokenized by it.
  DocumentTokenCache(const Tokenizer* tokenizer, size_t max_bytes, Observer observer = {}, KeyFunction key = nullptr);

  // tokenizer->Encode(text), from the cache where it holds the text.
  std::vector<int32_t> Encode(std::string_view text) ABSL_LOCKS_EXCLUDED(mu_);

  struct Stats {
    uint64_t hits = 0;
    uint64_t misses = 0;
    uint64_t evictions = 0;
    size_t entries = 0;  // (read from the list by stats())
    size_t bytes = 0;
  };
  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);

  // What an entry for a text of `text_bytes` bytes and `tokens` tokens counts against the budget.
  static size_t EntryBytes(size_t text_bytes, size_t tokens);

 private:
  struct Entry {
    absl::uint128 key;
    std::string text;
    std::vector<int32_t> tokens;
  };
  using Lru = std::list<Entry>;  // most recently used first

  void EraseLocked(Lru::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Tokenizer* const tokenizer_;
  const size_t max_bytes_;
  const Observer observer_;
  const KeyFunction key_;
  mutable Mutex mu_;
  Lru lru_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<absl::uint128, Lru::iterator> index_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lazykv
