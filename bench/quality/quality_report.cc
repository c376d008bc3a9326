#include "bench/quality/quality_report.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace lazykv::quality {

MetricsTable ComputeMetrics(const std::vector<StoryDoc>& corpus, const std::vector<QualityCase>& cases,
                            const RunResults& results) {
  MetricsTable table(cases.size());
  for (size_t c = 0; c < cases.size(); ++c) {
    for (int s = 0; s < kNumSettings; ++s) {
      const CaseSettingResult& r = results.per_case[c][s];
      if (!r.ran) continue;
      CaseMetrics& m = table[c][s];
      m.ran = true;
      const CaseSettingResult& ref = results.per_case[c][Settings()[s].reference];
      m.agreement = GreedyAgreement(r.continuation.generated, ref.continuation.generated);
      m.ref_nll = MeanNll(r.continuation.logprobs);
      m.ref_tokens = static_cast<int>(r.continuation.logprobs.size());
      m.held_nll = MeanNll(r.held_out.logprobs);
      m.held_tokens = static_cast<int>(r.held_out.logprobs.size());
      const int answer = std::min<int>(cases[c].answer_tokens, r.held_out.top1.size());
      m.answer_correct = answer > 0 && std::all_of(r.held_out.top1.begin(), r.held_out.top1.begin() + answer,
                                                   [](uint8_t ok) { return ok != 0; });
      for (int i = 0; i < answer; ++i) m.answer_nll -= r.held_out.logprobs[i];
      const std::vector<int32_t>& run = r.continuation.generated;
      const QualityCase& qc = cases[c];
      m.recalls_object = Mentions(run, corpus[qc.relevant_doc].object_ids);
      for (int id : Settings()[s].control ? qc.control_ids : qc.doc_ids) {
        if (id != qc.relevant_doc) m.wrong_object |= Mentions(run, corpus[id].object_ids);
      }
    }
  }
  return table;
}

