// Document-grounded cases for the output-quality harness (bench/quality/): a seeded corpus
// of short TinyStories-style documents, each introducing one child with a coloured object
// and a favourite place, and cases that put 1 to 8 of them in context, the relevant one
// first, in the middle or last, then a prompt about the relevant child whose reference
// continuation ("held-out text") names that child's object and place:
//
//   document: "There was a girl named Mia. Mia had a red kite. She liked to take it to the park."
//   prompt:   "One day, Mia took her"      held-out: " red kite to the park."
//
// The other documents (distractors) have other names, colours and objects, so the answer is
// in exactly one document. A control replaces the relevant document by an unrelated one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/tokenizer/tokenizer.h"

namespace lazykv::quality {

struct StoryDoc {
  std::string name, pronoun, possessive, color, object, place;
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<int32_t> object_ids;  // " OBJECT" as it tokenizes inside a sentence
};

// Where the relevant document sits among the case's documents.
enum class Placement { kOnly, kFirst, kMiddle, kLast };
const char* PlacementName(Placement placement);

struct QualityCase {
  int index = 0;
  int count = 1;  // documents in context
  Placement placement = Placement::kOnly;
  int relevant_slot = 0;         // index into doc_ids of the relevant document
  std::vector<int> doc_ids;      // corpus indices, in context order
  std::vector<int> control_ids;  // the same, with the relevant document swapped for an unrelated one
  int relevant_doc = 0;          // corpus index
  std::vector<int32_t> prompt;
  std::vector<int32_t> held_out;  // the reference continuation written from the relevant document
  int answer_tokens = 0;          // held_out's first tokens that spell " COLOR OBJECT"
};

// Whether `ids` holds `word` (a token sequence) anywhere.
bool Mentions(const std::vector<int32_t>& ids, const std::vector<int32_t>& word);

struct CaseOptions {
  int corpus_docs = 64;                 // at most the number of names (64)
  std::vector<int> counts{1, 2, 4, 8};  // documents per case
  int cases_per_group = 32;             // per (count, placement); count 1 has one placement, 2 has two
  uint64_t seed = 1;
};

// The corpus: `docs` documents with distinct names, attributes drawn from `seed`.
absl::StatusOr<std::vector<StoryDoc>> BuildCorpus(const Tokenizer& tokenizer, int docs, uint64_t seed);

// Cases in group order (count, then placement), seeded. Counts must be in [1, corpus/2].
absl::StatusOr<std::vector<QualityCase>> BuildCases(const std::vector<StoryDoc>& corpus, const Tokenizer& tokenizer,
                                                    const CaseOptions& options);

// The token ids of the corpus documents `ids`, in order: a request's docs.
std::vector<std::vector<int32_t>> DocsOf(const std::vector<StoryDoc>& corpus, const std::vector<int>& ids);

}  // namespace lazykv::quality
