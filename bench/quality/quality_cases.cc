#include "bench/quality/quality_cases.h"

#include <algorithm>
#include <array>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace lazykv::quality {
namespace {

constexpr std::array<const char*, 64> kNames = {
    "Mia",  "Tom",  "Max",  "Ben",  "Sam",  "Anna", "Lucy", "Jack", "Emma", "Leo",  "Zoe",  "Tim",  "Sue",
    "Kim",  "Bob",  "Amy",  "Jill", "Dan",  "Eva",  "Finn", "Gus",  "Hana", "Ivy",  "Jake", "Kate", "Liam",
    "Mark", "Nina", "Owen", "Pam",  "Rosa", "Ray",  "Sara", "Ted",  "Uma",  "Vic",  "Wes",  "Yara", "Zack",
    "Ella", "Noah", "Ruby", "Lola", "Ned",  "Cal",  "Dora", "Fred", "Gina", "Hugo", "Iris", "Joe",  "Kira",
    "Lena", "Milo", "Nora", "Otto", "Pete", "Rita", "Seth", "Tara", "Vera", "Will", "Ada",  "Ron"};
constexpr std::array<const char*, 10> kColors = {"red",    "blue",   "green", "yellow", "pink",
                                                 "purple", "orange", "brown", "black",  "white"};
constexpr std::array<const char*, 12> kObjects = {"ball", "kite", "hat",  "car", "doll", "book",
                                                  "drum", "boat", "bike", "cup", "box",  "bag"};
constexpr std::array<const char*, 10> kPlaces = {"park",   "beach",  "farm", "forest", "lake",
                                                 "garden", "school", "zoo",  "river",  "hill"};

template <typename T>
const T& Pick(const std::vector<T>& v, std::mt19937_64& rng) {
  return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)];
}

// The ids `text` adds after `prefix_text` when both are encoded together (SentencePiece-style
// tokenizers add a leading space to an encoded text, so the parts are not encoded apart).
absl::StatusOr<std::vector<int32_t>> ContinuationIds(const Tokenizer& tokenizer, const std::string& prefix_text,
                                                     const std::vector<int32_t>& prefix, const std::string& text) {
  std::vector<int32_t> all = tokenizer.Encode(prefix_text + text);
  if (all.size() <= prefix.size() || !std::equal(prefix.begin(), prefix.end(), all.begin())) {
    return absl::InternalError(
        absl::StrFormat("\"%s\" does not tokenize as a continuation of \"%s\"", text, prefix_text));
  }
  return std::vector<int32_t>(all.begin() + prefix.size(), all.end());
}

bool Compatible(const StoryDoc& a, const StoryDoc& b) { return a.color != b.color && a.object != b.object; }

}  // namespace

const char* PlacementName(Placement placement) {
  switch (placement) {
    case Placement::kOnly:
      return "only";
    case Placement::kFirst:
      return "first";
    case Placement::kMiddle:
      return "middle";
    case Placement::kLast:
      return "last";
  }
  return "?";
}

absl::StatusOr<std::vector<StoryDoc>> BuildCorpus(const Tokenizer& tokenizer, int docs, uint64_t seed) {
  if (docs < 2 || docs > static_cast<int>(kNames.size())) {
    return absl::InvalidArgumentError(absl::StrFormat("corpus of %d documents: need 2 to %d", docs, kNames.size()));
  }
  std::mt19937_64 rng(seed);
  std::vector<const char*> names(kNames.begin(), kNames.end());
  std::shuffle(names.begin(), names.end(), rng);
  const std::vector<const char*> colors(kColors.begin(), kColors.end()), objects(kObjects.begin(), kObjects.end()),
      places(kPlaces.begin(), kPlaces.end());
  std::vector<StoryDoc> corpus;
  for (int d = 0; d < docs; ++d) {
    StoryDoc doc;
    const bool girl = std::bernoulli_distribution(0.5)(rng);
    doc.name = names[d];
    doc.pronoun = girl ? "She" : "He";
    doc.possessive = girl ? "her" : "his";
    doc.color = Pick(colors, rng);
    doc.object = Pick(objects, rng);
    doc.place = Pick(places, rng);
    doc.text = absl::StrCat("There was a ", girl ? "girl" : "boy", " named ", doc.name, ". ", doc.name, " had a ",
                            doc.color, " ", doc.object, ". ", doc.pronoun, " liked to take it to the ", doc.place, ".");
    doc.tokens = tokenizer.Encode(doc.text);
    const std::string before = "It was a";
    auto object = ContinuationIds(tokenizer, before, tokenizer.Encode(before), absl::StrCat(" ", doc.object));
    if (!object.ok()) return object.status();
    doc.object_ids = *std::move(object);
    corpus.push_back(std::move(doc));
  }
  return corpus;
}

