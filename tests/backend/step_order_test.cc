// PrefillStepOrder (worker/backend/step_order.h) on random steps against the order written out
// plainly: a permutation that keeps the leading run of one-token steps first, then puts the
// few-token steps before the longer ones in the engine's order, and only where both hold a step
// with tokens.
#include "worker/backend/step_order.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace lazykv {
namespace {

using testing::FreshSeed;

// The expected order, stated as the contract says it: the leading run, then (where split) the
// rest by group, each in index order.
std::vector<size_t> Expected(const std::vector<size_t>& lengths, size_t few_max, size_t* many_first) {
  size_t lead = 0;
  while (lead < lengths.size() && lengths[lead] <= 1) ++lead;
  bool few_has_tokens = false, any_many = false;
  for (size_t i = lead; i < lengths.size(); ++i) {
    few_has_tokens = few_has_tokens || (lengths[i] > 0 && lengths[i] <= few_max);
    any_many = any_many || lengths[i] > few_max;
  }
  std::vector<size_t> order;
  for (size_t i = 0; i < lead; ++i) order.push_back(i);
  *many_first = 0;
  if (few_max == 0 || !few_has_tokens || !any_many) {
    for (size_t i = lead; i < lengths.size(); ++i) order.push_back(i);
    return order;
  }
  for (size_t i = lead; i < lengths.size(); ++i) {
    if (lengths[i] <= few_max) order.push_back(i);
  }
  for (size_t i : order) *many_first += lengths[i] > 0 ? 1 : 0;
  for (size_t i = lead; i < lengths.size(); ++i) {
    if (lengths[i] > few_max) order.push_back(i);
  }
  return order;
}

TEST(PrefillStepOrderTest, MatchesTheContractOnRandomSteps) {
  const unsigned seed = FreshSeed();
  SCOPED_TRACE(seed);
  std::mt19937 rng(seed);
  const std::vector<int32_t> token_pool(200, 7);
  int split = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const size_t count = std::uniform_int_distribution<size_t>(0, 12)(rng);
    const size_t few_max = trial % 5 == 0 ? 0 : 64;
    std::vector<size_t> lengths;
    for (size_t i = 0; i < count; ++i) {
      // Decoding steps (1), empty ones (0), few-token ones and longer ones, mixed.
      const int kind = std::uniform_int_distribution<int>(0, 3)(rng);
      lengths.push_back(kind == 0 ? 1 : kind == 1 ? rng() % 3 : kind == 2 ? 2 + rng() % 63 : 65 + rng() % 130);
    }
    std::vector<SequenceStep> steps(count);
    for (size_t i = 0; i < count; ++i) steps[i].tokens = std::span(token_pool.data(), lengths[i]);
    size_t many_first = 99, expected_many_first = 77;
    const std::vector<size_t> order = PrefillStepOrder(steps, few_max, &many_first);
    const std::vector<size_t> expected = Expected(lengths, few_max, &expected_many_first);
    ASSERT_EQ(order, expected) << "trial " << trial;
    ASSERT_EQ(many_first, expected_many_first) << "trial " << trial;
    std::vector<size_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(sorted[i], i) << "not a permutation, trial " << trial;
    split += many_first > 0 ? 1 : 0;
  }
  EXPECT_GT(split, 200) << "few trials split";
}

// The split only where it can help: not with few_max 0, not where the few-token group holds only
// empty steps, not where nothing is longer; and a step laid out ahead of a longer one it
// followed in the engine's order.
TEST(PrefillStepOrderTest, SplitsOnlyWhereBothGroupsHaveTokens) {
  const std::vector<int32_t> tokens(100, 3);
  const auto steps_of = [&](const std::vector<size_t>& lengths) {
    std::vector<SequenceStep> steps(lengths.size());
    for (size_t i = 0; i < lengths.size(); ++i) steps[i].tokens = std::span(tokens.data(), lengths[i]);
    return steps;
  };
  size_t many_first = 0;
  // Decoding, a document piece, a question, another document piece.
  std::vector<SequenceStep> mixed = steps_of({1, 1, 90, 16, 80});
  EXPECT_EQ(PrefillStepOrder(mixed, 64, &many_first), (std::vector<size_t>{0, 1, 3, 2, 4}));
  EXPECT_EQ(many_first, 3u);
  EXPECT_EQ(PrefillStepOrder(mixed, 0, &many_first), (std::vector<size_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(many_first, 0u);
  std::vector<SequenceStep> empty_few = steps_of({1, 90, 0, 80});  // only an empty step is few
  EXPECT_EQ(PrefillStepOrder(empty_few, 64, &many_first), (std::vector<size_t>{0, 1, 2, 3}));
  EXPECT_EQ(many_first, 0u);
  std::vector<SequenceStep> no_long = steps_of({1, 20, 16});
  EXPECT_EQ(PrefillStepOrder(no_long, 64, &many_first), (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(many_first, 0u);
  // An empty step inside the leading run counts nowhere; one after it goes with the few.
  std::vector<SequenceStep> empties = steps_of({0, 1, 70, 0, 5});
  EXPECT_EQ(PrefillStepOrder(empties, 64, &many_first), (std::vector<size_t>{0, 1, 3, 4, 2}));
  EXPECT_EQ(many_first, 2u);  // steps with tokens before index 2 (70 tokens): 1 and 4
}

}  // namespace
}  // namespace lazykv
