// LoadHfTokenizer: a Hugging Face tokenizer.json with a byte-level BPE model, checked
// field by field; whatever this code does not implement is refused with the field named,
// never tokenized differently from Hugging Face.
#include <array>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/mapped_file.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "worker/tokenizer/byte_level.h"
#include "worker/tokenizer/byte_level_bpe_tokenizer.h"
#include "worker/tokenizer/tokenizer.h"

namespace lazykv {
namespace {

using json = nlohmann::json;

// GPT-2's split, which a ByteLevel pre-tokenizer with use_regex applies.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class Loader {
 public:
  explicit Loader(std::string path) : path_(std::move(path)) {}

  absl::StatusOr<std::unique_ptr<Tokenizer>> Load() {
    ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path_));
    const auto bytes = file.bytes();
    json doc = json::parse(bytes.begin(), bytes.end(), nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded()) return Bad("", "not valid JSON");
    if (!doc.is_object()) return Bad("", "not a JSON object");
    try {
      RETURN_IF_ERROR(CheckNormalizer(doc));
      RETURN_IF_ERROR(CheckDecoder(doc));
      ASSIGN_OR_RETURN(std::vector<PretokenizerRegex> regexes, PreTokenizer(doc));
      RETURN_IF_ERROR(Vocabulary(doc));
      ASSIGN_OR_RETURN(std::vector<BpeModel::Merge> merges, Merges(doc));
      using Added = std::vector<std::pair<std::string, int32_t>>;
      ASSIGN_OR_RETURN(Added added, AddedTokens(doc));
      const json& model = doc["model"];
      bool ignore_merges = false;
      if (model.contains("ignore_merges") && !model["ignore_merges"].is_null()) {
        if (!model["ignore_merges"].is_boolean()) return Bad("model.ignore_merges", "not a boolean");
        ignore_merges = model["ignore_merges"].get<bool>();
      }
      spdlog::debug("{}: byte-level BPE, {} tokens, {} merges, {} added tokens, {} regexes (JIT {})", path_,
                    token_bytes_.size(), merges.size(), added.size(), regexes.size(),
                    regexes.empty() || regexes[0].jit());
      BpeModel bpe(std::move(by_bytes_), byte_ids_, merges, ignore_merges);
      return std::make_unique<ByteLevelBpeTokenizer>(std::move(bpe), std::move(regexes), AddedTokenMatcher(added),
                                                     token_bytes_);
    } catch (const json::exception& e) {  // a field of an unexpected JSON type
      return Bad("", absl::StrCat("unexpected JSON: ", e.what()));
    }
  }

 private:
  absl::Status Bad(const std::string& field, const std::string& what) const {
    if (field.empty()) return absl::InvalidArgumentError(absl::StrCat(path_, ": ", what));
    return absl::InvalidArgumentError(absl::StrCat(path_, ": ", field, ": ", what));
  }

  static std::string TypeOf(const json& v) {
    if (!v.is_object() || !v.contains("type")) return "(no type)";
    return v["type"].is_string() ? v["type"].get<std::string>() : v["type"].dump();
  }

  static bool Absent(const json& parent, const char* key) { return !parent.contains(key) || parent[key].is_null(); }

  absl::Status CheckNormalizer(const json& doc) const {
    if (Absent(doc, "normalizer")) return absl::OkStatus();
    const json& n = doc["normalizer"];
    if (TypeOf(n) == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array() &&
        n["normalizers"].empty()) {
      return absl::OkStatus();
    }
    return Bad("normalizer.type", absl::StrCat("'", TypeOf(n), "' is not supported (only a null normalizer)"));
  }

  absl::Status CheckDecoder(const json& doc) const {
    if (Absent(doc, "decoder")) return Bad("decoder", "missing (only a ByteLevel decoder is supported)");
    const json& d = doc["decoder"];
    if (TypeOf(d) == "ByteLevel") return absl::OkStatus();
    if (TypeOf(d) == "Sequence" && d.contains("decoders") && d["decoders"].is_array() && !d["decoders"].empty()) {
      for (size_t i = 0; i < d["decoders"].size(); ++i) {
        if (TypeOf(d["decoders"][i]) != "ByteLevel") {
          return Bad(absl::StrFormat("decoder.decoders[%d].type", i),
                     absl::StrCat("'", TypeOf(d["decoders"][i]), "' is not supported (only ByteLevel)"));
        }
      }
      return absl::OkStatus();
    }
    return Bad("decoder.type", absl::StrCat("'", TypeOf(d), "' is not supported (only ByteLevel)"));
  }

  // Split (Isolated) regexes, then one ByteLevel (its own GPT-2 regex if use_regex).
  absl::StatusOr<std::vector<PretokenizerRegex>> PreTokenizer(const json& doc) const {
    if (Absent(doc, "pre_tokenizer")) return Bad("pre_tokenizer", "missing (a ByteLevel pre-tokenizer is required)");
    const json& p = doc["pre_tokenizer"];
    std::vector<std::pair<std::string, const json*>> steps;  // (field, object)
    if (TypeOf(p) == "Sequence") {
      if (!p.contains("pretokenizers") || !p["pretokenizers"].is_array()) {
        return Bad("pre_tokenizer.pretokenizers", "missing or not an array");
      }
      for (size_t i = 0; i < p["pretokenizers"].size(); ++i) {
        steps.emplace_back(absl::StrFormat("pre_tokenizer.pretokenizers[%d]", i), &p["pretokenizers"][i]);
      }
    } else {
      steps.emplace_back("pre_tokenizer", &p);
    }
    std::vector<PretokenizerRegex> regexes;
    for (size_t i = 0; i < steps.size(); ++i) {
      const auto& [field, step] = steps[i];
      const std::string type = TypeOf(*step);
      if (type == "Split") {
        const json& s = *step;
        if (!s.contains("pattern") || !s["pattern"].is_object() || !s["pattern"].contains("Regex") ||
            !s["pattern"]["Regex"].is_string()) {
          return Bad(field + ".pattern", "not supported (only {\"Regex\": ...})");
        }
        if (s.value("behavior", std::string()) != "Isolated") {
          return Bad(field + ".behavior", absl::StrCat("'", s.contains("behavior") ? s["behavior"].dump() : "",
                                                       "' is not supported (only Isolated)"));
        }
        if (s.value("invert", false)) return Bad(field + ".invert", "true is not supported");
        auto regex = PretokenizerRegex::Compile(s["pattern"]["Regex"].get<std::string>());
        if (!regex.ok()) return Bad(field + ".pattern.Regex", std::string(regex.status().message()));
        regexes.push_back(*std::move(regex));
      } else if (type == "ByteLevel") {
        if (i + 1 != steps.size()) return Bad(field, "a ByteLevel pre-tokenizer must come last");
        // Hugging Face's default add_prefix_space is true: a missing key means true.
        if (step->value("add_prefix_space", true)) {
          return Bad(field + ".add_prefix_space", "true (or missing) is not supported");
        }
        if (step->value("use_regex", true)) {
          auto regex = PretokenizerRegex::Compile(kGpt2Pattern);
          if (!regex.ok()) return regex.status();  // cannot happen: the pattern is ours
          regexes.push_back(*std::move(regex));
        }
        return regexes;
      } else {
        return Bad(field + ".type", absl::StrCat("'", type, "' is not supported (only Split and ByteLevel)"));
      }
    }
    return Bad("pre_tokenizer", "has no ByteLevel step (only byte-level BPE is supported)");
  }

  // model: the vocabulary, by the alphabet's spelling (for merges) and by bytes (encoding).
  absl::Status Vocabulary(const json& doc) {
    if (!doc.contains("model") || !doc["model"].is_object()) return Bad("model", "missing or not an object");
    const json& model = doc["model"];
    if (!model.contains("type")) return Bad("model.type", "missing (only BPE is supported)");
    if (TypeOf(model) != "BPE")
      return Bad("model.type", absl::StrCat("'", TypeOf(model), "' is not supported (only BPE)"));
    if (!Absent(model, "dropout") && !(model["dropout"].is_number() && model["dropout"].get<double>() == 0)) {
      return Bad("model.dropout", absl::StrCat(model["dropout"].dump(), " is not supported (only null)"));
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (!Absent(model, key) && !(model[key].is_string() && model[key].get<std::string>().empty())) {
        return Bad(absl::StrCat("model.", key), absl::StrCat(model[key].dump(), " is not supported (only null)"));
      }
    }
    if (!model.contains("vocab") || !model["vocab"].is_object()) return Bad("model.vocab", "missing or not an object");
    const json& vocab = model["vocab"];
    by_chars_.reserve(vocab.size());
    std::vector<const std::string*> names;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
          it.value().get<int64_t>() >= (int64_t{1} << 30)) {
        return Bad("model.vocab",
                   absl::StrCat("token '", it.key(), "' has id ", it.value().dump(), " (not an integer in [0, 2^30))"));
      }
      const auto id = static_cast<int32_t>(it.value().get<int64_t>());
      if (static_cast<size_t>(id) >= names.size()) names.resize(id + 1, nullptr);
      if (names[id] != nullptr) {
        return Bad("model.vocab", absl::StrCat("id ", id, " is given to both '", *names[id], "' and '", it.key(), "'"));
      }
      names[id] = &it.key();
      by_chars_.emplace(it.key(), id);
    }
    token_bytes_.assign(names.size(), std::string());
    by_bytes_.reserve(by_chars_.size());
    for (size_t id = 0; id < names.size(); ++id) {
      if (names[id] == nullptr) continue;
      if (std::optional<std::string> bytes = byte_level::Unspell(*names[id])) {
        by_bytes_.emplace(*bytes, static_cast<int32_t>(id));
        token_bytes_[id] = *std::move(bytes);
      } else {
        token_bytes_[id] = *names[id];  // outside the alphabet: unreachable by merges, decoded as its text
      }
    }
    for (int b = 0; b < 256; ++b) {
      auto it = by_bytes_.find(std::string(1, static_cast<char>(b)));
      if (it == by_bytes_.end()) {
        return Bad("model.vocab", absl::StrFormat("no token for byte 0x%02X ('%s'): not a byte-level vocabulary", b,
                                                  byte_level::Spell(std::string(1, static_cast<char>(b)))));
      }
      byte_ids_[b] = it->second;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<BpeModel::Merge>> Merges(const json& doc) const {
    const json& model = doc["model"];
    if (!model.contains("merges") || !model["merges"].is_array()) return Bad("model.merges", "missing or not an array");
    const json& merges = model["merges"];
    std::vector<BpeModel::Merge> out;
    out.reserve(merges.size());
    std::string left, right;
    for (size_t i = 0; i < merges.size(); ++i) {
      const json& m = merges[i];
      const std::string field = absl::StrFormat("model.merges[%d]", i);
      if (m.is_string()) {  // the old format, "left right"
        const std::string& s = m.get_ref<const std::string&>();
        const size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
          return Bad(field, absl::StrCat("'", s, "' is not two tokens separated by one space"));
        }
        left = s.substr(0, space);
        right = s.substr(space + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        left = m[0].get<std::string>();
        right = m[1].get<std::string>();
      } else {
        return Bad(field, "neither \"left right\" nor [left, right]");
      }
      const auto l = by_chars_.find(left), r = by_chars_.find(right), merged = by_chars_.find(left + right);
      if (l == by_chars_.end()) return Bad(field, absl::StrCat("'", left, "' is not in model.vocab"));
      if (r == by_chars_.end()) return Bad(field, absl::StrCat("'", right, "' is not in model.vocab"));
      if (merged == by_chars_.end()) return Bad(field, absl::StrCat("'", left + right, "' is not in model.vocab"));
      out.push_back(BpeModel::Merge{l->second, r->second, merged->second});
    }
    return out;
  }

  // added_tokens: found in raw text, decoded as their text; they may extend the vocabulary.
  absl::StatusOr<std::vector<std::pair<std::string, int32_t>>> AddedTokens(const json& doc) {
    std::vector<std::pair<std::string, int32_t>> out;
    if (Absent(doc, "added_tokens")) return out;
    if (!doc["added_tokens"].is_array()) return Bad("added_tokens", "not an array");
    absl::flat_hash_map<std::string, int32_t> seen;
    for (size_t i = 0; i < doc["added_tokens"].size(); ++i) {
      const json& t = doc["added_tokens"][i];
      const std::string field = absl::StrFormat("added_tokens[%d]", i);
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || t["id"].get<int64_t>() < 0 ||
          t["id"].get<int64_t>() >= (int64_t{1} << 30)) {
        return Bad(field + ".id", "missing or not an integer in [0, 2^30)");
      }
      if (!t.contains("content") || !t["content"].is_string() || t["content"].get<std::string>().empty()) {
        return Bad(field + ".content", "missing, empty or not a string");
      }
      for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
        if (t.contains(flag) && !t[flag].is_boolean()) return Bad(absl::StrCat(field, ".", flag), "not a boolean");
        if (t.value(flag, false)) return Bad(absl::StrCat(field, ".", flag), "true is not supported");
      }
      const auto id = static_cast<int32_t>(t["id"].get<int64_t>());
      std::string content = t["content"].get<std::string>();
      if (auto [it, inserted] = seen.emplace(content, id); !inserted && it->second != id) {
        return Bad(field, absl::StrCat("'", content, "' is also added token ", it->second));
      }
      if (static_cast<size_t>(id) >= token_bytes_.size()) token_bytes_.resize(id + 1);
      token_bytes_[id] = content;
      out.emplace_back(std::move(content), id);
    }
    return out;
  }

  std::string path_;
  absl::flat_hash_map<std::string, int32_t> by_chars_;  // the vocabulary as the file spells it
  absl::flat_hash_map<std::string, int32_t> by_bytes_;  // the same tokens by their bytes
  std::array<int32_t, 256> byte_ids_{};
  std::vector<std::string> token_bytes_;  // by id: what Decode writes
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizer(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return Loader((std::filesystem::path(path) / "tokenizer.json").string()).Load();
  return Loader(path).Load();
}

}  // namespace lazykv