absl::StatusOr<std::vector<QualityCase>> BuildCases(const std::vector<StoryDoc>& corpus, const Tokenizer& tokenizer,
                                                    const CaseOptions& options) {
  std::mt19937_64 rng(options.seed ^ 0x9e3779b97f4a7c15ull);
  std::vector<QualityCase> cases;
  for (int count : options.counts) {
    if (count < 1 || 2 * count > static_cast<int>(corpus.size())) {
      return absl::InvalidArgumentError(absl::StrFormat("%d documents per case with a corpus of %d: need 1 to %d",
                                                        count, corpus.size(), corpus.size() / 2));
    }
    std::vector<Placement> placements;
    if (count == 1) placements = {Placement::kOnly};
    if (count == 2) placements = {Placement::kFirst, Placement::kLast};
    if (count > 2) placements = {Placement::kFirst, Placement::kMiddle, Placement::kLast};
    for (Placement placement : placements) {
      for (int i = 0; i < options.cases_per_group; ++i) {
        QualityCase c;
        c.index = static_cast<int>(cases.size());
        c.count = count;
        c.placement = placement;
        c.relevant_slot = placement == Placement::kFirst || placement == Placement::kOnly ? 0
                          : placement == Placement::kLast                                 ? count - 1
                                                                                          : count / 2;
        c.relevant_doc = std::uniform_int_distribution<int>(0, corpus.size() - 1)(rng);
        const StoryDoc& relevant = corpus[c.relevant_doc];
        // Distractors and the control's stand-in: other documents whose colour and object
        // both differ from the relevant one's, so the answer is in one document only.
        std::vector<int> others;
        for (int d = 0; d < static_cast<int>(corpus.size()); ++d) {
          if (d != c.relevant_doc && Compatible(corpus[d], relevant)) others.push_back(d);
        }
        if (static_cast<int>(others.size()) < count) {
          return absl::InternalError(
              absl::StrFormat("only %d documents differ from \"%s\"", others.size(), relevant.text));
        }
        std::shuffle(others.begin(), others.end(), rng);
        c.doc_ids.assign(others.begin(), others.begin() + (count - 1));
        c.doc_ids.insert(c.doc_ids.begin() + c.relevant_slot, c.relevant_doc);
        c.control_ids = c.doc_ids;
        c.control_ids[c.relevant_slot] = others[count - 1];
        const std::string prompt_text = absl::StrCat("One day, ", relevant.name, " took ", relevant.possessive);
        c.prompt = tokenizer.Encode(prompt_text);
        const std::string answer = absl::StrCat(" ", relevant.color, " ", relevant.object);
        auto held =
            ContinuationIds(tokenizer, prompt_text, c.prompt, absl::StrCat(answer, " to the ", relevant.place, "."));
        if (!held.ok()) return held.status();
        auto answer_ids = ContinuationIds(tokenizer, prompt_text, c.prompt, answer);
        if (!answer_ids.ok()) return answer_ids.status();
        c.held_out = *std::move(held);
        c.answer_tokens = static_cast<int>(answer_ids->size());
        if (!std::equal(answer_ids->begin(), answer_ids->end(), c.held_out.begin())) {
          return absl::InternalError(absl::StrFormat("answer \"%s\" is not a prefix of the held-out text", answer));
        }
        cases.push_back(std::move(c));
      }
    }
  }
  return cases;
}

bool Mentions(const std::vector<int32_t>& ids, const std::vector<int32_t>& word) {
  return !word.empty() && std::search(ids.begin(), ids.end(), word.begin(), word.end()) != ids.end();
}

std::vector<std::vector<int32_t>> DocsOf(const std::vector<StoryDoc>& corpus, const std::vector<int>& ids) {
  std::vector<std::vector<int32_t>> docs;
  docs.reserve(ids.size());
  for (int id : ids) docs.push_back(corpus[id].tokens);
  return docs;
}

}  // namespace lazykv::quality