namespace {

double MaxAbsDiff(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

}  // namespace

Equivalence CompareSettings(const RunResults& results, SettingId a, SettingId b) {
  Equivalence e;
  for (const auto& per_setting : results.per_case) {
    const CaseSettingResult& x = per_setting[a];
    const CaseSettingResult& y = per_setting[b];
    if (!x.ran || !y.ran) continue;
    ++e.cases;
    const std::vector<int32_t>& gx = x.continuation.generated;
    const std::vector<int32_t>& gy = y.continuation.generated;
    if (gx == gy) ++e.same_tokens;
    // Step s's logits depend on the tokens before it: compare through the first difference.
    size_t steps = std::min(x.continuation.sketch.size(), y.continuation.sketch.size());
    for (size_t s = 0; s < steps; ++s) {
      e.max_logit_rel_error =
          std::max(e.max_logit_rel_error, RelativeL2Error(x.continuation.sketch[s], y.continuation.sketch[s]));
      if (s >= gx.size() || s >= gy.size() || gx[s] != gy[s]) break;
    }
    // Held-out targets are the same; continuation targets too when both score one reference.
    e.max_logprob_diff = std::max(e.max_logprob_diff, MaxAbsDiff(x.held_out.logprobs, y.held_out.logprobs));
    const bool same_target = Settings()[a].reference == Settings()[b].reference || gx == gy;
    if (same_target) {
      e.max_logprob_diff = std::max(e.max_logprob_diff, MaxAbsDiff(x.continuation.logprobs, y.continuation.logprobs));
    }
  }
  return e;
}

QualityChecks RunChecks(const RunResults& results, const MetricsTable& metrics) {
  QualityChecks q;
  q.prefix_vs_none = CompareSettings(results, kPrefix, kNone);
  q.lazy_vs_block = CompareSettings(results, kLazy, kBlock);
  std::vector<double> none, control;
  for (const auto& m : metrics) {
    if (m[kNone].ran && m[kControl].ran) {
      none.push_back(m[kNone].held_nll);
      control.push_back(m[kControl].held_nll);
    }
  }
  q.none_held_nll = NormalMean(none).mean;
  q.control_held_nll = NormalMean(control).mean;
  const Equivalence& p = q.prefix_vs_none;
  if (p.same_tokens != p.cases || p.max_logit_rel_error > 1e-4 || p.max_logprob_diff > 1e-3) {
    q.failures.push_back(absl::StrFormat(
        "prefix differs from none: %d of %d free runs identical, logits relative error %.2g, log-prob diff %.2g",
        p.same_tokens, p.cases, p.max_logit_rel_error, p.max_logprob_diff));
  }
  const Equivalence& l = q.lazy_vs_block;
  if (l.max_logit_rel_error > 1e-3 || l.same_tokens < l.cases * 0.95) {
    q.failures.push_back(
        absl::StrFormat("lazy differs from block: %d of %d free runs identical, logits relative error %.2g",
                        l.same_tokens, l.cases, l.max_logit_rel_error));
  }
  if (!none.empty() && !(q.control_held_nll > q.none_held_nll)) {
    q.failures.push_back(
        absl::StrFormat("the control (relevant document swapped) is not worse than none: "
                        "held-out NLL %.3f against %.3f",
                        q.control_held_nll, q.none_held_nll));
  }
  return q;
}

namespace {

std::string Ci(const Interval& i, int digits) {
  return absl::StrFormat("%.*f [%.*f, %.*f]", digits, i.mean, digits, i.low, digits, i.high);
}

using Field = std::function<double(const CaseMetrics&)>;

// Bootstrap interval of a field over the cases that `keep` selects.
Interval Over(const MetricsTable& metrics, const std::vector<QualityCase>& cases, SettingId s, const Field& field,
              const std::function<bool(const QualityCase&)>& keep) {
  std::vector<double> v;
  for (size_t c = 0; c < cases.size(); ++c) {
    if (metrics[c][s].ran && keep(cases[c])) v.push_back(field(metrics[c][s]));
  }
  return BootstrapMean(v, 2000, 7);
}

// Paired: exp(mean(field_s - field_base)), a geometric-mean perplexity ratio.
Interval Ratio(const MetricsTable& metrics, const std::vector<QualityCase>& cases, SettingId s, SettingId base,
               const Field& nll, const std::function<bool(const QualityCase&)>& keep) {
  std::vector<double> v;
  for (size_t c = 0; c < cases.size(); ++c) {
    if (metrics[c][s].ran && metrics[c][base].ran && keep(cases[c])) {
      v.push_back(nll(metrics[c][s]) - nll(metrics[c][base]));
    }
  }
  return ExpInterval(BootstrapMean(v, 2000, 11));
}

const Field kAgreePrefix = [](const CaseMetrics& m) { return m.agreement.prefix; };
const Field kAgreeOverall = [](const CaseMetrics& m) { return m.agreement.overall; };
const Field kRefNll = [](const CaseMetrics& m) { return m.ref_nll; };
const Field kHeldNll = [](const CaseMetrics& m) { return m.held_nll; };
const Field kAnswerNll = [](const CaseMetrics& m) { return m.answer_nll; };
const Field kRecall = [](const CaseMetrics& m) { return m.recalls_object ? 1.0 : 0.0; };
const Field kWrong = [](const CaseMetrics& m) { return m.wrong_object ? 1.0 : 0.0; };

// The settings a group table shows: the one under test and its baseline.
struct Pair {
  SettingId s, base;
};

void GroupTable(std::string& out, const std::string& title, const std::vector<QualityCase>& cases,
                const MetricsTable& metrics,
                const std::vector<std::pair<std::string, std::function<bool(const QualityCase&)>>>& groups,
                const std::vector<Pair>& pairs) {
  absl::StrAppend(&out, "\n### ", title,
                  "\n\n| group | n | setting | agreement to first divergence | "
                  "held-out ppl ratio | object recall | baseline's | control's | wrong object | baseline's |\n"
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const auto& [label, keep] : groups) {
    for (const Pair& p : pairs) {
      const Interval acc = Over(metrics, cases, p.s, kRecall, keep);
      if (acc.n == 0) continue;
      absl::StrAppend(&out, "| ", label, " | ", acc.n, " | ", Settings()[p.s].name, " | ",
                      Ci(Over(metrics, cases, p.s, kAgreePrefix, keep), 2), " | ",
                      Ci(Ratio(metrics, cases, p.s, p.base, kHeldNll, keep), 2), " | ", Ci(acc, 2), " | ",
                      Ci(Over(metrics, cases, p.base, kRecall, keep), 2), " | ",
                      Ci(Over(metrics, cases, kControl, kRecall, keep), 2), " | ",
                      Ci(Over(metrics, cases, p.s, kWrong, keep), 2), " | ",
                      Ci(Over(metrics, cases, p.base, kWrong, keep), 2), " |\n");
    }
  }
}

// One row per setting over the cases `keep` selects.
void SettingTable(std::string& out, const std::string& title, const std::vector<QualityCase>& cases,
                  const MetricsTable& metrics, const std::function<bool(const QualityCase&)>& keep) {
  absl::StrAppend(&out, "\n### ", title, "\n\n",
                  "| setting | n | agreement to first divergence | agreement overall | ppl of ref. continuation | "
                  "ratio | held-out ppl | ratio | doc benefit kept | answer NLL | object recall | wrong object |\n"
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (int si = 0; si < kNumSettings; ++si) {
    const SettingId s = static_cast<SettingId>(si);
    const Setting& setting = Settings()[s];
    const Interval held = Over(metrics, cases, s, kHeldNll, keep);
    if (held.n == 0) continue;
    const SettingId base = setting.reference;
    double control_sum = 0, setting_sum = 0, base_sum = 0;
    for (size_t c = 0; c < cases.size(); ++c) {
      const auto& m = metrics[c];
      if (!keep(cases[c]) || !m[s].ran || !m[base].ran || !m[kControl].ran) continue;
      control_sum += m[kControl].held_nll;
      setting_sum += m[s].held_nll;
      base_sum += m[base].held_nll;
    }
    absl::StrAppend(&out, "| ", setting.name, " | ", held.n, " | ", Ci(Over(metrics, cases, s, kAgreePrefix, keep), 3),
                    " | ", Ci(Over(metrics, cases, s, kAgreeOverall, keep), 3), " | ",
                    Ci(ExpInterval(Over(metrics, cases, s, kRefNll, keep)), 3), " | ",
                    Ci(Ratio(metrics, cases, s, base, kRefNll, keep), 3), " | ", Ci(ExpInterval(held), 2), " | ",
                    Ci(Ratio(metrics, cases, s, base, kHeldNll, keep), 3), " | ",
                    absl::StrFormat("%.2f", (control_sum - setting_sum) / (control_sum - base_sum)), " | ",
                    Ci(Over(metrics, cases, s, kAnswerNll, keep), 2), " | ",
                    Ci(Over(metrics, cases, s, kRecall, keep), 3), " | ", Ci(Over(metrics, cases, s, kWrong, keep), 3),
                    " |\n");
  }
}

// The repair's effect and cost over the cases with 2 or more documents (with one, nothing
// is repaired): perplexity ratios against `none`, and the tokens each request computed.
void RepairSummary(std::string& out, const std::vector<QualityCase>& cases, const MetricsTable& metrics,
                   const RunResults& results) {
  auto multi = [](const QualityCase& c) { return c.count >= 2; };
  absl::StrAppend(&out,
                  "\n### Repair: the first K tokens of each document recomputed in context (cases with 2 or "
                  "more documents)\n\n| K | n | ppl ratio of ref. continuation | held-out ppl ratio | agreement "
                  "to first divergence | prompt tokens per request | computed per request (prompt) | "
                  "recomputed per request (repair) |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (SettingId s : {kLazy, kLazyRepair4, kLazyRepair16}) {
    double prompt = 0, computed = 0, repaired = 0;
    int n = 0;
    for (size_t c = 0; c < cases.size(); ++c) {
      const CaseSettingResult& r = results.per_case[c][s];
      if (!multi(cases[c]) || !r.ran) continue;
      prompt += r.continuation.prompt_tokens;
      computed += r.continuation.computed_tokens;
      repaired += r.continuation.repaired_tokens;
      ++n;
    }
    if (n == 0) continue;
    absl::StrAppend(&out, "| ", Settings()[s].repair, " | ", n, " | ", Ci(Ratio(metrics, cases, s, kNone, kRefNll, multi), 3),
                    " | ", Ci(Ratio(metrics, cases, s, kNone, kHeldNll, multi), 3), " | ",
                    Ci(Over(metrics, cases, s, kAgreePrefix, multi), 3), " | ",
                    absl::StrFormat("%.1f | %.1f | %.1f", prompt / n, computed / n, repaired / n), " |\n");
  }
}

}  // namespace

std::string MarkdownReport(const std::vector<QualityCase>& cases, const MetricsTable& metrics,
                           const QualityChecks& checks, const RunResults& results, const ReportContext& context) {
  std::string out;
  absl::StrAppend(&out, "Model `", context.model, "`, CPU backend (fp32), block size 16. Machine: ", context.machine,
                  ". Date: ", context.date, ".\n\n```\n", context.command, "\n```\n\n");
  absl::StrAppend(&out,
                  "Settings: `none`, `prefix`, `block`, `lazy` with the BOS anchor (the design default); "
                  "`control`: `none` with the relevant document swapped for an unrelated one; ");
  if (context.long_anchor_ran) {
    absl::StrAppend(&out, "`none+long` and `lazy+long`: the anchor is BOS + \"", context.long_anchor_text, "\" (",
                    context.long_anchor.size(), " tokens), for every sequence and every chunk; ");
  }
  if (context.anchorless_ran) {
    absl::StrAppend(&out,
                    "`none+noanchor` and `lazy+noanchor`: no anchor and no BOS at all (EngineOptions::anchorless), "
                    "each document encoded alone from position 0; ");
  }
  if (context.repair_ran) {
    absl::StrAppend(&out,
                    "`lazy+repairK`: `lazy` with the first K tokens of every document but the first computed "
                    "again in context (GenerateRequest::repair_tokens), in every request; ");
  }
  absl::StrAppend(&out, "free runs of ", context.free_run_tokens, " greedy tokens.\n\n");
  absl::StrAppend(&out,
                  "95% bootstrap intervals over cases (2000 resamples). Perplexity ratios are paired "
                  "geometric means, exp(mean over cases of the NLL difference), against `none` with the same "
                  "anchor. \"Doc benefit kept\": (control NLL - setting NLL) / (control NLL - none NLL) on the "
                  "held-out text, over the cases where all three ran. `prefix` and `block` run on a subset "
                  "(n).\n");
  SettingTable(out, "All cases, per setting", cases, metrics, [](const QualityCase&) { return true; });
  SettingTable(out, "Cases with 2 or more documents (with one, lazy is exactly none), per setting", cases, metrics,
               [](const QualityCase& c) { return c.count >= 2; });
  // An anchor setting's effect, paired per case against BOS: lazy's cost, (lazyX - noneX) -
  // (lazy - none), and the held-out text under noneX and lazyX against none (BOS).
  struct AnchorRow {
    bool ran;
    const char* title;
    SettingId none, lazy;
  };
  for (const AnchorRow& row : {AnchorRow{context.long_anchor_ran, "Long anchor", kNoneLong, kLazyLong},
                               AnchorRow{context.anchorless_ran, "No anchor", kNoneBare, kLazyBare}}) {
    if (!row.ran) continue;
    auto multi = [](const QualityCase& c) { return c.count >= 2; };
    absl::StrAppend(&out, "\n", row.title,
                    " against BOS, paired per case (ratio of lazy's perplexity ratios, < 1: it costs lazy less "
                    "than BOS does):");
    for (const auto& [label, field] :
         {std::pair<const char*, Field>{"reference continuation", kRefNll}, {"held-out text", kHeldNll}}) {
      std::vector<double> v;
      for (size_t c = 0; c < cases.size(); ++c) {
        const auto& m = metrics[c];
        if (multi(cases[c]) && m[kLazy].ran && m[kNone].ran && m[row.lazy].ran && m[row.none].ran) {
          v.push_back((field(m[row.lazy]) - field(m[row.none])) - (field(m[kLazy]) - field(m[kNone])));
        }
      }
      absl::StrAppend(&out, " ", label, " ", Ci(ExpInterval(BootstrapMean(v, 2000, 13)), 3), ";");
    }
    absl::StrAppend(&out, " held-out perplexity against `none` with BOS: `", Settings()[row.none].name, "` ",
                    Ci(Ratio(metrics, cases, row.none, kNone, kHeldNll, multi), 3), ", `", Settings()[row.lazy].name,
                    "` ", Ci(Ratio(metrics, cases, row.lazy, kNone, kHeldNll, multi), 3), " (`lazy` ",
                    Ci(Ratio(metrics, cases, kLazy, kNone, kHeldNll, multi), 3),
                    "); over the cases with 2 or more documents.\n");
  }

  if (context.repair_ran) RepairSummary(out, cases, metrics, results);

  std::vector<std::pair<std::string, std::function<bool(const QualityCase&)>>> by_count, by_place;
  std::vector<int> counts;
  for (const QualityCase& c : cases) {
    if (std::find(counts.begin(), counts.end(), c.count) == counts.end()) counts.push_back(c.count);
  }
  for (int k : counts) {
    by_count.emplace_back(absl::StrCat(k, " doc", k > 1 ? "s" : ""),
                          [k](const QualityCase& c) { return c.count == k; });
  }
  for (Placement p : {Placement::kFirst, Placement::kMiddle, Placement::kLast}) {
    for (int k : counts) {
      if (k < 2 || (p == Placement::kMiddle && k < 3)) continue;
      by_place.emplace_back(absl::StrCat(PlacementName(p), " of ", k),
                            [k, p](const QualityCase& c) { return c.count == k && c.placement == p; });
    }
  }
  std::vector<Pair> pairs = {{kLazy, kNone}};
  if (context.long_anchor_ran) pairs.push_back({kLazyLong, kNoneLong});
  if (context.anchorless_ran) pairs.push_back({kLazyBare, kNoneBare});
  if (context.repair_ran) {
    pairs.push_back({kLazyRepair4, kNone});
    pairs.push_back({kLazyRepair16, kNone});
  }
  GroupTable(out, "By document count (relevant document anywhere)", cases, metrics, by_count, pairs);
  GroupTable(out, "By position of the relevant document", cases, metrics, by_place, pairs);

  absl::StrAppend(&out,
                  "\n### Sanity checks (same run)\n\n| check | cases | identical free runs | worst logits "
                  "rel. error | worst log-prob diff |\n| --- | --- | --- | --- | --- |\n");
  for (const auto& [name, e] : {std::pair<const char*, Equivalence>{"prefix = none", checks.prefix_vs_none},
                                {"lazy = block", checks.lazy_vs_block}}) {
    absl::StrAppend(&out, absl::StrFormat("| %s | %d | %d | %.2g | %.2g |\n", name, e.cases, e.same_tokens,
                                          e.max_logit_rel_error, e.max_logprob_diff));
  }
  absl::StrAppend(&out, absl::StrFormat("\nControl (relevant document swapped for an unrelated one): held-out NLL "
                                        "%.3f against none's %.3f (must be worse). Checks: %s.\n",
                                        checks.control_held_nll, checks.none_held_nll,
                                        checks.failures.empty() ? "all hold" : absl::StrJoin(checks.failures, "; ")));
  absl::StrAppend(&out, absl::StrFormat("\nCost: %d engine requests in %.1f s of engine time.\n", results.requests,
                                        results.seconds));
  return out;
}

std::string MetricsCsv(const std::vector<QualityCase>& cases, const MetricsTable& metrics) {
  std::string out =
      "case,count,placement,setting,agree_prefix,agree_overall,ref_nll,ref_tokens,held_nll,held_tokens,"
      "answer_correct,answer_nll,recalls_object,wrong_object\n";
  for (size_t c = 0; c < cases.size(); ++c) {
    for (int s = 0; s < kNumSettings; ++s) {
      const CaseMetrics& m = metrics[c][s];
      if (!m.ran) continue;
      absl::StrAppend(&out, absl::StrFormat("%d,%d,%s,%s,%.6f,%.6f,%.6f,%d,%.6f,%d,%d,%.6f,%d,%d\n", cases[c].index,
                                            cases[c].count, PlacementName(cases[c].placement), Settings()[s].name,
                                            m.agreement.prefix, m.agreement.overall, m.ref_nll, m.ref_tokens,
                                            m.held_nll, m.held_tokens, m.answer_correct ? 1 : 0, m.answer_nll,
                                            m.recalls_object ? 1 : 0, m.wrong_object ? 1 : 0));
    }
  }
  return out;
}

}  // namespace lazykv::quality
